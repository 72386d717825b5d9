/* TP plan of the Qwen3 text encoder (FLUX.2-klein): Megatron-style split of
 * attention and MLP; q_norm/k_norm and the RMSNorm weights are replicated
 * (no rule). K/V are sharded only when tp divides the KV heads, and the
 * embedding table only when tp divides the vocabulary (llm.h). */
#include "core/models/llm.h"

static const llm_rule k_qwen3_rules[] = {
    {"embed_tokens.weight", STYLE_COLWISE, LLM_RULE_IF_TP_DIVIDES_VOCAB},
    {"layers.*.self_attn.q_proj.weight", STYLE_COLWISE, LLM_RULE_ALWAYS},
    {"layers.*.self_attn.k_proj.weight", STYLE_COLWISE, LLM_RULE_IF_TP_DIVIDES_KV},
    {"layers.*.self_attn.v_proj.weight", STYLE_COLWISE, LLM_RULE_IF_TP_DIVIDES_KV},
    {"layers.*.self_attn.o_proj.weight", STYLE_ROWWISE, LLM_RULE_ALWAYS},
    {"layers.*.mlp.gate_proj.weight", STYLE_COLWISE, LLM_RULE_ALWAYS},
    {"layers.*.mlp.up_proj.weight", STYLE_COLWISE, LLM_RULE_ALWAYS},
    {"layers.*.mlp.down_proj.weight", STYLE_ROWWISE, LLM_RULE_ALWAYS},
};

int plan_qwen3(const llm_config *cfg, int tp, llm_plan *out) {
    return llm_plan_fill(cfg, tp, "qwen3", k_qwen3_rules, (int)(sizeof k_qwen3_rules / sizeof k_qwen3_rules[0]), out);
}
