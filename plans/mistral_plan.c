/* TP plan of the Mistral Small 3.x language model (FLUX.2-dev text
 * encoder). Same split as Qwen3 (no q/k norm). The globs sit behind the
 * prefix the checkpoint uses (model.language_model., language_model.model.
 * or model., spec flux2-text-vae.md §3.6); the vision tower, projector and
 * lm_head match no rule and are never loaded (llm_want_tensor). */
#include "plan.h"

static const plan_rule k_mistral_rules[] = {
    {"embed_tokens.weight", STYLE_COLWISE, NULL, "V"},
    {"layers.*.self_attn.q_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"layers.*.self_attn.k_proj.weight", STYLE_COLWISE, NULL, "KV"},
    {"layers.*.self_attn.v_proj.weight", STYLE_COLWISE, NULL, "KV"},
    {"layers.*.self_attn.o_proj.weight", STYLE_ROWWISE, NULL, NULL},
    {"layers.*.mlp.gate_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"layers.*.mlp.up_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"layers.*.mlp.down_proj.weight", STYLE_ROWWISE, NULL, NULL},
};

const plan_table plan_table_mistral = {"mistral", k_mistral_rules,
                                       (int)(sizeof k_mistral_rules / sizeof k_mistral_rules[0])};
