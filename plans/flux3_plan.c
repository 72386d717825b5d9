/* The FLUX.3 transformer plan (docs/flux3.md). Every block, the mode
 * blocks of the three token modes and the joint single blocks alike, has
 * separate Q/K/V (colwise: whole heads per rank), an output projection
 * (rowwise), a fused [gate; up] ff.linear_in (colwise block by block) and
 * ff.linear_out (rowwise). Everything not listed (embedders, modulations,
 * QK norms, norm_out, proj_out) is replicated. The symbols (D, M) and the
 * divisor (num_attention_heads) come from the config: flux3_plan in
 * core/models/flux3/flux3.c. */
#include "plan.h"

#define FLUX3_BLOCK_RULES(prefix)                                                          \
    {.glob = prefix ".*.attn.to_q.weight", .style = STYLE_COLWISE, .blocks = NULL},        \
    {.glob = prefix ".*.attn.to_k.weight", .style = STYLE_COLWISE, .blocks = NULL},        \
    {.glob = prefix ".*.attn.to_v.weight", .style = STYLE_COLWISE, .blocks = NULL},        \
    {.glob = prefix ".*.attn.to_out.0.weight", .style = STYLE_ROWWISE, .blocks = NULL},    \
    {.glob = prefix ".*.ff.linear_in.weight", .style = STYLE_PACKED_COLWISE, .blocks = "1,1"}, \
    {.glob = prefix ".*.ff.linear_out.weight", .style = STYLE_ROWWISE, .blocks = NULL}

static const plan_rule k_flux3_rules[] = {
    FLUX3_BLOCK_RULES("txt_mode_blocks"),
    FLUX3_BLOCK_RULES("mode_blocks.image"),
    FLUX3_BLOCK_RULES("mode_blocks.image_cond"),
    FLUX3_BLOCK_RULES("single_transformer_blocks"),
};

const plan_table plan_table_flux3 = {"flux3", k_flux3_rules, (int)(sizeof k_flux3_rules / sizeof k_flux3_rules[0])};
