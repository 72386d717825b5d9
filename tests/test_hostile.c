/* Hostile inputs (issue 13): the finiteness scan against isfinite, the
 * output-path uniqueness shortcut against building every path, the
 * tokenizer's fast scanner against jansson on crafted files, and the tp
 * bound of the plan engine. The crafted-file runs of the binary are in
 * tests/sh/hostile.sh. */
#include "test.h"
#include "cli/runspec.h"
#include "kernels/err.h"
#include "kernels/tensor.h"
#include "core/models/tokenizer/tokenizer_int.h"
#include "plans/plan.h"
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

TEST(hostile_first_nonfinite_matches_isfinite) {
    srand(test_seed());
    const float specials[] = {NAN, -NAN, INFINITY, -INFINITY};
    for (int trial = 0; trial < 200; trial++) {
        size_t n = 1 + (size_t)(rand() % 3000);
        float *x = malloc(n * sizeof *x);
        for (size_t i = 0; i < n; i++) {
            int r = rand() % 4;   /* finite edge values too: FLT_MAX, denormals, zeros */
            x[i] = r == 0 ? FLT_MAX : r == 1 ? -FLT_MIN / 4 : r == 2 ? -0.0f : (float)rand() / RAND_MAX;
        }
        int k = rand() % 4;   /* 0..3 non-finite values at random places */
        for (int j = 0; j < k; j++) x[(size_t)rand() % n] = specials[rand() % 4];
        int64_t want = -1;
        for (size_t i = 0; i < n && want < 0; i++)
            if (!isfinite(x[i])) want = (int64_t)i;
        int64_t got = first_nonfinite_f32(x, n);
        CHECK(got == want, "n %zu: first non-finite at %lld, expected %lld", n, (long long)got, (long long)want);
        free(x);
        if (test_failed()) return;
    }
    CHECK(first_nonfinite_f32(NULL, 0) == -1, "empty input");
}

/* a spec of P prompts x S seeds with colliding slugs and repeated seeds */
static void adversarial_spec(run_spec *s, int P, int S) {
    runspec_init(s);
    s->prompts = malloc(sizeof *s->prompts * (size_t)P);
    for (int i = 0; i < P; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, i % 2 ? "a b %d" : "A-b-%d", i / 2);   /* pairs share the slug a-b-N */
        s->prompts[i] = strdup(buf);
    }
    s->n_prompts = P;
    /* repeated seeds, and seeds whose digits run into an index ("1" "11" vs "11" "1") */
    static const uint64_t k_seeds[] = {1, 11, 1, 2, 12, 21, 3, 1, 111, 10, 0, 1};
    s->seeds = malloc(sizeof *s->seeds * (size_t)S);
    for (int i = 0; i < S; i++) s->seeds[i] = k_seeds[i % 12];
    s->n_seeds = S;
}

/* the independent answer: build every path and compare all pairs */
static int brute_force_unique(const run_spec *s, const char *pat, int n) {
    char **p = malloc(sizeof *p * (size_t)n);
    int uniq = 1;
    for (int i = 0; i < n; i++) p[i] = runspec_output_path(s, pat, i);
    for (int i = 0; i < n && uniq; i++)
        for (int j = i + 1; j < n && uniq; j++) uniq = strcmp(p[i], p[j]) != 0;
    for (int i = 0; i < n; i++) free(p[i]);
    free(p);
    return uniq;
}

TEST(hostile_unique_paths_match_brute_force) {
    const char *pats[] = {"tpgen-{index:04}-{seed}.png", "{index}.png", "out/{prompt}-{seed}-{index}",
                          "{seed}{index}.png", "{index}{seed}.png", "{prompt_index}{seed_index}.png",
                          "x{index:02}1{seed}.png", "{seed}-{index}", "{{{index}}}-{seed}", "{prompt}/{seed}.png",
                          "{prompt}-{index}{seed}", "{seed_index}-{prompt_index}.png", "{index}0{seed}"};
    run_spec s;
    adversarial_spec(&s, 12, 12);
    int n = runspec_n_jobs(&s), n_unique = 0;
    for (size_t k = 0; k < sizeof pats / sizeof *pats; k++) {
        int want = brute_force_unique(&s, pats[k], n);
        n_unique += want;
        tp_error_clear();
        int got = runspec_check_unique_paths(&s, pats[k], "--output", n) == 0;
        CHECK(got == want, "pattern '%s': check says %s, building every path says %s (%s)", pats[k],
              got ? "unique" : "not unique", want ? "unique" : "not unique", tp_error_msg());
    }
    /* both answers occur, so the comparison can fail either way */
    CHECK(n_unique >= 3 && n_unique <= (int)(sizeof pats / sizeof *pats) - 3, "%d of %zu patterns unique", n_unique,
          sizeof pats / sizeof *pats);
    runspec_free(&s);
}

