/* FLUX.3's use of its Qwen3-VL text encoder (private to textenc*.c): which
 * hidden states, the prompt window, the chat template, the position ids.
 * Read from diffusers 0.42.1 modular_pipelines/flux3/encoders.py
 * (Flux3TextEncoderStep._get_qwen3_vl_prompt_embeds); docs/flux3.md. */
#ifndef TPGEN_TEXTENC_QWEN3VL_H
#define TPGEN_TEXTENC_QWEN3VL_H
#include "core/formats/checkpoint.h"
#include "textenc.h"
#include "core/models/tokenizer/tokenizer.h"
#include <stdint.h>

#define QWEN3VL_N_STACK 8          /* hidden states 4, 8, ..., 32 */
#define QWEN3VL_PAD_MULTIPLE TEXTENC_FLUX3_PAD_MULTIPLE   /* Flux3TextEncoderStep(pad_multiple=80) */
#define QWEN3VL_MAX_LEN TEXTENC_FLUX3_MAX_LEN             /* max_sequence_length default */

extern const int qwen3vl_stack[QWEN3VL_N_STACK];

/* The window for n_real template tokens (already truncated to max_len):
 * n_real rounded up to the pad multiple, capped at max_len. */
int qwen3vl_window(int n_real, int max_len);
/* The position ids the pipeline passes: arange(L) with every pad row
 * (mask 0) set to 1 (the transformers 4.57 rule FLUX.3 was trained with). */
void qwen3vl_positions(const int32_t *mask, int n, int32_t *pos);
/* "<|im_start|>user\n" P "<|im_end|>\n<|im_start|>assistant\n" tokenised,
 * truncated to max_len, right-padded with the pad token to exactly max_len. */
int qwen3vl_tokenize(const tokenizer *tok, const char *prompt, int max_len, int32_t *ids, int32_t *mask,
                     int *n_real);
/* Template tokens of the prompt truncated to max_len (the window's input). */
int qwen3vl_real_length(const tokenizer *tok, const char *prompt, int max_len, int *n_real);
/* Checks a Qwen3-VL encoder against its pipeline folder: enough layers for
 * hidden state 32, and 8 x hidden = the transformer's joint_attention_dim
 * when transformer/config.json exists. */
int qwen3vl_check(const model_dir *md, int hidden, int n_layers);

#endif
