/* String -> int map (name_index.h). */
#include "name_index.h"
#include "kernels/err.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct name_slot {
    char *key;                  /* NULL: empty */
    size_t len;
    int val;
} name_slot;

static uint64_t hash(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* the slot of s, or the empty slot where it would go */
static name_slot *find(const name_index *x, const char *s, size_t len) {
    size_t i = (size_t)hash(s, len) & (x->cap - 1);
    for (;; i = (i + 1) & (x->cap - 1)) {
        name_slot *e = &x->slot[i];
        if (!e->key || (e->len == len && !memcmp(e->key, s, len))) return e;
    }
}

int name_index_get(const name_index *x, const char *s, size_t len) {
    if (!x->cap) return -1;
    const name_slot *e = find(x, s, len);
    return e->key ? e->val : -1;
}

/* double the table (kept at most half full, so a probe ends) */
static void grow(name_index *x) {
    name_index y = {xcalloc(x->cap ? 2 * x->cap : 16, sizeof *y.slot), x->cap ? 2 * x->cap : 16, x->n};
    for (size_t i = 0; i < x->cap; i++)
        if (x->slot[i].key) *find(&y, x->slot[i].key, x->slot[i].len) = x->slot[i];
    free(x->slot);
    *x = y;
}

void name_index_put(name_index *x, const char *s, size_t len, int val) {
    if (2 * (x->n + 1) > x->cap) grow(x);
    name_slot *e = find(x, s, len);
    if (!e->key) {
        e->key = xmalloc(len + 1);
        memcpy(e->key, s, len);
        e->key[len] = 0;
        e->len = len;
        x->n++;
    }
    e->val = val;
}

void name_index_free(name_index *x) {
    for (size_t i = 0; i < x->cap; i++) free(x->slot[i].key);
    free(x->slot);
    memset(x, 0, sizeof *x);
}
