/* TP plans of the decoder LLM text encoders: Qwen3 (FLUX.2-klein) and the
 * Mistral Small 3.x language model (FLUX.2-dev) split the same way,
 * Megatron style: Q/K/V/gate/up colwise, O/down rowwise; q_norm/k_norm
 * (Qwen3 only) and the RMSNorm weights are replicated (no rule). K/V are
 * sharded only when tp divides the KV heads (symbol KV) and the embedding
 * table only when tp divides the vocabulary (symbol V). The globs sit
 * behind the checkpoint's prefix (core/models/llm/llm_plan.c): "model." for
 * Qwen3; model.language_model., language_model.model. or model. for
 * Mistral (docs/spec/flux2-text-vae.md §3.6); model.language_model. for
 * Qwen3-VL (FLUX.3, the same names as Qwen3 behind it), whose vision tower, projector and
 * lm_head match no rule and are never loaded (llm_want_tensor). */
#include "plan.h"

static const plan_rule k_llm_rules[] = {
    {"embed_tokens.weight", STYLE_COLWISE, NULL, "V"},
    {"layers.*.self_attn.q_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"layers.*.self_attn.k_proj.weight", STYLE_COLWISE, NULL, "KV"},
    {"layers.*.self_attn.v_proj.weight", STYLE_COLWISE, NULL, "KV"},
    {"layers.*.self_attn.o_proj.weight", STYLE_ROWWISE, NULL, NULL},
    {"layers.*.mlp.gate_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"layers.*.mlp.up_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"layers.*.mlp.down_proj.weight", STYLE_ROWWISE, NULL, NULL},
};
#define N_LLM_RULES ((int)(sizeof k_llm_rules / sizeof k_llm_rules[0]))

const plan_table plan_table_qwen3 = {"qwen3", k_llm_rules, N_LLM_RULES};
const plan_table plan_table_mistral = {"mistral", k_llm_rules, N_LLM_RULES};
const plan_table plan_table_qwen3vl = {"qwen3vl", k_llm_rules, N_LLM_RULES};
