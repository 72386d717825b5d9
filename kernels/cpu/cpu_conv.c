/* 2-D convolution (stride 1, zero padding k/2) as im2col + sgemm:
 *   y[Cout, pixels] = W[Cout, Cin·k·k] · col[Cin·k·k, pixels].
 * The image is processed in bands of output rows so that the im2col buffer
 * stays under COL_BYTES (a 3x3 conv over 256 channels at 1024² would need
 * 9.7 GB in one piece). Inside a band the work is split into (Cout panel,
 * pixel block) items over the OpenMP threads, each a single-threaded sgemm;
 * bf16 weights are widened per panel, never as a whole. */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

#define COL_BYTES (64u << 20)
enum { CO_PANEL = 64, PIX_BLOCK_MIN = 256 };

/* col[(ci*k + ky)*k + kx][p] for output rows [r0, r0+nr), p = (r-r0)*wd + xo */
static void im2col(const tensor *x, int64_t h, int64_t wd, int k, int64_t r0, int64_t nr, float *col) {
    int64_t Cin = x->rows, np = nr * wd, pad = k / 2;
#pragma omp parallel if (Cin * np * k * k > CPU_PAR_MIN)
    {
        float *buf = xmalloc((size_t)(h * wd) * sizeof(float));
#pragma omp for
        for (int64_t ci = 0; ci < Cin; ci++) {
            /* only the input rows the band touches are widened */
            int64_t lo = r0 - pad < 0 ? 0 : r0 - pad, hi = r0 + nr + pad > h ? h : r0 + nr + pad;
            const float *img = row_f32(x, ci, lo * wd, (hi - lo) * wd, buf); /* input row lo first */
            for (int ky = 0; ky < k; ky++)
                for (int kx = 0; kx < k; kx++) {
                    float *dst = col + ((ci * k + ky) * k + kx) * np;
                    for (int64_t r = 0; r < nr; r++) {
                        int64_t iy = r0 + r + ky - pad;
                        float *d = dst + r * wd;
                        if (iy < 0 || iy >= h) { memset(d, 0, (size_t)wd * sizeof(float)); continue; }
                        const float *s = img + (iy - lo) * wd;
                        for (int64_t xo = 0; xo < wd; xo++) {
                            int64_t ix = xo + kx - pad;
                            d[xo] = ix >= 0 && ix < wd ? s[ix] : 0.0f;
                        }
                    }
                }
        }
        free(buf);
    }
}

/* y rows [co0, co0+nc), pixels [p0, p0+pn) of the band starting at pixel b0 */
static void conv_item(tensor *y, const tensor *w, const float *bias, const float *col, int64_t np, int64_t KK,
                      int64_t co0, int64_t nc, int64_t b0, int64_t p0, int64_t pn, float *wbuf, float *cbuf) {
    const float *wp;
    int64_t ldw = KK, ldc = pn;
    if (w->dtype == DT_F32) { wp = (const float *)row_ptr(w, co0); ldw = w->ld; }
    else { for (int64_t r = 0; r < nc; r++) row_f32(w, co0 + r, 0, KK, wbuf + r * KK); wp = wbuf; }
    float *cp = cbuf;
    if (y->dtype == DT_F32) { cp = (float *)row_ptr(y, co0) + b0 + p0; ldc = y->ld; }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nc, (int)pn, (int)KK, 1.0f, wp, (int)ldw, col + p0,
                (int)np, 0.0f, cp, (int)ldc);
    for (int64_t r = 0; r < nc; r++) {
        float *cr = cp + r * ldc;
        if (bias) for (int64_t j = 0; j < pn; j++) cr[j] += bias[co0 + r];
        if (y->dtype != DT_F32) row_store(y, co0 + r, b0 + p0, pn, cr);
    }
}

void cpu_conv2d(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
                int64_t h, int64_t wd, int k) {
    int64_t Cin = x->rows, Cout = w->rows, KK = Cin * k * k;
    CPU_REQUIRE(k == 1 || k == 3, "op_conv2d: kernel size %d (1 or 3 supported)", k);
    CPU_REQUIRE(x->cols == h * wd && y->cols == h * wd && y->rows == Cout && w->cols == KK,
                "op_conv2d: x [%lld,%lld] w [%lld,%lld] y [%lld,%lld] do not fit %lldx%lld, k %d", (long long)Cin,
                (long long)x->cols, (long long)Cout, (long long)w->cols, (long long)y->rows, (long long)y->cols,
                (long long)h, (long long)wd, k);
    CPU_REQUIRE(!bias || bias->rows * bias->cols == Cout, "op_conv2d: bias must have %lld values", (long long)Cout);
    if (h * wd == 0 || Cout == 0) return;
    float *bf = NULL;
    if (bias) { bf = xmalloc((size_t)Cout * sizeof(float)); convert_to_f32(bf, bias->data, bias->dtype, (size_t)Cout); }
    int64_t band = (int64_t)(cpu_tile_budget(COL_BYTES) / (sizeof(float) * (size_t)(KK > 0 ? KK : 1) * (size_t)wd));
    band = band < 1 ? 1 : band > h ? h : band;
    float *col = xmalloc(sizeof(float) * (size_t)KK * (size_t)(band * wd));
    int threads = omp_get_max_threads();
    for (int64_t r0 = 0; r0 < h; r0 += band) {
        int64_t nr = h - r0 < band ? h - r0 : band, np = nr * wd;
        im2col(x, h, wd, k, r0, nr, col);
        int64_t npanel = (Cout + CO_PANEL - 1) / CO_PANEL;
        /* enough pixel blocks for two items per thread */
        int64_t pb = (np * npanel + 2 * threads - 1) / (2 * threads);
        pb = pb < PIX_BLOCK_MIN ? PIX_BLOCK_MIN : pb;
        pb = pb > np ? np : pb;
        int64_t nblk = (np + pb - 1) / pb;
#pragma omp parallel
        {
            float *wbuf = w->dtype == DT_F32 ? NULL : xmalloc(sizeof(float) * CO_PANEL * (size_t)KK);
            float *cbuf = y->dtype == DT_F32 ? NULL : xmalloc(sizeof(float) * CO_PANEL * (size_t)pb);
#pragma omp for collapse(2) schedule(dynamic)
            for (int64_t pi = 0; pi < npanel; pi++)
                for (int64_t bi = 0; bi < nblk; bi++) {
                    int64_t co0 = pi * CO_PANEL, nc = Cout - co0 < CO_PANEL ? Cout - co0 : CO_PANEL;
                    int64_t p0 = bi * pb, pn = np - p0 < pb ? np - p0 : pb;
                    conv_item(y, w, bf, col, np, KK, co0, nc, r0 * wd, p0, pn, wbuf, cbuf);
                }
            free(wbuf);
            free(cbuf);
        }
    }
    free(col);
    free(bf);
}
