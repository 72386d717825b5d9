/* Private layout of flux3_model, shared by flux3.c (config, load, binding),
 * flux3_forward.c and flux3_blocks.c. Weight tensors hold this rank's
 * shard (plans/flux3_plan.c): to_q/k/v [D/tp, D], ff.linear_in
 * [2M/tp, D] = [gate_k ; up_k], to_out [D, D/tp], ff.linear_out [D, M/tp].
 * Everything else is replicated. */
#ifndef TPGEN_FLUX3_IMPL_H
#define TPGEN_FLUX3_IMPL_H
#include "flux3.h"
#include "core/dist/ulysses.h"
#include "kernels/comm.h"
#include "core/models/block_cache.h"
#include "kernels/ops.h"

/* The token modes in the order of the joint sequence. */
enum { FLUX3_TXT = 0, FLUX3_IMG = 1, FLUX3_COND = 2, FLUX3_MODES = 3 };

/* One block: mode block and single block have the same weights. */
typedef struct flux3_block_w {
    const tensor *to_q, *to_k, *to_v, *norm_q, *norm_k, *to_out, *ff_in, *ff_out;
} flux3_block_w;

struct flux3_model {
    flux3_config cfg;
    backend *be;
    comm *comm;
    dtype_t act;               /* DT_F32 or DT_BF16 */
    int tp, rank;
    int heads_local;
    comm *sp_comm;             /* Ulysses SP group (flux3_set_sp); NULL: none */
    int sp, sp_rank;
    int64_t Dl, Ml;            /* D/tp, M/tp */
    int exact_time;
    weights *w;                /* loaded weights (NULL for random init) */
    weights *w_norm;           /* bf16 mode: the QK-norm weights, kept f32 as diffusers keeps them */
    tensor **owned;            /* random init: the tensors this model allocated */
    int n_owned;

    const tensor *t_lin1, *t_lin2, *tt_lin1, *tt_lin2;     /* timestep / target-timestep embedders */
    const tensor *early_mod[FLUX3_MODES], *single_mod[FLUX3_MODES];   /* [3D, D] each */
    const tensor *x_emb[FLUX3_MODES];                      /* context_embedder, x_embedders.image, .image_cond */
    const tensor *norm_out, *proj_out;
    flux3_block_w *mode[FLUX3_MODES];                      /* [num_layers] per mode */
    flux3_block_w *single;                                 /* [num_single_layers] */

    struct flux3_ws *ws;       /* activation buffers of the last (L, N, R) */
    struct block_cache *bc;    /* --cache: the image's block cache (flux3_set_block_cache), else NULL */
    flux3_stats stats;
};

/* Activation buffers of one forward shape, in the activation dtype unless
 * noted. Rows of the joint sequence: text [0, L), image [L, L+N),
 * references [L+N, S). */
typedef struct flux3_ws {
    int64_t L, N, R, S;  /* this rank's rows: with SP its slices of each mode's tokens */
    /* sequence parallelism: each mode's whole token count, where this rank's slice starts, the whole output */
    int64_t total[FLUX3_MODES], first[FLUX3_MODES];
    ulysses_bufs ub[FLUX3_MODES + 1];   /* the all-to-all's buffers: [0] the joint sequence, [1 + k] mode k */
    tensor *out_full; /* [total image tokens, in_channels] */
    int64_t r0[FLUX3_MODES], n[FLUX3_MODES];   /* rows of each mode */
    tensor *x;        /* [S, D]  residual stream */
    tensor *nrm;      /* [S, D]  modulated LayerNorm output */
    tensor *proj;     /* [S, 3Dl + 2Ml]  Q | K | V | gate | up */
    tensor *cat;      /* [S, Dl + Ml]  attention output | SwiGLU output */
    tensor *part;     /* [S, D]  partial sum of to_out + ff.linear_out (all-reduced) */
    tensor *part2;    /* [S, D]  partial sum of ff.linear_out before the add */
    tensor *qk32;     /* bf16 mode: [S, 2Dl] f32 Q | K for the fp32 QK norm and RoPE */
    tensor *in[FLUX3_MODES];   /* [rows, input width] of each mode */
    tensor *out;      /* [N, in_channels] */
    tensor *rope_cos, *rope_sin;   /* f32 [S, head_dim] */
    tensor *sinus, *hid, *tmp;     /* [1, Ct], [1, D], [1, D] */
    tensor *temb_img, *temb_zero;  /* [1, D]: embeddings, then silu'd in place */
    tensor *mod_early[FLUX3_MODES], *mod_single[FLUX3_MODES];   /* [1, 3D]: shift | scale | gate */
    tensor *mod_out;               /* [1, 2D]: scale | shift */
} flux3_ws;

/* flux3_blocks.c: the GEMM, attention and all-reduce the blocks and the
 * forward pass use (with counters) */
void flux3_gemm(flux3_model *m, tensor *y, const tensor *x, const tensor *w);
void flux3_attention(flux3_model *m, tensor *o, const tensor *q, const tensor *k, const tensor *v);
/* attention of one mode's rows (mode >= 0) or the joint sequence (-1); with
 * sequence parallelism the all-to-all around it (core/dist/ulysses.h) */
int flux3_attention_seq(flux3_model *m, int mode, tensor *o, const tensor *q, const tensor *k, const tensor *v);
int flux3_allreduce(flux3_model *m, tensor *t);
/* flux3_forward.c */
void flux3_release_ws(flux3_model *m);

/* flux3_blocks.c: block `i` of every present mode / single block `j`, in
 * place on ws->x; one all-reduce each */
int flux3_mode_layer(flux3_model *m, int i, flux3_ws *ws);
int flux3_single_block(flux3_model *m, const flux3_block_w *w, flux3_ws *ws);

#endif
