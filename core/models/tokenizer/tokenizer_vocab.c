/* Tokenizer tables: id -> bytes, bytes -> id, merge pairs, added tokens,
 * tokenizer_config.json's sides and pad token, and the small accessors:
 * the builder both loaders (tokenizer_hf.c, tokenizer_tekken.c) fill. The hash tables are plain
 * open addressing with linear probing, sized to a load factor <= 1/2 at
 * reserve time, so the 150k-entry Qwen vocabulary loads without rehashing. */
#include "tokenizer_int.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

void byte_unicode_tables(uint32_t byte_to_cp[256], int16_t cp_to_byte[0x144]) {
    for (int i = 0; i < 0x144; i++) cp_to_byte[i] = -1;
    uint32_t next = 0x100;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = printable ? (uint32_t)b : next++;
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

static uint32_t hash_bytes(const char *s, int n) {
    uint32_t h = 2166136261u;  /* FNV-1a */
    for (int i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h ^ (h >> 15);
}

static uint32_t hash_pair(uint64_t key) { return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32); }

static uint32_t table_size(int n) {
    uint32_t s = 64;
    while (s < (uint32_t)n * 2u + 16u) s <<= 1;
    return s;
}

tokenizer *tok_new(const char *source) {
    tokenizer *t = xcalloc(1, sizeof *t);
    t->source = xstrdup(source);
    t->pad_id = -1;
    t->family = TOKENIZER_OTHER;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    return t;
}

void tok_reserve(tokenizer *t, int n_ids, int n_vocab) {
    t->n_ids = n_ids;
    t->tok_off = xcalloc((size_t)n_ids, sizeof *t->tok_off);
    t->tok_len = xmalloc((size_t)n_ids * sizeof *t->tok_len);
    for (int i = 0; i < n_ids; i++) t->tok_len[i] = -1;
    uint32_t vs = table_size(n_vocab);
    t->vocab_mask = vs - 1;
    t->vocab_slots = xmalloc(vs * sizeof *t->vocab_slots);
    memset(t->vocab_slots, 0xff, vs * sizeof *t->vocab_slots);
    t->arena_cap = (size_t)n_vocab * 8 + 4096;
    t->arena = xmalloc(t->arena_cap);
}

void tok_reserve_pairs(tokenizer *t, int n_pairs) {
    uint32_t ps = table_size(n_pairs);
    t->pair_mask = ps - 1;
    t->pair_keys = xmalloc(ps * sizeof *t->pair_keys);
    memset(t->pair_keys, 0xff, ps * sizeof *t->pair_keys);
    t->pair_rank = xmalloc(ps * sizeof *t->pair_rank);
    t->pair_merged = xmalloc(ps * sizeof *t->pair_merged);
}

int tok_vocab_find(const tokenizer *t, const char *s, int n) {
    for (uint32_t h = hash_bytes(s, n) & t->vocab_mask;; h = (h + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slots[h];
        if (id < 0) return -1;
        if (t->tok_len[id] == n && !memcmp(t->arena + t->tok_off[id], s, (size_t)n)) return id;
    }
}

int tok_set(tokenizer *t, int id, const char *s, int n, int in_vocab) {
    if (id < 0 || id >= t->n_ids) return tp_error("token id %d is outside [0, %d)", id, t->n_ids);
    if (t->tok_len[id] >= 0) {
        /* the same token listed twice (e.g. a special that is also in the vocabulary) is fine */
        if (t->tok_len[id] != n || memcmp(t->arena + t->tok_off[id], s, (size_t)n))
            return tp_error("token id %d is given to two different strings", id);
    } else {
        if (t->arena_len + (size_t)n > t->arena_cap) {
            while (t->arena_len + (size_t)n > t->arena_cap) t->arena_cap *= 2;
            t->arena = xrealloc(t->arena, t->arena_cap);
        }
        memcpy(t->arena + t->arena_len, s, (size_t)n);
        t->tok_off[id] = (uint32_t)t->arena_len;
        t->tok_len[id] = n;
        t->arena_len += (size_t)n;
    }
    if (!in_vocab) return 0;
    if ((uint32_t)t->n_vocab * 2u >= t->vocab_mask) return tp_error("vocabulary larger than reserved");
    uint32_t h = hash_bytes(s, n) & t->vocab_mask;
    for (;; h = (h + 1) & t->vocab_mask) {
        int32_t other = t->vocab_slots[h];
        if (other < 0) break;
        if (other == id) return 0;
        if (t->tok_len[other] == n && !memcmp(t->arena + t->tok_off[other], s, (size_t)n))
            return tp_error("vocabulary ids %d and %d have the same bytes", other, id);
    }
    t->vocab_slots[h] = id;
    t->n_vocab++;
    return 0;
}

void tok_add_pair(tokenizer *t, int left, int right, int rank, int merged) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint32_t h = hash_pair(key) & t->pair_mask;
    for (;; h = (h + 1) & t->pair_mask) {
        if (t->pair_keys[h] == key) {
            if (rank < t->pair_rank[h]) t->pair_rank[h] = rank, t->pair_merged[h] = merged;
            return;
        }
        if (t->pair_keys[h] == UINT64_MAX) break;
    }
    if ((uint32_t)t->n_pairs * 2u >= t->pair_mask) tp_fatal("merge table larger than reserved");
    t->pair_keys[h] = key;
    t->pair_rank[h] = rank;
    t->pair_merged[h] = merged;
    t->n_pairs++;
}

static int cmp_added(const void *a, const void *b, void *ctx) {
    const tokenizer *t = ctx;
    int ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    int fa = t->tok_len[ia] ? (uint8_t)t->arena[t->tok_off[ia]] : -1;
    int fb = t->tok_len[ib] ? (uint8_t)t->arena[t->tok_off[ib]] : -1;
    if (fa != fb) return fa - fb;
    if (t->tok_len[ia] != t->tok_len[ib]) return t->tok_len[ib] - t->tok_len[ia]; /* longest first */
    return ia - ib;
}

void tok_set_added(tokenizer *t, const int32_t *ids, int n) {
    free(t->added_ids);
    t->added_ids = xmalloc((size_t)(n ? n : 1) * sizeof *ids);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (t->tok_len[ids[i]] > 0) t->added_ids[k++] = ids[i]; /* an empty added token can never match */
    t->n_added = k;
    qsort_r(t->added_ids, (size_t)k, sizeof *t->added_ids, cmp_added, t);
    int j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < k && (uint8_t)t->arena[t->tok_off[t->added_ids[j]]] < b) j++;
        t->added_start[b] = j;
    }
}

