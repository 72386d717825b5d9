/* Private layout of the VAE decoder, shared by the vae_*.c files. */
#ifndef TPGEN_VAE_INTERNAL_H
#define TPGEN_VAE_INTERNAL_H
#include "vae.h"
#include "core/formats/weights.h"
#include <mpi.h>

/* ResNet block: GN1+SiLU -> conv3 -> GN2+SiLU -> conv3, plus a 1x1
 * shortcut when the channel count changes. */
typedef struct vae_resnet {
    int cin, cout;
    const tensor *norm1_w, *norm1_b, *conv1_w, *conv1_b;
    const tensor *norm2_w, *norm2_b, *conv2_w, *conv2_b;
    const tensor *short_w, *short_b;   /* NULL when cin == cout */
} vae_resnet;

/* Single-head self-attention over the h*w tokens of the mid block. */
typedef struct vae_attn {
    int c;
    const tensor *norm_w, *norm_b;
    const tensor *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *o_w, *o_b;
} vae_attn;

typedef struct vae_up_block {
    int cin, cout, n_res;
    vae_resnet res[VAE_MAX_BLOCKS];
    const tensor *up_w, *up_b;         /* NULL on the last block (no upsampler) */
} vae_up_block;

/* Encoder down block: layers_per_block ResNets, then (all but the last
 * block) a stride-2 3x3 convolution (op_conv2d_down). */
typedef struct vae_down_block {
    int cin, cout, n_res;
    vae_resnet res[VAE_MAX_BLOCKS];
    const tensor *down_w, *down_b;     /* NULL on the last block */
} vae_down_block;

/* The encoder (vae_encode.c), bound only when asked for (VAE_ENCODER). */
typedef struct vae_encoder {
    int in_channels;                   /* 3 */
    const tensor *in_w, *in_b;         /* encoder.conv_in */
    vae_down_block down[VAE_MAX_BLOCKS];
    vae_resnet mid_res[2];
    vae_attn mid_attn;                 /* norm_w NULL without mid attention */
    const tensor *out_norm_w, *out_norm_b, *out_w, *out_b;  /* conv_out: top -> 2·lc */
    const tensor *qc_w, *qc_b;         /* quant_conv (2·lc -> 2·lc), NULL when unused */
} vae_encoder;

/* One reusable activation buffer of a run's pool. */
typedef struct vae_buf {
    void *data;
    size_t cap;
    int busy;
} vae_buf;

#define VAE_POOL_MAX 16

struct vae_model {
    vae_config cfg;
    backend *be;
    dtype_t dt;                        /* weights and activations */
    weights *w;                        /* loaded weights (vae_load), or NULL */
    size_t held_bytes;                 /* backend bytes of w */
    tensor **owned;                    /* tensors made by vae_create_random */
    int n_owned;
    float *bn_mean, *bn_std;           /* host [4·lc]: running_mean, sqrt(running_var + eps) */
    const tensor *pq_w, *pq_b;         /* post_quant_conv, NULL when unused */
    const tensor *in_w, *in_b;         /* decoder.conv_in */
    vae_resnet mid_res[2];
    vae_attn mid_attn;                 /* norm_w NULL when the config has no mid attention */
    vae_up_block up[VAE_MAX_BLOCKS];
    const tensor *out_norm_w, *out_norm_b, *out_w, *out_b;
    size_t band_bytes;                 /* settings each run copies: the band budget of a convolution, */
    double *prof;                      /* NULL, or seconds per VAE_PROF_* slot (vae_set_profile) */
    int parts;                         /* VAE_DECODER | VAE_ENCODER: what was bound */
    vae_encoder enc;
};

/* ---- the execution plan of one decode or encode ----
 * The model holds weights and settings only and is not changed by a run. A
 * run (vae_run) holds what a pass needs besides: its activation pool and its
 * strategy, the four ops that differ between computing the whole image
 * (vae_whole, vae_blocks.c) and one row band of it on a rank of a group
 * (vae_banded, vae_band.c, with the band in r->band). The forwards
 * (vae_decode.c, vae_encode.c) and the blocks call the ops through the
 * strategy and never ask which one it is; the group driver (vae_group.c)
 * picks it. */

/* The row band of one rank in a patch-parallel pass: rank r of comm holds
 * rows [b[r], b[r+1]) of the pass's unit grid (latent rows for a decode,
 * latent-mode rows for an encode; at least one each) of width wl. An
 * activation of h rows holds the band at scale s = h / (its unit rows): rank
 * r holds rows [s*b[r], s*b[r+1]) of an s*b[size] x s*wl image. */
