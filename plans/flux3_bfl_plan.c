/* The FLUX.3 transformer plan for Black Forest Labs single-file checkpoints
 * (docs/flux3.md "BFL single files"; the names are the inverse of diffusers
 * 0.42.1's convert_flux3_transformer_checkpoint_to_diffusers). The same
 * split as plans/flux3_plan.c: BFL FLUX.3 fuses nothing, so each rule is a
 * rename (q_proj/k_proj/v_proj colwise, attn_out rowwise, the [gate; up]
 * mlp_in colwise block by block, mlp_out rowwise); '*' matches only a
 * block index, and every rule must match. Names behind the
 * `model.diffusion_model.` prefix that ComfyUI-style files carry are read
 * without it (checkpoint_open). Everything not listed
 * (emb_in, txt_in, time_in, ref_time_in, modulations, QK norms,
 * final_layer) is replicated. */
#include "plan.h"

#define FLUX3_BFL_BLOCK(prefix)                                                                    \
    {.glob = prefix ".*.q_proj.weight", .style = STYLE_COLWISE, .blocks = NULL},                   \
    {.glob = prefix ".*.k_proj.weight", .style = STYLE_COLWISE, .blocks = NULL},                   \
    {.glob = prefix ".*.v_proj.weight", .style = STYLE_COLWISE, .blocks = NULL},                   \
    {.glob = prefix ".*.attn_out.weight", .style = STYLE_ROWWISE, .blocks = NULL},                 \
    {.glob = prefix ".*.mlp_in.weight", .style = STYLE_PACKED_COLWISE, .blocks = "1,1"},           \
    {.glob = prefix ".*.mlp_out.weight", .style = STYLE_ROWWISE, .blocks = NULL}

static const plan_rule k_flux3_bfl_rules[] = {
    FLUX3_BFL_BLOCK("txt_mode_blocks"), FLUX3_BFL_BLOCK("content_mode_blocks.image"),
    FLUX3_BFL_BLOCK("content_mode_blocks.image_cond"), FLUX3_BFL_BLOCK("single_blocks")};

const plan_table plan_table_flux3_bfl = {"flux3 (BFL names)", k_flux3_bfl_rules,
                                        (int)(sizeof k_flux3_bfl_rules / sizeof k_flux3_bfl_rules[0])};
