/* The banded strategy (vae_internal.h: vae_banded, with the band in
 * r->band): the ops of a patch-parallel decode or encode. Each rank of the
 * band communicator holds one band of rows of every activation, and only
 * four things cross bands:
 *  - a 3x3 convolution needs one row above and one below the band: the
 *    neighbours exchange them first (zeros at the image border, which is
 *    the convolution's zero padding). With upsampling the exchange happens
 *    before it, on the low-resolution rows, so that the band of upsampled
 *    rows [2a, 2b) sees upsampled rows 2a-1 and 2b, as the whole image does;
 *  - a GroupNorm's statistics: per-channel sums, then sums of squared
 *    deviations from the group mean, each all-reduced in f64 (the same
 *    two-pass arithmetic as op_group_norm, so that the mean and the rstd,
 *    rounded to f32, almost always come out bit-identical); where the
 *    backend is rows-invariant, the per-row sums folded in image row order
 *    instead (vae_norm.c: always bit-identical);
 *  - the mid-block attention, which is global: the whole mid activation
 *    (H/8 x W/8, small) is gathered on every band rank, and each computes
 *    the attention of its own query rows against all keys.
 * Everything else (1x1 convolutions, residual adds, SiLU) is per pixel. */
#include "vae_internal.h"
#include "core/dist/halo.h"
#include "kernels/err.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* rows of rank r's band at scale s */
static int64_t band_row0(const vae_band *b, int r, int64_t s) { return s * b->b[r]; }
static int64_t band_nrows(const vae_band *b, int r, int64_t s) { return s * (b->b[r + 1] - b->b[r]); }
/* the scale of an activation of h rows on this rank */
static int64_t band_scale(const vae_band *b, int64_t h) { return h / (b->b[b->rank + 1] - b->b[b->rank]); }

static int band_norm(vae_run *v, tensor *y, const tensor *x, const tensor *g, const tensor *b, int silu) {
    if (v->exact) return vae_norm_ordered(v, y, x, g, b, silu);
    const vae_band *bd = v->band;
    int64_t C = x->rows;
    int groups = v->m->cfg.norm_groups, cpg = (int)(C / groups);
    double *s = xmalloc((size_t)(C + 1) * sizeof(double)), *center = xmalloc((size_t)C * sizeof(double)),
           *mean = xcalloc((size_t)groups, sizeof(double)), *var = xcalloc((size_t)groups, sizeof(double));
    float *ga = xmalloc((size_t)C * sizeof(float)), *bb = xmalloc((size_t)C * sizeof(float));
    int rc = -1;
    op_channel_sums(v->be, x, NULL, 1, s);
    s[C] = (double)x->cols;   /* the pixel count travels with the sums */
    if (MPI_Allreduce(MPI_IN_PLACE, s, (int)C + 1, MPI_DOUBLE, MPI_SUM, bd->comm) != MPI_SUCCESS) {
        tp_error("VAE band decode: GroupNorm all-reduce failed");
        goto out;
    }
    double n = (double)cpg * s[C];
    for (int64_t c = 0; c < C; c++) mean[c / cpg] += s[c];
    for (int k = 0; k < groups; k++) mean[k] /= n;
    for (int64_t c = 0; c < C; c++) center[c] = mean[c / cpg];
    op_channel_sums(v->be, x, center, 2, s);
    if (MPI_Allreduce(MPI_IN_PLACE, s, (int)C, MPI_DOUBLE, MPI_SUM, bd->comm) != MPI_SUCCESS) {
        tp_error("VAE band decode: GroupNorm all-reduce failed");
        goto out;
    }
    for (int64_t c = 0; c < C; c++) var[c / cpg] += s[c];
    if (tensor_download_f32(g, ga) || tensor_download_f32(b, bb)) goto out;
    for (int64_t c = 0; c < C; c++) {   /* op_group_norm's folding: y = x*a + b */
        int k = (int)(c / cpg);
        float mu = (float)mean[k], rstd = (float)(1.0 / sqrt(var[k] / n + (double)v->m->cfg.norm_eps));
        float a = rstd * ga[c];
        ga[c] = a;
        bb[c] = bb[c] - mu * a;
    }
    op_channel_affine(v->be, y, x, ga, bb, silu);
    rc = 0;
out:
    free(s); free(center); free(mean); free(var); free(ga); free(bb);
    return rc;
}