typedef struct vae_band {
    MPI_Comm comm;
    int rank, size;
    int64_t *b;                        /* [size + 1] unit row boundaries */
    int64_t wl;
} vae_band;

typedef struct vae_run vae_run;
typedef struct vae_strategy {
    const char *name;
    /* GroupNorm (+ SiLU) of x [C, pixels] */
    int (*norm)(vae_run *r, tensor *y, const tensor *x, const tensor *g, const tensor *b, int silu);
    /* 3x3 convolution of x [Cin, h*wd], nearest 2x upsampling first when up */
    int (*conv3)(vae_run *r, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h, int64_t wd,
                 int up);
    /* the encoder's stride-2 convolution (padded at the bottom and right) */
    int (*conv_down)(vae_run *r, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h, int64_t wd);
    /* the mid block's single-head attention over all h*wd pixels, residual added into x */
    int (*attn)(vae_run *r, const vae_attn *a, tensor *x, int64_t h, int64_t wd);
} vae_strategy;

extern const vae_strategy vae_whole, vae_banded;

struct vae_run {
    const vae_model *m;
    backend *be;
    dtype_t dt;
    const vae_strategy *st;
    const vae_band *band;              /* vae_banded's band; NULL for vae_whole */
    vae_buf pool[VAE_POOL_MAX];
    size_t band_bytes;
    double *prof;
    /* op_rows_invariant agreed over the group: every op gives a pixel the same bits in any band, and the
     * GroupNorm statistics are folded row by row in image order (vae_norm_ordered), so the band count
     * changes nothing; else the GroupNorm sums are all-reduced (bits may move with the band count) */
    int exact;
    int64_t units, wl;                 /* the pass's unit grid (vae_band has them too) */
};

/* A run of model m with strategy st (band for vae_banded); vae_run_end frees its pool. */
void vae_run_begin(vae_run *r, const vae_model *m, const vae_strategy *st, const vae_band *band);
void vae_run_end(vae_run *r);
/* GroupNorm (+ SiLU) whose statistics do not depend on the band split: per
 * channel, each row's sum (op_channel_sums on the row) is added to a
 * running f64 sum in image row order, the bands one after another (each
 * band receives the sums of the rows above from the rank before and passes
 * them on; the last band's totals are broadcast), then the same for the
 * squared deviations from the group mean. The whole image (r->band NULL)
 * folds the same rows in the same order. */
int vae_norm_ordered(vae_run *r, tensor *y, const tensor *x, const tensor *g, const tensor *b, int silu);

/* Per-op time accounting for `tpgen bench vae --profile`: each wrapper
 * syncs the backend around its op when r->prof is set (costing a little on
 * CUDA, nothing on the CPU) and adds the seconds to its slot. */
double vae_prof_begin(const vae_run *r);
void vae_prof_end(const vae_run *r, int slot, double t0);
static inline void vae_conv(vae_run *r, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h,
                            int64_t wd, int k) {
    double t0 = vae_prof_begin(r);
    op_conv2d(r->be, y, x, w, b, h, wd, k);
    vae_prof_end(r, k == 1 ? VAE_PROF_CONV1 : VAE_PROF_CONV3, t0);
}
/* the strategy's ops, timed */
static inline int vae_norm(vae_run *r, tensor *y, const tensor *x, const tensor *g, const tensor *b, int silu) {
    double t0 = vae_prof_begin(r);
    int rc = r->st->norm(r, y, x, g, b, silu);
    vae_prof_end(r, VAE_PROF_NORM, t0);
    return rc;
}
static inline int vae_conv3(vae_run *r, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h,
                            int64_t wd, int up) {
    return r->st->conv3(r, y, x, w, b, h, wd, up);
}
static inline int vae_conv_down(vae_run *r, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h,
                                int64_t wd) {
    return r->st->conv_down(r, y, x, w, b, h, wd);
}
static inline int vae_attn_forward(vae_run *r, const vae_attn *a, tensor *x, int64_t h, int64_t wd) {
    double t0 = vae_prof_begin(r);
    int rc = r->st->attn(r, a, x, h, wd);
    vae_prof_end(r, VAE_PROF_ATTN, t0);
    return rc;
}

/* Fetch the tensor `name`, which must be a [rows, cols] matrix (weights.h
 * 2-D view); NULL + tp_error when it is missing or has another shape.
 * k > 0: a conv weight, [rows, cols/(k*k), k, k] in the file; k == 0 and
 * rows == 1: a vector [cols]; otherwise a matrix [rows, cols]. */
typedef const tensor *(*vae_getter)(void *ctx, const char *name, int64_t rows, int64_t cols, int k);
/* a vector [n] */
static inline const tensor *vae_vec(vae_getter get, void *ctx, const char *name, int n) {
    return get(ctx, name, 1, n, 0);
}

