/* The FLUX.2 VAE encoder (diffusers AutoencoderKLFlux2.encode, the Encoder
 * class of models/autoencoders/vae.py) and the reference-image tail of the
 * Flux2 pipelines (_encode_vae_image): pixels [3, H, W] in [-1, 1] ->
 * conv_in -> down blocks (ResNets, then a stride-2 3x3 convolution padded
 * only on the bottom/right, Downsample2D(padding=0)) -> mid block (ResNet,
 * single-head attention, ResNet) -> GroupNorm + SiLU -> conv_out (2·lc
 * channels: mean and log-variance) -> quant_conv -> the mean half
 * (sample_mode "argmax") -> patchify 2x2 -> BatchNorm normalisation.
 *
 * It shares the ResNet and attention blocks and the activation pool with
 * the decoder (vae_blocks.c), so the peak memory follows the same rule: the
 * widest ResNet at the highest resolution holds about four of its
 * activations (input kept for the residual, normalised copy, two convolution
 * outputs). */
#include "vae_internal.h"
#include "kernels/err.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_LEN 160

int vae_bind_encoder(vae_model *v, vae_getter get, void *ctx) {
    const vae_config *c = &v->cfg;
    vae_encoder *e = &v->enc;
    if (c->in_channels != 3)
        return tp_error("VAE config: in_channels is %d; the encoder reads RGB reference images and needs 3",
                        c->in_channels);
    if (!c->enc_blocks_ok)
        return tp_error("VAE config: down_block_types other than DownEncoderBlock2D are not supported by the encoder");
    if (c->enc_n_blocks < 1) return tp_error("VAE config: block_out_channels is missing (the encoder's widths)");
    for (int i = 0; i < c->enc_n_blocks; i++)
        if (c->enc_block_out[i] % c->norm_groups)
            return tp_error("VAE config: norm_num_groups %d does not divide encoder channel count %d", c->norm_groups,
                            c->enc_block_out[i]);
    /* the encoder halves the image n_blocks - 1 times, the patch 2x2 once
     * more: the same 16 pixels per token as the decoder when both have the
     * same number of blocks */
    if (c->enc_n_blocks != c->n_blocks)
        return tp_error("VAE config: the encoder has %d blocks and the decoder %d; their scale factors differ",
                        c->enc_n_blocks, c->n_blocks);
    int lc = c->latent_channels, nb = c->enc_n_blocks, top = c->enc_block_out[nb - 1];
    e->in_channels = 3;
    char n[NAME_LEN];
    if (!(e->in_w = get(ctx, "encoder.conv_in.weight", c->enc_block_out[0], 3 * 9, 3)) ||
        !(e->in_b = vae_vec(get, ctx, "encoder.conv_in.bias", c->enc_block_out[0])))
        return -1;
    int prev = c->enc_block_out[0];
    for (int i = 0; i < nb; i++) {
        vae_down_block *d = &e->down[i];
        d->cin = prev;
        d->cout = c->enc_block_out[i];
        d->n_res = c->layers_per_block;
        for (int j = 0; j < d->n_res; j++) {
            snprintf(n, sizeof n, "encoder.down_blocks.%d.resnets.%d", i, j);
            if (vae_bind_resnet(&d->res[j], n, j == 0 ? d->cin : d->cout, d->cout, get, ctx)) return -1;
        }
        if (i < nb - 1) {
            snprintf(n, sizeof n, "encoder.down_blocks.%d.downsamplers.0.conv.weight", i);
            if (!(d->down_w = get(ctx, n, d->cout, (int64_t)d->cout * 9, 3))) return -1;
            snprintf(n, sizeof n, "encoder.down_blocks.%d.downsamplers.0.conv.bias", i);
            if (!(d->down_b = vae_vec(get, ctx, n, d->cout))) return -1;
        }
        prev = d->cout;
    }
    if (vae_bind_resnet(&e->mid_res[0], "encoder.mid_block.resnets.0", top, top, get, ctx) ||
        vae_bind_resnet(&e->mid_res[1], "encoder.mid_block.resnets.1", top, top, get, ctx))
        return -1;
    if (c->mid_attention && vae_bind_attn(&e->mid_attn, "encoder.mid_block.attentions.0", top, get, ctx)) return -1;
    if (!(e->out_norm_w = vae_vec(get, ctx, "encoder.conv_norm_out.weight", top)) ||
        !(e->out_norm_b = vae_vec(get, ctx, "encoder.conv_norm_out.bias", top)) ||
        !(e->out_w = get(ctx, "encoder.conv_out.weight", 2 * lc, (int64_t)top * 9, 3)) ||
        !(e->out_b = vae_vec(get, ctx, "encoder.conv_out.bias", 2 * lc)))
        return -1;
    if (c->quant_conv &&
        (!(e->qc_w = get(ctx, "quant_conv.weight", 2 * lc, 2 * lc, 1)) ||
         !(e->qc_b = vae_vec(get, ctx, "quant_conv.bias", 2 * lc))))
        return -1;
    return 0;
}

