/* `tpgen bench tokenizer`: tokenizer load time and encoding throughput.
 * Timings only; correctness is the tests' job. */
#include "kernels/err.h"
#include "core/models/llm/prompt.h"
#include "core/models/tokenizer/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }
/* CPU time of this thread: on a shared, oversubscribed machine it is a
 * steadier figure than wall time (the loader is single-threaded). */
static double cpu_s(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

/* A long mixed text: English prose, numbers, punctuation, code, accents,
 * CJK and emoji, repeated to about `bytes` bytes. */
static char *make_text(size_t bytes) {
    static const char *const parts[] = {
        "A photo of an astronaut riding a horse on Mars, 4k, highly detailed, cinematic lighting. ",
        "It's a dog's life, isn't it? We'll see; they'd've LOVED it!!! ",
        "numbers 1234567890 and 3.14159 and 1,000,000 -- https://example.com/path?q=1&r=2#frag\n",
        "code: def f(x): return x**2 + 1  # comment\n\tindented\r\n",
        "Ünïcödé accents: café, naïve, Ångström, façade; 日本語のテキスト、そして中文字符。 🐱🐶🎨 ",
        "MiXeD CaSe WoRdS AND ALLCAPS, helloWorld camelCase snake_case   multiple   spaces\n\n",
    };
    size_t np = sizeof parts / sizeof *parts, n = 0;
    char *s = xmalloc(bytes + 256);
    for (size_t i = 0; n < bytes; i++) {
        size_t k = strlen(parts[i % np]);
        memcpy(s + n, parts[i % np], k);
        n += k;
    }
    s[n] = 0;
    return s;
}

int bench_tokenizer(int argc, char **argv) {
    const char *model = "tests/data/qwen3-tokenizer";
    int loads = 3;
    size_t bytes = 1 << 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--loads") && i + 1 < argc) loads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bytes") && i + 1 < argc) bytes = (size_t)atol(argv[++i]);
        else {
            printf("usage: tpgen bench tokenizer [--model DIR] [--loads N] [--bytes N]\n"
                   "  load time (best and mean of N loads) and encoding speed on a mixed text of N bytes\n"
                   "  default model: tests/data/qwen3-tokenizer (the real Qwen3 tokenizer)\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (loads < 1) loads = 1;
    double best = 1e30, sum = 0, best_cpu = 1e30;
    tokenizer *t = NULL;
    for (int i = 0; i < loads; i++) {
        tokenizer_free(t);
        double t0 = now_s(), c0 = cpu_s();
        t = tokenizer_load(model);
        double dt = now_s() - t0, dc = cpu_s() - c0;
        best_cpu = dc < best_cpu ? dc : best_cpu;
        if (!t) {
            fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
            return 1;
        }
        best = dt < best ? dt : best;
        sum += dt;
    }
    printf("tokenizer   %s\n", tokenizer_source(t));
    printf("load        best %.1f ms wall (%.1f ms CPU), mean %.1f ms wall over %d loads (%d ids)\n", best * 1e3,
           best_cpu * 1e3, sum / loads * 1e3, loads, tokenizer_vocab_size(t));
    char *text = make_text(bytes);
    size_t len = strlen(text);
    int32_t *ids;
    int n;
    double t0 = now_s(), c0 = cpu_s();
    int rc = tokenizer_encode(t, text, len, &ids, &n);
    double dt = now_s() - t0, dc = cpu_s() - c0;
    if (rc) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        free(text);
        tokenizer_free(t);
        return 1;
    }
    printf("encode      %zu bytes -> %d tokens in %.1f ms wall (%.1f ms CPU): %.2f M tokens/s, %.1f MB/s (wall)\n",
           len, n, dt * 1e3, dc * 1e3, n / dt * 1e-6, (double)len / dt * 1e-6);
    /* the pipeline's case: one short prompt in the model's layout, padded to 512 */
    int32_t pids[512], mask[512];
    int reps = 200;
    t0 = now_s();
    for (int i = 0; i < reps; i++)
        prompt_encode_ids(t, prompt_format_for(t), "a cat holding a sign that says hello", 512, pids, mask, NULL);
    dt = now_s() - t0;
    printf("prompt      %.1f us per 512-token padded prompt (%s layout)\n", dt / reps * 1e6,
           prompt_format_name(prompt_format_for(t)));
    free(ids);
    free(text);
    tokenizer_free(t);
    return 0;
}
