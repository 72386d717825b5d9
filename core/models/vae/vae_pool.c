/* The parts below both ways of running the VAE blocks, the whole image
 * (vae_blocks.c) and a row band of it (vae_band.c): the per-op time
 * accounting, the activation pool, the band height of a convolution and
 * attention over a range of query rows. Neither path calls the other
 * through here. */
#include "vae_internal.h"
#include "kernels/err.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

double vae_prof_begin(const vae_model *v) {
    if (!v->prof) return 0;
    be_sync(v->be);
    return omp_get_wtime();
}

void vae_prof_end(const vae_model *v, int slot, double t0) {
    if (!v->prof) return;
    be_sync(v->be);
    v->prof[slot] += omp_get_wtime() - t0;
}

/* Free the idle buffers (after the banded passes, whose band-sized
 * buffers would otherwise stay allocated through the next ResNet). */
void vae_pool_trim(vae_model *v) {
    for (int i = 0; i < VAE_POOL_MAX; i++)
        if (v->pool[i].data && !v->pool[i].busy) {
            be_free(v->be, v->pool[i].data);
            v->pool[i].data = NULL;
            v->pool[i].cap = 0;
        }
}

int vae_pool_get(vae_model *v, int64_t rows, int64_t cols, tensor *out) {
    size_t need = (size_t)rows * (size_t)cols * dtype_size(v->dt);
    int best = -1;
    for (int i = 0; i < VAE_POOL_MAX; i++) {
        vae_buf *b = &v->pool[i];
        if (b->data && !b->busy && b->cap >= need && (best < 0 || b->cap < v->pool[best].cap)) best = i;
    }
    if (best < 0) {
        /* nothing idle is big enough: give the idle buffers back first, so
         * that the peak stays near the live set */
        vae_pool_trim(v);
        for (int i = 0; i < VAE_POOL_MAX && best < 0; i++)
            if (!v->pool[i].data) best = i;
        if (best < 0) tp_fatal("vae: activation pool exhausted (more than %d live buffers)", VAE_POOL_MAX);
        v->pool[best].data = be_alloc(v->be, need ? need : 1);
        if (!v->pool[best].data) return tp_error_context("VAE decoder activations");
        v->pool[best].cap = need;
    }
    v->pool[best].busy = 1;
    *out = tensor_wrap(v->be, v->dt, rows, cols, v->pool[best].data);
    return 0;
}

void vae_pool_put(vae_model *v, const tensor *t) {
    for (int i = 0; i < VAE_POOL_MAX; i++)
        if (v->pool[i].data == t->data && v->pool[i].busy) { v->pool[i].busy = 0; return; }
    tp_fatal("vae: buffer returned to the pool twice or not from it");
}

void vae_pool_release(vae_model *v) {
    be_sync(v->be);
    for (int i = 0; i < VAE_POOL_MAX; i++) {
        be_free(v->be, v->pool[i].data);
        memset(&v->pool[i], 0, sizeof v->pool[i]);
    }
}

/* Output rows per band of an upsampling convolution: the band's upsampled
 * input and its output must fit in band_bytes, and in a quarter of the
 * output's size so that the bands never dominate the peak. (The backends'
 * conv2d already bounds its own im2col workspace.) */
int64_t vae_band_rows(const vae_model *v, int64_t cin, int64_t cout, int64_t H, int64_t W) {
    size_t es = dtype_size(v->dt), per_row = (size_t)W * (size_t)(cin + cout) * es;
    size_t budget = (size_t)cout * (size_t)H * (size_t)W * es / 4;
    if (v->band_bytes < budget) budget = v->band_bytes;
    int64_t rows = (int64_t)(budget / (per_row ? per_row : 1));
    return rows < 1 ? 1 : rows;
}

/* Single-head attention: queries [q0, q0+nq) of xfull's hw tokens; residual into xout. */
int vae_attn_rows(vae_model *v, const vae_attn *a, const tensor *xfull, int64_t hw, int64_t q0, int64_t nq,
                  tensor *xout) {
    const vae_config *c = &v->cfg;
    tensor t, tok, q, k, val, o, p, back;
    if (vae_pool_get(v, a->c, hw, &t)) return -1;
    op_group_norm(v->be, &t, xfull, a->norm_w, a->norm_b, c->norm_groups, c->norm_eps, 0);
    if (vae_pool_get(v, hw, a->c, &tok)) return -1;
    op_transpose(v->be, &tok, &t);   /* [C, HW] -> tokens [HW, C], token index y*W + x */
    vae_pool_put(v, &t);
    if (vae_pool_get(v, nq, a->c, &q) || vae_pool_get(v, hw, a->c, &k) || vae_pool_get(v, hw, a->c, &val)) return -1;
    tensor tq = tensor_rows(&tok, q0, nq);
    op_gemm(v->be, &q, &tq, a->q_w, a->q_b);
    op_gemm(v->be, &k, &tok, a->k_w, a->k_b);
    op_gemm(v->be, &val, &tok, a->v_w, a->v_b);
    vae_pool_put(v, &tok);
    if (vae_pool_get(v, nq, a->c, &o)) return -1;
    attn_params ap = {.n_q_heads = 1, .n_kv_heads = 1, .head_dim = a->c, .scale = 1.0f / sqrtf((float)a->c)};
    op_attention(v->be, &o, &q, &k, &val, &ap);
    vae_pool_put(v, &q);
    vae_pool_put(v, &k);
    vae_pool_put(v, &val);
    if (vae_pool_get(v, nq, a->c, &p)) return -1;
    op_gemm(v->be, &p, &o, a->o_w, a->o_b);
    vae_pool_put(v, &o);
    if (vae_pool_get(v, a->c, nq, &back)) return -1;
    op_transpose(v->be, &back, &p);
    vae_pool_put(v, &p);
    op_add(v->be, xout, xout, &back);
    vae_pool_put(v, &back);
    return 0;
}
