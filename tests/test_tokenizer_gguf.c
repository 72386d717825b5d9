/* The tokenizer from a GGUF file's tokenizer.ggml.* metadata
 * (core/models/tokenizer/tokenizer_gguf.c) against the tokenizer.json / tekken.json
 * loaders it must equal: the files of tests/data/tok-gguf are what
 * llama.cpp's converter writes for those tokenizers (made with gguf-py by
 * tests/tools/tok_gguf_testdata.py). Checked: the tables entry by entry, the
 * golden ids of every golden prompt (raw, chat text, klein layout, the
 * padded e2e input ids), a batch of hard and random strings, special ids,
 * pad id, padding side, and bad metadata refused naming the file and key. */
#include "test.h"
#include "kernels/err.h"
#include "core/formats/gguf.h"
#include "core/models/llm/prompt.h"
#include "core/models/tokenizer/tokenizer.h"
#include "core/models/tokenizer/tokenizer_int.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define QWEN_DIR "tests/data/qwen3-tokenizer"
#define TEKKEN_HF "tests/data/tekken-mini/hf"
#define TEKKEN_TJ "tests/data/tekken-mini/tekken"
#define GGUF_DIR "tests/data/tok-gguf"

/* qwen3.gguf.xz unpacked once into the test folder (xz is a build
 * dependency: tests/unpack-golden.sh uses it too) */
static const char *qwen_gguf_path(void) {
    static char *path;
    if (!path) {
        path = xasprintf("%s/qwen3.gguf", test_tmp_dir());
        char *cmd = xasprintf("xz -dc " GGUF_DIR "/qwen3.gguf.xz > '%s'", path);
        if (system(cmd) != 0) fprintf(stderr, "could not unpack " GGUF_DIR "/qwen3.gguf.xz with xz\n");
        free(cmd);
    }
    return path;
}

static tokenizer *qwen_json(void) {
    static tokenizer *t;
    if (!t) t = tokenizer_load(QWEN_DIR);
    return t;
}

static tokenizer *qwen_gguf(void) {
    static tokenizer *t;
    if (!t) t = tokenizer_load_gguf(qwen_gguf_path());
    return t;
}

/* Both tokenizers give the same ids for s (and both succeed). */
static int same_ids(const tokenizer *a, const tokenizer *b, const char *s, size_t n, char *why, size_t wl) {
    int32_t *ia = NULL, *ib = NULL;
    int na = 0, nb = 0;
    int ra = tokenizer_encode(a, s, n, &ia, &na), rb = tokenizer_encode(b, s, n, &ib, &nb);
    int ok = ra == 0 && rb == 0 && na == nb && (na == 0 || !memcmp(ia, ib, (size_t)na * sizeof *ia));
    if (!ok) {
        int k = 0;
        while (k < na && k < nb && ia[k] == ib[k]) k++;
        snprintf(why, wl, "rc %d/%d, %d vs %d ids, first difference at %d (%d vs %d)", ra, rb, na, nb, k,
                 k < na ? ia[k] : -1, k < nb ? ib[k] : -1);
    }
    free(ia), free(ib);
    return ok;
}

/* The two tokenizers hold the same tables: every id's bytes, the vocabulary
 * lookups, the added tokens, the merge table slot by slot (same hash and the
 * same insertion order when the merges come in the same order), the
 * normaliser, the split regex and the properties. */
