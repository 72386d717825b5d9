/* TP plan of the Qwen3 text encoder (FLUX.2-klein): Megatron-style split of
 * attention and MLP; q_norm/k_norm and the RMSNorm weights are replicated
 * (no rule). K/V are sharded only when tp divides the KV heads (symbol KV)
 * and the embedding table only when tp divides the vocabulary (symbol V);
 * the globs sit behind the checkpoint's prefix (core/models/llm_plan.c). */
#include "plan.h"

static const plan_rule k_qwen3_rules[] = {
    {"embed_tokens.weight", STYLE_COLWISE, NULL, "V"},
    {"layers.*.self_attn.q_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"layers.*.self_attn.k_proj.weight", STYLE_COLWISE, NULL, "KV"},
    {"layers.*.self_attn.v_proj.weight", STYLE_COLWISE, NULL, "KV"},
    {"layers.*.self_attn.o_proj.weight", STYLE_ROWWISE, NULL, NULL},
    {"layers.*.mlp.gate_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"layers.*.mlp.up_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"layers.*.mlp.down_proj.weight", STYLE_ROWWISE, NULL, NULL},
};

const plan_table plan_table_qwen3 = {"qwen3", k_qwen3_rules, (int)(sizeof k_qwen3_rules / sizeof k_qwen3_rules[0])};
