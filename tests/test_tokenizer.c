/* Tokenizer tests: the real Qwen3 tokenizer against ids computed by the
 * reference implementation (golden tokens.json), a hand-made Tekken-format
 * tokenizer (tests/data/tekken-mini) against hand-derived ids in both file
 * forms, the prompt layouts, padding, and bad input. */
#include "test.h"
#include "kernels/err.h"
#include "core/models/llm/prompt.h"
#include "core/models/tokenizer/tokenizer.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define QWEN_DIR "tests/data/qwen3-tokenizer"

/* Write DIR/NAME under the test folder; returns DIR's path (caller frees). */
static char *write_file(const char *dir, const char *name, const char *text) {
    char *d = xasprintf("%s/%s", test_tmp_dir(), dir);
    mkdir(d, 0755);
    char *p = xasprintf("%s/%s", d, name);
    FILE *f = fopen(p, "w");
    if (f) fputs(text, f), fclose(f);
    free(p);
    return d;
}

static tokenizer *qwen(void) {
    static tokenizer *t;
    if (!t) t = tokenizer_load(QWEN_DIR);
    return t;
}

/* ids of one JSON array equal to ids[n]? On mismatch the message names the
 * first differing position. */
static int ids_match(json_t *want, const int32_t *ids, int n, char *why, size_t why_len) {
    if ((int)json_array_size(want) != n) {
        snprintf(why, why_len, "%d ids, expected %zu", n, json_array_size(want));
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, (size_t)i)) != ids[i]) {
            snprintf(why, why_len, "id %d is %d, expected %lld", i, ids[i],
                     (long long)json_integer_value(json_array_get(want, (size_t)i)));
            return 0;
        }
    return 1;
}

/* Every case of a golden tokens.json: the raw prompt and the chat text. */
static void check_golden_cases(const char *rel) {
    tokenizer *t = qwen();
    REQUIRE(t, "load %s: %s", QWEN_DIR, tp_error_msg());
    char *path = xasprintf("%s/%s", test_golden_dir(), rel);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    free(path);
    REQUIRE(root, "cannot read golden %s: %s", rel, jerr.text);
    json_t *cases = json_object_get(root, "cases"), *c;
    size_t i;
    CHECK(json_array_size(cases) >= 3, "too few cases in %s", rel);
    json_array_foreach(cases, i, c) {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        int32_t *ids;
        int n;
        char why[128];
        CHECK(tokenizer_encode(t, prompt, strlen(prompt), &ids, &n) == 0, "encode: %s", tp_error_msg());
        CHECK(ids_match(json_object_get(c, "ids"), ids, n, why, sizeof why), "case %zu raw '%s': %s", i, prompt, why);
        free(ids);
        /* the chat text through the engine, and the prompt through the klein template */
        const char *chat = json_string_value(json_object_get(c, "chat_text"));
        CHECK(tokenizer_encode(t, chat, strlen(chat), &ids, &n) == 0, "encode: %s", tp_error_msg());
        CHECK(ids_match(json_object_get(c, "chat_ids"), ids, n, why, sizeof why), "case %zu chat text: %s", i, why);
        free(ids);
        char *rendered = prompt_render(PROMPT_KLEIN, prompt);
        CHECK(!strcmp(rendered, chat), "case %zu: klein template renders differently from the reference", i);
        free(rendered);
        CHECK(prompt_encode(t, PROMPT_KLEIN, prompt, &ids, &n) == 0, "prompt_encode: %s", tp_error_msg());
        CHECK(ids_match(json_object_get(c, "chat_ids"), ids, n, why, sizeof why), "case %zu klein: %s", i, why);
        free(ids);
    }
    json_decref(root);
}

TEST(tokenizer_qwen3_golden) { check_golden_cases("qwen3-tokenizer/tokens.json"); }
TEST(tokenizer_klein_tiny_golden) { check_golden_cases("klein-tiny/tokens.json"); }

/* ---- Mistral / Tekken: tests/data/tekken-mini (see gen.py there) ----
 * Ids: specials 0..999 (1 <s>, 3 [INST], 4 [/INST], 10 [IMG], 11 <pad>,
 * 17 [SYSTEM_PROMPT], 18 [/SYSTEM_PROMPT]); byte b has id 1000 + b; merged
 * tokens: he 1256, ll 1257, hell 1258, hello 1259, Wo 1260, rl 1261, rld 1262,
 * World 1263, AB 1264, ABc 1265, "\n\n" 1266, "\n/" 1267, "://" 1268. The
 * tekken.json also lists "lll" past default_vocab_size, which must be unused. */