TEST(hostile_unique_paths_bounded) {
    /* 10 prompts x 1M seeds: the default pattern needs no paths; a pattern
     * without {index} would build ~1 GB of them and is refused */
    run_spec s;
    runspec_init(&s);
    s.n_prompts = 10;
    s.prompts = calloc(10, sizeof *s.prompts);
    for (int i = 0; i < 10; i++) s.prompts[i] = strdup("p");
    s.n_seeds = 1000000;
    s.seeds = malloc(sizeof *s.seeds * 1000000);
    for (int i = 0; i < 1000000; i++) s.seeds[i] = (uint64_t)i;
    int n = runspec_n_jobs(&s);
    CHECK(runspec_check_unique_paths(&s, "tpgen-{index:04}-{seed}.png", "--output", n) == 0, "default pattern: %s",
          tp_error_msg());
    tp_error_clear();
    CHECK(runspec_check_unique_paths(&s, "{prompt}-{seed}-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx.png", "--output", n) != 0 &&
              strstr(tp_error_msg(), "limit of 64 MB"),
          "a long pattern without {index}: '%s'", tp_error_msg());
    runspec_free(&s);
}

static tokenizer *load_text(const char *name, const char *text, int fast) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", test_tmp_dir(), name);
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    return tok_load_json_ex(path, NULL, fast);
}

TEST(hostile_tokenizer_fast_agrees_with_jansson) {
    /* the 256 byte tokens (GPT-2 alphabet, id = byte value), "ab" = 256 */
    char vocab[8192];
    size_t k = (size_t)snprintf(vocab, sizeof vocab, "{");
    int next = 0x100;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : next++;
        k += (size_t)snprintf(vocab + k, sizeof vocab - k, "\"\\u%04x\":%d,", cp, b);
    }
    const char *pre = "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}";
    struct { const char *name, *extra_vocab, *merges, *model_extra; int loads; } cases[] = {
        {"good", "\"ab\":256", "[\"a b\"]", "", 1},
        {"dup_key", "\"ab\":256,\"ab\":257", "[\"a b\"]", "", 0},
        {"dup_key_escaped", "\"ab\":256,\"\\u0061b\":257", "[\"a b\"]", "", 0},
        {"second_vocab", "\"ab\":256", "[\"a b\"]", ",\"vocab\":{\"a\":5}", 0},
        {"second_merges", "\"ab\":256", "[\"a b\"]", ",\"merges\":[]", 0},
        {"overlong_utf8", "\"\xc0\xa1\":256", "[]", "", 0},
        {"surrogate_utf8", "\"\xed\xa0\x80\":256", "[]", "", 0},
        {"lone_low_surrogate", "\"\\udc00\":256", "[]", "", 0},
        {"leading_zero", "\"ab\":0256", "[\"a b\"]", "", 0},
        {"huge_id", "\"ab\":2000000000", "[\"a b\"]", "", 0},
        {"int_max_id", "\"ab\":2147483647", "[\"a b\"]", "", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *text = NULL;
        if (asprintf(&text, "{\"model\":{\"type\":\"BPE\",\"vocab\":%s%s},\"merges\":%s%s},%s,\"added_tokens\":[]}",
                     vocab, cases[i].extra_vocab, cases[i].merges, cases[i].model_extra, pre) < 0) return;
        tokenizer *fast = load_text(cases[i].name, text, 1), *slow = load_text(cases[i].name, text, 0);
        CHECK(!fast == !slow, "%s: fast path %s, jansson path %s", cases[i].name, fast ? "loaded" : "failed",
              slow ? "loaded" : "failed");
        CHECK(!!slow == cases[i].loads, "%s: %s (%s)", cases[i].name, slow ? "loaded" : "failed", tp_error_msg());
        if (fast && slow) {
            int32_t *a = NULL, *b = NULL;
            int na = 0, nb = 0;
            CHECK(tokenizer_encode(fast, "ab abc", 6, &a, &na) == 0 && tokenizer_encode(slow, "ab abc", 6, &b, &nb) == 0 &&
                      na == nb && !memcmp(a, b, (size_t)na * sizeof *a) && na >= 1 && a[0] == 256,
                  "%s: the two paths give different ids", cases[i].name);
            free(a), free(b);
        }
        tokenizer_free(fast);
        tokenizer_free(slow);
        free(text);
    }
}

TEST(hostile_plan_tp_hint_bounded) {
    plan p = {.model = "test"};
    plan_add_divisor(&p, "num_attention_heads", ((int64_t)1 << 61) - 1);   /* prime */
    checkpoint c = {.dir = "none"};
    /* the hint lists divisors up to PLAN_MAX_TP: this returns at all (a loop
     * up to 2^61 would not), and names only 1 */
    tp_error_clear();
    CHECK(checkpoint_validate_plan(&c, &p, 2) != 0 && strstr(tp_error_msg(), "valid tp values: 1") &&
              !strstr(tp_error_msg(), "valid tp values: 1,"), "%s", tp_error_msg());
    tp_error_clear();
    CHECK(checkpoint_validate_plan(&c, &p, PLAN_MAX_TP + 1) != 0 && strstr(tp_error_msg(), "from 1 to 4096"), "%s", tp_error_msg());
}
