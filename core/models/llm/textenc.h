/* The text encoder of a FLUX.2 or FLUX.3 pipeline folder: prompt ->
 * prompt_embeds.
 *
 * FLUX.2-klein uses Qwen3 (hidden states 9, 18, 27), FLUX.2-dev uses the
 * language model of Mistral Small 3.x (hidden states 10, 20, 30), FLUX.3
 * the language model of Qwen3-VL (hidden states 4, 8, ..., 32: K = 8); which
 * one is read from model_index.json / text_encoder/config.json. The LLM is
 * sharded over the ranks of `c` by its TP plan (each rank reads only its
 * shard) and only the layers the embeddings need are loaded and run.
 *
 * prompt_embeds[t, k*H + d] = hidden_states[layer_k][t, d] (spec
 * docs/spec/flux2-text-vae.md §2.3): width 3H, which is the transformer's
 * joint_attention_dim. Every rank of `c` gets the full embeddings.
 *
 * All calls taking a textenc are collective over its communicator and agree
 * on errors (dist_agree), so a failure returns -1 on every rank.
 * Free the encoder (textenc_free) before loading the transformer: that is
 * what gives the denoiser its memory back. */
#ifndef TPGEN_TEXTENC_H
#define TPGEN_TEXTENC_H
#include "kernels/tensor.h"
#include "core/formats/weights.h"
#include <stdint.h>

struct backend;
struct comm;
typedef struct textenc textenc;

/* Default max_sequence_length of the FLUX.2 pipelines (FLUX.3: 8192, see
 * textenc_max_len). */
#define TEXTENC_DEFAULT_MAX_LEN 512
/* FLUX.3's defaults (diffusers Flux3TextEncoderStep): the cap and the window multiple. */
#define TEXTENC_FLUX3_MAX_LEN 8192
#define TEXTENC_FLUX3_PAD_MULTIPLE 80

/* Load <model_dir>/text_encoder (+ tokenizer/) for the ranks of c (NULL:
 * single process, no sharding). precision: DT_F32 (reference) or DT_BF16
 * (weights stay bf16; activations and the residual stream are f32).
 * st (may be NULL) receives this rank's load statistics. */
int textenc_load(const char *model_dir, struct backend *be, struct comm *c, dtype_t precision,
                 textenc **out, load_stats *st);

/* The prompt window L, the number of rows textenc_encode must be given to
 * reproduce the pipeline. FLUX.2 (fixed window): L = max_len. FLUX.3: the
 * template tokens of the prompt (truncated to max_len) rounded up to
 * textenc_pad_multiple (80), capped at max_len (<= 0: textenc_max_len, 8192).
 * Tokenizes only; collective (agrees on errors). */
int textenc_window(textenc *t, const char *prompt, int max_len, int *L);
int textenc_max_len(const textenc *t);       /* the pipeline's default cap: 512, FLUX.3 8192 */
int textenc_pad_multiple(const textenc *t);  /* FLUX.3 80; 0: fixed window */

/* Where a text encoder comes from (--text-encoder PATH, --family).
 * path: a folder or one checkpoint file in the HF names, with or without
 * a `model.` / `text_encoder.` prefix (Mistral3 also `language_model.model.`);
 * NULL: <model_dir>/text_encoder. Its config is the folder's config.json, or
 * the one beside the file, else derived from the shapes for the family
 * (dev 1: Mistral, 0: Qwen3; -1: unknown, then a config.json is required;
 * textenc_config.c). The tokenizer: `tokenizer` when set, else
 * <model_dir>/tokenizer, else the text-encoder folder when it holds the
 * tokenizer files, else an error saying to pass --model. */
typedef struct textenc_source {
    const char *model_dir;       /* pipeline folder (model_index.json, tokenizer/) or NULL */
    const char *path;            /* text-encoder folder or file, or NULL */
    const char *tokenizer;       /* tokenizer folder, or NULL */
    int dev;                     /* 1 FLUX.2-dev, 0 klein, -1 unknown */
} textenc_source;
int textenc_load_from(const textenc_source *src, struct backend *be, struct comm *c, dtype_t precision,
                      textenc **out, load_stats *st);