#define TEKKEN_HF "tests/data/tekken-mini/hf"
#define TEKKEN_TJ "tests/data/tekken-mini/tekken"
#define B(c) (1000 + (uint8_t)(c))

typedef struct { const char *text; int n; int32_t ids[16]; const char *why; } tok_case;

/* Expected ids derived by hand from the Tekken regex (docs/spec/flux2-text-vae.md §5.3, §5.5) and the
 * merge table above. */
static const tok_case k_tekken_cases[] = {
    {"helloWorld", 2, {1259, 1263}, "lower run then Upper+lower run: 'hello' 'World', whole-piece tokens"},
    {"ABc ABC", 4, {1265, B(' '), 1264, B('C')}, "'ABc' (U* Lw+), ' ABC' (U+ Lw*) = ' ' AB C"},
    {"2024", 4, {B('2'), B('0'), B('2'), B('4')}, "one digit per piece"},
    {"https://x", 7, {B('h'), B('t'), B('t'), B('p'), B('s'), 1268, B('x')}, "'https' no merges, '://' whole piece"},
    {".\n/x", 3, {B('.'), 1267, B('x')}, "punctuation tail takes CR/LF and '/': '.\\n/' = '.' + '\\n/'"},
    {"a\n\nb", 3, {B('a'), 1266, B('b')}, "newline run is its own piece"},
    {"x  \n  y", 7, {B('x'), B(' '), B(' '), B('\n'), B(' '), B(' '), B('y')},
     "'  \\n' (\\s*[\\r\\n]+), ' ' (\\s+(?!\\S)), ' y'"},
    {"e\xcc\x81", 3, {B('e'), B(0xcc), B(0x81)}, "no NFC for Tekken: e + combining acute, one piece, byte fallback"},
    {"\xc3\xa9\xf0\x9f\x90\xb1", 6, {B(0xc3), B(0xa9), B(0xf0), B(0x9f), B(0x90), B(0xb1)}, "UTF-8 bytes as single-byte tokens"},
    {"[INST]hello[/INST]", 3, {3, 1259, 4}, "control tokens matched in text"},
    {"<s><pad>[IMG]<SPECIAL_999>", 4, {1, 11, 10, 999}, "adjacent specials, the implied <SPECIAL_999>"},
    {"[INST", 5, {B('['), B('I'), B('N'), B('S'), B('T')}, "an unfinished control string is ordinary text"},
    {"lll", 2, {1257, B('l')}, "leftmost merge on ties; the 'lll' past default_vocab_size is not used"},
    {"hellhe", 2, {1258, 1256}, "merge order by rank: he, he, ll, then he+ll"},
    {"", 0, {0}, "empty text"},
};

static void check_tekken_cases(const char *dir) {
    tokenizer *t = tokenizer_load(dir);
    REQUIRE(t, "load %s: %s", dir, tp_error_msg());
    CHECK(tokenizer_get_family(t) == TOKENIZER_MISTRAL, "%s: not detected as a Mistral tokenizer", dir);
    CHECK(prompt_format_for(t) == PROMPT_DEV, "%s: default prompt format is not dev", dir);
    CHECK(tokenizer_pad_id(t) == 11, "%s: pad id %d, expected 11 (<pad>)", dir, tokenizer_pad_id(t));
    for (size_t c = 0; c < sizeof k_tekken_cases / sizeof *k_tekken_cases; c++) {
        const tok_case *k = &k_tekken_cases[c];
        int32_t *ids;
        int n;
        if (tokenizer_encode(t, k->text, strlen(k->text), &ids, &n)) {
            CHECK(0, "%s case %zu: %s", dir, c, tp_error_msg());
            continue;
        }
        int same = n == k->n;
        for (int i = 0; same && i < n; i++) same = ids[i] == k->ids[i];
        CHECK(same, "%s case %zu (%s): got %d ids, first %d", dir, c, k->why, n, n ? ids[0] : -1);
        free(ids);
    }
    tokenizer_free(t);
}

TEST(tokenizer_tekken_hf_form) { check_tekken_cases(TEKKEN_HF); }
TEST(tokenizer_tekken_json_form) { check_tekken_cases(TEKKEN_TJ); }

/* The dev layout: one BOS, [SYSTEM_PROMPT] system [/SYSTEM_PROMPT] [INST]
 * prompt [/INST], "[IMG]" removed. No merge of the mini vocabulary occurs in
 * the system message, so it is one byte token per byte. */
