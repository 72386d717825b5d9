/* A decoder-only LLM (Qwen3, Mistral, or Qwen3-VL's text model) used as a text encoder: one forward
 * pass whose model differences are configuration (docs/spec/flux2-text-vae.md §3).
 *
 *   x = embed(ids)                           hidden state 0
 *   per layer: x += O(attn(rope(qk_norm?(Q,K)(rms(x))), V))
 *              x += Down(silu(Gate(rms(x))) * Up(rms(x)))
 *                                             hidden state i = x after layer i-1
 *   hidden state N = final RMSNorm of the last layer's output
 *
 * Tensor parallelism (Megatron style): Q/K/V/gate/up are split by output
 * rows (colwise), O/down by input columns (rowwise) with an all-reduce of
 * their [L, H] partial outputs; RMSNorm weights are replicated. Rules for
 * counts tp does not divide, in llm_plan_build:
 * - query heads and intermediate size: tp must divide them (clear error);
 * - KV heads: sharded when tp divides n_kv_heads; otherwise K/V are
 *   replicated (every rank projects all KV heads, a small cost next to the
 *   MLP) and each rank uses the ones its query heads map to;
 * - embedding table: vocab-sharded (rows split, out-of-range ids gather 0,
 *   then one all-reduce of [L, H]) when tp divides the vocabulary,
 *   otherwise replicated. */
#ifndef TPGEN_LLM_H
#define TPGEN_LLM_H
#include "core/formats/checkpoint.h"
#include "core/formats/weights.h"
#include "plans/plan.h"
#include <jansson.h>
#include <stdint.h>

struct backend;
struct comm;

/* LLM_QWEN3VL: the language model of Qwen3VLForConditionalGeneration
 * (model_type qwen3_vl, nested text_config; FLUX.3). Its layers are Qwen3's
 * (q/k norm, GQA, no bias); its RoPE is M-RoPE, which for text-only input
 * is ordinary 1-D rotate-half RoPE: the three position rows (t, h, w) are
 * the same, so the interleaved sections pick the same angles
 * (docs/flux3.md "Text encoder"). */
typedef enum { LLM_QWEN3 = 0, LLM_MISTRAL = 1, LLM_QWEN3VL = 2 } llm_arch;

typedef struct llm_config {
    llm_arch arch;
    int hidden, n_layers, n_heads, n_kv_heads, head_dim, ffn, vocab;
    float eps;
    double rope_theta;
    int qk_norm;            /* per-head q/k RMSNorm before RoPE (Qwen3) */
    int sliding_window;     /* 0: plain causal; else sequences longer than it are refused */
    int rope_interleaved;   /* Q/K rows in llama.cpp's order (a llama GGUF): RoPE on pairs (2j, 2j+1) */
    int mrope_section[3];   /* Qwen3-VL: frequencies per t/h/w section (sum head_dim/2); text-only: unused */
    char prefix[64];        /* weight-name prefix, e.g. "model." or "language_model.model." */
} llm_config;

/* Parse text_encoder/config.json (Qwen3 flat; Mistral3 and Qwen3-VL with a
 * nested text_config). The prefix is left empty: llm_config_resolve_prefix fills it. */
int llm_config_parse(const json_t *config, const char *where, llm_config *out);
/* Find which accepted prefix the checkpoint uses (docs/spec/flux2-text-vae.md §3.6 for Mistral). */
int llm_config_resolve_prefix(llm_config *cfg, const checkpoint *ck);
const char *llm_arch_name(llm_arch a);

