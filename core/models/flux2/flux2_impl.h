/* Private layout of flux2_model, shared by flux2.c (load, random init),
 * flux2_forward.c, flux2_blocks.c and flux2_layers.c. Weight tensors hold
 * this rank's shard (plan_flux2):
 * colwise Q/K/V [D/tp, D], packed linear_in [2M/tp, D] = [gate_k ; up_k],
 * rowwise outputs [D, D/tp] / [D, M/tp], packed single in-projection
 * [(3D+2M)/tp, D] = [Q_k ; K_k ; V_k ; gate_k ; up_k] and its out-projection
 * [D, (D+M)/tp]. Everything else is replicated. */
#ifndef TPGEN_FLUX2_IMPL_H
#define TPGEN_FLUX2_IMPL_H
#include "flux2.h"
#include "core/dist/ulysses.h"
#include "kernels/comm.h"
#include "core/models/block_cache.h"
#include "kernels/ops.h"

typedef struct flux2_double_w {
    const tensor *to_q, *to_k, *to_v, *norm_q, *norm_k, *to_out;
    const tensor *add_q, *add_k, *add_v, *norm_added_q, *norm_added_k, *to_add_out;
    const tensor *ff_in, *ff_out, *ffc_in, *ffc_out;
} flux2_double_w;

typedef struct flux2_single_w {
    const tensor *qkv_mlp, *norm_q, *norm_k, *to_out;
} flux2_single_w;

/* The context projection of one prompt, kept across denoising steps. */
typedef struct flux2_txt_cache {
    uint64_t key;              /* hash of (L, embeddings): a quick filter */
    int64_t L;
    float *embeds;             /* host copy [L, Jt]: a hit needs equal bytes */
    tensor *proj;              /* [L, D] in the activation dtype */
    long last_use;
} flux2_txt_cache;

#define FLUX2_TXT_CACHE 2

struct flux2_model {
    flux2_config cfg;
    backend *be;
    comm *comm;
    dtype_t act;               /* DT_F32 or DT_BF16: activations and weights */
    int tp, rank;
    int heads_local;
    comm *sp_comm;             /* Ulysses SP group (flux2_set_sp); NULL: none */
    int sp, sp_rank;
    int64_t Dl, Ml;            /* D/tp, M/tp */
    int fused_allreduce, profiling, exact_time;

    weights *w;                /* loaded weights (NULL for random init) */
    tensor **owned;            /* random init: tensors this model allocated */
    int n_owned;

    const tensor *x_emb, *ctx_emb, *t_lin1, *t_lin2, *g_lin1, *g_lin2;
    const tensor *mod_img, *mod_txt, *mod_single, *norm_out, *proj_out;
    flux2_double_w *dbl;
    flux2_single_w *sgl;

    flux2_txt_cache txt_cache[FLUX2_TXT_CACHE];
    long use_clock;
    /* RoPE tables of the last id set (usually constant across steps) */
    int64_t rope_rows, rope_L;
    int32_t *rope_ids;         /* [rope_rows, 4]: text ids, then image ids */
    tensor *rope_cos, *rope_sin;

    /* optional: called with (rows, out, in) of every GEMM (benchmarks) */
    void (*gemm_log)(void *ctx, int64_t m, int64_t n, int64_t k);
    void *gemm_log_ctx;
    struct flux2_ws *ws;       /* activation buffers for the last (N, L) */
    struct block_cache *bc;    /* --cache: the image's block cache (flux2_set_block_cache), else NULL */
    flux2_stats stats;
};

/* Activation buffers of one forward shape (N image, L text tokens, S = L+N),
 * in the activation dtype. The joint rows are always text first. */
typedef struct flux2_ws {
    int64_t N, L, S;  /* this rank's rows: with SP its slices of the text and image tokens */
    /* sequence parallelism: the layout (text, image), where this rank's slices start, the whole output */
    ulysses_layout lay;
    ulysses_bufs ub;  /* the all-to-all's buffers, reserved in ws_for (the prepare step) */
    int64_t l0, L_full, N_full, R_full;  /* where my text slice starts; the whole sequence's text, image and
                                           * (KV extract) reference rows */
    /* my image rows in the whole image input: the slice of its R_full reference rows, then the slice of the
     * rest (without references: piece 0 is empty, piece 1 the slice of all N_full rows) */
    int64_t img_at[2], img_n[2];
    tensor *out_full; /* [N_full - R_full, out_dim]: the whole output (the noise rows) */
    tensor *x;        /* [S, D]  residual stream */
    tensor *nrm;      /* [S, D]  modulated LayerNorm output */
    tensor *proj;     /* [S, 3Dl + 2Ml]  Q|K|V (double), Q|K|V|gate|up (single), MLP in (double) */
    tensor *cat;      /* [S, Dl + Ml]  attention output | SwiGLU output */
    tensor *part;     /* [S, D]  partial sums of the row-split projections (all-reduced) */
    tensor *xin;      /* [N, in_channels] */
    tensor *out;      /* [N, out_dim] */
    tensor *temb, *silu_temb, *hid, *sinus;            /* [1, D], [1, D], [1, D], [1, Ct] */
    tensor *mod_img, *mod_txt, *mod_single, *mod_out;  /* [1, 6D], [1, 6D], [1, 3D], [1, 2D] */
    /* KV-cached references (flux2_forward_kv), set per forward */
    int kv_mode;      /* FLUX2_KV_NONE / _EXTRACT / _CACHED */
    int64_t R;        /* extract: the first R of my image rows are reference tokens (R_full in the sequence) */
    float ref_t;      /* extract: the reference rows' timestep (the pipeline's ref_fixed_timestep) */
    int kv_layer;     /* block index into the cache (double blocks, then single) */
    struct flux2_kv_cache *kv;
    tensor *mod_img_ref, *mod_single_ref;  /* extract: modulation of the reference rows [1, 6D], [1, 3D] */
    tensor *kcat, *vcat;  /* cached: [L + R + N, Dl/sp] keys/values of the whole sequence with the cached rows injected */
} flux2_ws;

/* Reference K/V of every block (after QK norm and RoPE), this rank's heads:
 * with sequence parallelism in the layout after the all-to-all, all R
 * reference tokens of this rank's Dl/sp heads (so SP divides it too). */
struct flux2_kv_cache {
    int64_t R;        /* reference tokens */
    int n_layers;
    tensor **k, **v;  /* [n_layers] of [R, Dl/sp] */
};

/* flux2_forward.c */
void flux2_release_caches(flux2_model *m);
/* flux2_layers.c, used by the blocks and the forward pass: GEMM with FLOP
 * counting, the all-reduce of a partial-sum buffer, attention over local
 * heads */
void flux2_gemm(flux2_model *m, tensor *y, const tensor *x, const tensor *w);
int flux2_allreduce(flux2_model *m, tensor *t);
void flux2_attention(flux2_model *m, tensor *o, const tensor *q, const tensor *k, const tensor *v);
/* attention over the joint sequence of the forward: with sequence
 * parallelism the all-to-all around flux2_attention (core/dist/ulysses.h) */
int flux2_attention_seq(flux2_model *m, tensor *o, const tensor *q, const tensor *k, const tensor *v);

/* flux2_blocks.c: one block on the workspace, in place on ws->x */
int flux2_double_block(flux2_model *m, const flux2_double_w *w, flux2_ws *ws);
int flux2_single_block(flux2_model *m, const flux2_single_w *w, flux2_ws *ws);

#endif