static int32_t *dev_expected(const char *prompt_ids_desc, int *n) {
    (void)prompt_ids_desc;
    const char *sys = PROMPT_DEV_SYSTEM_MESSAGE;
    size_t ns = strlen(sys);
    int32_t *e = xmalloc((ns + 16) * sizeof *e);
    int k = 0;
    e[k++] = 1, e[k++] = 17;
    for (size_t i = 0; i < ns; i++) e[k++] = B(sys[i]);
    e[k++] = 18, e[k++] = 3;
    /* "helloWorld [IMG]ABc" -> "helloWorld ABc": hello, World, ' ABc' = ' ' + (A B -> AB, AB c -> ABc) */
    e[k++] = 1259, e[k++] = 1263, e[k++] = B(' '), e[k++] = 1265;
    e[k++] = 4;
    *n = k;
    return e;
}

TEST(tokenizer_dev_layout) {
    CHECK(strlen(PROMPT_DEV_SYSTEM_MESSAGE) == 168 && strchr(PROMPT_DEV_SYSTEM_MESSAGE, '\n') &&
              !strncmp(strchr(PROMPT_DEV_SYSTEM_MESSAGE, '\n') - 6, "object\nattribution", 18),
          "system message bytes differ from the spec");
    int ne;
    int32_t *want = dev_expected("", &ne);
    const char *dirs[2] = {TEKKEN_HF, TEKKEN_TJ};
    for (int d = 0; d < 2; d++) {
        tokenizer *t = tokenizer_load(dirs[d]);
        REQUIRE(t, "load: %s", tp_error_msg());
        int32_t *ids;
        int n;
        REQUIRE(prompt_encode(t, PROMPT_DEV, "helloWorld [IMG]ABc", &ids, &n) == 0, "%s", tp_error_msg());
        int same = n == ne;
        for (int i = 0; same && i < n; i++) same = ids[i] == want[i];
        CHECK(same, "%s: dev layout ids differ (got %d ids, expected %d)", dirs[d], n, ne);
        free(ids);
        tokenizer_free(t);
    }
    free(want);
}

/* Padding side: left from the tokenizer class (the hf config names
 * LlamaTokenizerFast and no padding_side) and for a lone tekken.json
 * (mistral-common pads left); an explicit padding_side "right" wins.
 * Truncation keeps the first ids. */
static void check_padding(const tokenizer *t, int left, const int32_t *want, int ne, const char *what) {
    int32_t ids[400], mask[400];
    int n_real = -1, L = ne + 3;
    for (int i = 0; i < L; i++) ids[i] = mask[i] = -7; /* poison */
    REQUIRE(prompt_encode_ids(t, PROMPT_DEV, "helloWorld [IMG]ABc", L, ids, mask, &n_real) == 0, "%s", tp_error_msg());
    CHECK(n_real == ne, "%s: n_real %d, expected %d", what, n_real, ne);
    for (int i = 0; i < L; i++) {
        int real = left ? i >= 3 : i < ne;
        int32_t wid = real ? want[left ? i - 3 : i] : 11;
        CHECK(ids[i] == wid && mask[i] == real, "%s: position %d is (%d, %d), expected (%d, %d)", what, i, ids[i],
              mask[i], wid, real);
        if (test_failed()) break;
    }
}

TEST(tokenizer_dev_padding_and_truncation) {
    int ne;
    int32_t *want = dev_expected("", &ne);
    int32_t ids[8], mask[8];
    int n_real;
    char *cfg = write_file("right", "tokenizer_config.json", "{\"tokenizer_class\": \"LlamaTokenizerFast\", "
                                                               "\"padding_side\": \"right\", \"pad_token\": \"<pad>\"}");
    char *cfg_path = xasprintf("%s/tokenizer_config.json", cfg);
    tokenizer *hf = tokenizer_load(TEKKEN_HF), *tj = tokenizer_load(TEKKEN_TJ);
    tokenizer *right = tokenizer_load_files(TEKKEN_HF "/tokenizer.json", cfg_path);
    if (!hf || !tj || !right) {
        CHECK(0, "load: %s", tp_error_msg());
        goto done;
    }
    CHECK(tokenizer_padding_side(hf) == TOKENIZER_PAD_LEFT, "LlamaTokenizerFast without padding_side pads left");
    CHECK(tokenizer_padding_side(tj) == TOKENIZER_PAD_LEFT, "a lone tekken.json pads left");
    CHECK(tokenizer_padding_side(right) == TOKENIZER_PAD_RIGHT, "explicit padding_side right");
    check_padding(hf, 1, want, ne, "hf");
    check_padding(tj, 1, want, ne, "tekken");
    check_padding(right, 0, want, ne, "right");
    /* truncation to 4: BOS, [SYSTEM_PROMPT], 'Y', 'o' and no padding */
    for (int i = 0; i < 8; i++) ids[i] = mask[i] = -7;
    REQUIRE(prompt_encode_ids(hf, PROMPT_DEV, "helloWorld", 4, ids, mask, &n_real) == 0, "%s", tp_error_msg());
    CHECK(n_real == 4 && ids[0] == 1 && ids[1] == 17 && ids[2] == B('Y') && ids[3] == B('o') && ids[4] == -7,
          "truncated ids %d %d %d %d (n_real %d)", ids[0], ids[1], ids[2], ids[3], n_real);
    CHECK(mask[0] == 1 && mask[3] == 1 && mask[4] == -7, "truncated mask");
done:
    tokenizer_free(hf);
    tokenizer_free(tj);
    tokenizer_free(right);
    free(want), free(cfg), free(cfg_path);
}

