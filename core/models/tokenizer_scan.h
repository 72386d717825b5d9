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
} hf_fast;

/* Scan text (modified: the two members are blanked out on success). Returns
 * 0 when both were read; -1 when the caller must parse the text with jansson
 * instead (the text may then be partly blanked: re-read it). */
int hf_fast_scan(char *text, size_t len, const int16_t *cp_to_byte, hf_fast *f);
void hf_fast_free(hf_fast *f);

#endif