static void compare_tables(const tokenizer *g, const tokenizer *j, int same_merge_order, const char *what) {
    CHECK(g->n_ids == j->n_ids && g->n_vocab == j->n_vocab && g->n_added == j->n_added,
          "%s: ids %d/%d, vocabulary %d/%d, added %d/%d (gguf/json)", what, g->n_ids, j->n_ids, g->n_vocab, j->n_vocab,
          g->n_added, j->n_added);
    int bad = 0;
    for (int id = 0; id < g->n_ids && id < j->n_ids; id++) {
        int lg, lj;
        const char *sg = tokenizer_token_bytes(g, id, &lg), *sj = tokenizer_token_bytes(j, id, &lj);
        if (!sg != !sj || (sg && (lg != lj || memcmp(sg, sj, (size_t)lg)))) bad++;
        else if (sg && tok_vocab_find(g, sg, lg) != tok_vocab_find(j, sj, lj)) bad++;
    }
    CHECK(!bad, "%s: %d ids differ in bytes or vocabulary membership", what, bad);
    int added_same = g->n_added == j->n_added;
    for (int i = 0; added_same && i < g->n_added; i++) added_same = g->added_ids[i] == j->added_ids[i];
    CHECK(added_same, "%s: the added tokens differ", what);
    CHECK(!memcmp(g->added_start, j->added_start, sizeof g->added_start), "%s: added-token buckets differ", what);
    if (same_merge_order) {
        int bp = g->pair_mask != j->pair_mask || g->n_pairs != j->n_pairs;
        for (uint32_t h = 0; !bp && h <= g->pair_mask; h++)
            bp = g->pair_keys[h] != j->pair_keys[h] ||
                 (g->pair_keys[h] != UINT64_MAX && (g->pair_rank[h] != j->pair_rank[h] || g->pair_merged[h] != j->pair_merged[h]));
        CHECK(!bp, "%s: merge tables differ (%d / %d merges)", what, g->n_pairs, j->n_pairs);
    }
    CHECK(g->nfc == j->nfc && g->ignore_merges == j->ignore_merges && g->add_prefix_space == j->add_prefix_space,
          "%s: nfc %d/%d ignore_merges %d/%d", what, g->nfc, j->nfc, g->ignore_merges, j->ignore_merges);
    CHECK(!memcmp(g->byte_id, j->byte_id, sizeof g->byte_id), "%s: byte ids differ", what);
    CHECK(tokenizer_get_family(g) == tokenizer_get_family(j), "%s: family differs", what);
    CHECK(tokenizer_pad_id(g) == tokenizer_pad_id(j), "%s: pad id %d, json %d", what, tokenizer_pad_id(g), tokenizer_pad_id(j));
    CHECK(tokenizer_padding_side(g) == tokenizer_padding_side(j), "%s: padding side differs", what);
    CHECK(tokenizer_truncation_side(g) == tokenizer_truncation_side(j), "%s: truncation side differs", what);
}

/* The split regex of a tokenizer.json (Sequence[Split, ByteLevel]) or a
 * tekken.json (config.pattern). */
static char *file_pattern(const char *path) {
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, NULL); /* tekken.json's token_str of byte 0 is "\u0000" */
    const char *p = json_string_value(json_object_get(json_object_get(root, "config"), "pattern"));
    if (!p) {
        json_t *seq = json_object_get(json_object_get(root, "pre_tokenizer"), "pretokenizers");
        p = json_string_value(json_object_get(json_object_get(json_array_get(seq, 0), "pattern"), "Regex"));
    }
    char *s = p ? xstrdup(p) : NULL;
    json_decref(root);
    return s;
}

TEST(tokenizer_gguf_pretokenizer_patterns) {
    static const struct { const char *pre, *file; } k[] = {
        {"qwen2", QWEN_DIR "/tokenizer.json"},
        {"tekken", TEKKEN_HF "/tokenizer.json"},
        {"tekken", TEKKEN_TJ "/tekken.json"},
        {"pixtral", TEKKEN_HF "/tokenizer.json"},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char *want = file_pattern(k[i].file);
        const char *got = tok_gguf_pattern(k[i].pre);
        CHECK(want && got && !strcmp(want, got), "pre '%s': regex differs from %s's", k[i].pre, k[i].file);
        free(want);
    }
    CHECK(!tok_gguf_pattern("llama-bpe") && !tok_gguf_pattern(""), "unknown names have no pattern");
}