/* ---- the pipeline's padded ids: klein-tiny end-to-end golden ---- */

/* Read an I64 tensor of n elements from a safetensors file (header parsed
 * here with jansson, independent of the project's reader). */
static int read_i64(const char *path, const char *name, int64_t *out, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint64_t hl;
    int ok = fread(&hl, 8, 1, f) == 1 && hl < (1u << 24);
    char *hdr = ok ? xmalloc(hl + 1) : NULL;
    ok = ok && fread(hdr, 1, hl, f) == hl;
    json_t *root = ok ? (hdr[hl] = 0, json_loads(hdr, 0, NULL)) : NULL;
    json_t *e = json_object_get(root, name);
    json_t *offs = json_object_get(e, "data_offsets");
    ok = e && !strcmp(json_string_value(json_object_get(e, "dtype")), "I64") &&
         json_integer_value(json_array_get(offs, 1)) - json_integer_value(json_array_get(offs, 0)) == (json_int_t)(n * 8);
    ok = ok && fseek(f, (long)(8 + hl + (uint64_t)json_integer_value(json_array_get(offs, 0))), SEEK_SET) == 0 &&
         fread(out, 8, n, f) == n;
    json_decref(root);
    free(hdr);
    fclose(f);
    return ok ? 0 : -1;
}

TEST(tokenizer_klein_e2e_padded_ids) {
    char *model = xasprintf("%s/klein-tiny/model", test_golden_dir());
    char *meta = xasprintf("%s/klein-tiny/e2e.json", test_golden_dir());
    char *st = xasprintf("%s/klein-tiny/e2e.safetensors", test_golden_dir());
    tokenizer *t = tokenizer_load(model); /* a pipeline folder: uses model/tokenizer/ */
    json_t *root = json_load_file(meta, 0, NULL);
    if (!t || !root) {
        CHECK(0, "load %s / %s: %s", model, meta, tp_error_msg());
        goto done;
    }
    int L = (int)json_integer_value(json_object_get(root, "max_sequence_length"));
    CHECK(L == 32, "max_sequence_length %d", L);
    CHECK(tokenizer_pad_id(t) == json_integer_value(json_object_get(root, "pad_id")), "pad id %d", tokenizer_pad_id(t));
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        int64_t want_ids[32], want_mask[32];
        int32_t ids[32], mask[32];
        char key[64];
        snprintf(key, sizeof key, "case%zu.input_ids", i);
        REQUIRE(L == 32 && read_i64(st, key, want_ids, 32) == 0, "read %s", key);
        snprintf(key, sizeof key, "case%zu.attention_mask", i);
        REQUIRE(read_i64(st, key, want_mask, 32) == 0, "read %s", key);
        for (int k = 0; k < 32; k++) ids[k] = mask[k] = -7;
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        REQUIRE(prompt_encode_ids(t, prompt_format_for(t), prompt, 32, ids, mask, NULL) == 0, "%s", tp_error_msg());
        for (int k = 0; k < 32; k++)
            CHECK(ids[k] == want_ids[k] && mask[k] == want_mask[k], "case %zu position %d: (%d, %d), expected (%lld, %lld)",
                  i, k, ids[k], mask[k], (long long)want_ids[k], (long long)want_mask[k]);
    }
done:
    json_decref(root);
    tokenizer_free(t);
    free(model), free(meta), free(st);
}

/* ---- BPE against a naive reference on long single pieces ----
 * The reference works on the byte-level-mapped strings of tokenizer.json
 * directly: merges looked up as "A B" keys, the lowest rank (leftmost on ties)
 * merged one at a time, O(n^2). */
static void map_bytes(const uint8_t *s, int n, char **syms) {
    for (int i = 0; i < n; i++) {
        int b = s[i], k = 0, printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        for (int x = 0; x < b && !printable; x++)
            k += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
        unsigned cp = printable ? (unsigned)b : 0x100u + (unsigned)k;
        char u[3] = {(char)(0xC0 | cp >> 6), (char)(0x80 | (cp & 0x3F)), 0};
        if (cp < 0x80) u[0] = (char)cp, u[1] = 0;
        syms[i] = xstrdup(u);
    }
}

