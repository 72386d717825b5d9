/* Building a tokenizer from a GGUF file's tokenizer.ggml.* metadata, as
 * llama.cpp's convert_hf_to_gguf.py writes it for the FLUX.2 text encoders
 * (Qwen3 for klein, Mistral Small 3.x with Tekken for dev). The vocabulary
 * goes into the same builder (tokenizer_vocab.c) the tokenizer.json and
 * tekken.json loaders fill, so one engine encodes all three forms.
 *
 * What the converter writes (model "gpt2" = byte-level BPE):
 *   tokenizer.ggml.tokens      one string per id; NORMAL entries are the
 *                              byte-level-mapped vocabulary keys of
 *                              tokenizer.json, CONTROL / USER_DEFINED ones
 *                              the added tokens' own text, UNUSED ones
 *                              "[PAD<i>]" fillers up to the model's vocab_size
 *   tokenizer.ggml.token_type  the type of each (llama.cpp's TokenType)
 *   tokenizer.ggml.merges      "A B", rank = index (spaces inside A or B are
 *                              written as U+0120, i.e. byte-level already)
 *   tokenizer.ggml.pre         the pre-tokenizer's name: not the regex, so
 *                              each known name maps to the normaliser, split
 *                              regex and ignore_merges its tokenizer.json has
 *   .bos/eos/unknown/padding_token_id, .add_bos_token / .add_eos_token
 * The chat template (tokenizer.chat_template) is not used: tpgen renders its
 * own layouts (prompt.c). add_bos/add_eos are type-checked only: the klein
 * layout has no BOS and the dev layout writes "<s>" itself. */
#include "tokenizer_int.h"
#include "core/formats/gguf.h"
#include "kernels/err.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* llama.cpp's token types (gguf-py TokenType) */
enum { TT_UNDEFINED = 0, TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* The pre-tokenizers of the FLUX.2 text encoders: what their tokenizer.json
 * says (normalizer, Split regex, model.ignore_merges) under the name the
 * converter writes. The padding side is the default of the transformers
 * class each loads as when no tokenizer_config.json says otherwise (a GGUF
 * carries none): Qwen2Tokenizer pads right, the converted Tekken tokenizer
 * (LlamaTokenizerFast) and mistral-common's pad left (docs/tokenizer.md). */
typedef struct {
    const char *name, *pattern;
    int nfc, ignore_merges;
    tokenizer_side padding_side;
} gguf_pretok;

/* Tekken's split regex, under both names llama.cpp's converter writes for a
 * Tekken tokenizer.json: "tekken" (Mistral Nemo's) and "pixtral" (the hash
 * of pixtral-12b's, whose tokenizer.json splits with the same regex; which
 * of the two a given Mistral Small 3.x GGUF carries depends on its vocabulary).
 * llama.cpp itself runs "pixtral" with its llama3 regex (digits in runs of
 * 3), which differs from the HF tokenizer on numbers: tpgen follows the HF
 * tokenizer, the reference of the FLUX.2 pipelines. */
#define TEKKEN_PATTERN                                                                                                \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"                           \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"                           \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const gguf_pretok k_pretoks[] = {
    {"qwen2",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     1, 0, TOKENIZER_PAD_RIGHT},
    {"tekken", TEKKEN_PATTERN, 0, 1, TOKENIZER_PAD_LEFT},
    {"pixtral", TEKKEN_PATTERN, 0, 1, TOKENIZER_PAD_LEFT},
};

const char *tok_gguf_pattern(const char *pre) {
    for (size_t i = 0; i < sizeof k_pretoks / sizeof *k_pretoks; i++)
        if (!strcmp(k_pretoks[i].name, pre)) return k_pretoks[i].pattern;
    return NULL;
}

/* Undo the byte-level mapping of s[0..n): each code point (all below U+0144,
 * so one or two UTF-8 bytes) stands for one byte. Returns the byte count, -1
 * for anything outside the alphabet. */
static int unmap(const char *s, uint64_t n, char *out, const int16_t *cp_to_byte) {
    int k = 0;
    const uint8_t *p = (const uint8_t *)s, *end = p + n;
    while (p < end) {
        uint32_t cp;
        if (p[0] < 0x80) cp = *p++;
        else if ((p[0] & 0xE0) == 0xC0 && p + 1 < end && (p[1] & 0xC0) == 0x80)
            cp = (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F), p += 2;
        else return -1;
        if (cp >= 0x144 || cp_to_byte[cp] < 0) return -1;
        out[k++] = (char)cp_to_byte[cp];
    }
    return k;
}