/* llama.cpp GGUF text encoders (llm_gguf.c; docs/gguf.md "Text encoders"):
 * general.architecture "qwen3" (FLUX.2-klein) or "llama" (Mistral Small,
 * FLUX.2-dev). llm_gguf_config reads the configuration from the `<arch>.*`
 * keys and token_embd's shape (where: the file, for messages);
 * llm_gguf_adopt does that for the one .gguf file of ck, renames its
 * tensors to the HF names this loader binds (prefix "model.") and, when
 * json (text_encoder/config.json, parsed) is not NULL, refuses any field on
 * which the two disagree. A llama file's Q/K rows are in the order
 * llama.cpp's converter permuted them to (LlamaModel.permute: each head's
 * rows [half, j] -> [j, half]); the config says so (rope_interleaved) and
 * the forward applies RoPE to pairs (2j, 2j+1), which is the HF rotation of
 * the unpermuted rows (the same dot products q.k), so no rows are moved. */
struct gguf_file;
int llm_gguf_is(const checkpoint *ck);   /* 1 when ck is one .gguf file */
int llm_gguf_config(const struct gguf_file *g, const char *where, llm_config *out);
int llm_gguf_adopt(checkpoint *ck, const llm_config *json, llm_config *out);

/* The TP plan for degree tp (the rule table in plans/llm_plan.c; globs
 * are the table's suffixes behind the checkpoint's prefix; symbols KV and
 * V are the KV heads and the vocabulary). The plan points into its own llm_plan: do not copy an
 * llm_plan after filling it. Fails when tp does not divide the query heads
 * or the MLP size. */
typedef plan_built llm_plan;
int plan_qwen3(const llm_config *cfg, int tp, llm_plan *out);
int plan_mistral(const llm_config *cfg, int tp, llm_plan *out);
int plan_qwen3vl(const llm_config *cfg, int tp, llm_plan *out);
int llm_plan_build(const llm_config *cfg, int tp, llm_plan *out);   /* dispatches on arch */

/* Layer-selection filter for weights_load: the embedding table, layers
 * [0, n_run) and the final norm when with_norm; never lm_head or the
 * vision tower. */
typedef struct llm_want {
    const llm_config *cfg;
    int n_run, with_norm;
} llm_want;
int llm_want_tensor(const char *name, void *ctx);

typedef struct llm llm;

/* Load the weights needed to produce hidden states up to index max_index
 * (<= n_layers; n_layers means the final norm too). Collective over c when
 * c is not NULL (tp = c->size, rank = c->rank). */
int llm_load(const checkpoint *ck, const llm_config *cfg, int max_index, struct backend *be,
             struct comm *c, dtype_t precision, llm **out, load_stats *st);
void llm_free(llm *m);
const llm_config *llm_cfg(const llm *m);
uint64_t llm_bytes(const llm *m);     /* backend bytes of this rank's weights */

/* Run the encoder on n tokens (positions 0..n-1, causal + key-padding
 * mask; mask NULL = all real) and write the hidden states with indices
 * idx[0..n_idx) stacked per token into out[n, n_idx*H] (host, f32):
 * out[t, k*H + d] = hidden_states[idx[k]][t, d]. Runs only the layers the
 * largest index needs. Collective over the model's communicator. */
int llm_forward(llm *m, const int32_t *ids, const int32_t *mask, int n, const int *idx, int n_idx,
                float *out);
/* The same with explicit position ids pos[n] (>= 0; NULL = 0..n-1): the
 * RoPE angle of row t is pos[t] x inv_freq. Causality and the key mask
 * stay by row index (as transformers' create_causal_mask with an
 * attention mask). FLUX.3 gives its pad rows position 1. */
int llm_forward_pos(llm *m, const int32_t *ids, const int32_t *mask, const int32_t *pos, int n, const int *idx,
                    int n_idx, float *out);

/* RoPE tables as the HF reference computes them (fp32 inv_freq, fp32
 * angle = pos * inv_freq, cos/sin of the fp32 angle; each frequency twice,
 * [n, head_dim], the rotate-half layout op_rope ROPE_HALF expects). */
void llm_rope_tables(int n, int head_dim, double theta, float *cos_out, float *sin_out);
/* The same for positions pos[0..n) (NULL: 0..n-1). */
void llm_rope_tables_pos(int n, const int32_t *pos, int head_dim, double theta, float *cos_out, float *sin_out);

#endif
