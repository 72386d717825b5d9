/* Private to core/models/llm*.c and the LLM plans: the loaded model. */
#ifndef TPGEN_LLM_INTERNAL_H
#define TPGEN_LLM_INTERNAL_H
#include "llm.h"

typedef struct llm_layer {
    const tensor *in_norm, *post_norm, *q_norm, *k_norm;   /* replicated */
    const tensor *q, *k, *v, *gate, *up;                    /* colwise (k, v: see kv rule) */
    const tensor *o, *down;                                 /* rowwise */
} llm_layer;

struct llm {
    llm_config cfg;
    struct backend *be;
    struct comm *comm;        /* NULL: single process */
    int tp, rank;
    char *dir;
    llm_plan plan;
    weights *w;
    int n_run, with_norm;     /* layers [0, n_run) loaded; final norm loaded */
    /* this rank's share (llm_shard_layout) */
    int nq_local;             /* query heads of this rank: [rank*nq_local, (rank+1)*nq_local) */
    int nkv_held, kv_sharded; /* KV heads held: nkv/tp sharded, or all nkv replicated */
    int ffn_local;
    int vocab_sharded;
    const tensor *embed, *norm;
    llm_layer *layers;
    tensor **owned;           /* llm_init_random's tensors (weights_load's live in w) */
    int n_owned;
};

/* How the plan splits the model at degree tp for `rank` (the one place the
 * divisibility rules of llm.h live, shared by the plan and the forward). */
void llm_shard_layout(const llm_config *c, int tp, int rank, int *nq_local, int *nkv_held,
                      int *kv_sharded, int *ffn_local, int *vocab_sharded);

/* Random weights (llm_random.c): a BF16 checkpoint (config.json +
 * model.safetensors) in te_dir, Qwen3 as klein stores it or Mistral3 as
 * FLUX.2-dev does (nested text_config, language_model.model.* names, plus
 * lm_head and a vision-tower tensor), and this rank's shards of layers [0, n_run)
 * built directly in memory (benchmarks; no final norm). The file is
 * streamed; sparse leaves the matrices as holes (zeros). */
int llm_write_random(const char *te_dir, const llm_config *cfg, unsigned seed, int sparse);
int llm_init_random(const llm_config *cfg, int n_run, struct backend *be, struct comm *c, dtype_t dt,
                    unsigned seed, llm **out);

#endif
