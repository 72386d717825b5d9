/* libFuzzer harness: the bytes as a tokenizer.json or tekken.json, loaded
 * through the fast scanner and through jansson alone. The two must agree
 * (both fail, or both load and give the same ids), else the harness
 * aborts: the fast path must never change the answer. A loaded tokenizer
 * encodes a fixed text and the input's own first bytes. */
#include "kernels/err.h"
#include "core/models/tokenizer/tokenizer_int.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_file[128];

static int encode(const tokenizer *t, const char *s, size_t n, int32_t **ids) {
    int k = 0;
    if (tokenizer_encode(t, s, n, ids, &k)) return -1;
    return k;
}

static void same_ids(const tokenizer *a, const tokenizer *b, const char *s, size_t n) {
    int32_t *ia = NULL, *ib = NULL;
    int na = encode(a, s, n, &ia), nb = encode(b, s, n, &ib);
    if (na != nb || (na > 0 && memcmp(ia, ib, (size_t)na * sizeof *ia))) {
        fprintf(stderr, "fast and jansson tokenizers disagree on '%.*s': %d vs %d ids\n", (int)n, s, na, nb);
        abort();
    }
    free(ia), free(ib);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_file[0]) snprintf(g_file, sizeof g_file, "/tmp/tpgen-fuzz-tok-%d.json", (int)getpid());
    FILE *f = fopen(g_file, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    tokenizer *fast = tok_load_json_ex(g_file, NULL, 1);
    tokenizer *slow = tok_load_json_ex(g_file, NULL, 0);
    if (!fast != !slow) {
        fprintf(stderr, "fast path %s, jansson path %s\n", fast ? "loaded" : "failed", slow ? "loaded" : "failed");
        abort();
    }
    if (fast) {
        static const char text[] = "a red fox in the snow, 1024px <|im_start|> caf\xc3\xa9  \n\t!";
        same_ids(fast, slow, text, sizeof text - 1);
        same_ids(fast, slow, (const char *)data, size < 64 ? size : 64);
    }
    tokenizer_free(fast);
    tokenizer_free(slow);
    return 0;
}