/* Deterministic random values for tensor `name` (weights ~ U(+-sqrt(3/fan_in)),
 * norm scales near 1, small biases, BatchNorm statistics with mean near 0 and
 * variance in [0.5, 2]): used by vae_create_random and vae_write_tiny. */
void vae_random_values(const char *name, int64_t rows, int64_t cols, uint64_t *rng, float *out);

/* Point every decoder field of v at the tensors that get returns (v->cfg set). */
int vae_bind(vae_model *v, vae_getter get, void *ctx);

/* Point the encoder fields of v at the tensors that get returns
 * (encoder.*, quant_conv.*; v->cfg set). */
int vae_bind_encoder(vae_model *v, vae_getter get, void *ctx);

/* vae_blocks.c: what the encoder shares with the decoder: binding a ResNet
 * (norm1, conv1, norm2, conv2, conv_shortcut when the width changes) or an
 * attention block under `prefix`; the ResNet forward; the attention of a
 * range of query rows; the whole-image strategy. */
int vae_bind_resnet(vae_resnet *r, const char *prefix, int cin, int cout, vae_getter get, void *ctx);
int vae_bind_attn(vae_attn *a, const char *prefix, int c, vae_getter get, void *ctx);
int vae_resnet_forward(vae_run *r, const vae_resnet *res, tensor *x, int64_t h, int64_t w);
/* Attention of the query tokens [q0, q0 + nq) of xfull [C, hw] over all hw
 * tokens, its residual added into xout [C, nq] (xout == xfull, q0 = 0,
 * nq = hw: the whole image). */
int vae_attn_rows(vae_run *r, const vae_attn *a, const tensor *xfull, int64_t hw, int64_t q0, int64_t nq,
                  tensor *xout);

/* vae_pool.c: the run's activation pool, the per-op timers, and the band
 * height of a convolution that goes in bands of output rows. */
int vae_pool_get(vae_run *r, int64_t rows, int64_t cols, tensor *out);
void vae_pool_put(vae_run *r, const tensor *t);
void vae_pool_trim(vae_run *r);
int64_t vae_band_rows(const vae_run *r, int64_t cin, int64_t cout, int64_t H, int64_t W);

/* vae_group.c: one pass (a decode or an encode) over a group of ranks
 * (MPI_COMM_NULL or a group of one: the whole image on this rank). The
 * input in [in_ch, units*s_in, in_cols] (host, on every rank) is split into
 * row bands of the unit grid [units, wl] (one band per rank, at least one
 * unit row each; with fewer unit rows than ranks the last ranks sit out),
 * each band runs `forward` with the banded strategy (a group of one: the
 * whole image), and the first out_ch channels of the outputs are gathered
 * into out [out_ch, units*s, wl*s] on rank 0 of the group (unused
 * elsewhere), s the forward's output scale. Errors are agreed over the
 * group. */
typedef int (*vae_forward_fn)(vae_run *r, tensor *x, int64_t *h, int64_t *w);
typedef struct vae_pass {
    const float *in;
    int in_ch;
    int64_t units, wl, s_in, in_cols;
    int out_ch;
    vae_forward_fn forward;
    const char *what;                  /* "VAE decode", "VAE encoder" (messages) */
} vae_pass;
int vae_group_pass(const vae_model *m, MPI_Comm group, const vae_pass *p, float *out);
/* dist_agree over the group; MPI_COMM_NULL (one rank, no MPI needed): rc itself */
int vae_agree(MPI_Comm group, int rc);

/* vae_band.c: the band gather of the banded strategy (the output of a pass
 * at scale s into all [channels, s*units, s*wl] on rank 0 of the band comm). */
int vae_band_gather(const vae_band *bd, int64_t s, const float *band, int64_t channels, float *all);

/* Shape of the BatchNorm statistics: 4·lc values (the 2x2 patch channels). */
static inline int vae_bn_channels(const vae_config *c) { return 4 * c->latent_channels; }

/* Write a config.json for cfg (used by vae_write_tiny). */
int vae_config_write(const vae_config *cfg, const char *path);

/* The BFL/LDM name of a diffusers VAE tensor name (vae_bfl_names.c; the map
 * is in its header comment), n_up_blocks the decoder's up blocks. 0 when it
 * does not fit out[n]. */
int vae_bfl_name(const char *name, int n_up_blocks, char *out, size_t n);
/* 1 when a VAE checkpoint uses the BFL/LDM names (decoder.mid.attn_1...). */
int vae_checkpoint_is_bfl(const checkpoint *ck);

#endif