int tok_set_pattern(tokenizer *t, const char *pattern, int literal, const char *where) {
    int code;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    t->split_re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &code, &off, NULL);
    if (!t->split_re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return tp_error("%s: the pre-tokenizer regex does not compile at offset %zu: %s", where, (size_t)off, msg);
    }
    pcre2_jit_compile(t->split_re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    return 0;
}

static int added_find(const tokenizer *t, const char *s) {
    for (int i = 0; i < t->n_added; i++) {
        int id = t->added_ids[i];
        if ((size_t)t->tok_len[id] == strlen(s) && !memcmp(t->arena + t->tok_off[id], s, strlen(s))) return id;
    }
    return -1;
}

int tok_finish(tokenizer *t, const char *pad_token) {
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = tok_vocab_find(t, &c, 1);
        if (t->byte_id[b] < 0)
            return tp_error("%s: byte 0x%02x has no token; tpgen supports byte-level BPE vocabularies, "
                            "which have one token for each of the 256 bytes", t->source, b);
    }
    if (added_find(t, "<|im_start|>") >= 0) t->family = TOKENIZER_QWEN;
    else if (added_find(t, "[INST]") >= 0 && added_find(t, "<s>") >= 0) t->family = TOKENIZER_MISTRAL;
    if (pad_token) {
        t->pad_id = tokenizer_token_id(t, pad_token);
        if (t->pad_id < 0)
            return tp_error("%s: the pad token '%s' named in tokenizer_config.json is not a token", t->source, pad_token);
    } else {
        /* no tokenizer_config.json: the pad tokens of the FLUX.2 pipelines */
        t->pad_id = added_find(t, "<pad>");
        if (t->pad_id < 0) t->pad_id = added_find(t, "<|endoftext|>");
    }
    return 0;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->source);
    free(t->tok_off);
    free(t->tok_len);
    free(t->arena);
    free(t->vocab_slots);
    free(t->pair_keys);
    free(t->pair_rank);
    free(t->pair_merged);
    free(t->added_ids);
    if (t->split_re) pcre2_code_free(t->split_re);
    free(t);
}

