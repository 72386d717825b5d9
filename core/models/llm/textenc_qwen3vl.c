/* FLUX.3's text-encoder recipe around the Qwen3-VL language model
 * (textenc_qwen3vl.h). */
#include "textenc_qwen3vl.h"
#include "prompt.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

const int qwen3vl_stack[QWEN3VL_N_STACK] = {4, 8, 12, 16, 20, 24, 28, 32};

int qwen3vl_window(int n_real, int max_len) {
    long w = ((long)n_real + QWEN3VL_PAD_MULTIPLE - 1) / QWEN3VL_PAD_MULTIPLE * QWEN3VL_PAD_MULTIPLE;
    return (int)(w < max_len ? w : max_len);
}

void qwen3vl_positions(const int32_t *mask, int n, int32_t *pos) {
    for (int i = 0; i < n; i++) pos[i] = mask && !mask[i] ? 1 : i;
}

/* Qwen3-VL-Instruct's chat template, text-only user message, generation prompt on */
static char *render(const char *prompt) {
    return xasprintf("<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", prompt ? prompt : "");
}

/* Right padding whatever tokenizer_config.json says (the pipeline passes
 * padding_side="right"); truncation on the tokenizer's side, as there. */
int qwen3vl_tokenize(const tokenizer *tok, const char *prompt, int max_len, int32_t *ids, int32_t *mask,
                     int *n_real) {
    if (max_len <= 0) return tp_error("max_sequence_length must be positive (got %d)", max_len);
    int pad = tokenizer_pad_id(tok);
    if (pad < 0)
        return tp_error("%s has no pad token: set pad_token in tokenizer_config.json (Qwen3-VL: <|endoftext|>)",
                        tokenizer_source(tok));
    char *text = render(prompt);
    int32_t *all = NULL;
    int n = 0, rc = prompt_encode(tok, PROMPT_RAW, text, &all, &n);
    free(text);
    if (rc) return -1;
    int keep = n < max_len ? n : max_len;
    const int32_t *src = tokenizer_truncation_side(tok) == TOKENIZER_PAD_LEFT ? all + (n - keep) : all;
    for (int i = 0; i < max_len; i++) {
        ids[i] = i < keep ? src[i] : pad;
        mask[i] = i < keep;
    }
    if (n_real) *n_real = keep;
    free(all);
    return 0;
}

int qwen3vl_real_length(const tokenizer *tok, const char *prompt, int max_len, int *n_real) {
    char *text = render(prompt);
    int32_t *ids = NULL;
    int n = 0, rc = prompt_encode(tok, PROMPT_RAW, text, &ids, &n);
    free(text);
    free(ids);
    if (!rc) *n_real = n < max_len ? n : max_len;
    return rc;
}

int qwen3vl_check(const model_dir *md, int hidden, int n_layers) {
    int top = qwen3vl_stack[QWEN3VL_N_STACK - 1];
    if (n_layers < top)
        return tp_error("%s/text_encoder/config.json: the Qwen3-VL text model has %d layers but FLUX.3 stacks hidden "
                        "state %d; this is not FLUX.3's text encoder", md->root, n_layers, top);
    if (!model_dir_has(md, "transformer")) return 0;
    char *path = xasprintf("%s/transformer/config.json", md->root);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    int rc = 0;
    const json_t *jd = cfg ? json_object_get(cfg, "joint_attention_dim") : NULL;
    if (json_is_integer(jd) && json_integer_value(jd) != (json_int_t)QWEN3VL_N_STACK * hidden)
        rc = tp_error("%s: joint_attention_dim %lld does not match the text encoder: FLUX.3 stacks %d hidden states "
                      "of Qwen3-VL's hidden_size %d (text_encoder/config.json) = %d features; text encoder and "
                      "transformer do not belong together", path, (long long)json_integer_value(jd), QWEN3VL_N_STACK,
                      hidden, QWEN3VL_N_STACK * hidden);
    json_decref(cfg);
    free(path);
    return rc;
}
