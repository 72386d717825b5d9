/* Instantiating an LLM plan table for one checkpoint and TP degree, and the
 * shard layout the forward pass derives from the same rules (llm.h). */
#include "llm_internal.h"
#include "kernels/err.h"
#include <stdio.h>
#include <string.h>

void llm_shard_layout(const llm_config *c, int tp, int rank, int *nq_local, int *nkv_held,
                      int *kv_sharded, int *ffn_local, int *vocab_sharded) {
    (void)rank;
    *nq_local = c->n_heads / tp;
    *kv_sharded = c->n_kv_heads % tp == 0;
    *nkv_held = *kv_sharded ? c->n_kv_heads / tp : c->n_kv_heads;
    *ffn_local = c->ffn / tp;
    *vocab_sharded = c->vocab % tp == 0;
}

int llm_plan_fill(const llm_config *cfg, int tp, const char *model, const llm_rule *table, int n,
                  llm_plan *out) {
    memset(out, 0, sizeof *out);
    if (tp < 1) return tp_error("tensor-parallel degree must be >= 1 (got %d)", tp);
    if (cfg->n_heads % tp)
        return tp_error("%s text encoder: --tp %d does not divide num_attention_heads %d; use a tp that "
                        "divides it", model, tp, cfg->n_heads);
    if (cfg->ffn % tp)
        return tp_error("%s text encoder: --tp %d does not divide intermediate_size %d; use a tp that "
                        "divides it", model, tp, cfg->ffn);
    if (n > LLM_PLAN_MAX_RULES) return tp_error("%s plan: %d rules, at most %d", model, n, LLM_PLAN_MAX_RULES);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const llm_rule *r = &table[i];
        if (r->when == LLM_RULE_IF_TP_DIVIDES_KV && cfg->n_kv_heads % tp) continue;
        if (r->when == LLM_RULE_IF_TP_DIVIDES_VOCAB && cfg->vocab % tp) continue;
        snprintf(out->globs[k], sizeof out->globs[k], "%s%s", cfg->prefix, r->suffix);
        out->rules[k] = (plan_rule){out->globs[k], r->style, NULL};
        k++;
    }
    out->p.model = model;
    out->p.rules = out->rules;
    out->p.n_rules = k;
    out->p.n_divisors = 2;
    out->p.div_names[0] = "num_attention_heads";
    out->p.div_values[0] = cfg->n_heads;
    out->p.div_names[1] = "intermediate_size";
    out->p.div_values[1] = cfg->ffn;
    return 0;
}

int llm_plan_build(const llm_config *cfg, int tp, llm_plan *out) {
    return cfg->arch == LLM_QWEN3 ? plan_qwen3(cfg, tp, out) : plan_mistral(cfg, tp, out);
}
