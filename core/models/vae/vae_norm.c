/* The GroupNorm whose statistics do not depend on the band split
 * (vae_internal.h, vae_norm_ordered), for both strategies where the backend
 * is rows-invariant: the whole image (vae_blocks.c) and a band
 * (vae_band.c) fold the same per-row sums in the same image row order, so
 * the mean and rstd, and with them the image, are the same bits for any
 * band count. Each row's sum is op_channel_sums on that row alone
 * (op_channel_row_sums: the same vector lanes wherever the row sits); a band adds its rows to the running
 * sums received from the band above and passes them on (C doubles per
 * hop), and the last band broadcasts the totals. */
#include "vae_internal.h"
#include "kernels/err.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the row width of an activation of `cols` pixels holding `rows` unit rows (width wl units): s*wl with
 * cols = s*rows * s*wl */
static int64_t row_width(int64_t cols, int64_t rows, int64_t wl) {
    int64_t s = 1;
    while (s * s * rows * wl < cols) s++;
    return s * wl;
}

/* acc[c] += the sums of rows [0, rows) of x (row width W), in row order */
static void fold_rows(vae_run *v, const tensor *x, int64_t W, const double *center, int p, double *acc) {
    int64_t rows = x->cols / W;
    double *rs = xmalloc((size_t)(x->rows * rows) * sizeof *rs);
    op_channel_row_sums(v->be, x, W, center, p, rs);
    for (int64_t c = 0; c < x->rows; c++)
        for (int64_t r = 0; r < rows; r++) acc[c] += rs[c * rows + r];
    free(rs);
}

/* out [C] = the image's row sums folded in row order across the bands */
static int ordered_sums(vae_run *v, const tensor *x, int64_t W, const double *center, int p, double *out) {
    const vae_band *bd = v->band;
    int64_t C = x->rows;
    int rc = 0;
    memset(out, 0, (size_t)C * sizeof *out);
    if (bd && bd->rank > 0) rc = MPI_Recv(out, (int)C, MPI_DOUBLE, bd->rank - 1, 0, bd->comm, MPI_STATUS_IGNORE);
    if (!rc) fold_rows(v, x, W, center, p, out);
    if (!rc && bd && bd->rank + 1 < bd->size) rc = MPI_Send(out, (int)C, MPI_DOUBLE, bd->rank + 1, 0, bd->comm);
    if (!rc && bd) rc = MPI_Bcast(out, (int)C, MPI_DOUBLE, bd->size - 1, bd->comm);
    return rc == MPI_SUCCESS ? 0 : tp_error("VAE: passing the GroupNorm sums between bands failed");
}

int vae_norm_ordered(vae_run *v, tensor *y, const tensor *x, const tensor *g, const tensor *b, int silu) {
    const vae_band *bd = v->band;
    int64_t C = x->rows, rows = bd ? bd->b[bd->rank + 1] - bd->b[bd->rank] : v->units;
    int64_t total = bd ? bd->b[bd->size] : v->units, W = row_width(x->cols, rows, v->wl);
    int groups = v->m->cfg.norm_groups, cpg = (int)(C / groups);
    double *s = xmalloc((size_t)C * sizeof(double)), *center = xmalloc((size_t)C * sizeof(double)),
           *mean = xcalloc((size_t)groups, sizeof(double)), *var = xcalloc((size_t)groups, sizeof(double));
    float *ga = xmalloc((size_t)C * sizeof(float)), *bb = xmalloc((size_t)C * sizeof(float));
    /* the pixel count: the image's rows at this scale (W / wl of them per unit row) times W */
    double n = (double)cpg * (double)(total * (W / v->wl)) * (double)W;
    int rc = ordered_sums(v, x, W, NULL, 1, s);
    for (int64_t c = 0; !rc && c < C; c++) mean[c / cpg] += s[c];
    for (int k = 0; !rc && k < groups; k++) mean[k] /= n;
    for (int64_t c = 0; !rc && c < C; c++) center[c] = mean[c / cpg];
    if (!rc) rc = ordered_sums(v, x, W, center, 2, s);
    for (int64_t c = 0; !rc && c < C; c++) var[c / cpg] += s[c];
    if (!rc) rc = tensor_download_f32(g, ga) || tensor_download_f32(b, bb) ? -1 : 0;
    for (int64_t c = 0; !rc && c < C; c++) {   /* op_group_norm's folding: y = x*a + b */
        int k = (int)(c / cpg);
        float mu = (float)mean[k], rstd = (float)(1.0 / sqrt(var[k] / n + (double)v->m->cfg.norm_eps));
        float a = rstd * ga[c];
        ga[c] = a;
        bb[c] = bb[c] - mu * a;
    }
    if (!rc) op_channel_affine(v->be, y, x, ga, bb, silu);
    free(s); free(center); free(mean); free(var); free(ga); free(bb);
    return rc;
}