/* A string safe in a message: its first 40 bytes, control and non-ASCII
 * bytes as \xNN (a hostile file's bytes need not be UTF-8). */
#define SHOWN 176
static void shown(const gguf_str *s, char out[SHOWN]) {
    int k = 0;
    for (uint64_t i = 0; i < s->len && i < 40; i++) {
        unsigned char c = (unsigned char)s->s[i];
        if (c < 0x20 || c >= 0x7f) k += snprintf(out + k, 5, "\\x%02x", c);
        else out[k++] = (char)c;
    }
    if (s->len > 40) out[k++] = '.', out[k++] = '.', out[k++] = '.';
    out[k] = 0;
}

static uint32_t hash_str(const gguf_str *s) {
    uint32_t h = 2166136261u;
    for (uint64_t i = 0; i < s->len; i++) h = (h ^ (uint8_t)s->s[i]) * 16777619u;
    return h ^ (h >> 15);
}

/* Two ids with the same string: llama.cpp refuses such a file (its
 * token-to-id map would lose one), and so does this loader. */
static int check_unique(const gguf_file *g, const gguf_str *tok, int n) {
    uint32_t size = 64;
    while (size < (uint32_t)n * 2u + 16u) size <<= 1;
    int32_t *slot = xmalloc(size * sizeof *slot);
    memset(slot, 0xff, size * sizeof *slot);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        for (uint32_t h = hash_str(&tok[i]) & (size - 1);; h = (h + 1) & (size - 1)) {
            if (slot[h] < 0) { slot[h] = i; break; }
            const gguf_str *o = &tok[slot[h]];
            if (o->len == tok[i].len && !memcmp(o->s, tok[i].s, (size_t)o->len)) {
                char s[SHOWN];
                shown(&tok[i], s);
                rc = tp_error("%s: tokenizer.ggml.tokens lists '%s' twice (ids %d and %d); the file is corrupt", g->path,
                              s, slot[h], i);
                break;
            }
        }
    }
    free(slot);
    return rc;
}

static const char *type_name(int64_t t) {
    static const char *const names[] = {"UNDEFINED", "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"};
    return t >= 0 && t <= TT_BYTE ? names[t] : "not a token type";
}

/* The token list and types: sizes the tables and enters every token. */
static int read_tokens(tokenizer *t, const gguf_file *g, const gguf_str *tok, const int64_t *type, int n,
                       const int16_t *cp_to_byte) {
    int n_ids = 0, n_normal = 0;
    for (int i = 0; i < n; i++) {
        if (type[i] == TT_BYTE || type[i] < TT_NORMAL || type[i] > TT_BYTE)
            return tp_error("%s: tokenizer.ggml.token_type[%d] is %lld (%s): a byte-level BPE vocabulary has NORMAL, "
                            "CONTROL, USER_DEFINED, UNKNOWN and UNUSED tokens only", g->path, i, (long long)type[i],
                            type_name(type[i]));
        if (type[i] != TT_UNUSED) n_ids = i + 1;
        if (type[i] == TT_NORMAL) n_normal++;
        if (type[i] != TT_UNUSED && tok[i].len == 0)
            return tp_error("%s: tokenizer.ggml.tokens[%d] is empty; the file is corrupt", g->path, i);
    }
    if (!n_ids) return tp_error("%s: every entry of tokenizer.ggml.tokens is UNUSED", g->path);
    if (check_unique(g, tok, n)) return -1;
    /* ids past the last used one (the UNUSED "[PAD<i>]" fillers up to the
     * model's vocab_size) are no ids of the tokenizer */
    tok_reserve(t, n_ids, n_normal);
    int32_t *added = xmalloc((size_t)(n_ids ? n_ids : 1) * sizeof *added);
    char *buf = NULL;
    size_t cap = 0;
    int n_added = 0, rc = 0;
    for (int i = 0; i < n_ids && !rc; i++) {
        if (type[i] == TT_UNUSED) continue;
        if (type[i] != TT_NORMAL) { /* added token: matched in the text as it is */
            if (tok[i].len > 0x7fffffff) rc = tp_error("%s: tokenizer.ggml.tokens[%d] is too long", g->path, i);
            else if (tok_set(t, i, tok[i].s, (int)tok[i].len, 0)) rc = tp_error_context("%s: tokenizer.ggml.tokens[%d]", g->path, i);
            else added[n_added++] = i;
            continue;
        }
        if (tok[i].len + 1 > cap) cap = (size_t)tok[i].len + 64, buf = xrealloc(buf, cap);
        int k = unmap(tok[i].s, tok[i].len, buf, cp_to_byte);
        if (k < 0) {
            char s[SHOWN];
            shown(&tok[i], s);
            rc = tp_error("%s: tokenizer.ggml.tokens[%d] '%s' (NORMAL) is not in the byte-level alphabet; tpgen "
                          "supports byte-level BPE vocabularies only", g->path, i, s);
        } else if (tok_set(t, i, buf, k, 1)) {
            rc = tp_error_context("%s: tokenizer.ggml.tokens[%d]", g->path, i);
        }
    }
    if (!rc) tok_set_added(t, added, n_added);
    free(buf);
    free(added);
    return rc;
}