static int naive_bpe(json_t *ranks, json_t *vocab, const char *piece, int32_t *out) {
    int n = (int)strlen(piece);
    char **sym = xmalloc((size_t)n * sizeof *sym);
    map_bytes((const uint8_t *)piece, n, sym);
    for (;;) {
        int best = -1;
        json_int_t best_rank = 0;
        for (int i = 0; i + 1 < n; i++) {
            char *key = xasprintf("%s %s", sym[i], sym[i + 1]);
            json_t *r = json_object_get(ranks, key);
            if (r && (best < 0 || json_integer_value(r) < best_rank)) best = i, best_rank = json_integer_value(r);
            free(key);
        }
        if (best < 0) break;
        char *m = xasprintf("%s%s", sym[best], sym[best + 1]);
        free(sym[best]), free(sym[best + 1]);
        sym[best] = m;
        memmove(sym + best + 1, sym + best + 2, (size_t)(n - best - 2) * sizeof *sym);
        n--;
    }
    for (int i = 0; i < n; i++) {
        out[i] = (int32_t)json_integer_value(json_object_get(vocab, sym[i]));
        free(sym[i]);
    }
    free(sym);
    return n;
}

TEST(tokenizer_bpe_matches_naive_reference) {
    tokenizer *t = qwen();
    REQUIRE(t, "load: %s", tp_error_msg());
    json_t *root = json_load_file(QWEN_DIR "/tokenizer.json", 0, NULL);
    REQUIRE(root, "read tokenizer.json");
    json_t *model = json_object_get(root, "model"), *ranks = json_object(), *m;
    size_t i;
    json_array_foreach(json_object_get(model, "merges"), i, m) {
        char *key = xasprintf("%s %s", json_string_value(json_array_get(m, 0)), json_string_value(json_array_get(m, 1)));
        json_object_set_new(ranks, key, json_integer((json_int_t)i));
        free(key);
    }
    /* alphabets whose random strings stay one regex piece: letters (after an
     * optional space), or punctuation runs; multi-byte letters included */
    static const char *const letters[] = {"a", "e", "i", "n", "r", "s", "t", "o", "l", "th", "\xc3\xa9", "\xd0\xb6", "\xe4\xb8\xad", "q"};
    static const char *const puncts[] = {"!", "?", ".", ",", "-", "*", "(", ")", "=", "#"};
    char piece[2048];
    int32_t got_ref[2048];
    for (int c = 0; c < 60; c++) {
        int punct = c % 3 == 2, len = c < 40 ? 1 + rand() % 24 : 200 + rand() % 300, k = 0;
        if (rand() % 2) piece[k++] = ' ';
        for (int j = 0; j < len; j++) {
            const char *s = punct ? puncts[rand() % 10] : letters[rand() % 14];
            memcpy(piece + k, s, strlen(s));
            k += (int)strlen(s);
        }
        piece[k] = 0;
        int32_t *ids;
        int n;
        REQUIRE(tokenizer_encode(t, piece, (size_t)k, &ids, &n) == 0, "%s", tp_error_msg());
        int nr = naive_bpe(ranks, json_object_get(model, "vocab"), piece, got_ref);
        int same = n == nr;
        for (int j = 0; same && j < n; j++) same = ids[j] == got_ref[j];
        CHECK(same, "piece %d ('%.40s...', %d bytes): %d ids, reference %d", c, piece, k, n, nr);
        free(ids);
    }
    json_decref(ranks);
    json_decref(root);
}

/* ---- bad input ---- */


/* A minimal byte-level BPE tokenizer.json: the 256 byte tokens (skipping
 * byte `skip` when >= 0), no merges, with the given normalizer and
 * pre-tokenizer JSON. */
static char *minimal_bpe_json(int skip, const char *normalizer, const char *pretok) {
    json_t *vocab = json_object();
    uint32_t b2u[256];
    int next = 0x100;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        b2u[b] = printable ? (uint32_t)b : (uint32_t)next++;
        char u[3] = {(char)(0xC0 | b2u[b] >> 6), (char)(0x80 | (b2u[b] & 0x3F)), 0};
        if (b2u[b] < 0x80) u[0] = (char)b2u[b], u[1] = 0;
        if (b != skip) json_object_set_new(vocab, u, json_integer(b));
    }
    char *v = json_dumps(vocab, JSON_COMPACT);
    char *s = xasprintf("{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": []}, \"added_tokens\": [],"
                        " \"normalizer\": %s, \"pre_tokenizer\": %s}", v, normalizer, pretok);
    free(v);
    json_decref(vocab);
    return s;
}

