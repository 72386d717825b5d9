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

/* Both LLM tables: symbols for their conditional rules, divisors for the
 * counts tp must divide (with a message naming the field). */
static int llm_plan_fill(const llm_config *cfg, int tp, const plan_table *t, llm_plan *out) {
    memset(out, 0, sizeof *out);
    if (tp < 1) return tp_error("tensor-parallel degree must be >= 1 (got %d)", tp);
    if (cfg->n_heads % tp)
        return tp_error("%s text encoder: --tp %d does not divide num_attention_heads %d; use a tp that "
                        "divides it", t->model, tp, cfg->n_heads);
    if (cfg->ffn % tp)
        return tp_error("%s text encoder: --tp %d does not divide intermediate_size %d; use a tp that "
                        "divides it", t->model, tp, cfg->ffn);
    plan *p = &out->p;
    p->model = t->model;
    plan_add_symbol(p, "KV", cfg->n_kv_heads);
    plan_add_symbol(p, "V", cfg->vocab);
    plan_add_divisor(p, "num_attention_heads", cfg->n_heads);
    plan_add_divisor(p, "intermediate_size", cfg->ffn);
    return plan_use_table(out, t, cfg->prefix, tp);
}

int plan_qwen3(const llm_config *cfg, int tp, llm_plan *out) { return llm_plan_fill(cfg, tp, &plan_table_qwen3, out); }
int plan_mistral(const llm_config *cfg, int tp, llm_plan *out) {
    return llm_plan_fill(cfg, tp, &plan_table_mistral, out);
}

int plan_qwen3vl(const llm_config *cfg, int tp, llm_plan *out) {
    return llm_plan_fill(cfg, tp, &plan_table_qwen3vl, out);
}

int llm_plan_build(const llm_config *cfg, int tp, llm_plan *out) {
    if (cfg->arch == LLM_QWEN3VL) return plan_qwen3vl(cfg, tp, out);
    return cfg->arch == LLM_QWEN3 ? plan_qwen3(cfg, tp, out) : plan_mistral(cfg, tp, out);
}
