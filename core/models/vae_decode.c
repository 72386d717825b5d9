/* The VAE decoder forward pass (spec flux2-text-vae.md §6.3) and the
 * pipeline tail around it (§6.2, §6.5).
 *
 * Memory: activations come from a small pool of reusable backend buffers
 * (released at the end of each decode), and the upsamplers run in bands of
 * output rows, so that the upsampled image exists one band at a time. The
 * largest live set is the first ResNet of the last up block at full
 * resolution: its input (normalised in place) and two output-sized buffers. */
#include "vae_internal.h"
#include "kernels/err.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- activation pool ---- */

/* Free the idle buffers (after the banded passes, whose band-sized
 * buffers would otherwise stay allocated through the next ResNet). */
static void pool_trim(vae_model *v) {
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
        pool_trim(v);
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

/* ---- 3x3 convolution, banded when it upsamples ---- */

/* Output rows per band of an upsampling convolution: the band's upsampled
 * input and its output must fit in band_bytes, and in a quarter of the
 * output's size so that the bands never dominate the peak. (The backends'
 * conv2d already bounds its own im2col workspace.) */
static int64_t band_rows(const vae_model *v, int64_t cin, int64_t cout, int64_t H, int64_t W) {
    size_t es = dtype_size(v->dt), per_row = (size_t)W * (size_t)(cin + cout) * es;
    size_t budget = (size_t)cout * (size_t)H * (size_t)W * es / 4;
    if (v->band_bytes < budget) budget = v->band_bytes;
    int64_t rows = (int64_t)(budget / (per_row ? per_row : 1));
    return rows < 1 ? 1 : rows;
}

/* y [Cout, H*W] = conv3x3(up ? upsample2x(x) : x) with zero padding, where
 * x is [Cin, h*wd] and (H, W) = up ? (2h, 2wd) : (h, wd).
 * An upsampling convolution never materialises the whole upsampled image
 * (at 1024² that is a [256, 1024²] buffer): each band of output rows
 * [r0, r1) is computed from upsampled rows [r0-1, r1+1) (clipped: the image
 * border is the zero padding), and only rows [r0, r1) are kept. */
static int conv3_banded(vae_model *v, tensor *y, const tensor *x, const tensor *w, const tensor *b,
                        int64_t h, int64_t wd, int up) {
    if (!up) {
        vae_conv(v, y, x, w, b, h, wd, 3);
        return 0;
    }
    int64_t H = 2 * h, W = 2 * wd;
    int64_t B = band_rows(v, x->rows, y->rows, H, W);
    for (int64_t r0 = 0; r0 < H; r0 += B) {
        int64_t r1 = r0 + B < H ? r0 + B : H;
        int64_t ia = r0 > 0 ? r0 - 1 : 0, ib = r1 < H ? r1 + 1 : H;
        int64_t sa = ia / 2, sb = (ib + 1) / 2;   /* source rows covering [ia, ib) */
        int64_t ba = 2 * sa, bb = 2 * sb;
        tensor upb;
        if (vae_pool_get(v, x->rows, (bb - ba) * W, &upb)) return -1;
        tensor src = tensor_cols(x, sa * wd, (sb - sa) * wd);
        double t0 = vae_prof_begin(v);
        op_upsample2x(v->be, &upb, &src, sb - sa, wd);
        vae_prof_end(v, VAE_PROF_UPSAMPLE, t0);
        if (ba == 0 && bb == H && r0 == 0 && r1 == H) {   /* one band: straight into y */
            vae_conv(v, y, &upb, w, b, H, W, 3);
        } else {
            tensor tmp;
            if (vae_pool_get(v, y->rows, (bb - ba) * W, &tmp)) return -1;
            vae_conv(v, &tmp, &upb, w, b, bb - ba, W, 3);
            tensor keep = tensor_cols(&tmp, (r0 - ba) * W, (r1 - r0) * W);
            tensor dst = tensor_cols(y, r0 * W, (r1 - r0) * W);
            t0 = vae_prof_begin(v);
            op_copy(v->be, &dst, &keep);
            vae_prof_end(v, VAE_PROF_OTHER, t0);
            vae_pool_put(v, &tmp);
        }
        vae_pool_put(v, &upb);
    }
    pool_trim(v);
    return 0;
}

/* ---- blocks ---- */

/* x (in: [cin, h*w]) is replaced by the block output [cout, h*w].
 * With a 1x1 shortcut, the shortcut is taken first so that x itself can be
 * normalised in place: the widest ResNet (cin > cout, at the highest
 * resolution of its block) then holds 1 cin-sized + 2 cout-sized buffers
 * instead of 2 + 1. Identity ResNets keep x for the residual. */
int vae_resnet_forward(vae_model *v, const vae_resnet *r, tensor *x, int64_t h, int64_t w) {
    int64_t hw = h * w;
    tensor t, a, o, skip;
    if (r->short_w) {
        if (vae_pool_get(v, r->cout, hw, &skip)) return -1;
        vae_conv(v, &skip, x, r->short_w, r->short_b, h, w, 1);
        t = *x;
    } else {
        skip = *x;
        if (vae_pool_get(v, r->cin, hw, &t)) return -1;
    }
    vae_norm(v, &t, x, r->norm1_w, r->norm1_b, 1);
    if (vae_pool_get(v, r->cout, hw, &a)) return -1;
    if (conv3_banded(v, &a, &t, r->conv1_w, r->conv1_b, h, w, 0)) return -1;
    vae_pool_put(v, &t);   /* x itself when normalised in place */
    vae_norm(v, &a, &a, r->norm2_w, r->norm2_b, 1);
    if (vae_pool_get(v, r->cout, hw, &o)) return -1;
    if (conv3_banded(v, &o, &a, r->conv2_w, r->conv2_b, h, w, 0)) return -1;
    vae_pool_put(v, &a);
    double t0 = vae_prof_begin(v);
    op_add(v->be, &o, &o, &skip);
    vae_prof_end(v, VAE_PROF_OTHER, t0);
    vae_pool_put(v, &skip);
    *x = o;
    return 0;
}

/* Single-head attention over the h*w tokens; residual added into x in place. */
static int attn_forward(vae_model *v, const vae_attn *a, tensor *x, int64_t hw) {
    const vae_config *c = &v->cfg;
    tensor t, tok, q, k, val, o, p, back;
    if (vae_pool_get(v, a->c, hw, &t)) return -1;
    op_group_norm(v->be, &t, x, a->norm_w, a->norm_b, c->norm_groups, c->norm_eps, 0);
    if (vae_pool_get(v, hw, a->c, &tok)) return -1;
    op_transpose(v->be, &tok, &t);   /* [C, HW] -> tokens [HW, C], token index y*W + x */
    vae_pool_put(v, &t);
    if (vae_pool_get(v, hw, a->c, &q) || vae_pool_get(v, hw, a->c, &k) || vae_pool_get(v, hw, a->c, &val)) return -1;
    op_gemm(v->be, &q, &tok, a->q_w, a->q_b);
    op_gemm(v->be, &k, &tok, a->k_w, a->k_b);
    op_gemm(v->be, &val, &tok, a->v_w, a->v_b);
    vae_pool_put(v, &tok);
    if (vae_pool_get(v, hw, a->c, &o)) return -1;
    attn_params ap = {.n_q_heads = 1, .n_kv_heads = 1, .head_dim = a->c, .scale = 1.0f / sqrtf((float)a->c)};
    op_attention(v->be, &o, &q, &k, &val, &ap);
    vae_pool_put(v, &q);
    vae_pool_put(v, &k);
    vae_pool_put(v, &val);
    if (vae_pool_get(v, hw, a->c, &p)) return -1;
    op_gemm(v->be, &p, &o, a->o_w, a->o_b);
    vae_pool_put(v, &o);
    if (vae_pool_get(v, a->c, hw, &back)) return -1;
    op_transpose(v->be, &back, &p);
    vae_pool_put(v, &p);
    op_add(v->be, x, x, &back);
    vae_pool_put(v, &back);
    return 0;
}

int vae_attn_forward(vae_model *v, const vae_attn *a, tensor *x, int64_t hw) {
    double t0 = vae_prof_begin(v);
    int rc = attn_forward(v, a, x, hw);
    vae_prof_end(v, VAE_PROF_ATTN, t0);
    return rc;
}

/* x [lc, h*w] -> [3, H*W]; on success *x is the output (in the pool). */
static int decoder_forward(vae_model *v, tensor *x, int64_t *h, int64_t *w) {
    const vae_config *c = &v->cfg;
    tensor y;
    int top = c->block_out[c->n_blocks - 1];
    if (v->pq_w) {
        if (vae_pool_get(v, c->latent_channels, *h * *w, &y)) return -1;
        vae_conv(v, &y, x, v->pq_w, v->pq_b, *h, *w, 1);
        vae_pool_put(v, x);
        *x = y;
    }
    if (vae_pool_get(v, top, *h * *w, &y) || conv3_banded(v, &y, x, v->in_w, v->in_b, *h, *w, 0)) return -1;
    vae_pool_put(v, x);
    *x = y;
    if (vae_resnet_forward(v, &v->mid_res[0], x, *h, *w)) return -1;
    if (v->mid_attn.norm_w && vae_attn_forward(v, &v->mid_attn, x, *h * *w)) return -1;
    if (vae_resnet_forward(v, &v->mid_res[1], x, *h, *w)) return -1;
    for (int i = 0; i < c->n_blocks; i++) {
        const vae_up_block *u = &v->up[i];
        for (int j = 0; j < u->n_res; j++)
            if (vae_resnet_forward(v, &u->res[j], x, *h, *w)) return -1;
        if (!u->up_w) continue;
        if (vae_pool_get(v, u->cout, 4 * *h * *w, &y) || conv3_banded(v, &y, x, u->up_w, u->up_b, *h, *w, 1)) return -1;
        vae_pool_put(v, x);
        *x = y;
        *h *= 2;
        *w *= 2;
    }
    vae_norm(v, x, x, v->out_norm_w, v->out_norm_b, 1);
    if (vae_pool_get(v, c->out_channels, *h * *w, &y) || conv3_banded(v, &y, x, v->out_w, v->out_b, *h, *w, 0)) return -1;
    vae_pool_put(v, x);
    *x = y;
    return 0;
}

/* ---- the pipeline tail ---- */

void vae_unpack_bn_unpatchify(const vae_model *v, const float *packed, int hl, int wl,
                              float *after_unpack, float *after_bn, float *x) {
    int c4 = vae_bn_channels(&v->cfg), bf = v->dt == DT_BF16;
    int64_t n = (int64_t)hl * wl, W2 = 2 * (int64_t)wl;
    for (int64_t t = 0; t < n; t++) {
        int64_t r = t / wl, q = t % wl;
        for (int c = 0; c < c4; c++) {
            float z = packed[t * c4 + c], zb;
            if (after_unpack) after_unpack[(int64_t)c * n + t] = z;
            if (bf) zb = bf16r(bf16r(bf16r(z) * v->bn_std[c]) + v->bn_mean[c]);
            else zb = z * v->bn_std[c] + v->bn_mean[c];
            if (after_bn) after_bn[(int64_t)c * n + t] = zb;
            /* channel c = 4*c32 + 2*dy + dx lands at (2r+dy, 2q+dx) of channel c32 */
            int c32 = c / 4, dy = (c / 2) % 2, dx = c % 2;
            x[((int64_t)c32 * 2 * hl + 2 * r + dy) * W2 + 2 * q + dx] = zb;
        }
    }
}

void vae_to_rgb8(const float *chw, int h, int w, int bf16, uint8_t *rgb) {
    size_t hw = (size_t)h * (size_t)w;
    for (size_t p = 0; p < hw; p++)
        for (int c = 0; c < 3; c++) {
            float x = chw[(size_t)c * hw + p];
            float u = bf16 ? bf16r(bf16r(x * 0.5f) + 0.5f) : x * 0.5f + 0.5f;
            u = u > 1.0f ? 1.0f : u;
            u = u >= 0.0f ? u : 0.0f;   /* also maps NaN to 0 */
            rgb[p * 3 + (size_t)c] = (uint8_t)rintf(u * 255.0f);   /* round half to even */
        }
}

int vae_decode_latent(vae_model *v, const float *xh, int h, int w, float *image_chw, uint8_t *rgb) {
    if (h <= 0 || w <= 0) return tp_error("VAE decode: latent size %dx%d is empty", h, w);
    int64_t H = h, W = w;
    tensor x;
    int rc = vae_pool_get(v, v->cfg.latent_channels, H * W, &x);
    if (!rc) rc = tensor_upload_f32(&x, xh);
    if (!rc) rc = decoder_forward(v, &x, &H, &W);
    float *img = NULL;
    if (!rc) {
        img = image_chw ? image_chw : xmalloc((size_t)3 * (size_t)H * (size_t)W * sizeof(float));
        rc = tensor_download_f32(&x, img);
    }
    vae_pool_release(v);
    int64_t bad = rc ? -1 : first_nonfinite_f32(img, (size_t)3 * (size_t)H * (size_t)W);
    if (bad >= 0)   /* would be written as black pixels */
        rc = tp_error("VAE decode: the decoded image is not finite (%s at channel %lld, pixel %lld); the latents or "
                      "a VAE weight hold NaN/Inf (find a weight with 'tpgen inspect --model DIR --component vae "
                      "--scan-weights')", img[bad] != img[bad] ? "NaN" : "Inf", (long long)(bad / (H * W)),
                      (long long)(bad % (H * W)));
    if (!rc && rgb) vae_to_rgb8(img, (int)H, (int)W, v->dt == DT_BF16, rgb);
    if (img != image_chw) free(img);
    return rc;
}

int vae_decode_packed(vae_model *v, const float *packed, int hl, int wl, float *image_chw, uint8_t *rgb) {
    if (hl <= 0 || wl <= 0) return tp_error("VAE decode: token grid %dx%d is empty", hl, wl);
    size_t n = (size_t)v->cfg.latent_channels * 4 * (size_t)hl * (size_t)wl;
    float *x = xmalloc(n * sizeof(float));
    vae_unpack_bn_unpatchify(v, packed, hl, wl, NULL, NULL, x);
    int rc = vae_decode_latent(v, x, 2 * hl, 2 * wl, image_chw, rgb);
    free(x);
    return rc;
}