static void expect_load_error(const char *dir, const char *what, const char *pattern) {
    tokenizer *t = tokenizer_load(dir);
    CHECK(!t, "%s: loaded", what);
    CHECK(strstr(tp_error_msg(), pattern), "%s: message '%s' lacks '%s'", what, tp_error_msg(), pattern);
    tokenizer_free(t);
}

#define BYTE_LEVEL "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}"

TEST(tokenizer_rejects_bad_files) {
    expect_load_error("/nonexistent/tpgen-model", "missing folder", "/nonexistent/tpgen-model");
    char *empty = write_file("empty", "README", "nothing here\n");
    expect_load_error(empty, "folder without tokenizer", "tokenizer.json");
    CHECK(strstr(tp_error_msg(), "tekken.json"), "message should name tekken.json too: %s", tp_error_msg());
    free(empty);
    char *d = write_file("wordpiece", "tokenizer.json",
                         "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}, \"unk_token\": \"[UNK]\"}}");
    expect_load_error(d, "WordPiece", "WordPiece");
    free(d);
    d = write_file("unigram", "tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", -1.0]]}}");
    expect_load_error(d, "Unigram", "Unigram");
    free(d);
    d = write_file("broken", "tokenizer.json", "{\"model\": {\"type\": \"BPE\",\n \"vocab\": {\"a\": 0,,}}}");
    expect_load_error(d, "malformed JSON", "tokenizer.json:2:");
    free(d);
    /* an error after the fast-scanned members: the line number still points at it */
    d = write_file("broken_late", "tokenizer.json",
                   "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,\n \"b\": 1},\n \"merges\": [\"a b\"]},\n \"added_tokens\": [,]}");
    expect_load_error(d, "malformed JSON after the vocabulary", "tokenizer.json:4:");
    free(d);
    d = write_file("neither", "tokenizer.json", "[1, 2, 3]");
    expect_load_error(d, "not a tokenizer", "neither");
    free(d);
    char *j = minimal_bpe_json(0x41, "null", BYTE_LEVEL);
    d = write_file("missing_byte", "tokenizer.json", j);
    expect_load_error(d, "missing byte token", "byte 0x41");
    free(d), free(j);
    j = minimal_bpe_json(-1, "{\"type\": \"NFKC\"}", BYTE_LEVEL);
    d = write_file("nfkc", "tokenizer.json", j);
    expect_load_error(d, "NFKC normalizer", "NFKC");
    free(d), free(j);
    j = minimal_bpe_json(-1, "null", "{\"type\": \"Whitespace\"}");
    d = write_file("whitespace", "tokenizer.json", j);
    expect_load_error(d, "Whitespace pre-tokenizer", "Whitespace");
    free(d), free(j);
    j = minimal_bpe_json(-1, "null", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                                     "{\"Regex\": \"(?<bad\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
                                     "{\"type\": \"ByteLevel\", \"use_regex\": false}]}");
    d = write_file("badregex", "tokenizer.json", j);
    expect_load_error(d, "bad regex", "regex does not compile");
    free(d), free(j);
    d = write_file("badmerge", "tokenizer.json",
                   "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a zz\"]}, \"added_tokens\": [],"
                   " \"pre_tokenizer\": " BYTE_LEVEL "}");
    expect_load_error(d, "merge of unknown tokens", "not in the vocabulary");
    free(d);
    d = write_file("badconfig", "tokenizer_config.json", "{\"padding_side\": \"middle\"}");
    j = minimal_bpe_json(-1, "null", BYTE_LEVEL);
    free(write_file("badconfig", "tokenizer.json", j));
    expect_load_error(d, "bad padding_side", "padding_side");
    free(d), free(j);
    d = write_file("tekken_short", "tekken.json", "{\"config\": {\"pattern\": \"\\\\s+\"}, \"vocab\": []}");
    expect_load_error(d, "tekken without bytes", "256");
    free(d);
}

TEST(tokenizer_no_pad_token) {
    char *j = minimal_bpe_json(-1, "null", BYTE_LEVEL);
    char *d = write_file("nopad", "tokenizer.json", j);
    tokenizer *t = tokenizer_load(d);
    REQUIRE(t, "load minimal: %s", tp_error_msg());
    int32_t ids[8], mask[8];
    CHECK(prompt_encode_ids(t, PROMPT_RAW, "x", 8, ids, mask, NULL) == -1 && strstr(tp_error_msg(), "pad"),
          "padding without a pad token: %s", tp_error_msg());
    /* the raw encoding still works: one byte token per byte with no merges */
    int32_t *out;
    int n;
    CHECK(tokenizer_encode(t, "hi!", 3, &out, &n) == 0 && n == 3 && out[0] == 'h' && out[1] == 'i' && out[2] == '!',
          "minimal byte tokenizer");
    free(out);
    tokenizer_free(t);
    free(d), free(j);
}

