/* Prompt layouts of the FLUX.2 pipelines, truncation and padding (docs/spec/flux2-text-vae.md §2). */
#include "prompt.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

/* diffusers pipelines/flux2/system_messages.py (and BFL's): one LF between
 * "object" and "attribution", no trailing newline */
const char *const PROMPT_DEV_SYSTEM_MESSAGE =
    "You are an AI that reasons about image descriptions. You give structured responses focusing on "
    "object relationships, object\nattribution and actions without speculation.";

prompt_format prompt_format_for(const tokenizer *t) {
    switch (tokenizer_get_family(t)) {
    case TOKENIZER_QWEN: return PROMPT_KLEIN;
    case TOKENIZER_MISTRAL: return PROMPT_DEV;
    default: return PROMPT_RAW;
    }
}

int prompt_format_parse(const char *name, prompt_format *f) {
    if (!strcmp(name, "klein")) *f = PROMPT_KLEIN;
    else if (!strcmp(name, "dev")) *f = PROMPT_DEV;
    else if (!strcmp(name, "raw")) *f = PROMPT_RAW;
    else return tp_error("unknown prompt format '%s' (use klein, dev or raw)", name);
    return 0;
}

const char *prompt_format_name(prompt_format f) {
    return f == PROMPT_KLEIN ? "klein" : f == PROMPT_DEV ? "dev" : "raw";
}

/* The dev pipeline removes every literal "[IMG]" from the prompt. */
static char *strip_img(const char *p) {
    static const char img[] = "[IMG]";
    char *out = xmalloc(strlen(p) + 1), *o = out;
    while (*p) {
        if (!strncmp(p, img, sizeof img - 1)) p += sizeof img - 1;
        else *o++ = *p++;
    }
    *o = 0;
    return out;
}

char *prompt_render(prompt_format f, const char *prompt) {
    if (!prompt) prompt = "";
    switch (f) {
    case PROMPT_KLEIN:
        return xasprintf("<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", prompt);
    case PROMPT_DEV: {
        char *p = strip_img(prompt);
        char *s = xasprintf("<s>[SYSTEM_PROMPT]%s[/SYSTEM_PROMPT][INST]%s[/INST]", PROMPT_DEV_SYSTEM_MESSAGE, p);
        free(p);
        return s;
    }
    default:
        return xstrdup(prompt);
    }
}

int prompt_encode(const tokenizer *t, prompt_format f, const char *prompt, int32_t **ids, int *n) {
    char *text = prompt_render(f, prompt);
    int rc = tokenizer_encode(t, text, strlen(text), ids, n);
    free(text);
    return rc;
}

int prompt_encode_ids(const tokenizer *t, prompt_format f, const char *prompt, int max_len,
                      int32_t *ids, int32_t *mask, int *n_real) {
    if (max_len <= 0) return tp_error("max_sequence_length must be positive (got %d)", max_len);
    int pad = tokenizer_pad_id(t);
    if (pad < 0)
        return tp_error("%s has no pad token: set pad_token in tokenizer_config.json", tokenizer_source(t));
    int32_t *all;
    int n;
    if (prompt_encode(t, f, prompt, &all, &n)) return -1;
    int keep = n < max_len ? n : max_len;
    /* truncation keeps the first ids (right side) unless the config says left */
    const int32_t *src = tokenizer_truncation_side(t) == TOKENIZER_PAD_LEFT ? all + (n - keep) : all;
    int start = tokenizer_padding_side(t) == TOKENIZER_PAD_LEFT ? max_len - keep : 0;
    for (int i = 0; i < max_len; i++) {
        int real = i >= start && i < start + keep;
        ids[i] = real ? src[i - start] : pad;
        mask[i] = real;
    }
    if (n_real) *n_real = keep;
    free(all);
    return 0;
}