/* dst [C, (s1-s0)*wd] = rows [s0, s1) of V = [above; x rows 0..h-1; below] */
static int fill_rows(vae_run *v, tensor *dst, const tensor *x, const tensor *above, const tensor *below, int64_t h,
                     int64_t wd, int64_t s0, int64_t s1) {
    int64_t j = 0;
    if (s0 == 0) {
        tensor d = tensor_cols(dst, 0, wd);
        op_copy(v->be, &d, above);
        j = 1;
    }
    int64_t x0 = s0 + j - 1, x1 = s1 < h + 1 ? s1 - 1 : h;   /* x rows [x0, x1) */
    if (x1 > x0) {
        tensor d = tensor_cols(dst, j * wd, (x1 - x0) * wd), src = tensor_cols(x, x0 * wd, (x1 - x0) * wd);
        op_copy(v->be, &d, &src);
        j += x1 - x0;
    }
    if (s1 == h + 2) {
        tensor d = tensor_cols(dst, j * wd, wd);
        op_copy(v->be, &d, below);
    }
    return 0;
}

/* The two halo rows of x [C, h*wd] from the neighbours, in backend tensors
 * [C, wd] (zeros at the image border). */
static int exchange_halos(vae_run *v, const tensor *x, int64_t h, int64_t wd, tensor *above, tensor *below) {
    int64_t C = x->rows;
    size_t row = (size_t)C * (size_t)wd * dtype_size(v->dt);
    char *buf = xcalloc(4, row);   /* top, bottom, from above, from below */
    tensor t = tensor_cols(x, 0, wd), bt = tensor_cols(x, (h - 1) * wd, wd);
    int rc = tensor_download_raw(&t, buf) || tensor_download_raw(&bt, buf + row) ? -1 : 0;
    if (!rc) rc = dist_halo_rows(v->band->comm, buf, buf + row, buf + 2 * row, buf + 3 * row, row);
    if (!rc) rc = vae_pool_get(v, C, wd, above) || vae_pool_get(v, C, wd, below) ? -1 : 0;
    if (!rc) rc = tensor_upload_raw(above, buf + 2 * row) || tensor_upload_raw(below, buf + 3 * row) ? -1 : 0;
    free(buf);
    return rc;
}

/* y [Cout, S*h * S*wd] (S = 2 when up) = this band's rows of
 * conv3x3(upsample(V)), V the band with its halos (h + 2 rows). Chunks of
 * output rows [r0, r1) (in the coordinates of upsample(V), whose rows
 * [S, S*(h+1)) are the band's) each build V rows [sa, sb) covering the
 * upsampled rows [r0-1, r1+1), convolve them, and keep [r0, r1). */
static int band_conv3(vae_run *v, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h, int64_t wd,
                      int up) {
    tensor above, below;
    if (exchange_halos(v, x, h, wd, &above, &below)) return -1;
    int64_t S = up ? 2 : 1, W = S * wd, R0 = S, R1 = S * (h + 1);
    int64_t B = vae_band_rows(v, x->rows, y->rows, R1 - R0, W);
    for (int64_t r0 = R0; r0 < R1; r0 += B) {
        int64_t r1 = r0 + B < R1 ? r0 + B : R1;
        int64_t sa = (r0 - 1) / S, sb = (r1 + 1 + S - 1) / S;
        tensor vin, upb, tmp;
        if (vae_pool_get(v, x->rows, (sb - sa) * wd, &vin)) return -1;
        fill_rows(v, &vin, x, &above, &below, h, wd, sa, sb);
        if (up) {
            if (vae_pool_get(v, x->rows, (sb - sa) * S * W, &upb)) return -1;
            double t0 = vae_prof_begin(v);
            op_upsample2x(v->be, &upb, &vin, sb - sa, wd);
            vae_prof_end(v, VAE_PROF_UPSAMPLE, t0);
            vae_pool_put(v, &vin);
        } else {
            upb = vin;
        }
        if (vae_pool_get(v, y->rows, S * (sb - sa) * W, &tmp)) return -1;
        vae_conv(v, &tmp, &upb, w, b, S * (sb - sa), W, 3);
        vae_pool_put(v, &upb);
        tensor keep = tensor_cols(&tmp, (r0 - S * sa) * W, (r1 - r0) * W);
        tensor dst = tensor_cols(y, (r0 - R0) * W, (r1 - r0) * W);
        double t0 = vae_prof_begin(v);
        op_copy(v->be, &dst, &keep);
        vae_prof_end(v, VAE_PROF_OTHER, t0);
        vae_pool_put(v, &tmp);
    }
    vae_pool_put(v, &above);
    vae_pool_put(v, &below);
    vae_pool_trim(v);
    return 0;
}

/* y [Cout, (h/2)*(wd/2)]: output row i reads input rows 2i, 2i+1, 2i+2
 * (diffusers pads one zero row at the bottom only), so the band needs the
 * first row of the band below. V = [x; below; a zero row] has h + 2 rows
 * (even, as op_conv2d_down wants); its last output row is discarded. */