TEST(tokenizer_rejects_invalid_utf8) {
    tokenizer *t = qwen();
    REQUIRE(t, "load: %s", tp_error_msg());
    static const struct { const char *s; const char *offset; } bad[] = {
        {"abc\xff", "offset 3"},           /* never valid */
        {"caf\xc3", "offset 3"},           /* truncated sequence */
        {"x\xc0\xaf", "offset 1"},         /* overlong '/' */
        {"\xed\xa0\x80", "offset 0"},      /* UTF-16 surrogate */
        {"ok \x80 no", "offset 3"},        /* stray continuation byte */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int32_t *ids = (int32_t *)1;
        int n = -1;
        int rc = tokenizer_encode(t, bad[i].s, strlen(bad[i].s), &ids, &n);
        CHECK(rc == -1 && ids == NULL && n == 0, "case %zu accepted", i);
        CHECK(strstr(tp_error_msg(), "UTF-8") && strstr(tp_error_msg(), bad[i].offset), "case %zu: message '%s'", i,
              tp_error_msg());
    }
    int32_t ids[4], mask[4];
    CHECK(prompt_encode_ids(t, PROMPT_KLEIN, "\xfe", 4, ids, mask, NULL) == -1, "prompt_encode_ids accepted bad UTF-8");
}

/* ---- the fast vocabulary/merges scanner against a full jansson parse ---- */
#include "core/models/tokenizer/tokenizer_int.h"

static void compare_load_paths(const char *path, const char *config) {
    tokenizer *a = tok_load_json_ex(path, config, 1), *b = tok_load_json_ex(path, config, 0);
    REQUIRE(a && b, "load %s: %s", path, tp_error_msg());
    CHECK(a->n_ids == b->n_ids && a->n_vocab == b->n_vocab && a->n_pairs == b->n_pairs && a->n_added == b->n_added,
          "%s: sizes differ (ids %d/%d, vocab %d/%d, merges %d/%d)", path, a->n_ids, b->n_ids, a->n_vocab, b->n_vocab,
          a->n_pairs, b->n_pairs);
    int bad_tok = 0, bad_pair = 0;
    for (int id = 0; id < a->n_ids && id < b->n_ids; id++) {
        int la, lb;
        const char *sa = tokenizer_token_bytes(a, id, &la), *sb = tokenizer_token_bytes(b, id, &lb);
        if (!sa != !sb || (sa && (la != lb || memcmp(sa, sb, (size_t)la)))) bad_tok++;
        else if (sa && tok_vocab_find(a, sa, la) != tok_vocab_find(b, sb, lb)) bad_tok++;
    }
    /* same hash, same insertion order (merge rank): the tables must be identical slot by slot */
    if (a->pair_mask != b->pair_mask) bad_pair = 1;
    for (uint32_t h = 0; !bad_pair && h <= a->pair_mask; h++)
        bad_pair = a->pair_keys[h] != b->pair_keys[h] ||
                   (a->pair_keys[h] != UINT64_MAX && (a->pair_rank[h] != b->pair_rank[h] || a->pair_merged[h] != b->pair_merged[h]));
    CHECK(!bad_tok, "%s: %d tokens differ between the fast scan and jansson", path, bad_tok);
    CHECK(!bad_pair, "%s: merges differ between the fast scan and jansson", path);
    tokenizer_free(a);
    tokenizer_free(b);
}