TEST(tokenizer_gguf_qwen3_tables) {
    tokenizer *g = qwen_gguf(), *j = qwen_json();
    REQUIRE(g && j, "load: %s", tp_error_msg());
    /* the GGUF lists 151936 ids (Qwen3-4B's vocab_size); the 267 UNUSED
     * fillers past the last token are no ids of the tokenizer */
    CHECK(tokenizer_vocab_size(g) == 151669, "vocabulary size %d", tokenizer_vocab_size(g));
    compare_tables(g, j, 1, "qwen3");
    CHECK(!strcmp(tokenizer_source(g), qwen_gguf_path()), "source %s", tokenizer_source(g));
    CHECK(tokenizer_pad_id(g) == 151643 && tokenizer_padding_side(g) == TOKENIZER_PAD_RIGHT, "pad %d",
          tokenizer_pad_id(g));
    CHECK(tokenizer_token_id(g, "<|im_start|>") == 151644 && tokenizer_token_id(g, "</think>") == 151668 &&
              tokenizer_token_id(g, "[PAD151700]") == -1,
          "special token ids");
}

/* ids of a JSON array equal to ids[n] */
static int ids_equal(json_t *want, const int32_t *ids, int n) {
    if ((int)json_array_size(want) != n) return 0;
    for (int i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, (size_t)i)) != ids[i]) return 0;
    return 1;
}

static void golden_cases(const char *rel) {
    tokenizer *g = qwen_gguf(), *j = qwen_json();
    REQUIRE(g && j, "load: %s", tp_error_msg());
    char *path = xasprintf("%s/%s", test_golden_dir(), rel);
    json_t *root = json_load_file(path, 0, NULL);
    free(path);
    REQUIRE(root, "cannot read golden %s", rel);
    json_t *cases = json_object_get(root, "cases"), *c;
    size_t i;
    CHECK(json_array_size(cases) >= 3, "too few cases in %s", rel);
    json_array_foreach(cases, i, c) {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        const char *chat = json_string_value(json_object_get(c, "chat_text"));
        int32_t *ids;
        int n;
        char why[160];
        REQUIRE(tokenizer_encode(g, prompt, strlen(prompt), &ids, &n) == 0, "%s", tp_error_msg());
        CHECK(ids_equal(json_object_get(c, "ids"), ids, n), "%s case %zu raw: %d ids differ from the golden ones", rel, i, n);
        free(ids);
        REQUIRE(tokenizer_encode(g, chat, strlen(chat), &ids, &n) == 0, "%s", tp_error_msg());
        CHECK(ids_equal(json_object_get(c, "chat_ids"), ids, n), "%s case %zu chat text differs", rel, i);
        free(ids);
        REQUIRE(prompt_encode(g, PROMPT_KLEIN, prompt, &ids, &n) == 0, "%s", tp_error_msg());
        CHECK(ids_equal(json_object_get(c, "chat_ids"), ids, n), "%s case %zu klein layout differs", rel, i);
        free(ids);
        CHECK(same_ids(g, j, prompt, strlen(prompt), why, sizeof why), "%s case %zu: gguf vs json: %s", rel, i, why);
    }
    json_decref(root);
}

TEST(tokenizer_gguf_qwen3_golden) { golden_cases("qwen3-tokenizer/tokens.json"); }
TEST(tokenizer_gguf_klein_tiny_golden) { golden_cases("klein-tiny/tokens.json"); }

/* an I64 tensor of a safetensors file, header read with jansson */
static int read_i64(const char *path, const char *name, int64_t *out, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint64_t hl;
    int ok = fread(&hl, 8, 1, f) == 1 && hl < (1u << 24);
    char *hdr = ok ? xmalloc(hl + 1) : NULL;
    ok = ok && fread(hdr, 1, hl, f) == hl;
    json_t *root = ok ? (hdr[hl] = 0, json_loads(hdr, 0, NULL)) : NULL;
    json_t *e = json_object_get(root, name), *offs = json_object_get(e, "data_offsets");
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    ok = e && dt && !strcmp(dt, "I64") &&
         json_integer_value(json_array_get(offs, 1)) - json_integer_value(json_array_get(offs, 0)) == (json_int_t)(n * 8);
    ok = ok && fseek(f, (long)(8 + hl + (uint64_t)json_integer_value(json_array_get(offs, 0))), SEEK_SET) == 0 &&
         fread(out, 8, n, f) == n;
    json_decref(root);
    free(hdr);
    fclose(f);
    return ok ? 0 : -1;
}