/* The tokenizer folder textenc_load_from would use (malloc'ed), or NULL + tp_error. */
char *textenc_tokenizer_dir(const textenc_source *src);
struct llm_config;
struct checkpoint;
/* The config of a checkpoint without config.json (textenc_config.c). */
int textenc_config_derive(const struct checkpoint *ck, int dev, struct llm_config *out);

/* Tokenize `prompt` with the pipeline's chat template, truncate/pad to
 * max_len (<= 0: 512) and run the encoder. Outputs (host, caller-owned):
 * embeds [max_len, K*H] f32, ids [max_len], mask [max_len] (1 real, 0 pad);
 * ids and mask may be NULL. For FLUX.3 pass max_len = the L of
 * textenc_window (max_len <= 0 is refused there): the rows are then exactly the pipeline's (right padding
 * with <|endoftext|>, pad rows at position 1), and the DiT attends to all L
 * rows (the mask is informational). */
int textenc_encode(textenc *t, const char *prompt, int max_len, float *embeds, int32_t *ids,
                   int32_t *mask);

/* The same from token ids already padded to n (mask: 1 real, 0 pad; FLUX.3
 * derives the position ids from it). */
int textenc_encode_ids(textenc *t, const int32_t *ids, const int32_t *mask, int n, float *embeds);

int textenc_hidden(const textenc *t);      /* H of the LLM */
int textenc_embed_dim(const textenc *t);   /* K*H = the transformer's joint_attention_dim */
const char *textenc_kind(const textenc *t);/* "qwen3", "mistral" or "qwen3vl" */
uint64_t textenc_bytes(const textenc *t);  /* backend bytes held by this rank's weights */
void textenc_free(textenc *t);             /* NULL ok; returns all backend memory */

/* Write a tiny random Qwen3 text encoder into <model_dir>/text_encoder
 * (config.json + model.safetensors, BF16; the shape of golden/klein-tiny:
 * 28 layers, 4/2 heads of 8, the real 151936-token vocabulary, so klein's
 * hidden states (9,18,27) apply unchanged) and copy the real Qwen3 tokenizer files
 * into <model_dir>/tokenizer. Contract with make-tiny's transformer: the
 * hidden size is joint_attention_dim / 3 read from
 * <model_dir>/transformer/config.json when that file exists, else
 * TEXTENC_TINY_HIDDEN (so joint_attention_dim must be 3 * that). */
#define TEXTENC_TINY_HIDDEN 32
int textenc_write_tiny(const char *model_dir, unsigned seed);

/* The same for FLUX.2-dev: a tiny random Mistral3ForConditionalGeneration
 * (nested text_config, legacy `language_model.model.` weight names, plus the
 * lm_head and a vision tensor the encoder skips; 31 layers so that hidden
 * states 10, 20, 30 exist; 4/2 heads of hidden/4; a vocabulary of
 * TEXTENC_TINY_MISTRAL_VOCAB) and the mini Tekken tokenizer of
 * tests/data/tekken-mini/hf (tokenizer.json form, left padding, <pad> 11)
 * into <model_dir>/tokenizer. Same hidden-size contract as above. Writes no
 * model_index.json (the caller names the pipeline). */
#define TEXTENC_TINY_MISTRAL_VOCAB 1280
int textenc_write_tiny_mistral(const char *model_dir, unsigned seed);
/* The same for FLUX.3: a tiny random Qwen3VLForConditionalGeneration (nested
 * text_config, model.language_model.* names, a final norm and a vision
 * tensor the encoder skips; 33 layers so that hidden states 4..32 exist;
 * 4/2 heads of hidden/4; the real vocabulary) and the Qwen3 tokenizer files.
 * The hidden size is joint_attention_dim / 8 of
 * <model_dir>/transformer/config.json when it exists (a multiple of 64),
 * else TEXTENC_TINY_HIDDEN. Writes no model_index.json. */
int textenc_write_tiny_qwen3vl(const char *model_dir, unsigned seed);
/* The same at the real widths: Qwen3-4B (36 layers, H 2560; the Qwen3
 * tokenizer) or, dev, Mistral Small 3.x's language model (40 layers,
 * H 5120; the mini Tekken tokenizer, whose ids fit its vocabulary),
 * streamed to disk; sparse: the matrices as holes. */
int textenc_write_full(const char *model_dir, int dev, unsigned seed, int sparse);

#endif
