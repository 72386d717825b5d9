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

/* One reusable activation buffer of the decode pool. */
typedef struct vae_buf {
    void *data;
    size_t cap;
    int busy;
} vae_buf;

#define VAE_POOL_MAX 16

/* The row band this rank decodes in a patch-parallel decode (vae_band.c):
 * rank r of comm holds latent rows [b[r], b[r+1]) (at least one each);
 * every activation is that band at the current scale s (1, 2, 4, 8: it
 * doubles at each upsampler), so rank r holds rows [s*b[r], s*b[r+1]) of
 * an s*b[size] x s*wl image. */
typedef struct vae_band {
    MPI_Comm comm;
    int rank, size;
    int64_t *b;                        /* [size + 1] latent row boundaries */
    int64_t wl, s;
} vae_band;

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
    size_t band_bytes;
    vae_buf pool[VAE_POOL_MAX];
    int parts;                         /* VAE_DECODER | VAE_ENCODER: what was bound */
    vae_encoder enc;
    double *prof;                      /* NULL, or seconds per VAE_PROF_* slot (vae_set_profile) */
    vae_band *band;                    /* NULL, or the band of a patch-parallel decode in progress */
};

/* Per-op time accounting for `tpgen bench vae --profile`: each wrapper
 * syncs the backend around its op when v->prof is set (costing a little on
 * CUDA, nothing on the CPU) and adds the seconds to its slot. */
double vae_prof_begin(const vae_model *v);
void vae_prof_end(const vae_model *v, int slot, double t0);
static inline void vae_conv(vae_model *v, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h,
                            int64_t wd, int k) {
    double t0 = vae_prof_begin(v);
    op_conv2d(v->be, y, x, w, b, h, wd, k);
    vae_prof_end(v, k == 1 ? VAE_PROF_CONV1 : VAE_PROF_CONV3, t0);
}
static inline void vae_conv_down(vae_model *v, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h,
                                 int64_t wd) {
    double t0 = vae_prof_begin(v);
    op_conv2d_down(v->be, y, x, w, b, h, wd);
    vae_prof_end(v, VAE_PROF_CONV_DOWN, t0);
}
int vae_band_norm(vae_model *v, tensor *y, const tensor *x, const tensor *g, const tensor *b, int silu);
static inline int vae_norm(vae_model *v, tensor *y, const tensor *x, const tensor *g, const tensor *b, int silu) {
    double t0 = vae_prof_begin(v);
    int rc = 0;
    if (v->band) rc = vae_band_norm(v, y, x, g, b, silu);
    else op_group_norm(v->be, y, x, g, b, v->cfg.norm_groups, v->cfg.norm_eps, silu);
    vae_prof_end(v, VAE_PROF_NORM, t0);
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

/* vae_blocks.c: what the encoder shares with the decoder. Binding a ResNet
 * (norm1, conv1, norm2, conv2, conv_shortcut when the width changes) or an
 * attention block under `prefix`; the activation pool; the 3x3
 * convolution, in bands of output rows when up (nearest 2x upsampling
 * first) or when the output is large; the ResNet and attention forwards. */
int vae_bind_resnet(vae_resnet *r, const char *prefix, int cin, int cout, vae_getter get, void *ctx);
int vae_bind_attn(vae_attn *a, const char *prefix, int c, vae_getter get, void *ctx);
int vae_conv3_banded(vae_model *v, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h, int64_t wd,
                     int up);
int vae_pool_get(vae_model *v, int64_t rows, int64_t cols, tensor *out);
void vae_pool_trim(vae_model *v);
int64_t vae_band_rows(const vae_model *v, int64_t cin, int64_t cout, int64_t H, int64_t W);
void vae_pool_put(vae_model *v, const tensor *t);
void vae_pool_release(vae_model *v);
int vae_resnet_forward(vae_model *v, const vae_resnet *r, tensor *x, int64_t h, int64_t w);
int vae_attn_forward(vae_model *v, const vae_attn *a, tensor *x, int64_t hw);
/* Attention of the query tokens [q0, q0 + nq) of xfull [C, hw] over all hw
 * tokens, its residual added into xout [C, nq] (xout == xfull, q0 = 0,
 * nq = hw: vae_attn_forward). */
int vae_attn_rows(vae_model *v, const vae_attn *a, const tensor *xfull, int64_t hw, int64_t q0, int64_t nq,
                  tensor *xout);

/* vae_band.c: the patch-parallel halves of the decoder's ops (v->band set).
 * A 3x3 convolution (upsampling first when up) of the band x [C, h*wd] with
 * one halo row from each neighbour; the mid attention with the whole mid
 * activation gathered; the band image gathered on rank 0 of the band comm. */
int vae_band_conv3(vae_model *v, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h, int64_t wd,
                   int up);
int vae_band_attn(vae_model *v, const vae_attn *a, tensor *x);
/* The encoder's stride-2 convolution of the band x [C, h*wd] (h even): the
 * first row of the band below is its bottom halo (zeros on the last band). */
int vae_band_conv_down(vae_model *v, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h,
                       int64_t wd);
int vae_band_gather(vae_model *v, const float *band, int64_t channels, float *all);

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