/* x [3, H*W] -> the moments [2·lc, (H/8)*(W/8)]; *x is replaced (in the pool) */
static int encoder_forward(vae_run *r, tensor *x, int64_t *h, int64_t *w) {
    const vae_config *c = &r->m->cfg;
    const vae_encoder *e = &r->m->enc;
    tensor y;
    if (vae_pool_get(r, e->in_w->rows, *h * *w, &y) || vae_conv3(r, &y, x, e->in_w, e->in_b, *h, *w, 0)) return -1;
    vae_pool_put(r, x);
    *x = y;
    for (int i = 0; i < c->enc_n_blocks; i++) {
        const vae_down_block *d = &e->down[i];
        for (int j = 0; j < d->n_res; j++)
            if (vae_resnet_forward(r, &d->res[j], x, *h, *w)) return -1;
        if (!d->down_w) continue;
        if (vae_pool_get(r, d->cout, (*h / 2) * (*w / 2), &y) || vae_conv_down(r, &y, x, d->down_w, d->down_b, *h, *w))
            return -1;
        vae_pool_put(r, x);
        *x = y;
        *h /= 2;
        *w /= 2;
    }
    if (vae_resnet_forward(r, &e->mid_res[0], x, *h, *w)) return -1;
    if (e->mid_attn.norm_w && vae_attn_forward(r, &e->mid_attn, x, *h, *w)) return -1;
    if (vae_resnet_forward(r, &e->mid_res[1], x, *h, *w)) return -1;
    if (vae_norm(r, x, x, e->out_norm_w, e->out_norm_b, 1)) return -1;
    if (vae_pool_get(r, e->out_w->rows, *h * *w, &y) || vae_conv3(r, &y, x, e->out_w, e->out_b, *h, *w, 0)) return -1;
    vae_pool_put(r, x);
    *x = y;
    if (e->qc_w) {
        if (vae_pool_get(r, e->qc_w->rows, *h * *w, &y)) return -1;
        vae_conv(r, &y, x, e->qc_w, e->qc_b, *h, *w, 1);
        vae_pool_put(r, x);
        *x = y;
    }
    return 0;
}

/* The host tail on z = latent_dist.mode() [lc, h, w]: the optional outputs. */
static void encode_tail(const vae_model *v, const float *z, int64_t h, int64_t w, float *mode, float *latents,
                        float *packed) {
    int lc = v->cfg.latent_channels;
    if (mode) memcpy(mode, z, (size_t)lc * (size_t)(h * w) * sizeof(float));
    /* patchify: channel 4·c + 2·dy + dx of token (r, q) is z[c, 2r+dy, 2q+dx];
     * then (z - mean) / std, in bf16 as bf16(bf16(z - mean) / std) */
    int bf = v->dt == DT_BF16, c4 = 4 * lc;
    int64_t hl = h / 2, wl = w / 2, nt = hl * wl;
    for (int64_t t = 0; t < nt; t++) {
        int64_t r = t / wl, q = t % wl;
        for (int ch = 0; ch < c4; ch++) {
            int cz = ch / 4, dy = (ch / 2) % 2, dx = ch % 2;
            float val = z[((int64_t)cz * h + 2 * r + dy) * w + 2 * q + dx];
            float o = bf ? bf16r(bf16r(val - v->bn_mean[ch]) / v->bn_std[ch]) : (val - v->bn_mean[ch]) / v->bn_std[ch];
            if (latents) latents[(int64_t)ch * nt + t] = o;
            if (packed) packed[t * c4 + ch] = o;
        }
    }
}

static int check_encode_args(const vae_model *v, int H, int W) {
    int px = vae_pixels_per_token(&v->cfg);
    if (!(v->parts & VAE_ENCODER)) return tp_error("VAE encode: the encoder was not loaded");
    if (H <= 0 || W <= 0 || H % px || W % px)
        return tp_error("VAE encode: image size %dx%d must be a positive multiple of %d", W, H, px);
    return 0;
}

int vae_encode_image_group(vae_model *v, MPI_Comm group, const float *pixels, int H, int W, float *mode,
                           float *latents, float *packed) {
    int rank = 0;
    if (group != MPI_COMM_NULL) MPI_Comm_rank(group, &rank);
    if (vae_agree(group, check_encode_args(v, H, W))) return -1;
    /* bands of latent-mode rows (s pixel rows each: every band halves evenly at each downsampler); the
     * moments' first lc channels are latent_dist.mode() */
    int s = 1 << (v->cfg.enc_n_blocks - 1), hm = H / s, wm = W / s, lc = v->cfg.latent_channels;
    float *z = rank == 0 ? xmalloc((size_t)lc * (size_t)hm * (size_t)wm * sizeof(float)) : NULL;
    vae_pass p = {.in = pixels, .in_ch = 3, .units = hm, .wl = wm, .s_in = s, .in_cols = W, .out_ch = lc,
                  .forward = encoder_forward, .what = "VAE encoder"};
    int rc = vae_group_pass(v, group, &p, z);
    if (!rc && rank == 0) encode_tail(v, z, hm, wm, mode, latents, packed);
    free(z);
    return rc;
}

int vae_encode_image(vae_model *v, const float *pixels, int H, int W, float *mode, float *latents, float *packed) {
    return vae_encode_image_group(v, MPI_COMM_NULL, pixels, H, W, mode, latents, packed);
}
