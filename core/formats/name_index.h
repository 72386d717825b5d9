/* A string -> int map for the name lookups of the file parsers (LoRA
 * modules, fp8 hints): a hostile file may hold 200 000 names, and a linear
 * search per name made those parsers quadratic (minutes for one file).
 * Open addressing, FNV-1a, keys copied; lookups by (pointer, length) so a
 * caller can look up a prefix of a longer name. */
#ifndef TPGEN_NAME_INDEX_H
#define TPGEN_NAME_INDEX_H
#include <stddef.h>

typedef struct name_index {
    struct name_slot *slot;
    size_t cap, n;
} name_index;

/* The value stored under s[0:len), or -1 when absent. */
int name_index_get(const name_index *x, const char *s, size_t len);
/* Store val (>= 0) under s[0:len), replacing an earlier value. */
void name_index_put(name_index *x, const char *s, size_t len, int val);
void name_index_free(name_index *x);

#endif
