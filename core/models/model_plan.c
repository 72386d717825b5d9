/* Plans of the pipeline components (model_plan.h): a model's config gives
 * the symbols and divisors of its rule table. */
#include "model_plan.h"
#include "core/models/flux3/flux3.h"
#include "core/models/llm/llm.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

/* bounds as in flux2_config_parse (flux2_host.c): D = heads * head_dim and
 * M = D * mlp_ratio must stay far from int64 overflow */
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

static int flux2_plan_from(const json_t *config, const plan_table *t, plan *out) {
    *out = (plan){.model = t->model, .rules = t->rules, .n_rules = t->n_rules};
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

int plan_flux2(const json_t *config, plan *out) { return flux2_plan_from(config, &plan_table_flux2, out); }
int plan_flux2_bfl(const json_t *config, plan *out) { return flux2_plan_from(config, &plan_table_flux2_bfl, out); }

/* ---- which plan each pipeline component uses ---- */

/* FLUX.3 says so in its config's _class_name, or (no class: a BFL file or
 * a GGUF without config.json) in its tensor names (flux3_checkpoint_names:
 * then the config is derived from the shapes, as flux3_load does); the plan
 * follows the names (diffusers, or BFL behind their prefix). FLUX.2 in
 * diffusers or BFL names. */
static int transformer_plan(const json_t *config, const checkpoint *c, int tp, component_plan *out) {
    (void)tp;
    const char *cls = json_string_value(json_object_get(config, "_class_name"));
    const char *bfl = NULL;
    int names3 = flux3_checkpoint_names(c, &bfl);
    if ((cls && !strcmp(cls, FLUX3_CLASS_NAME)) || (!cls && names3)) {
        json_t *derived = cls ? NULL : flux3_config_from_shapes(c);
        if (!cls && !derived) return -1;
        flux3_config f3;
        int rc = flux3_config_parse(derived ? derived : config,
                                    derived ? "transformer (config derived from the FLUX.3 tensor shapes)"
                                            : "transformer/config.json", &f3) ||
                 (bfl ? flux3_plan_bfl(&f3, &out->p) : flux3_plan(&f3, &out->p)) ? -1 : 0;
        json_decref(derived);
        return rc;
    }
    return checkpoint_is_bfl(c) ? plan_flux2_bfl(config, &out->p) : plan_flux2(config, &out->p);
}

/* The LLM text encoder (Qwen3 for klein, Mistral for dev): its plan
 * depends on tp (K/V and the embedding are split only when tp divides
 * them) and on the checkpoint's name prefix; only the layers that produce
 * the prompt embeddings are loaded (hidden states 9/18/27 for Qwen3,
 * 10/20/30 for Mistral, up to 32 for Qwen3-VL, as core/models/llm/textenc.c
 * chooses). */
typedef struct text_encoder_storage {
    llm_config cfg;
    llm_plan lp;
    llm_want want;
} text_encoder_storage;

static int text_encoder_plan(const json_t *config, const checkpoint *c, int tp, component_plan *out) {
    text_encoder_storage *s = xcalloc(1, sizeof *s);
    out->storage = s;
    if (llm_config_parse(config, "text_encoder/config.json", &s->cfg) || llm_config_resolve_prefix(&s->cfg, c) ||
        llm_plan_build(&s->cfg, tp, &s->lp))
        return -1;
    int top = s->cfg.arch == LLM_QWEN3 ? 27 : s->cfg.arch == LLM_QWEN3VL ? 32 : 30;
    s->want = (llm_want){&s->cfg, top < s->cfg.n_layers ? top : s->cfg.n_layers, top >= s->cfg.n_layers};
    out->p = s->lp.p;
    out->want = llm_want_tensor;
    out->want_ctx = &s->want;
    return 0;
}

static const struct {
    const char *component;
    int (*make)(const json_t *config, const checkpoint *c, int tp, component_plan *out);
} k_component_plans[] = {
    {"transformer", transformer_plan},
    {"text_encoder", text_encoder_plan},
};

int plan_for_component(const char *component, const json_t *config, const checkpoint *c, int tp,
                       component_plan *out) {
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < sizeof k_component_plans / sizeof k_component_plans[0]; i++)
        if (!strcmp(component, k_component_plans[i].component)) return k_component_plans[i].make(config, c, tp, out);
    out->p.model = component;
    return 1;
}

void component_plan_free(component_plan *cp) {
    if (!cp) return;
    free(cp->storage);
    memset(cp, 0, sizeof *cp);
}
