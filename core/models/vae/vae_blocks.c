/* The parts both VAE halves are built from (vae_internal.h): binding a
 * ResNet or an attention block to its tensors, the ResNet forward, the
 * mid block's attention, and the whole-image strategy (vae_whole: every op
 * on the whole activation). The decoder (vae_decode.c) and the encoder
 * (vae_encode.c) sit on this file; neither calls the other. */
#include "vae_internal.h"
#include "kernels/err.h"
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 160

/* ---- binding (the encoder's blocks have the decoder's layout) ---- */

int vae_bind_resnet(vae_resnet *r, const char *prefix, int cin, int cout, vae_getter get, void *ctx) {
    char n[NAME_MAX_LEN];
    r->cin = cin;
    r->cout = cout;
#define VEC(field, suffix, len) \
    (snprintf(n, sizeof n, "%s.%s", prefix, suffix), (r->field = vae_vec(get, ctx, n, len)) != NULL)
#define CONV(field, suffix, co, ci, k) \
    (snprintf(n, sizeof n, "%s.%s", prefix, suffix), (r->field = get(ctx, n, co, (int64_t)(ci) * (k) * (k), k)) != NULL)
    int ok = VEC(norm1_w, "norm1.weight", cin) && VEC(norm1_b, "norm1.bias", cin) &&
             CONV(conv1_w, "conv1.weight", cout, cin, 3) && VEC(conv1_b, "conv1.bias", cout) &&
             VEC(norm2_w, "norm2.weight", cout) && VEC(norm2_b, "norm2.bias", cout) &&
             CONV(conv2_w, "conv2.weight", cout, cout, 3) && VEC(conv2_b, "conv2.bias", cout);
    if (ok && cin != cout)
        ok = CONV(short_w, "conv_shortcut.weight", cout, cin, 1) && VEC(short_b, "conv_shortcut.bias", cout);
#undef VEC
#undef CONV
    return ok ? 0 : -1;
}

int vae_bind_attn(vae_attn *a, const char *prefix, int c, vae_getter get, void *ctx) {
    char n[NAME_MAX_LEN];
    a->c = c;
#define VEC(field, suffix) (snprintf(n, sizeof n, "%s.%s", prefix, suffix), (a->field = vae_vec(get, ctx, n, c)) != NULL)
#define MAT(field, suffix) (snprintf(n, sizeof n, "%s.%s", prefix, suffix), (a->field = get(ctx, n, c, c, 0)) != NULL)
    int ok = VEC(norm_w, "group_norm.weight") && VEC(norm_b, "group_norm.bias") &&
             MAT(q_w, "to_q.weight") && VEC(q_b, "to_q.bias") && MAT(k_w, "to_k.weight") && VEC(k_b, "to_k.bias") &&
             MAT(v_w, "to_v.weight") && VEC(v_b, "to_v.bias") && MAT(o_w, "to_out.0.weight") &&
             VEC(o_b, "to_out.0.bias");
#undef VEC
#undef MAT
    return ok ? 0 : -1;
}

/* ---- 3x3 convolution, banded when it upsamples ---- */

/* y [Cout, H*W] = conv3x3(up ? upsample2x(x) : x) with zero padding, where
 * x is [Cin, h*wd] and (H, W) = up ? (2h, 2wd) : (h, wd).
 * An upsampling convolution never materialises the whole upsampled image
 * (at 1024² that is a [256, 1024²] buffer): each band of output rows
 * [r0, r1) is computed from upsampled rows [r0-1, r1+1) (clipped: the image
 * border is the zero padding), and only rows [r0, r1) are kept. */
static int whole_conv3(vae_run *v, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h,
                       int64_t wd, int up) {
    if (!up) {
        vae_conv(v, y, x, w, b, h, wd, 3);
        return 0;
    }
    int64_t H = 2 * h, W = 2 * wd;
    int64_t B = vae_band_rows(v, x->rows, y->rows, H, W);
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
    vae_pool_trim(v);
    return 0;
}

/* ---- blocks ---- */

/* x (in: [cin, h*w]) is replaced by the block output [cout, h*w].
 * With a 1x1 shortcut, the shortcut is taken first so that x itself can be
 * normalised in place: the widest ResNet (cin > cout, at the highest
 * resolution of its block) then holds 1 cin-sized + 2 cout-sized buffers
 * instead of 2 + 1. Identity ResNets keep x for the residual. */
int vae_resnet_forward(vae_run *v, const vae_resnet *r, tensor *x, int64_t h, int64_t w) {
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
    if (vae_norm(v, &t, x, r->norm1_w, r->norm1_b, 1)) return -1;
    if (vae_pool_get(v, r->cout, hw, &a)) return -1;
    if (vae_conv3(v, &a, &t, r->conv1_w, r->conv1_b, h, w, 0)) return -1;
    vae_pool_put(v, &t);   /* x itself when normalised in place */
    if (vae_norm(v, &a, &a, r->norm2_w, r->norm2_b, 1)) return -1;
    if (vae_pool_get(v, r->cout, hw, &o)) return -1;
    if (vae_conv3(v, &o, &a, r->conv2_w, r->conv2_b, h, w, 0)) return -1;
    vae_pool_put(v, &a);
    double t0 = vae_prof_begin(v);
    op_add(v->be, &o, &o, &skip);
    vae_prof_end(v, VAE_PROF_OTHER, t0);
    vae_pool_put(v, &skip);
    *x = o;
    return 0;
}

/* ---- the mid block's attention ---- */

/* Single-head attention: queries [q0, q0+nq) of xfull's hw tokens; residual into xout. */
int vae_attn_rows(vae_run *v, const vae_attn *a, const tensor *xfull, int64_t hw, int64_t q0, int64_t nq,
                  tensor *xout) {
    const vae_config *c = &v->m->cfg;
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

/* ---- the whole-image strategy ---- */

static int whole_norm(vae_run *v, tensor *y, const tensor *x, const tensor *g, const tensor *b, int silu) {
    if (v->exact) return vae_norm_ordered(v, y, x, g, b, silu);   /* the bands' statistics, bit for bit */
    op_group_norm(v->be, y, x, g, b, v->m->cfg.norm_groups, v->m->cfg.norm_eps, silu);
    return 0;
}

static int whole_conv_down(vae_run *v, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h,
                           int64_t wd) {
    double t0 = vae_prof_begin(v);
    op_conv2d_down(v->be, y, x, w, b, h, wd);
    vae_prof_end(v, VAE_PROF_CONV_DOWN, t0);
    return 0;
}

static int whole_attn(vae_run *v, const vae_attn *a, tensor *x, int64_t h, int64_t wd) {
    return vae_attn_rows(v, a, x, h * wd, 0, h * wd, x);
}

const vae_strategy vae_whole = {"whole image", whole_norm, whole_conv3, whole_conv_down, whole_attn};
