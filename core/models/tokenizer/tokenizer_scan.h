/* Fast reading of model.vocab and model.merges from a tokenizer.json text
 * (see tokenizer_scan.c). Internal to the tokenizer. */
#ifndef TPGEN_TOKENIZER_SCAN_H
#define TPGEN_TOKENIZER_SCAN_H
#include <stddef.h>
#include <stdint.h>

typedef struct { uint32_t off; int32_t len; int32_t id; } hf_fast_entry;      /* len -1: not byte-level */
typedef struct { uint32_t off; int32_t len_a, len; } hf_fast_merge;          /* A = [off, off+len_a), B the rest */

typedef struct hf_fast_s {
    char *bytes;
    size_t nbytes, cap_bytes;
    hf_fast_entry *vocab;
    int n_vocab, cap_vocab;
    hf_fast_merge *merges;
    int n_merges, cap_merges;
    int have_vocab, have_merges;
    int n_spans;                       /* the two values' places in the text */
    char *span_from[2], *span_to[2];
} hf_fast;

/* Scan text. On success (0) both members were read and are cut out of the
 * text, leaving {} and [] (the new length is stored in *len; line numbers
 * are kept, columns after the cut shift). -1: the caller must parse the
 * text with jansson instead (the text is then unchanged). */
int hf_fast_scan(char *text, size_t *len, const int16_t *cp_to_byte, hf_fast *f);
void hf_fast_free(hf_fast *f);

#endif
