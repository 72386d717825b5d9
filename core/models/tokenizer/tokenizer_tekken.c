/* Loading a mistral-common tekken.json (docs/spec/flux2-text-vae.md §5.3), the fallback for a
 * FLUX.2-dev tokenizer folder without tokenizer.json. Tekken is tiktoken:
 * ids 0..S-1 are special tokens (S = default_num_special_tokens), vocabulary
 * rank r has id S + r, and BPE merges the adjacent pair whose concatenation
 * has the lowest rank. We turn that into the same (left, right) -> (rank,
 * merged) table the tokenizer.json path builds, so one BPE engine serves
 * both files and the two forms give the same ids. */
#include "tokenizer_int.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

/* Older tekken files carry no special_tokens list; these are mistral-common's
 * defaults for the first ids (the rest are <SPECIAL_i>). */
static const char *const k_default_specials[] = {
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
};

static int b64_value(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with optional '=' padding; returns the byte count or -1. */
static int b64_decode(const char *s, char *out) {
    int n = 0, bits = 0;
    uint32_t acc = 0;
    for (; *s && *s != '='; s++) {
        int v = b64_value((uint8_t)*s);
        if (v < 0) return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (char)(acc >> bits & 0xff);
        }
    }
    return n;
}

static int read_config(json_t *cfg, const char *path, int *n_special, int *vocab_size, const char **pattern) {
    json_t *ns = json_object_get(cfg, "default_num_special_tokens");
    json_t *vs = json_object_get(cfg, "default_vocab_size");
    *pattern = json_string_value(json_object_get(cfg, "pattern"));
    if (!*pattern) return tp_error("%s: config.pattern (the pre-tokenizer regex) is missing", path);
    /* range-checked as int64 before the int casts (2^32 + 5 must not become 5) */
    json_int_t nsv = json_is_integer(ns) ? json_integer_value(ns) : 1000;
    json_int_t vsv = json_is_integer(vs) ? json_integer_value(vs) : -1;
    if (nsv < 1 || nsv > 1000000)
        return tp_error("%s: config.default_num_special_tokens %lld is not valid (1 to 1000000)", path,
                        (long long)nsv);
    if (vsv > (1 << 30))
        return tp_error("%s: config.default_vocab_size %lld is out of range (at most 2^30)", path, (long long)vsv);
    *n_special = (int)nsv;
    *vocab_size = vsv < 0 ? -1 : (int)vsv;
    return 0;
}

static int read_vocab(tokenizer *t, json_t *vocab, int n_special, int n_inner, const char *path) {
    char buf[1024];
    for (int r = 0; r < n_inner; r++) {
        json_t *e = json_array_get(vocab, (size_t)r);
        json_t *rank = json_object_get(e, "rank");
        const char *b64 = json_string_value(json_object_get(e, "token_bytes"));
        if (!json_is_integer(rank) || json_integer_value(rank) != r || !b64 || strlen(b64) > 1300)
            return tp_error("%s: vocab[%d] needs rank %d and token_bytes (base64)", path, r, r);
        int n = b64_decode(b64, buf);
        if (n <= 0) return tp_error("%s: vocab[%d].token_bytes is not valid base64", path, r);
        if (tok_set(t, n_special + r, buf, n, 1)) return tp_error_context("%s: vocab[%d]", path, r);
    }
    return 0;
}

/* Every way to cut a token into two vocabulary tokens is a merge whose rank
 * is the token's own rank: tiktoken's "lowest rank of the concatenation".
 * With add == 0 only counts them (to size the table). */
static int derive_merges(tokenizer *t, int n_special, int n_inner, int add) {
    int count = 0;
    for (int r = 0; r < n_inner; r++) {
        int id = n_special + r, n = t->tok_len[id];
        const char *s = t->arena + t->tok_off[id];
        for (int k = 1; k < n; k++) {
            int l = tok_vocab_find(t, s, k), rr = l < 0 ? -1 : tok_vocab_find(t, s + k, n - k);
            if (rr < 0) continue;
            count++;
            if (add) tok_add_pair(t, l, rr, r, id);
        }
    }
    return count;
}

static int read_specials(tokenizer *t, json_t *specials, int n_special, const char *path) {
    int32_t *ids = xmalloc((size_t)n_special * sizeof *ids);
    int rc = 0;
    size_t i;
    json_t *e;
    json_array_foreach(specials, i, e) {
        json_t *rank = json_object_get(e, "rank");
        const char *s = json_string_value(json_object_get(e, "token_str"));
        if (!json_is_integer(rank) || json_integer_value(rank) < 0 || json_integer_value(rank) >= n_special || !s) {
            rc = tp_error("%s: special_tokens[%zu] needs a rank below %d and a token_str", path, i, n_special);
            goto done;
        }
        if (tok_set(t, (int)json_integer_value(rank), s, (int)strlen(s), 0)) {
            rc = tp_error_context("%s: special_tokens[%zu]", path, i);
            goto done;
        }
    }
    for (int id = 0; id < n_special; id++) {
        if (t->tok_len[id] < 0) {
            int nd = (int)(sizeof k_default_specials / sizeof *k_default_specials);
            char name[32];
            if (id < nd) snprintf(name, sizeof name, "%s", k_default_specials[id]);
            else snprintf(name, sizeof name, "<SPECIAL_%d>", id);
            if (tok_set(t, id, name, (int)strlen(name), 0)) { rc = -1; goto done; }
        }
        ids[id] = id;
    }
    tok_set_added(t, ids, n_special);
done:
    free(ids);
    return rc;
}

tokenizer *tok_from_tekken_json(json_t *root, const char *path, const char *config_path) {
    json_t *vocab = json_object_get(root, "vocab");
    int n_special = 0, vocab_size = 0;
    const char *pattern;
    if (read_config(json_object_get(root, "config"), path, &n_special, &vocab_size, &pattern)) return NULL;
    /* only the first default_vocab_size - num_special ranks are in use */
    int n_inner = (int)json_array_size(vocab);
    if (vocab_size > 0 && vocab_size - n_special < n_inner) n_inner = vocab_size - n_special;
    if (n_inner < 256) {
        tp_error("%s: the vocabulary has %d entries; a Tekken vocabulary starts with the 256 single bytes", path, n_inner);
        return NULL;
    }
    tokenizer *t = tok_new(path);
    char *pad = NULL;
    tok_reserve(t, n_special + n_inner, n_inner);
    if (tok_set_pattern(t, pattern, 0, path) ||
        read_vocab(t, vocab, n_special, n_inner, path) ||
        read_specials(t, json_object_get(root, "special_tokens"), n_special, path))
        goto fail;
    tok_reserve_pairs(t, derive_merges(t, n_special, n_inner, 0));
    derive_merges(t, n_special, n_inner, 1);
    t->ignore_merges = 1; /* tiktoken emits a piece that is a whole token directly */
    /* transformers loads a lone tekken.json as MistralCommonTokenizer, which pads left */
    if (tok_read_config(t, config_path, &pad, TOKENIZER_PAD_LEFT) || tok_finish(t, pad)) goto fail;
    free(pad);
    return t;
fail:
    free(pad);
    tokenizer_free(t);
    return NULL;
}