/* "A B" (split at the first space after the first byte, as llama.cpp does),
 * both parts and their concatenation vocabulary tokens; rank = index. */
static int read_merges(tokenizer *t, const gguf_file *g, const gguf_str *m, uint64_t n, const int16_t *cp_to_byte) {
    char *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    for (uint64_t i = 0; i < n && !rc; i++) {
        const char *sp = m[i].len > 1 ? memchr(m[i].s + 1, ' ', (size_t)m[i].len - 1) : NULL;
        char s[SHOWN];
        if (!sp) {
            shown(&m[i], s);
            rc = tp_error("%s: tokenizer.ggml.merges[%llu] '%s' is not two tokens separated by a space", g->path,
                          (unsigned long long)i, s);
            break;
        }
        uint64_t la = (uint64_t)(sp - m[i].s), lb = m[i].len - la - 1;
        if (m[i].len + 1 > cap) cap = (size_t)m[i].len + 64, buf = xrealloc(buf, cap);
        int na = unmap(m[i].s, la, buf, cp_to_byte);
        int nb = na < 0 ? -1 : unmap(sp + 1, lb, buf + na, cp_to_byte);
        int ia = na <= 0 ? -1 : tok_vocab_find(t, buf, na);
        int ib = nb <= 0 ? -1 : tok_vocab_find(t, buf + na, nb);
        int im = ia < 0 || ib < 0 ? -1 : tok_vocab_find(t, buf, na + nb);
        if (ia < 0 || ib < 0 || im < 0)
            shown(&m[i], s), rc = tp_error("%s: tokenizer.ggml.merges[%llu] '%s' names a token that is not a NORMAL entry of "
                          "tokenizer.ggml.tokens (%s); the file is corrupt", g->path, (unsigned long long)i, s,
                          ia < 0 ? "its left part" : ib < 0 ? "its right part" : "the merged token");
        else
            tok_add_pair(t, ia, ib, (int)i, im);
    }
    free(buf);
    return rc;
}

/* A special token id key: absent is fine; present it must name a token. */
static int special_id(const tokenizer *t, const gguf_file *g, const char *key, int *id) {
    uint32_t v;
    int r = gguf_get_u32(g, key, &v);
    if (r < 0) return -1;
    if (r == 1) return 1;
    if (v >= (uint32_t)t->n_ids || t->tok_len[v] < 0)
        return tp_error("%s: %s = %u names no token (the vocabulary has ids 0..%d%s)", g->path, key, v, t->n_ids - 1,
                        v < (uint32_t)t->n_ids ? "; that id is UNUSED" : "");
    *id = (int)v;
    return 0;
}

