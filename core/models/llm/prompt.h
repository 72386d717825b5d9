/* Prompt layouts of the FLUX.2 pipelines (docs/spec/flux2-text-vae.md §2):
 *
 *  klein (Qwen3): "<|im_start|>user\n" P "<|im_end|>\n<|im_start|>assistant\n"
 *                 "<think>\n\n</think>\n\n"; no BOS.
 *  dev (Mistral): "<s>[SYSTEM_PROMPT]" SYSTEM "[/SYSTEM_PROMPT][INST]" P "[/INST]"
 *                 with every "[IMG]" removed from P first.
 *
 * The rendered text is tokenised as a whole (special-token strings inside the
 * user prompt become special tokens, as in diffusers), truncated to max_len
 * (on the tokenizer's truncation side, default right) and padded with the pad
 * token on the tokenizer's padding side (tokenizer_config.json
 * `padding_side`, default right). */
#ifndef TPGEN_PROMPT_H
#define TPGEN_PROMPT_H
#include "core/models/tokenizer/tokenizer.h"

typedef enum {
    PROMPT_RAW = 0,  /* the text as given, no template */
    PROMPT_KLEIN,    /* Qwen3 chat template, thinking disabled */
    PROMPT_DEV       /* Mistral system + [INST] layout */
} prompt_format;

/* The FLUX.2-dev system message (exact bytes, one LF inside). */
extern const char *const PROMPT_DEV_SYSTEM_MESSAGE;

/* The template of the tokenizer's family (klein for Qwen, dev for Mistral,
 * raw otherwise). */
prompt_format prompt_format_for(const tokenizer *t);
/* Parse "klein" | "dev" | "raw"; -1 after tp_error for anything else. */
int prompt_format_parse(const char *name, prompt_format *f);
const char *prompt_format_name(prompt_format f);

/* Render the template as text (malloc'ed, caller frees). */
char *prompt_render(prompt_format f, const char *prompt);

/* Render and tokenise without truncation or padding; *ids malloc'ed. */
int prompt_encode(const tokenizer *t, prompt_format f, const char *prompt, int32_t **ids, int *n);

/* Render, tokenise, truncate to max_len and pad to exactly max_len.
 * ids[max_len] and mask[max_len] (1 real, 0 pad) are filled; *n_real is the
 * number of real tokens kept (may be NULL). Fails if the tokenizer has no
 * pad token. */
int prompt_encode_ids(const tokenizer *t, prompt_format f, const char *prompt, int max_len,
                      int32_t *ids, int32_t *mask, int *n_real);

#endif
