/* The FLUX.2 transformer plan, docs/spec/flux2-transformer.md §7.2. Everything
 * not listed (embedders, modulations, norms, norm_out, proj_out) is
 * replicated. D = heads * head_dim, M = int(D * mlp_ratio): the model sets
 * the symbols from its config (core/models/flux2_plan.c). */
#include "plan.h"

static const plan_rule k_flux2_rules[] = {
    /* double-stream attention: heads split, outputs all-reduced */
    {"transformer_blocks.*.attn.to_q.weight", STYLE_COLWISE, NULL, NULL},
    {"transformer_blocks.*.attn.to_k.weight", STYLE_COLWISE, NULL, NULL},
    {"transformer_blocks.*.attn.to_v.weight", STYLE_COLWISE, NULL, NULL},
    {"transformer_blocks.*.attn.add_q_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"transformer_blocks.*.attn.add_k_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"transformer_blocks.*.attn.add_v_proj.weight", STYLE_COLWISE, NULL, NULL},
    {"transformer_blocks.*.attn.to_out.0.weight", STYLE_ROWWISE, NULL, NULL},
    {"transformer_blocks.*.attn.to_add_out.weight", STYLE_ROWWISE, NULL, NULL},
    /* double-stream MLPs: [gate; up] rows split block by block */
    {"transformer_blocks.*.ff.linear_in.weight", STYLE_PACKED_COLWISE, "1,1", NULL},
    {"transformer_blocks.*.ff.linear_out.weight", STYLE_ROWWISE, NULL, NULL},
    {"transformer_blocks.*.ff_context.linear_in.weight", STYLE_PACKED_COLWISE, "1,1", NULL},
    {"transformer_blocks.*.ff_context.linear_out.weight", STYLE_ROWWISE, NULL, NULL},
    /* single-stream fused projections */
    {"single_transformer_blocks.*.attn.to_qkv_mlp_proj.weight", STYLE_PACKED_COLWISE, "D,D,D,M,M", NULL},
    {"single_transformer_blocks.*.attn.to_out.weight", STYLE_PACKED_ROWWISE, "D,M", NULL},
};

const plan_table plan_table_flux2 = {"flux2", k_flux2_rules, (int)(sizeof k_flux2_rules / sizeof k_flux2_rules[0])};