tokenizer_family tokenizer_get_family(const tokenizer *t) { return t->family; }
int tokenizer_vocab_size(const tokenizer *t) { return t->n_ids; }
int tokenizer_pad_id(const tokenizer *t) { return t->pad_id; }
tokenizer_side tokenizer_padding_side(const tokenizer *t) { return t->padding_side; }
tokenizer_side tokenizer_truncation_side(const tokenizer *t) { return t->truncation_side; }
const char *tokenizer_source(const tokenizer *t) { return t->source; }

int tokenizer_token_id(const tokenizer *t, const char *s) {
    int id = added_find(t, s);
    return id >= 0 ? id : tok_vocab_find(t, s, (int)strlen(s));
}

const char *tokenizer_token_bytes(const tokenizer *t, int id, int *len) {
    if (id < 0 || id >= t->n_ids || t->tok_len[id] < 0) return NULL;
    *len = t->tok_len[id];
    return t->arena + t->tok_off[id];
}

/* ---- tokenizer_config.json: padding and truncation sides, pad token ---- */

static int side_of(json_t *v, tokenizer_side *side, const char *key, const char *path) {
    if (!v || json_is_null(v)) return 0;
    const char *s = json_string_value(v);
    if (s && !strcmp(s, "left")) *side = TOKENIZER_PAD_LEFT;
    else if (s && !strcmp(s, "right")) *side = TOKENIZER_PAD_RIGHT;
    else return tp_error("%s: %s must be \"left\" or \"right\"", path, key);
    return 0;
}

/* transformers tokenizer classes whose class attribute padding_side is
 * "left" (used when the config does not say): the Llama fast tokenizer that
 * converted Mistral/Tekken tokenizers load as, and the mistral-common one */
static int class_pads_left(const char *cls) {
    static const char *const left[] = {"LlamaTokenizer", "LlamaTokenizerFast", "MistralCommonTokenizer",
                                       "MistralCommonBackend"};
    for (size_t i = 0; cls && i < sizeof left / sizeof *left; i++)
        if (!strcmp(cls, left[i])) return 1;
    return 0;
}

int tok_read_config(tokenizer *t, const char *config_path, char **pad_token, tokenizer_side default_side) {
    *pad_token = NULL;
    t->padding_side = default_side;
    t->truncation_side = TOKENIZER_PAD_RIGHT; /* the transformers default */
    if (!config_path) return 0;
    json_error_t jerr;
    /* configs carry huge integers (model_max_length 1e30) that only fit a double */
    json_t *root = json_load_file(config_path, JSON_DECODE_INT_AS_REAL, &jerr);
    if (!root) return tp_error("%s:%d:%d: cannot read the tokenizer config: %s", config_path, jerr.line, jerr.column, jerr.text);
    int rc = 0;
    if (class_pads_left(json_string_value(json_object_get(root, "tokenizer_class")))) t->padding_side = TOKENIZER_PAD_LEFT;
    if (side_of(json_object_get(root, "padding_side"), &t->padding_side, "padding_side", config_path) ||
        side_of(json_object_get(root, "truncation_side"), &t->truncation_side, "truncation_side", config_path))
        rc = -1;
    json_t *pad = json_object_get(root, "pad_token");
    if (json_is_object(pad)) pad = json_object_get(pad, "content"); /* AddedToken form */
    if (json_is_string(pad)) *pad_token = xstrdup(json_string_value(pad));
    json_decref(root);
    return rc;
}
