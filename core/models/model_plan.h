/* Which plan each pipeline component uses, with the symbols and divisors
 * its config gives (the rule tables are data in plans/; the engine is
 * plans/plan.h). */
#ifndef TPGEN_MODEL_PLAN_H
#define TPGEN_MODEL_PLAN_H
#include "core/formats/checkpoint.h"
#include "plans/plan.h"
#include <jansson.h>

/* The FLUX.2 transformer plan (docs/spec/flux2-transformer.md §7.2), with its
 * symbols (D, M) and divisors (heads) taken from config.json; _bfl: the
 * same under the names of a Black Forest Labs single-file checkpoint (spec
 * Appendix A; checkpoint_is_bfl picks it). */
int plan_flux2(const json_t *config, plan *out);
int plan_flux2_bfl(const json_t *config, plan *out);

/* The plan of a pipeline component ("transformer", "text_encoder", ...)
 * at degree tp, chosen by a small table in model_plan.c (add a row for a
 * new component). Some plans depend on tp and on the checkpoint's tensor
 * names (the LLM text encoders), and a component may load only some of
 * its tensors (want). Returns 1 with an empty plan when the component has
 * none (everything replicated), 0 when *out was filled, -1 on a bad config
 * or a tp the plan cannot take. Free with component_plan_free. */
typedef struct component_plan {
    plan p;
    int (*want)(const char *name, void *ctx);   /* tensors the component loads; NULL: all */
    void *want_ctx;
    void *storage;                              /* owned by the plan (rules, globs, want_ctx) */
} component_plan;
int plan_for_component(const char *component, const json_t *config, const checkpoint *c, int tp,
                       component_plan *out);
void component_plan_free(component_plan *cp);

#endif