tokenizer *tok_from_gguf(const gguf_file *g) {
    const char *model, *pre;
    int r = gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (r) {
        if (r == 1)
            tp_error("%s has no tokenizer (no tokenizer.ggml.model key): give the model's tokenizer folder "
                     "(tokenizer.json) instead", g->path);
        return NULL;
    }
    if (strcmp(model, "gpt2"))
        return tp_error("%s: tokenizer.ggml.model is '%s'; tpgen supports 'gpt2' (byte-level BPE: the Qwen3 and "
                        "Mistral Tekken tokenizers of FLUX.2) only", g->path, model), NULL;
    if ((r = gguf_get_str(g, "tokenizer.ggml.pre", &pre))) {
        if (r == 1) tp_error("%s: tokenizer.ggml.pre (the pre-tokenizer) is missing; tpgen knows 'qwen2', 'tekken' and 'pixtral'", g->path);
        return NULL;
    }
    const gguf_pretok *pt = NULL;
    for (size_t i = 0; i < sizeof k_pretoks / sizeof *k_pretoks; i++)
        if (!strcmp(k_pretoks[i].name, pre)) pt = &k_pretoks[i];
    if (!pt)
        return tp_error("%s: tokenizer.ggml.pre is '%s', a pre-tokenizer tpgen does not know (it knows 'qwen2' for "
                        "Qwen3 and 'tekken' / 'pixtral' for Mistral Small 3.x); give the model's tokenizer folder instead",
                        g->path, pre), NULL;
    const gguf_str *tok, *merges;
    uint64_t n_tok, n_types, n_merges;
    int64_t *type = NULL;
    if ((r = gguf_get_arr_str(g, "tokenizer.ggml.tokens", &tok, &n_tok))) {
        if (r == 1) tp_error("%s: tokenizer.ggml.tokens (the vocabulary) is missing", g->path);
        return NULL;
    }
    if ((r = gguf_get_arr_str(g, "tokenizer.ggml.merges", &merges, &n_merges))) {
        if (r == 1) tp_error("%s: tokenizer.ggml.merges is missing; a BPE vocabulary needs its merges", g->path);
        return NULL;
    }
    if (n_tok < 256 || n_tok > (1u << 26))
        return tp_error("%s: tokenizer.ggml.tokens has %llu entries; a byte-level BPE vocabulary has 256 to 2^26",
                        g->path, (unsigned long long)n_tok), NULL;
    if (n_merges >= (1u << 26))
        return tp_error("%s: tokenizer.ggml.merges has %llu entries (at most 2^26)", g->path,
                        (unsigned long long)n_merges), NULL;
    if ((r = gguf_get_arr_i64(g, "tokenizer.ggml.token_type", &type, &n_types))) {
        if (r == 1)
            tp_error("%s: tokenizer.ggml.token_type is missing; without it the special tokens cannot be told from "
                     "the vocabulary", g->path);
        return NULL;
    }
    tokenizer *t = NULL;
    if (n_types != n_tok) {
        tp_error("%s: tokenizer.ggml.token_type has %llu entries and tokenizer.ggml.tokens %llu; they must match",
                 g->path, (unsigned long long)n_types, (unsigned long long)n_tok);
        goto fail;
    }
    for (const char *const *k = (const char *const[]){"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", NULL}; *k; k++) {
        int b;
        if (gguf_get_bool(g, *k, &b) < 0) goto fail;
    }
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[0x144];
    byte_unicode_tables(byte_to_cp, cp_to_byte);
    t = tok_new(g->path);
    t->nfc = pt->nfc;
    t->ignore_merges = pt->ignore_merges;
    if (tok_set_pattern(t, pt->pattern, 0, g->path) || read_tokens(t, g, tok, type, (int)n_tok, cp_to_byte))
        goto fail;
    tok_reserve_pairs(t, (int)n_merges);
    if (read_merges(t, g, merges, n_merges, cp_to_byte)) goto fail;
    t->padding_side = pt->padding_side;
    t->truncation_side = TOKENIZER_PAD_RIGHT;
    if (tok_finish(t, NULL)) goto fail;
    static const char *const ids[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id",
                                      "tokenizer.ggml.padding_token_id"};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
        int id = -1;
        r = special_id(t, g, ids[i], &id);
        if (r < 0) goto fail;
        if (r == 0 && i == 4) t->pad_id = id; /* without the key: tok_finish's <pad> / <|endoftext|> */
    }
    free(type);
    return t;
fail:
    free(type);
    tokenizer_free(t);
    return NULL;
}

tokenizer *tokenizer_load_gguf(const char *gguf_path) {
    gguf_file *g;
    if (gguf_open(gguf_path, &g)) return NULL;
    tokenizer *t = tok_from_gguf(g);
    gguf_close(g);
    return t;
}
