/* The VAE decoder forward pass (docs/spec/flux2-text-vae.md §6.3) and the
 * pipeline tail around it (§6.2, §6.5).
 *
 * Memory: activations come from a small pool of reusable backend buffers
 * (vae_blocks.c; released at the end of each decode), and the upsamplers
 * run in bands of output rows, so that the upsampled image exists one band at a time. The
 * largest live set is the first ResNet of the last up block at full
 * resolution: its input (normalised in place) and two output-sized buffers. */
#include "vae_internal.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    if (vae_pool_get(v, top, *h * *w, &y) || vae_conv3_banded(v, &y, x, v->in_w, v->in_b, *h, *w, 0)) return -1;
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
        if (vae_pool_get(v, u->cout, 4 * *h * *w, &y) || vae_conv3_banded(v, &y, x, u->up_w, u->up_b, *h, *w, 1)) return -1;
        vae_pool_put(v, x);
        *x = y;
        *h *= 2;
        *w *= 2;
        if (v->band) v->band->s *= 2;
    }
    if (vae_norm(v, x, x, v->out_norm_w, v->out_norm_b, 1)) return -1;
    if (vae_pool_get(v, c->out_channels, *h * *w, &y) || vae_conv3_banded(v, &y, x, v->out_w, v->out_b, *h, *w, 0)) return -1;
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
    if (!rc) rc = finish_image(v, img, H, W, rgb);
    if (img != image_chw) free(img);
    return rc;
}

/* This rank's band of the decode (it holds latent rows [b[rank], b[rank+1])):
 * the decoder on the band, then the band image gathered on band rank 0
 * into img [3, H*W] (NULL elsewhere). */
static int decode_band(vae_model *v, vae_band *bd, const float *xh, int h, int w, float *img) {
    int lc = v->cfg.latent_channels;
    int64_t a = bd->b[bd->rank], rows = bd->b[bd->rank + 1] - a, H = rows, W = w;
    float *xb = xmalloc((size_t)lc * (size_t)(rows * w) * sizeof(float));
    for (int c = 0; c < lc; c++)
        memcpy(xb + (size_t)c * (size_t)(rows * w), xh + ((size_t)c * (size_t)h + (size_t)a) * (size_t)w,
               (size_t)(rows * w) * sizeof(float));
    tensor x;
    v->band = bd;
    int rc = vae_pool_get(v, lc, rows * w, &x);
    if (!rc) rc = tensor_upload_f32(&x, xb);
    free(xb);
    /* the band's input is the prepare step, agreed before the first halo
     * exchange; the pool's later buffers come and go between collectives */
    rc = dist_lockstep_begin(bd->comm, rc);
    if (!rc) {
        rc = decoder_forward(v, &x, &H, &W);
        dist_lockstep_end();
    }
    float *mine = NULL;
    if (!rc) {
        mine = xmalloc((size_t)3 * (size_t)(H * W) * sizeof(float));
        rc = tensor_download_f32(&x, mine);
    }
    vae_pool_release(v);
    if (!rc) rc = vae_band_gather(v, mine, 3, img);
    v->band = NULL;
    free(mine);
    return rc;
}

int vae_decode_latent_group(vae_model *v, MPI_Comm group, const float *xh, int h, int w, float *image_chw,
                            uint8_t *rgb) {
    int size, rank;
    MPI_Comm_size(group, &size);
    MPI_Comm_rank(group, &rank);
    if (size == 1) return vae_decode_latent(v, xh, h, w, image_chw, rgb);
    if (h <= 0 || w <= 0) return dist_agree(group, tp_error("VAE decode: latent size %dx%d is empty", h, w));
    /* one band of at least one latent row per rank; with fewer rows than
     * ranks the last ranks sit out (they only wait for the agreement) */
    int n = size < h ? size : h, active = rank < n;
    MPI_Comm bc;
    MPI_Comm_split(group, active ? 0 : MPI_UNDEFINED, rank, &bc);
    int rc = 0;
    int64_t s = vae_upscale(&v->cfg), H = (int64_t)h * s, W = (int64_t)w * s;
    float *img = NULL;
    if (active) {
        vae_band bd = {.comm = bc, .rank = rank, .size = n, .wl = w, .s = 1};
        bd.b = xmalloc((size_t)(n + 1) * sizeof(int64_t));
        for (int r = 0; r <= n; r++) bd.b[r] = (int64_t)r * (h / n) + (r < h % n ? r : h % n);
        if (rank == 0) img = image_chw ? image_chw : xmalloc((size_t)3 * (size_t)(H * W) * sizeof(float));
        rc = decode_band(v, &bd, xh, h, w, img);
        free(bd.b);
        MPI_Comm_free(&bc);
    }
    if (!rc && rank == 0) rc = finish_image(v, img, H, W, rgb);
    if (img != image_chw) free(img);
    return dist_agree(group, rc);
}

int vae_decode_packed_group(vae_model *v, MPI_Comm group, const float *packed, int hl, int wl, float *image_chw,
                            uint8_t *rgb) {
    if (hl <= 0 || wl <= 0)
        return dist_agree(group, tp_error("VAE decode: token grid %dx%d is empty", hl, wl));
    size_t n = (size_t)v->cfg.latent_channels * 4 * (size_t)hl * (size_t)wl;
    float *x = xmalloc(n * sizeof(float));
    vae_unpack_bn_unpatchify(v, packed, hl, wl, NULL, NULL, x);
    int rc = vae_decode_latent_group(v, group, x, 2 * hl, 2 * wl, image_chw, rgb);
    free(x);
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
