/* The VAE decoder forward pass (docs/spec/flux2-text-vae.md §6.3) and the
 * pipeline tail around it (§6.2, §6.5).
 *
 * Memory: activations come from a small pool of reusable backend buffers
 * (vae_blocks.c; released at the end of each decode), and the upsamplers
 * run in bands of output rows, so that the upsampled image exists one band at a time. The
 * largest live set is the first ResNet of the last up block at full
 * resolution: its input (normalised in place) and two output-sized buffers. */
#include "vae_internal.h"
#include "kernels/err.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* x [lc, h*w] -> [3, H*W]; *x is replaced (in the pool) */
static int decoder_forward(vae_run *r, tensor *x, int64_t *h, int64_t *w) {
    const vae_model *v = r->m;
    const vae_config *c = &v->cfg;
    tensor y;
    int top = c->block_out[c->n_blocks - 1];
    if (v->pq_w) {
        if (vae_pool_get(r, c->latent_channels, *h * *w, &y)) return -1;
        vae_conv(r, &y, x, v->pq_w, v->pq_b, *h, *w, 1);
        vae_pool_put(r, x);
        *x = y;
    }
    if (vae_pool_get(r, top, *h * *w, &y) || vae_conv3(r, &y, x, v->in_w, v->in_b, *h, *w, 0)) return -1;
    vae_pool_put(r, x);
    *x = y;
    if (vae_resnet_forward(r, &v->mid_res[0], x, *h, *w)) return -1;
    if (v->mid_attn.norm_w && vae_attn_forward(r, &v->mid_attn, x, *h, *w)) return -1;
    if (vae_resnet_forward(r, &v->mid_res[1], x, *h, *w)) return -1;
    for (int i = 0; i < c->n_blocks; i++) {
        const vae_up_block *u = &v->up[i];
        for (int j = 0; j < u->n_res; j++)
            if (vae_resnet_forward(r, &u->res[j], x, *h, *w)) return -1;
        if (!u->up_w) continue;
        if (vae_pool_get(r, u->cout, 4 * *h * *w, &y) || vae_conv3(r, &y, x, u->up_w, u->up_b, *h, *w, 1)) return -1;
        vae_pool_put(r, x);
        *x = y;
        *h *= 2;
        *w *= 2;
    }
    if (vae_norm(r, x, x, v->out_norm_w, v->out_norm_b, 1)) return -1;
    if (vae_pool_get(r, c->out_channels, *h * *w, &y) || vae_conv3(r, &y, x, v->out_w, v->out_b, *h, *w, 0)) return -1;
    vae_pool_put(r, x);
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

/* The end of a decode on the rank that holds the image: a non-finite
 * value is an error (it would be written as black pixels), then 8-bit RGB. */
static int finish_image(const vae_model *v, const float *img, int64_t H, int64_t W, uint8_t *rgb) {
    int64_t bad = first_nonfinite_f32(img, (size_t)3 * (size_t)H * (size_t)W);
    if (bad >= 0)
        return tp_error("VAE decode: the decoded image is not finite (%s at channel %lld, pixel %lld); the latents or "
                        "a VAE weight hold NaN/Inf (find a weight with 'tpgen inspect --model DIR --component vae "
                        "--scan-weights')", img[bad] != img[bad] ? "NaN" : "Inf", (long long)(bad / (H * W)),
                        (long long)(bad % (H * W)));
    if (rgb) vae_to_rgb8(img, (int)H, (int)W, v->dt == DT_BF16, rgb);
    return 0;
}

int vae_decode_latent_group(vae_model *v, MPI_Comm group, const float *xh, int h, int w, float *image_chw,
                            uint8_t *rgb) {
    int rank = 0;
    if (group != MPI_COMM_NULL) MPI_Comm_rank(group, &rank);
    if (h <= 0 || w <= 0) return vae_agree(group, tp_error("VAE decode: latent size %dx%d is empty", h, w));
    int64_t s = vae_upscale(&v->cfg), H = (int64_t)h * s, W = (int64_t)w * s;
    float *img = rank == 0 ? image_chw ? image_chw : xmalloc((size_t)3 * (size_t)(H * W) * sizeof(float)) : NULL;
    vae_pass p = {.in = xh, .in_ch = v->cfg.latent_channels, .units = h, .wl = w, .s_in = 1, .in_cols = w,
                  .out_ch = 3, .forward = decoder_forward, .what = "VAE decode"};
    int rc = vae_group_pass(v, group, &p, img);
    if (!rc && rank == 0) rc = finish_image(v, img, H, W, rgb);
    if (img != image_chw) free(img);
    return vae_agree(group, rc);
}

int vae_decode_latent(vae_model *v, const float *xh, int h, int w, float *image_chw, uint8_t *rgb) {
    return vae_decode_latent_group(v, MPI_COMM_NULL, xh, h, w, image_chw, rgb);
}

int vae_decode_packed_group(vae_model *v, MPI_Comm group, const float *packed, int hl, int wl, float *image_chw,
                            uint8_t *rgb) {
    if (hl <= 0 || wl <= 0)
        return vae_agree(group, tp_error("VAE decode: token grid %dx%d is empty", hl, wl));
    size_t n = (size_t)v->cfg.latent_channels * 4 * (size_t)hl * (size_t)wl;
    float *x = xmalloc(n * sizeof(float));
    vae_unpack_bn_unpatchify(v, packed, hl, wl, NULL, NULL, x);
    int rc = vae_decode_latent_group(v, group, x, 2 * hl, 2 * wl, image_chw, rgb);
    free(x);
    return rc;
}

int vae_decode_packed(vae_model *v, const float *packed, int hl, int wl, float *image_chw, uint8_t *rgb) {
    return vae_decode_packed_group(v, MPI_COMM_NULL, packed, hl, wl, image_chw, rgb);
}