/* the end-to-end klein golden's padded input ids (max_sequence_length 32) */
TEST(tokenizer_gguf_klein_e2e_padded_ids) {
    tokenizer *g = qwen_gguf();
    REQUIRE(g, "load: %s", tp_error_msg());
    char *meta = xasprintf("%s/klein-tiny/e2e.json", test_golden_dir());
    char *st = xasprintf("%s/klein-tiny/e2e.safetensors", test_golden_dir());
    json_t *root = json_load_file(meta, 0, NULL);
    if (!root) {
        CHECK(0, "read %s", meta);
        goto done;
    }
    CHECK(json_integer_value(json_object_get(root, "max_sequence_length")) == 32, "max_sequence_length");
    CHECK(tokenizer_pad_id(g) == json_integer_value(json_object_get(root, "pad_id")), "pad id %d", tokenizer_pad_id(g));
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        int64_t want_ids[32], want_mask[32];
        int32_t ids[32], mask[32];
        char key[64];
        snprintf(key, sizeof key, "case%zu.input_ids", i);
        REQUIRE(read_i64(st, key, want_ids, 32) == 0, "read %s", key);
        snprintf(key, sizeof key, "case%zu.attention_mask", i);
        REQUIRE(read_i64(st, key, want_mask, 32) == 0, "read %s", key);
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        REQUIRE(prompt_encode_ids(g, prompt_format_for(g), prompt, 32, ids, mask, NULL) == 0, "%s", tp_error_msg());
        for (int k = 0; k < 32; k++)
            CHECK(ids[k] == want_ids[k] && mask[k] == want_mask[k], "case %zu position %d: (%d, %d), expected (%lld, %lld)",
                  i, k, ids[k], mask[k], (long long)want_ids[k], (long long)want_mask[k]);
    }
done:
    json_decref(root);
    free(meta), free(st);
}

/* Hard strings, then random mixtures of the same pieces, through both. */
static const char *const k_hard[] = {
    "", " ", "  ", "\t", "\n", "\r\n", "\n\n\n", "   \n\t  x", "trailing   ", "   leading",
    "0", "12", "123456789", "3.14159", "1,000,000", "v2.0.1-rc3", "2024-12-02T01:55Z",
    "caf\xc3\xa9", "cafe\xcc\x81", "\xe2\x84\xab", "\xef\xac\x81", "\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97",
    "\xf0\x9f\x90\xb1\xf0\x9f\x90\xb1", "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb",
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82", "\xd8\xa7\xd9\x84\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a\xd8\xa9",
    "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\x82\xe0\xa4\xa6\xe0\xa5\x80", "\xc2\xa0\xe3\x80\x80\xe2\x80\x8b",
    "I'm you're we'LL they'D it's 'S", "don't", "http://example.com/a?b=c&d=e#f", "a_b-c.d/e\\f",
    "<|im_start|>user\nhi<|im_end|>", "<|im_start|><|im_start|>", "<|im_start", "<|endoftext|>x<think>y</think>",
    "[INST]x[/INST]", "<s>", "</s>", "<pad>", "[IMG]", "((()))[[]]{{}}", "!!!???...", "$$$ %%% ^^^",
    "helloWorld ABc ABC 2024 https://x", "camelCaseWordsHere XMLHttpRequest",
};

static void hard_and_random(const tokenizer *g, const tokenizer *j, const char *what, const char *const *specials,
                            int n_specials) {
    char why[160];
    for (size_t i = 0; i < sizeof k_hard / sizeof *k_hard; i++)
        CHECK(same_ids(g, j, k_hard[i], strlen(k_hard[i]), why, sizeof why), "%s: hard string %zu: %s", what, i, why);
    static const char *const parts[] = {"a", "Z", "hello", "World", " ", "  ", "\t", "\n", "\r\n", "7", "42", "'s", "'LL",
                                        "!", "...", "/", "://", "_", "\xc3\xa9", "e\xcc\x81", "\xd0\x96", "\xe4\xb8\xad",
                                        "\xf0\x9f\x90\xb1", "\xe2\x80\x8d", "\xc2\xa0", "\xe3\x80\x80", "<", "[", "|>",
                                        "ABc", "lll", "hellhe"};
    char text[4096];
    srand(test_seed());
    for (int c = 0; c < 300; c++) {
        int n = 0, k = 1 + rand() % 60;
        for (int p = 0; p < k; p++) {
            const char *s = rand() % 10 == 0 ? specials[rand() % n_specials] : parts[rand() % (int)(sizeof parts / sizeof *parts)];
            memcpy(text + n, s, strlen(s));
            n += (int)strlen(s);
        }
        CHECK(same_ids(g, j, text, (size_t)n, why, sizeof why), "%s: random text %d ('%.*s'): %s", what, c, n, text, why);
        if (test_failed()) return;
    }
}

