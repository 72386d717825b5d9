/* `tpgen tokenize`: print the token ids of a prompt, raw or inside the
 * model's prompt layout, optionally truncated/padded like the pipeline. */
#include "commands.h"
#include "core/dist/dist.h"
#include "core/formats/gguf.h"
#include "kernels/err.h"
#include "core/models/llm/prompt.h"
#include "core/models/tokenizer/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *model, *prompt, *format;
    int chat, json, max_len;
} tokenize_args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: tpgen tokenize --model DIR --prompt TEXT [--chat] [--format klein|dev|raw]\n"
            "                      [--max-length N] [--json]\n\n"
            "  --model DIR       a pipeline folder (uses DIR/tokenizer/), a folder holding\n"
            "                    tokenizer.json (+ tokenizer_config.json) or tekken.json, that file,\n"
            "                    or a GGUF file with tokenizer.ggml.* metadata (a llama.cpp text encoder)\n"
            "  --prompt TEXT     UTF-8 text ('-' reads it from standard input)\n"
            "  --chat            wrap the prompt in the model's layout: the klein chat template\n"
            "                    for Qwen tokenizers, the dev system/[INST] layout for Mistral\n"
            "  --format F        use layout F (klein, dev or raw) whatever the tokenizer\n"
            "  --max-length N    truncate and pad to N tokens as the pipeline does (prints the mask)\n"
            "  --json            print {\"ids\": [...]} on one line (with \"mask\" under --max-length)\n");
}

/* Returns 0 to run, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, tokenize_args *a) {
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) return usage(stdout), 1;
        else if (!strcmp(o, "--chat")) a->chat = 1;
        else if (!strcmp(o, "--json")) a->json = 1;
        else if (!strcmp(o, "--model") && has) a->model = argv[++i];
        else if (!strcmp(o, "--prompt") && has) a->prompt = argv[++i];
        else if (!strcmp(o, "--format") && has) a->format = argv[++i];
        else if (!strcmp(o, "--max-length") && has) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v <= 0 || v > 1 << 20) {
                fprintf(stderr, "tpgen tokenize: error: --max-length needs a positive integer, got '%s'\n", argv[i]);
                return 2;
            }
            a->max_len = (int)v;
        } else {
            fprintf(stderr, "tpgen tokenize: error: %s '%s'\n\n", has || o[0] != '-' ? "unknown option" : "missing value for", o);
            usage(stderr);
            return 2;
        }
    }
    if (!a->model || !a->prompt) {
        fprintf(stderr, "tpgen tokenize: error: --model and --prompt are required\n\n");
        usage(stderr);
        return 2;
    }
    return 0;
}

/* The prompt from stdin. A NUL byte would cut the C string there and the
 * rest would be dropped silently, so it is refused with its offset. */
static char *read_stdin(void) {
    size_t cap = 4096, n = 0, k;
    char *s = xmalloc(cap);
    while ((k = fread(s + n, 1, cap - n - 1, stdin)) > 0)
        if ((n += k) + 1 == cap) s = xrealloc(s, cap *= 2);
    s[n] = 0;
    const char *nul = memchr(s, 0, n);
    if (nul) {
        tp_error("--prompt -: the text on stdin has a NUL byte at byte offset %zu (of %zu); a prompt is UTF-8 text "
                 "without NUL bytes", (size_t)(nul - s), n);
        free(s);
        return NULL;
    }
    return s;
}

static void print_token(const tokenizer *t, int id) {
    int len;
    const char *s = tokenizer_token_bytes(t, id, &len);
    printf("%8d  '", id);
    for (int i = 0; s && i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') printf("\\n");
        else if (c == '\t') printf("\\t");
        else if (c == '\\' || c == '\'') printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c); /* UTF-8 bytes pass through; partial characters show as the terminal likes */
    }
    printf("'\n");
}

static void print_ids(const tokenizer *t, const int32_t *ids, const int32_t *mask, int n, int json) {
    if (json) {
        printf("{\"ids\": [");
        for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        if (mask) {
            printf("], \"mask\": [");
            for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", mask[i]);
        }
        printf("]}\n");
        return;
    }
    for (int i = 0; i < n; i++) {
        if (mask && !mask[i]) printf("%8d  (pad)\n", ids[i]);
        else print_token(t, ids[i]);
    }
    printf("# %d tokens (%s)\n", n, tokenizer_source(t));
}

/* Load, encode and print (rank 0 prints). Returns 0 or -1 with tp_error. */
static int run_tokenize(const tokenize_args *a, const char *prompt, int rank) {
    /* a GGUF file (told by its magic): the tokenizer from its metadata */
    tokenizer *t = gguf_is_gguf(a->model) ? tokenizer_load_gguf(a->model) : tokenizer_load(a->model);
    if (!t) return -1;
    prompt_format f = a->chat ? prompt_format_for(t) : PROMPT_RAW;
    int rc = a->format ? prompt_format_parse(a->format, &f) : 0;
    int32_t *ids = NULL, *mask = NULL;
    int n = 0;
    if (rc == 0 && a->max_len) {
        ids = xmalloc((size_t)a->max_len * sizeof *ids);
        mask = xmalloc((size_t)a->max_len * sizeof *mask);
        n = a->max_len;
        rc = prompt_encode_ids(t, f, prompt, a->max_len, ids, mask, NULL);
    } else if (rc == 0) {
        rc = prompt_encode(t, f, prompt, &ids, &n);
    }
    if (rc == 0 && rank == 0) print_ids(t, ids, mask, n, a->json);
    free(ids);
    free(mask);
    tokenizer_free(t);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    tokenize_args a;
    int pr = parse_args(argc, argv, &a);
    if (pr) return pr == 1 ? 0 : 2;
    dist d;
    if (dist_init(&argc, &argv, &d)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    int from_stdin = !strcmp(a.prompt, "-");
    char *stdin_text = from_stdin ? read_stdin() : NULL;
    int rc = from_stdin && !stdin_text ? -1 : run_tokenize(&a, stdin_text ? stdin_text : a.prompt, d.world_rank);
    free(stdin_text);
    /* every rank did the same work; agree so that all exit alike */
    if (dist_agree(d.world, rc)) dist_report_error(d.world);
    fflush(stdout);
    dist_finalize(&d);
    return rc ? 1 : 0;
}
