/* Building a tokenizer from a Hugging Face tokenizer.json ("fast" format),
 * parsed by jansson (or scanned, tokenizer_scan.h). Only what the FLUX.2 text encoders use is accepted:
 * a BPE model over a ByteLevel alphabet, an optional NFC normaliser and a
 * Split(regex, Isolated) pre-tokenizer. Anything else is rejected with a
 * message rather than tokenised differently from the reference. */
#include "tokenizer_int.h"
#include "tokenizer_scan.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

/* GPT-2's pattern, used by a ByteLevel pre-tokenizer with use_regex = true */
static const char *k_gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Undo the byte-level mapping of a vocabulary key: each code point stands for
 * one byte. Returns the byte count, -1 for a code point outside the table. */
static int unmap_key(const char *s, char *out, const int16_t *cp_to_byte) {
    int n = 0;
    for (const uint8_t *p = (const uint8_t *)s; *p;) {
        uint32_t cp;
        if (p[0] < 0x80) cp = *p++;
        else if ((p[0] & 0xE0) == 0xC0 && p[1]) cp = (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F), p += 2;
        else return -1;  /* every mapped code point is below U+0800 */
        if (cp >= 0x144 || cp_to_byte[cp] < 0) return -1;
        out[n++] = (char)cp_to_byte[cp];
    }
    return n;
}

static int check_model(json_t *model, const char *path) {
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE"))
        return tp_error("%s: the tokenizer model is %s; tpgen supports byte-level BPE tokenizers only "
                        "(Qwen3 for FLUX.2-klein, Mistral Tekken for FLUX.2-dev)", path, type);
    if (!json_is_object(json_object_get(model, "vocab")) || !json_is_array(json_object_get(model, "merges")))
        return tp_error("%s: model.vocab (object) or model.merges (array) is missing", path);
    const char *cont = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *eow = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((cont && *cont) || (eow && *eow))
        return tp_error("%s: BPE with a continuing_subword_prefix or end_of_word_suffix is not supported", path);
    return 0;
}

static int read_normalizer(tokenizer *t, json_t *norm, const char *path) {
    if (!norm || json_is_null(norm)) return 0;
    const char *type = json_string_value(json_object_get(norm, "type"));
    if (type && !strcmp(type, "NFC")) return t->nfc = 1, 0;
    if (type && !strcmp(type, "Sequence")) {
        size_t i;
        json_t *n;
        json_array_foreach(json_object_get(norm, "normalizers"), i, n)
            if (read_normalizer(t, n, path)) return -1;
        return 0;
    }
    return tp_error("%s: normalizer '%s' is not supported (only NFC or none)", path, type ? type : "?");
}

static int read_pretok_one(tokenizer *t, json_t *p, const char *path, int *byte_level, int *gpt2_regex) {
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && !strcmp(type, "ByteLevel")) {
        *byte_level = 1;
        t->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        json_t *ur = json_object_get(p, "use_regex");
        *gpt2_regex = !ur || json_is_true(ur);
        return 0;
    }
    if (type && !strcmp(type, "Split")) {
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (t->split_re || !beh || strcmp(beh, "Isolated") || json_is_true(json_object_get(p, "invert")))
            return tp_error("%s: only one Split pre-tokenizer with behavior Isolated (not inverted) is supported", path);
        json_t *pat = json_object_get(p, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        if (!re && !lit) return tp_error("%s: Split pre-tokenizer without a pattern", path);
        return tok_set_pattern(t, re ? re : lit, !re, path);
    }
    return tp_error("%s: pre-tokenizer '%s' is not supported (Split and ByteLevel are)", path, type ? type : "?");
}

static int read_pretokenizer(tokenizer *t, json_t *pre, const char *path) {
    int byte_level = 0, gpt2_regex = 0;
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (type && !strcmp(type, "Sequence")) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pre, "pretokenizers"), i, p)
            if (read_pretok_one(t, p, path, &byte_level, &gpt2_regex)) return -1;
    } else if (pre && !json_is_null(pre) && read_pretok_one(t, pre, path, &byte_level, &gpt2_regex)) {
        return -1;
    }
    if (!byte_level)
        return tp_error("%s: no ByteLevel pre-tokenizer; tpgen supports byte-level BPE tokenizers only", path);
    if (gpt2_regex) {
        if (t->split_re) return tp_error("%s: both a Split regex and ByteLevel use_regex are set", path);
        return tok_set_pattern(t, k_gpt2_pattern, 0, path);
    }
    return 0;
}

static int max_id_of(json_t *vocab, json_t *added, const char *path, int *max_id) {
    const char *key;
    json_t *v;
    *max_id = -1;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff)
            return tp_error("%s: vocabulary entry '%s' has no valid id", path, key);
        if (json_integer_value(v) > *max_id) *max_id = (int)json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > 0x7fffffff ||
            !json_is_string(json_object_get(v, "content")))
            return tp_error("%s: added_tokens[%zu] needs an integer id and a content string", path, i);
        if (json_integer_value(id) > *max_id) *max_id = (int)json_integer_value(id);
    }
    return 0;
}