TEST(tokenizer_fast_scan_matches_jansson) {
    compare_load_paths(QWEN_DIR "/tokenizer.json", QWEN_DIR "/tokenizer_config.json");
    compare_load_paths(TEKKEN_HF "/tokenizer.json", TEKKEN_HF "/tokenizer_config.json");
    /* escapes in keys, merges as "A B" strings, members in another order */
    char *d = write_file("escapes", "tokenizer.json", "");
    char *p = xasprintf("%s/tokenizer.json", d);
    FILE *f = fopen(p, "w");
    REQUIRE(f, "write %s", p);
    fputs("{\"added_tokens\": [{\"id\": 300, \"content\": \"<x>\"}], \"pre_tokenizer\": " BYTE_LEVEL ",\n"
          " \"model\": {\"merges\": [\"\\u0041 B\", \"AB \\\"\", \"\\u0120 \\u0120\"], \"type\": \"BPE\", \"vocab\": {", f);
    uint32_t b2u[256];
    int16_t u2b[0x144];
    byte_unicode_tables(b2u, u2b);
    for (int b = 0; b < 256; b++) fprintf(f, "\"\\u%04x\": %d, ", b2u[b], b); /* every key escaped */
    fputs("\"AB\": 256, \"AB\\\"\": 257, \"\\u0120\\u0120\": 258}, \"ignore_merges\": false}}", f);
    fclose(f);
    compare_load_paths(p, NULL);
    tokenizer *t = tokenizer_load(d);
    REQUIRE(t, "load escapes: %s", tp_error_msg());
    int32_t *ids;
    int n;
    /* GPT-2 pieces "AB", "\"", then <x>, then "  " (U+0120 U+0120 = two spaces, merged) */
    CHECK(tokenizer_encode(t, "AB\"<x>  ", 8, &ids, &n) == 0 && n == 4 && ids[0] == 256 && ids[1] == '"' &&
              ids[2] == 300 && ids[3] == 258,
          "escaped keys and merges: %d ids, first %d", n, n ? ids[0] : -1);
    free(ids);
    tokenizer_free(t);
    free(p), free(d);
}

/* ---- round trip: the bytes of the tokens give back the (normalised) text ----
 * Random texts mixing ASCII, whitespace runs, multi-byte letters, emoji,
 * decomposed accents and special-token text; for Qwen the expected bytes are
 * the NFC form of each text between special tokens, computed with utf8proc. */
#include <utf8proc.h>

static void roundtrip(const tokenizer *t, int nfc, const char *const *specials, int n_specials) {
    static const char *const parts[] = {"a", "Z", "hello", "World", " ", "  ", "\t", "\n", "\r\n", "7", "42", "'s", "'LL",
                                        "!", "...", "/", "://", "_", "\xc3\xa9", "e\xcc\x81", "\xd0\x96", "\xe4\xb8\xad",
                                        "\xf0\x9f\x90\xb1", "\xe2\x80\x8d", "\xc2\xa0", "\xe3\x80\x80", "<", "[", "|>"};
    char text[4096], want[8192];
    for (int c = 0; c < 200; c++) {
        int n = 0, w = 0, seg = 0, k = 1 + rand() % 40;
        for (int j = 0; j < k; j++) {
            int is_special = rand() % 8 == 0;
            const char *p = is_special ? specials[rand() % n_specials] : parts[rand() % (int)(sizeof parts / sizeof *parts)];
            if (is_special || j == k - 1) { /* flush the ordinary text before it (NFC per segment) */
                if (!is_special) { memcpy(text + n, p, strlen(p)); n += (int)strlen(p); }
                utf8proc_uint8_t *norm = NULL;
                utf8proc_ssize_t m = nfc ? utf8proc_map((const utf8proc_uint8_t *)text + seg, n - seg, &norm,
                                                        UTF8PROC_STABLE | UTF8PROC_COMPOSE)
                                         : n - seg;
                memcpy(want + w, nfc ? (const char *)norm : text + seg, (size_t)m);
                w += (int)m;
                free(norm);
                if (is_special) { memcpy(text + n, p, strlen(p)); n += (int)strlen(p); memcpy(want + w, p, strlen(p)); w += (int)strlen(p); }
                seg = n;
            } else {
                memcpy(text + n, p, strlen(p));
                n += (int)strlen(p);
            }
        }
        int32_t *ids;
        int nid;
        REQUIRE(tokenizer_encode(t, text, (size_t)n, &ids, &nid) == 0, "%s", tp_error_msg());
        char got[8192];
        int g = 0;
        for (int i = 0; i < nid; i++) {
            int len;
            const char *b = tokenizer_token_bytes(t, ids[i], &len);
            if (!b || g + len > (int)sizeof got) { g = -1; break; }
            memcpy(got + g, b, (size_t)len);
            g += len;
        }
        free(ids);
        CHECK(g == w && !memcmp(got, want, (size_t)w), "text %d ('%.*s'): the tokens spell %d bytes, expected %d", c, n, text, g, w);
        if (test_failed()) return;
    }
}

TEST(tokenizer_roundtrip_bytes) {
    static const char *const qwen_specials[] = {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"};
    static const char *const tek_specials[] = {"<s>", "[INST]", "[/INST]", "<pad>", "[IMG]", "<SPECIAL_500>"};
    REQUIRE(qwen(), "load: %s", tp_error_msg());
    roundtrip(qwen(), 1, qwen_specials, 5);
    tokenizer *t = tokenizer_load(TEKKEN_TJ);
    REQUIRE(t, "load: %s", tp_error_msg());
    roundtrip(t, 0, tek_specials, 6);
    tokenizer_free(t);
}
