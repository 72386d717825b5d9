/* The FLUX.2 transformer plan for Black Forest Labs single-file checkpoints
 * (flux2-dev.safetensors, flux-2-klein-*.safetensors; spec
 * flux2-transformer.md Appendix A). The same split as plans/flux2_plan.c
 * under BFL names, with one difference: BFL fuses the double-block Q, K and
 * V of each stream into one `qkv` [3D, D], which is packed colwise with
 * blocks D,D,D so that each rank reads only its own heads' rows of Q, K and
 * V (core/models/flux2/flux2.c binds the three row blocks as views). Everything
 * not listed (img_in, txt_in, time_in, guidance_in, modulations, norms,
 * final_layer) is replicated. */
#include "plan.h"

static const plan_rule k_flux2_bfl_rules[] = {
    /* double-stream attention: fused [Q; K; V] per stream, heads split */
    {"double_blocks.*.img_attn.qkv.weight", STYLE_PACKED_COLWISE, "D,D,D", NULL},
    {"double_blocks.*.txt_attn.qkv.weight", STYLE_PACKED_COLWISE, "D,D,D", NULL},
    {"double_blocks.*.img_attn.proj.weight", STYLE_ROWWISE, NULL, NULL},
    {"double_blocks.*.txt_attn.proj.weight", STYLE_ROWWISE, NULL, NULL},
    /* double-stream MLPs: [gate; up] rows split block by block */
    {"double_blocks.*.img_mlp.0.weight", STYLE_PACKED_COLWISE, "1,1", NULL},
    {"double_blocks.*.img_mlp.2.weight", STYLE_ROWWISE, NULL, NULL},
    {"double_blocks.*.txt_mlp.0.weight", STYLE_PACKED_COLWISE, "1,1", NULL},
    {"double_blocks.*.txt_mlp.2.weight", STYLE_ROWWISE, NULL, NULL},
    /* single-stream fused projections */
    {"single_blocks.*.linear1.weight", STYLE_PACKED_COLWISE, "D,D,D,M,M", NULL},
    {"single_blocks.*.linear2.weight", STYLE_PACKED_ROWWISE, "D,M", NULL},
};

const plan_table plan_table_flux2_bfl = {"flux2 (BFL names)", k_flux2_bfl_rules,
                                        (int)(sizeof k_flux2_bfl_rules / sizeof k_flux2_bfl_rules[0])};