static int read_vocab(tokenizer *t, json_t *vocab, const int16_t *cp_to_byte, const char *path) {
    const char *key;
    json_t *v;
    char *buf = NULL;
    size_t cap = 0;
    json_object_foreach(vocab, key, v) {
        /* an added token that is also listed in the vocabulary (the Tekken
         * conversion lists its specials there, unmapped) is matched only as
         * an added token */
        if (t->tok_len[json_integer_value(v)] >= 0) continue;
        size_t kl = strlen(key);
        if (kl + 1 > cap) cap = kl + 64, buf = xrealloc(buf, cap);
        int n = unmap_key(key, buf, cp_to_byte);
        if (n < 0) {
            free(buf);
            return tp_error("%s: vocabulary entry '%s' is not in the byte-level alphabet; tpgen supports "
                            "byte-level BPE tokenizers only", path, key);
        }
        if (tok_set(t, (int)json_integer_value(v), buf, n, 1)) {
            free(buf);
            return tp_error_context("%s", path);
        }
    }
    free(buf);
    return 0;
}

/* One merge: "A B" or ["A", "B"]; both parts and their concatenation must be
 * vocabulary entries. */
static int read_merge(tokenizer *t, json_t *m, int rank, const int16_t *cp_to_byte, const char *path) {
    const char *a, *b;
    char *tmp = NULL;
    if (json_is_string(m)) {
        tmp = xstrdup(json_string_value(m));
        char *sp = strchr(tmp, ' ');
        if (!sp) { free(tmp); return tp_error("%s: merges[%d] '%s' is not two tokens separated by a space", path, rank, json_string_value(m)); }
        *sp = 0;
        a = tmp, b = sp + 1;
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
        a = json_string_value(json_array_get(m, 0)), b = json_string_value(json_array_get(m, 1));
    } else {
        return tp_error("%s: merges[%d] is neither \"A B\" nor [\"A\", \"B\"]", path, rank);
    }
    char stack[256];
    size_t need = strlen(a) + strlen(b) + 1;
    char *buf = need <= sizeof stack ? stack : xmalloc(need);
    int na = unmap_key(a, buf, cp_to_byte);
    int nb = na < 0 ? -1 : unmap_key(b, buf + na, cp_to_byte);
    int ia = na < 0 ? -1 : tok_vocab_find(t, buf, na);
    int ib = nb < 0 ? -1 : tok_vocab_find(t, buf + na, nb);
    int im = nb < 0 ? -1 : tok_vocab_find(t, buf, na + nb);
    int rc = 0;
    if (ia < 0 || ib < 0 || im < 0)
        rc = tp_error("%s: merges[%d] ('%s' + '%s') uses a token that is not in the vocabulary", path, rank, a, b);
    else
        tok_add_pair(t, ia, ib, rank, im);
    if (buf != stack) free(buf);
    free(tmp);
    return rc;
}

static int read_added(tokenizer *t, json_t *added, const char *path) {
    size_t n = json_array_size(added), i;
    int32_t *ids = xmalloc((n ? n : 1) * sizeof *ids);
    json_t *v;
    json_array_foreach(added, i, v) {
        const char *s = json_string_value(json_object_get(v, "content"));
        ids[i] = (int32_t)json_integer_value(json_object_get(v, "id"));
        if (tok_set(t, ids[i], s, (int)strlen(s), 0)) {
            free(ids);
            return tp_error_context("%s: added token '%s'", path, s);
        }
    }
    tok_set_added(t, ids, (int)n);
    free(ids);
    return 0;
}

/* The same as max_id_of / read_vocab / read_merge, from the scanned arrays. */
static int fast_max_id(const hf_fast *f, json_t *vocab, json_t *added, const char *path, int *max_id) {
    if (max_id_of(vocab, added, path, max_id)) return -1; /* vocab was cut to {}: checks the added tokens */
    for (int i = 0; i < f->n_vocab; i++)
        if (f->vocab[i].id > *max_id) *max_id = f->vocab[i].id;
    return 0;
}

/* A key listed twice in model.vocab: jansson (JSON_REJECT_DUPLICATES)
 * refuses the file on the slow path, so the fast path must too. Byte-level
 * keys map to bytes one to one, so equal bytes mean equal keys. */