TEST(tokenizer_gguf_qwen3_hard_strings) {
    static const char *const sp[] = {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<tool_call>"};
    REQUIRE(qwen_gguf() && qwen_json(), "load: %s", tp_error_msg());
    hard_and_random(qwen_gguf(), qwen_json(), "qwen3", sp, 6);
    /* a long run of one piece: the BPE heap on thousands of symbols */
    char *big = xmalloc(20001);
    for (int i = 0; i < 20000; i++) big[i] = "abcdefghij"[i * 7 % 10];
    char why[160];
    CHECK(same_ids(qwen_gguf(), qwen_json(), big, 20000, why, sizeof why), "long piece: %s", why);
    free(big);
}

/* ---- Tekken (tests/data/tekken-mini): both GGUF paths of the converter ---- */

#define B(c) (1000 + (uint8_t)(c))

TEST(tokenizer_gguf_tekken) {
    static const char *const sp[] = {"<s>", "[INST]", "[/INST]", "<pad>", "[IMG]", "<SPECIAL_500>", "[SYSTEM_PROMPT]"};
    tokenizer *hf = tokenizer_load(TEKKEN_HF), *tj = tokenizer_load(TEKKEN_TJ);
    tokenizer *ghf = tokenizer_load_gguf(GGUF_DIR "/tekken-hf.gguf");
    tokenizer *gms = tokenizer_load_gguf(GGUF_DIR "/tekken-mistral.gguf");
    if (!hf || !tj || !ghf || !gms) {
        CHECK(0, "load: %s", tp_error_msg());
        goto done;
    }
    /* the HF path lists the merges of tokenizer.json in its order; the
     * mistral-format path derives them in the same order */
    compare_tables(ghf, hf, 1, "tekken-hf.gguf vs tokenizer.json");
    compare_tables(gms, hf, 1, "tekken-mistral.gguf vs tokenizer.json");
    hard_and_random(ghf, hf, "tekken-hf.gguf", sp, 7);
    hard_and_random(gms, tj, "tekken-mistral.gguf vs tekken.json", sp, 7);
    const tokenizer *both[2] = {ghf, gms};
    for (int k = 0; k < 2; k++) {
        const tokenizer *t = both[k];
        CHECK(tokenizer_get_family(t) == TOKENIZER_MISTRAL && prompt_format_for(t) == PROMPT_DEV, "family");
        CHECK(tokenizer_pad_id(t) == 11 && tokenizer_padding_side(t) == TOKENIZER_PAD_LEFT, "pad %d side %d",
              tokenizer_pad_id(t), (int)tokenizer_padding_side(t));
        /* a few of the hand-derived ids of tests/test_tokenizer.c */
        static const struct { const char *s; int n; int32_t ids[8]; } c[] = {
            {"helloWorld", 2, {1259, 1263}},
            {"https://x", 7, {B('h'), B('t'), B('t'), B('p'), B('s'), 1268, B('x')}},
            {"[INST]hello[/INST]", 3, {3, 1259, 4}},
            {"lll", 2, {1257, B('l')}},
        };
        for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
            int32_t *ids;
            int n;
            REQUIRE(tokenizer_encode(t, c[i].s, strlen(c[i].s), &ids, &n) == 0, "%s", tp_error_msg());
            CHECK(n == c[i].n && !memcmp(ids, c[i].ids, (size_t)n * sizeof *ids), "'%s': %d ids", c[i].s, n);
            free(ids);
        }
        /* the dev layout, left-padded, equal to the tokenizer.json's */
        int32_t a[300], am[300], b[300], bm[300];
        int na, nb;
        REQUIRE(prompt_encode_ids(t, PROMPT_DEV, "helloWorld [IMG]ABc", 260, a, am, &na) == 0, "%s", tp_error_msg());
        REQUIRE(prompt_encode_ids(hf, PROMPT_DEV, "helloWorld [IMG]ABc", 260, b, bm, &nb) == 0, "%s", tp_error_msg());
        CHECK(na == nb && !memcmp(a, b, sizeof a[0] * 260) && !memcmp(am, bm, sizeof am[0] * 260) && a[0] == 11 &&
                  a[260 - nb] == 1,
              "dev layout differs (%d / %d real)", na, nb);
    }
done:
    tokenizer_free(hf), tokenizer_free(tj), tokenizer_free(ghf), tokenizer_free(gms);
}

