/* Internals of the tokenizer shared by its loaders (tokenizer_load.c over
 * tokenizer_hf.c and tokenizer_tekken.c), the tables they build
 * (tokenizer_vocab.c) and the encoder (tokenizer.c). Not a public API. */
#ifndef TPGEN_TOKENIZER_INT_H
#define TPGEN_TOKENIZER_INT_H
#include "tokenizer.h"
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <jansson.h>
#include <stdint.h>

/* The GPT-2 "bytes_to_unicode" table (docs/spec/flux2-text-vae.md §5.4) and its inverse on code
 * points 0..0x143 (-1 for code points that no byte maps to). */
void byte_unicode_tables(uint32_t byte_to_cp[256], int16_t cp_to_byte[0x144]);

struct tokenizer {
    char *source;               /* path of the file it was loaded from */
    tokenizer_family family;

    /* id -> raw bytes (tok_len -1: no token has this id) */
    int n_ids;
    uint32_t *tok_off;
    int32_t *tok_len;
    char *arena;
    size_t arena_len, arena_cap;

    /* vocabulary bytes -> id, open addressing, slots hold ids (-1 empty) */
    int32_t *vocab_slots;
    uint32_t vocab_mask;
    int n_vocab;
    int32_t byte_id[256];       /* id of each single byte (-1 if absent) */

    /* BPE merges: (left id, right id) -> rank and merged id */
    uint64_t *pair_keys;        /* UINT64_MAX empty */
    int32_t *pair_rank, *pair_merged;
    uint32_t pair_mask;
    int n_pairs;
    int ignore_merges;          /* a piece that is a whole vocab entry is emitted as is */

    /* added / special tokens, matched before anything else */
    int n_added;
    int32_t *added_ids;         /* sorted by first byte, then longest first */
    int added_start[257];       /* bucket of first byte b: added_start[b] .. added_start[b+1] */

    /* normaliser and pre-tokenizer */
    int nfc;
    int add_prefix_space;
    pcre2_code *split_re;       /* NULL: the whole segment is one piece */

    int pad_id;
    tokenizer_side padding_side, truncation_side;
};

tokenizer *tok_new(const char *source);
/* Allocate the id table for ids [0, n_ids) and the hash table for at most
 * n_vocab vocabulary entries; then the merge table for at most n_pairs. */
void tok_reserve(tokenizer *t, int n_ids, int n_vocab);
void tok_reserve_pairs(tokenizer *t, int n_pairs);
/* Give token `id` the raw bytes s[0..n); in_vocab also enters it in the
 * bytes->id table used by BPE. Fails on a duplicate id or duplicate bytes. */
int tok_set(tokenizer *t, int id, const char *s, int n, int in_vocab);
int tok_vocab_find(const tokenizer *t, const char *s, int n);
/* Add a merge rule; a pair already present keeps its lower rank. */
void tok_add_pair(tokenizer *t, int left, int right, int rank, int merged);
/* Register the added tokens (ids already given bytes with tok_set). */
void tok_set_added(tokenizer *t, const int32_t *ids, int n);
/* Compile the split regex; fails with the PCRE2 message. */
int tok_set_pattern(tokenizer *t, const char *pattern, int literal, const char *where);
/* Final checks and derived fields (byte ids, family, pad id). */
int tok_finish(tokenizer *t, const char *pad_token);

/* Read padding_side / truncation_side / pad_token from a
 * tokenizer_config.json (missing file: defaults). Without padding_side the
 * side is default_side, or left for tokenizer classes that pad left
 * (LlamaTokenizerFast, MistralCommonTokenizer). *pad_token is malloc'ed or
 * NULL. */
int tok_read_config(tokenizer *t, const char *config_path, char **pad_token, tokenizer_side default_side);

/* Parse a tokenizer file and build from it: HF tokenizer.json or
 * mistral-common tekken.json, told apart by content. */
tokenizer *tok_load_json(const char *path, const char *config_path);
/* fast_scan 0: parse everything with jansson (the tests compare both paths) */
tokenizer *tok_load_json_ex(const char *path, const char *config_path, int fast_scan);
struct hf_fast_s;
/* fast: the vocabulary and merges already scanned (tokenizer_scan.h), or
 * NULL to read them from root */
tokenizer *tok_from_hf_json(json_t *root, const char *path, const char *config_path, const struct hf_fast_s *fast);
tokenizer *tok_from_tekken_json(json_t *root, const char *path, const char *config_path);

/* tokenizer_gguf.c: build from an open GGUF file's tokenizer.ggml.* keys;
 * the split regex tpgen uses for a tokenizer.ggml.pre name (NULL: unknown). */
struct gguf_file;
tokenizer *tok_from_gguf(const struct gguf_file *g);
const char *tok_gguf_pattern(const char *pre);

#endif
