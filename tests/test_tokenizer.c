/* Tokenizer tests: the real Qwen3 tokenizer against ids computed by the
 * reference implementation (golden tokens.json), a hand-made Tekken-format
 * tokenizer (tests/data/tekken-mini) against hand-derived ids in both file
 * forms, the prompt layouts, padding, and bad input. */
#include "test.h"
#include "core/err.h"
#include "core/models/prompt.h"
#include "core/models/tokenizer.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define QWEN_DIR "tests/data/qwen3-tokenizer"

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