/* ---- bad metadata: tekken-hf.gguf with one key changed, written by gguf_write ---- */

typedef struct {
    gguf_file *src;
    gguf_kv kv[64];
    int n;
    gguf_str strs[2048];   /* a patched copy of a string array */
    int32_t i32[2048];
} variant;

static gguf_kv *find(variant *v, const char *key) {
    for (int i = 0; i < v->n; i++)
        if (!strcmp(v->kv[i].key, key)) return &v->kv[i];
    return NULL;
}

static void drop(variant *v, const char *key) {
    gguf_kv *k = find(v, key);
    if (k) memmove(k, k + 1, (size_t)(v->n - (k - v->kv) - 1) * sizeof *k), v->n--;
}

static void set_str(variant *v, const char *key, const char *s) {
    gguf_kv *k = find(v, key);
    if (!k) k = &v->kv[v->n++], k->key = (char *)key;
    memset(&k->v, 0, sizeof k->v);
    k->v.type = GGUF_STRING;
    k->v.str = (gguf_str){strlen(s), (char *)s};
}

static void set_u32(variant *v, const char *key, uint32_t x) {
    gguf_kv *k = find(v, key);
    if (!k) k = &v->kv[v->n++], k->key = (char *)key;
    memset(&k->v, 0, sizeof k->v);
    k->v.type = GGUF_U32;
    k->v.num.u = x;
}

/* element i of the string array `key` becomes s */
static void patch_str(variant *v, const char *key, uint64_t i, const char *s) {
    gguf_kv *k = find(v, key);
    memcpy(v->strs, k->v.data, (size_t)k->v.n * sizeof *v->strs);
    v->strs[i] = (gguf_str){strlen(s), (char *)s};
    k->v.data = v->strs;
}

/* the token_type array (int32) with element i set to x, or cut to n entries */
static void patch_type(variant *v, int64_t i, int32_t x, uint64_t n) {
    gguf_kv *k = find(v, "tokenizer.ggml.token_type");
    memcpy(v->i32, k->v.data, (size_t)k->v.n * 4);
    if (i >= 0) v->i32[i] = x;
    k->v.data = v->i32;
    if (n) k->v.n = n;
}

static void variant_start(variant *v) {
    memset(v, 0, sizeof *v);
    if (gguf_open(GGUF_DIR "/tekken-hf.gguf", &v->src)) return;
    v->n = v->src->n_kv;
    memcpy(v->kv, v->src->kv, (size_t)v->n * sizeof *v->kv);
}

/* write the variant, load it: must fail with a message holding the path and want */
static void variant_expect(variant *v, const char *name, const char *want) {
    char *path = xasprintf("%s/%s.gguf", test_tmp_dir(), name);
    if (gguf_write(path, v->kv, v->n, NULL, 0, NULL, NULL)) {
        CHECK(0, "%s: write: %s", name, tp_error_msg());
    } else {
        tokenizer *t = tokenizer_load_gguf(path);
        CHECK(!t, "%s: loaded", name);
        CHECK(strstr(tp_error_msg(), path) && strstr(tp_error_msg(), want), "%s: message '%s' lacks the path or '%s'", name,
              tp_error_msg(), want);
        tokenizer_free(t);
    }
    free(path);
    gguf_close(v->src);
}

