/* The FLUX.2 transformer plan, spec flux2-transformer.md §7.2. Everything
 * not listed (embedders, modulations, norms, norm_out, proj_out) is
 * replicated. D = heads * head_dim, M = int(D * mlp_ratio). */
#include "plan.h"
#include "kernels/err.h"

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

/* bounds as in flux2_config_parse (core/models/flux2_host.c): D = heads *
 * head_dim and M = D * mlp_ratio must stay far from int64 overflow */
#define PLAN_MAX_FIELD (1 << 20)
#define PLAN_MAX_D (1 << 20)

static int config_int(const json_t *config, const char *key, int64_t *out) {
    json_t *v = json_object_get(config, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > PLAN_MAX_FIELD)
        return tp_error("transformer config.json: \"%s\" missing or not an integer from 1 to %d", key,
                        PLAN_MAX_FIELD);
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
    if (!(ratio > 0 && ratio <= 64))
        return tp_error("transformer config.json: \"mlp_ratio\" %g is out of range (above 0, at most 64)", ratio);
    if (heads * hd > PLAN_MAX_D)
        return tp_error("transformer config.json: num_attention_heads %lld x attention_head_dim %lld is more than %d; "
                        "the config is corrupt", (long long)heads, (long long)hd, PLAN_MAX_D);
    int64_t D = heads * hd, M = (int64_t)((double)D * ratio);       /* int() truncates, as in diffusers */
    plan_add_symbol(out, "D", D);
    plan_add_symbol(out, "M", M);
    plan_add_divisor(out, "num_attention_heads", heads);
    return 0;
}
