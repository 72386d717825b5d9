/* The FLUX.2 transformer plan, spec flux2-transformer.md §7.2. Everything
 * not listed (embedders, modulations, norms, norm_out, proj_out) is
 * replicated. D = heads * head_dim, M = int(D * mlp_ratio). */
#include "plan.h"
#include "../core/err.h"

static const plan_rule k_flux2_rules[] = {
    /* double-stream attention: heads split, outputs all-reduced */
    {"transformer_blocks.*.attn.to_q.weight", STYLE_COLWISE, NULL},
    {"transformer_blocks.*.attn.to_k.weight", STYLE_COLWISE, NULL},
    {"transformer_blocks.*.attn.to_v.weight", STYLE_COLWISE, NULL},
    {"transformer_blocks.*.attn.add_q_proj.weight", STYLE_COLWISE, NULL},
    {"transformer_blocks.*.attn.add_k_proj.weight", STYLE_COLWISE, NULL},
    {"transformer_blocks.*.attn.add_v_proj.weight", STYLE_COLWISE, NULL},
    {"transformer_blocks.*.attn.to_out.0.weight", STYLE_ROWWISE, NULL},
    {"transformer_blocks.*.attn.to_add_out.weight", STYLE_ROWWISE, NULL},
    /* double-stream MLPs: [gate; up] rows split block by block */
    {"transformer_blocks.*.ff.linear_in.weight", STYLE_PACKED_COLWISE, "1,1"},
    {"transformer_blocks.*.ff.linear_out.weight", STYLE_ROWWISE, NULL},
    {"transformer_blocks.*.ff_context.linear_in.weight", STYLE_PACKED_COLWISE, "1,1"},
    {"transformer_blocks.*.ff_context.linear_out.weight", STYLE_ROWWISE, NULL},
    /* single-stream fused projections */
    {"single_transformer_blocks.*.attn.to_qkv_mlp_proj.weight", STYLE_PACKED_COLWISE, "D,D,D,M,M"},
    {"single_transformer_blocks.*.attn.to_out.weight", STYLE_PACKED_ROWWISE, "D,M"},
};

static int config_int(const json_t *config, const char *key, int64_t *out) {
    json_t *v = json_object_get(config, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0)
        return tp_error("transformer config.json: \"%s\" missing or not a positive integer", key);
    *out = json_integer_value(v);
    return 0;
}

int plan_flux2(const json_t *config, plan *out) {
    *out = (plan){.model = "flux2", .rules = k_flux2_rules,
                  .n_rules = (int)(sizeof k_flux2_rules / sizeof k_flux2_rules[0])};
    int64_t heads, hd;
    if (config_int(config, "num_attention_heads", &heads) || config_int(config, "attention_head_dim", &hd)) return -1;
    json_t *r = json_object_get(config, "mlp_ratio");
    double ratio = json_is_number(r) ? json_number_value(r) : 3.0;   /* diffusers default */
    int64_t D = heads * hd, M = (int64_t)((double)D * ratio);       /* int() truncates, as in diffusers */
    plan_add_symbol(out, "D", D);
    plan_add_symbol(out, "M", M);
    plan_add_divisor(out, "num_attention_heads", heads);
    return 0;
}