static int band_conv_down(vae_run *v, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h,
                          int64_t wd) {
    tensor above, below, vin, out;
    if (exchange_halos(v, x, h, wd, &above, &below)) return -1;
    if (vae_pool_get(v, x->rows, (h + 2) * wd, &vin)) return -1;
    tensor d = tensor_cols(&vin, 0, h * wd), last = tensor_cols(&vin, (h + 1) * wd, wd);
    op_copy(v->be, &d, x);
    d = tensor_cols(&vin, h * wd, wd);
    op_copy(v->be, &d, &below);
    size_t row = (size_t)x->rows * (size_t)wd * dtype_size(v->dt);
    char *zero = xcalloc(1, row);
    int rc = tensor_upload_raw(&last, zero);
    free(zero);
    if (rc) return -1;
    vae_pool_put(v, &above);
    vae_pool_put(v, &below);
    if (vae_pool_get(v, y->rows, (h / 2 + 1) * (wd / 2), &out)) return -1;
    double t0 = vae_prof_begin(v);
    op_conv2d_down(v->be, &out, &vin, w, b, h + 2, wd);
    vae_prof_end(v, VAE_PROF_CONV_DOWN, t0);
    vae_pool_put(v, &vin);
    tensor keep = tensor_cols(&out, 0, (h / 2) * (wd / 2));
    op_copy(v->be, y, &keep);
    vae_pool_put(v, &out);
    vae_pool_trim(v);
    return 0;
}

/* Gather the bands of x [C, rows*W] into full [C, H*W] on every band rank
 * (host staging; the mid activation is small). */
static int gather_full(vae_run *v, const tensor *x, int64_t s, tensor *full) {
    const vae_band *bd = v->band;
    int64_t C = x->rows, W = s * bd->wl, H = band_row0(bd, bd->size, s);
    size_t es = dtype_size(v->dt);
    size_t *counts = xmalloc((size_t)bd->size * sizeof(size_t));
    for (int r = 0; r < bd->size; r++) counts[r] = (size_t)C * (size_t)(band_nrows(bd, r, s) * W) * es;
    char *mine = xmalloc(counts[bd->rank]), *all = xmalloc((size_t)C * (size_t)(H * W) * es),
         *img = xmalloc((size_t)C * (size_t)(H * W) * es);
    int rc = tensor_download_raw(x, mine) || dist_gather_bytes(bd->comm, -1, mine, counts, all) ? -1 : 0;
    if (!rc) {   /* rank-major [r][C][rows_r*W] -> [C][H*W] */
        size_t off = 0;
        for (int r = 0; r < bd->size; r++) {
            size_t n = (size_t)(band_nrows(bd, r, s) * W) * es, at = (size_t)(band_row0(bd, r, s) * W) * es;
            for (int64_t c = 0; c < C; c++) memcpy(img + (size_t)c * (size_t)(H * W) * es + at, all + off + (size_t)c * n, n);
            off += (size_t)C * n;
        }
        rc = vae_pool_get(v, C, H * W, full) || tensor_upload_raw(full, img) ? -1 : 0;
    }
    free(counts); free(mine); free(all); free(img);
    return rc;
}

static int band_attn(vae_run *v, const vae_attn *a, tensor *x, int64_t h, int64_t wd) {
    const vae_band *bd = v->band;
    int64_t s = band_scale(bd, h), W = s * bd->wl, H = band_row0(bd, bd->size, s);
    tensor full;
    if (gather_full(v, x, s, &full)) return -1;
    int rc = vae_attn_rows(v, a, &full, H * W, band_row0(bd, bd->rank, s) * W, x->cols, x);
    vae_pool_put(v, &full);
    return rc;
}

int vae_band_gather(const vae_band *bd, int64_t s, const float *band, int64_t channels, float *all) {
    int64_t W = s * bd->wl, H = band_row0(bd, bd->size, s);
    size_t *counts = xmalloc((size_t)bd->size * sizeof(size_t));
    for (int r = 0; r < bd->size; r++) counts[r] = (size_t)channels * (size_t)(band_nrows(bd, r, s) * W) * sizeof(float);
    float *tmp = bd->rank == 0 ? xmalloc((size_t)channels * (size_t)(H * W) * sizeof(float)) : NULL;
    int rc = dist_gather_bytes(bd->comm, 0, band, counts, tmp);
    if (!rc && bd->rank == 0) {
        size_t off = 0;
        for (int r = 0; r < bd->size; r++) {
            int64_t n = band_nrows(bd, r, s) * W, at = band_row0(bd, r, s) * W;
            for (int64_t c = 0; c < channels; c++)
                memcpy(all + c * H * W + at, tmp + off + (size_t)(c * n), (size_t)n * sizeof(float));
            off += (size_t)(channels * n);
        }
    }
    free(counts);
    free(tmp);
    return rc;
}

const vae_strategy vae_banded = {"row band", band_norm, band_conv3, band_conv_down, band_attn};