TEST(tokenizer_gguf_rejects_bad_metadata) {
    variant *v = xmalloc(sizeof *v);
    variant_start(v);
    REQUIRE(v->src, "open: %s", tp_error_msg());
    /* the unchanged copy loads (so each failure below is the one change) */
    char *ok = xasprintf("%s/unchanged.gguf", test_tmp_dir());
    REQUIRE(gguf_write(ok, v->kv, v->n, NULL, 0, NULL, NULL) == 0, "%s", tp_error_msg());
    tokenizer *t = tokenizer_load_gguf(ok);
    CHECK(t, "unchanged copy: %s", tp_error_msg());
    tokenizer_free(t);
    free(ok);
    gguf_close(v->src);

    variant_start(v), set_str(v, "tokenizer.ggml.model", "llama"), variant_expect(v, "spm", "tokenizer.ggml.model is 'llama'");
    variant_start(v), drop(v, "tokenizer.ggml.model"), variant_expect(v, "nomodel", "no tokenizer");
    variant_start(v), set_str(v, "tokenizer.ggml.pre", "llama-bpe"), variant_expect(v, "llama-bpe", "'llama-bpe'");
    variant_start(v), drop(v, "tokenizer.ggml.pre"), variant_expect(v, "nopre", "tokenizer.ggml.pre");
    variant_start(v), set_u32(v, "tokenizer.ggml.pre", 3), variant_expect(v, "prenum", "tokenizer.ggml.pre");
    variant_start(v), drop(v, "tokenizer.ggml.tokens"), variant_expect(v, "notokens", "tokenizer.ggml.tokens");
    variant_start(v), drop(v, "tokenizer.ggml.merges"), variant_expect(v, "nomerges", "tokenizer.ggml.merges");
    variant_start(v), drop(v, "tokenizer.ggml.token_type"), variant_expect(v, "notypes", "tokenizer.ggml.token_type");
    variant_start(v), patch_type(v, -1, 0, 1000), variant_expect(v, "shorttypes", "tokenizer.ggml.token_type has 1000");
    variant_start(v), patch_type(v, 1065, 6, 0), variant_expect(v, "bytetype", "token_type[1065] is 6 (BYTE)");
    variant_start(v), patch_type(v, 7, 99, 0), variant_expect(v, "badtype", "token_type[7] is 99");
    /* a merge naming an unknown token, one without a space, one whose result is no token */
    variant_start(v), patch_str(v, "tokenizer.ggml.merges", 3, "zz q"), variant_expect(v, "mergeunknown", "merges[3] 'zz q'");
    variant_start(v), patch_str(v, "tokenizer.ggml.merges", 0, "he"), variant_expect(v, "mergenospace", "merges[0] 'he'");
    variant_start(v), patch_str(v, "tokenizer.ggml.merges", 1, "q q"), variant_expect(v, "mergeresult", "the merged token");
    /* duplicate tokens: a NORMAL one twice, a control token equal to another */
    variant_start(v), patch_str(v, "tokenizer.ggml.tokens", 1106, "i"), variant_expect(v, "dupnormal", "'i' twice (ids 1105 and 1106)");
    variant_start(v), patch_str(v, "tokenizer.ggml.tokens", 20, "<s>"), variant_expect(v, "dupcontrol", "ids 1 and 20");
    variant_start(v), patch_str(v, "tokenizer.ggml.tokens", 1001, " "), variant_expect(v, "notbytelevel", "tokens[1001] ' '");
    variant_start(v), patch_str(v, "tokenizer.ggml.tokens", 5, ""), variant_expect(v, "empty", "tokens[5] is empty");
    /* special ids out of range, of the wrong type, naming an UNUSED id */
    variant_start(v), set_u32(v, "tokenizer.ggml.padding_token_id", 5000), variant_expect(v, "padrange", "padding_token_id = 5000");
    variant_start(v), set_str(v, "tokenizer.ggml.bos_token_id", "1"), variant_expect(v, "bosstr", "bos_token_id' is a string");
    variant_start(v), set_u32(v, "tokenizer.ggml.eos_token_id", 1269), variant_expect(v, "eosrange", "eos_token_id = 1269");
    variant_start(v), patch_type(v, 11, 5, 0), variant_expect(v, "padunused", "that id is UNUSED");
    variant_start(v), set_u32(v, "tokenizer.ggml.add_bos_token", 1), variant_expect(v, "addbos", "add_bos_token");
    free(v);
    /* not a tokenizer: a GGUF without tokenizer keys, a file that is no GGUF, a missing file */
    t = tokenizer_load_gguf("tests/data/gguf/types.gguf");
    CHECK(!t && strstr(tp_error_msg(), "types.gguf has no tokenizer"), "types.gguf: %s", tp_error_msg());
    tokenizer_free(t);
    t = tokenizer_load_gguf(QWEN_DIR "/tokenizer_config.json");
    CHECK(!t && strstr(tp_error_msg(), "tokenizer_config.json"), "not a GGUF: %s", tp_error_msg());
    tokenizer_free(t);
    t = tokenizer_load_gguf("/nonexistent/te.gguf");
    CHECK(!t && strstr(tp_error_msg(), "/nonexistent/te.gguf"), "missing: %s", tp_error_msg());
    tokenizer_free(t);
}