static int fast_duplicates(const hf_fast *f, const char *path) {
    uint32_t size = 64;
    while (size < (uint32_t)f->n_vocab * 2u + 16u) size <<= 1;
    int32_t *slot = xmalloc(size * sizeof *slot);
    memset(slot, 0xff, size * sizeof *slot);
    int rc = 0;
    for (int i = 0; i < f->n_vocab && !rc; i++) {
        const hf_fast_entry *e = &f->vocab[i];
        if (e->len < 0) continue;   /* refused by fast_vocab with its own message */
        uint32_t h = 2166136261u;
        for (int k = 0; k < e->len; k++) h = (h ^ (uint8_t)f->bytes[e->off + k]) * 16777619u;
        for (h &= size - 1;; h = (h + 1) & (size - 1)) {
            if (slot[h] < 0) { slot[h] = i; break; }
            const hf_fast_entry *o = &f->vocab[slot[h]];
            if (o->len == e->len && !memcmp(f->bytes + o->off, f->bytes + e->off, (size_t)e->len)) {
                rc = tp_error("%s: model.vocab lists the same key twice (ids %d and %d); the file is corrupt", path,
                              o->id, e->id);
                break;
            }
        }
    }
    free(slot);
    return rc;
}

static int fast_vocab(tokenizer *t, const hf_fast *f, const char *path) {
    if (fast_duplicates(f, path)) return -1;
    for (int i = 0; i < f->n_vocab; i++) {
        const hf_fast_entry *e = &f->vocab[i];
        if (t->tok_len[e->id] >= 0) continue; /* an added token, see read_vocab */
        if (e->len < 0)
            return tp_error("%s: vocabulary entry %d is not in the byte-level alphabet; tpgen supports "
                            "byte-level BPE tokenizers only", path, e->id);
        if (tok_set(t, e->id, f->bytes + e->off, e->len, 1)) return tp_error_context("%s", path);
    }
    return 0;
}

static int fast_merges(tokenizer *t, const hf_fast *f, const char *path) {
    for (int i = 0; i < f->n_merges; i++) {
        const hf_fast_merge *m = &f->merges[i];
        const char *a = f->bytes + m->off;
        int ia = tok_vocab_find(t, a, m->len_a), ib = tok_vocab_find(t, a + m->len_a, m->len - m->len_a);
        int im = tok_vocab_find(t, a, m->len);
        if (ia < 0 || ib < 0 || im < 0)
            return tp_error("%s: merges[%d] ('%.*s' + '%.*s', raw bytes) uses a token that is not in the vocabulary",
                            path, i, m->len_a, a, m->len - m->len_a, a + m->len_a);
        tok_add_pair(t, ia, ib, i, im);
    }
    return 0;
}

/* Ids index dense tables (tok_off, tok_len), so the largest id is bounded
 * by the number of entries that give ids: one id of 2e9 in a tiny file
 * must not allocate 16 GB. Real vocabularies are dense (Qwen3: 151643
 * entries, ids 0..151642, added tokens right after). */
static int check_max_id(int max_id, int64_t n_entries, const char *path) {
    int64_t limit = 2 * n_entries + 1024;
    if ((int64_t)max_id >= limit)
        return tp_error("%s: token id %d is far beyond the %lld vocabulary and added-token entries (ids must be "
                        "below %lld: the vocabulary is nearly dense); the file is corrupt", path, max_id,
                        (long long)n_entries, (long long)limit);
    return 0;
}

tokenizer *tok_from_hf_json(json_t *root, const char *path, const char *config_path, const hf_fast *fast) {
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (check_model(model, path)) return NULL;
    tokenizer *t = tok_new(path);
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[0x144];
    byte_unicode_tables(byte_to_cp, cp_to_byte);
    char *pad = NULL;
    int max_id;
    if (read_normalizer(t, json_object_get(root, "normalizer"), path) ||
        read_pretokenizer(t, json_object_get(root, "pre_tokenizer"), path) ||
        (fast ? fast_max_id(fast, vocab, added, path, &max_id) : max_id_of(vocab, added, path, &max_id)) ||
        check_max_id(max_id, (int64_t)(fast ? fast->n_vocab : (int)json_object_size(vocab)) +
                                 (int64_t)json_array_size(added), path))
        goto fail;
    tok_reserve(t, max_id + 1, fast ? fast->n_vocab : (int)json_object_size(vocab));
    tok_reserve_pairs(t, fast ? fast->n_merges : (int)json_array_size(merges));
    if (read_added(t, added, path)) goto fail;
    if (fast) {
        if (fast_vocab(t, fast, path) || fast_merges(t, fast, path)) goto fail;
    } else {
        if (read_vocab(t, vocab, cp_to_byte, path)) goto fail;
        size_t i;
        json_t *m;
        json_array_foreach(merges, i, m)
            if (read_merge(t, m, (int)i, cp_to_byte, path)) goto fail;
    }
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    if (tok_read_config(t, config_path, &pad, TOKENIZER_PAD_RIGHT) || tok_finish(t, pad)) goto fail;
    free(pad);
    return t;
fail:
    free(pad);
    tokenizer_free(t);
    return NULL;
}