/* the GGUF lists the UNUSED fillers; a file that cuts them off gives the same tokenizer */
TEST(tokenizer_gguf_cut_fillers_and_open_handle) {
    gguf_file *g;
    REQUIRE(gguf_open(qwen_gguf_path(), &g) == 0, "%s", tp_error_msg());
    gguf_kv *kv = xmalloc((size_t)g->n_kv * sizeof *kv);
    memcpy(kv, g->kv, (size_t)g->n_kv * sizeof *kv);
    for (int i = 0; i < g->n_kv; i++)
        if (!strcmp(kv[i].key, "tokenizer.ggml.tokens") || !strcmp(kv[i].key, "tokenizer.ggml.token_type")) kv[i].v.n = 151669;
    char *path = xasprintf("%s/qwen3-nofill.gguf", test_tmp_dir());
    REQUIRE(gguf_write(path, kv, g->n_kv, NULL, 0, NULL, NULL) == 0, "%s", tp_error_msg());
    tokenizer *t = tokenizer_load_gguf(path);
    REQUIRE(t && qwen_json(), "load: %s", tp_error_msg());
    compare_tables(t, qwen_json(), 1, "qwen3 without fillers");
    tokenizer_free(t);
    t = tok_from_gguf(g); /* from the open handle */
    CHECK(t && t->n_ids == 151669, "tok_from_gguf: %s", t ? "wrong size" : tp_error_msg());
    tokenizer_free(t);
    gguf_close(g);
    free(kv), free(path);
}

/* "pixtral" (the converter's name for pixtral-12b's Tekken vocabulary) is
 * Tekken's tokenizer: tekken-hf.gguf relabelled gives tokenizer.json's
 * tables and ids (the regex itself: tokenizer_gguf_pretokenizer_patterns) */
TEST(tokenizer_gguf_pixtral_is_tekken) {
    static const char *const sp[] = {"<s>", "[INST]", "[/INST]", "<pad>", "[IMG]", "<SPECIAL_500>", "[SYSTEM_PROMPT]"};
    variant *v = xmalloc(sizeof *v);
    variant_start(v);
    REQUIRE(v->src, "open: %s", tp_error_msg());
    set_str(v, "tokenizer.ggml.pre", "pixtral");
    char *path = xasprintf("%s/pixtral.gguf", test_tmp_dir());
    REQUIRE(gguf_write(path, v->kv, v->n, NULL, 0, NULL, NULL) == 0, "%s", tp_error_msg());
    gguf_close(v->src);
    free(v);
    tokenizer *g = tokenizer_load_gguf(path), *hf = tokenizer_load(TEKKEN_HF);
    REQUIRE(g && hf, "load: %s", tp_error_msg());
    compare_tables(g, hf, 1, "pixtral.gguf vs tokenizer.json");
    hard_and_random(g, hf, "pixtral.gguf", sp, 7);
    tokenizer_free(g), tokenizer_free(hf);
    free(path);
}
