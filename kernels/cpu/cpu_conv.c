/* 2-D convolution (stride 1, zero padding k/2) as im2col + sgemm:
 *   y[Cout, pixels] = W[Cout, Cin·k·k] · col[Cin·k·k, pixels].
 * The image is processed in bands of output rows so that the im2col buffer
 * stays under COL_BYTES (a 3x3 conv over 256 channels at 1024² would need
 * 9.7 GB in one piece). Inside a band the work is split into (Cout panel,
 * pixel block) items over the OpenMP threads, each a single-threaded sgemm;
 * bf16 weights are widened per panel, never as a whole.
 *
 * bf16 activations with bf16 weights on an AVX512-BF16 CPU take another
 * route (conv_band_bf16): the im2col buffer stays bf16 (exact), 32 pixels
 * at a time are packed as a vdpbf16ps panel and the weight rows are the
 * left operand read in place, so y[co, pixels] comes out row-major with no
 * widening at all (fp32 sums, like the sgemm route). */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include "cpu_gemm_bf16.h"
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

/* im2col of a bf16 x into pair-interleaved form: the 32-bit word
 * colp[q][p] holds (col[2q][p], col[2q+1][p]) with col as in im2col(), rows
 * of np32 (np rounded up to 32, pad pixels 0). A vdpbf16ps panel of 32
 * pixels is then one 128-byte copy per pair of rows. (Using the rows in
 * place as the panel, stride np32, was measured 40% slower: the large
 * power-of-two strides thrash L1/L2 sets.) */
/* tap value at output column xo: row s shifted by off, 0 outside the row */
static inline uint32_t tap(const uint16_t *s, int64_t xo, int64_t off, int64_t wd) {
    int64_t ix = xo + off;
    return ix >= 0 && ix < wd ? s[ix] : 0;
}

static void im2col_pairs(const tensor *x, int64_t h, int64_t wd, int k, int64_t r0, int64_t nr, int64_t np32,
                         uint16_t *colp) {
    int64_t Cin = x->rows, np = nr * wd, pad = k / 2, KK = Cin * k * k;
#pragma omp parallel if (KK * np > CPU_PAR_MIN)
    {
        uint16_t *zrow = xcalloc((size_t)wd, sizeof(uint16_t)); /* stands in for rows outside the image */
#pragma omp for
        for (int64_t q = 0; q < KK / 2; q++) {
            int64_t ci[2], ky[2], off[2]; /* the pair's two (channel, ky, kx) taps; column offset kx - pad */
            for (int e = 0; e < 2; e++) {
                int64_t kk = 2 * q + e;
                ci[e] = kk / (k * k);
                ky[e] = kk / k % k;
                off[e] = kk % k - pad;
            }
            uint32_t *dst = (uint32_t *)colp + q * np32;
            /* columns [lo, hi) have both taps inside the row for any kx */
            int64_t lo = pad < wd ? pad : wd, hi = wd - pad > lo ? wd - pad : lo;
            for (int64_t r = 0; r < nr; r++) {
                const uint16_t *s[2];
                for (int e = 0; e < 2; e++) {
                    int64_t iy = r0 + r + ky[e] - pad;
                    s[e] = iy >= 0 && iy < h ? (const uint16_t *)row_ptr(x, ci[e]) + iy * wd : zrow;
                }
                uint32_t *d = dst + r * wd;
                for (int64_t xo = 0; xo < lo; xo++) d[xo] = tap(s[0], xo, off[0], wd) | tap(s[1], xo, off[1], wd) << 16;
                const uint16_t *a = s[0] + lo + off[0], *c = s[1] + lo + off[1];
                for (int64_t i = 0; i < hi - lo; i++) d[lo + i] = (uint32_t)a[i] | (uint32_t)c[i] << 16;
                for (int64_t xo = hi; xo < wd; xo++) d[xo] = tap(s[0], xo, off[0], wd) | tap(s[1], xo, off[1], wd) << 16;
            }
            for (int64_t p = np; p < np32; p++) dst[p] = 0;
        }
        free(zrow);
    }
}

/* One band with vdpbf16ps: items of (32-pixel panel, range of output
 * channels); y[co, b0 + p] for the panel's pixels. */
static void conv_band_bf16(tensor *y, const tensor *w, const float *bias, const uint16_t *colp, int64_t np,
                           int64_t np32, int64_t KK, int64_t b0) {
    int64_t Cout = w->rows, kp = KK / 2, npan = np32 / BF16_PANEL_ROWS;
    int threads = omp_get_max_threads();
    /* split the channels too when there are fewer than two panels per thread */
    int64_t nch = npan >= 2 * threads ? 1 : (2 * threads + npan - 1) / npan;
    int64_t cc = (Cout + nch - 1) / nch;
    cc = (cc + 7) / 8 * 8;
    nch = (Cout + cc - 1) / cc;
#pragma omp parallel
    {
        float *out = xmalloc(sizeof(float) * BF16_PANEL_ROWS * (size_t)cc);
        uint32_t *panel = xmalloc(sizeof(uint32_t) * BF16_PANEL_ROWS * (size_t)kp);
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t pi = 0; pi < npan; pi++)
            for (int64_t ch = 0; ch < nch; ch++) {
                int64_t p0 = pi * BF16_PANEL_ROWS, nn = np - p0 < BF16_PANEL_ROWS ? np - p0 : BF16_PANEL_ROWS;
                int64_t co0 = ch * cc, nc = Cout - co0 < cc ? Cout - co0 : cc;
                if (nc <= 0) continue;
                const uint32_t *src = (const uint32_t *)colp + p0;
                for (int64_t q = 0; q < kp; q++)
                    memcpy(panel + q * BF16_PANEL_ROWS, src + q * np32, BF16_PANEL_ROWS * sizeof(uint32_t));
                bf16_panel_gemm(row_ptr(w, co0), w->ld, nc, panel, BF16_PANEL_ROWS, kp, out, BF16_PANEL_ROWS, nn);
                for (int64_t r = 0; r < nc; r++) {
                    float *o = out + r * BF16_PANEL_ROWS;
                    if (bias) for (int64_t j = 0; j < nn; j++) o[j] += bias[co0 + r];
                    row_store(y, co0 + r, b0 + p0, nn, o);
                }
            }
        free(out);
        free(panel);
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

/* The output channels x pixels of one band from its im2col columns, as
 * CO_PANEL-channel panels x pixel blocks, with enough pixel blocks for two
 * items per thread; b0 is the band's first output pixel. */
static void conv_panels(tensor *y, const tensor *w, const float *bf, const float *col, int64_t np, int64_t KK,
                        int64_t Cout, int threads, int64_t b0) {
    int64_t npanel = (Cout + CO_PANEL - 1) / CO_PANEL;
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
                conv_item(y, w, bf, col, np, KK, co0, nc, b0, p0, pn, wbuf, cbuf);
            }
        free(wbuf);
        free(cbuf);
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
    int bf16 = x->dtype == DT_BF16 && w->dtype == DT_BF16 && KK % 2 == 0 && cpu_bf16_kernels_enabled();
    size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
    int64_t band = (int64_t)(cpu_tile_budget(COL_BYTES) / (es * (size_t)(KK > 0 ? KK : 1) * (size_t)wd));
    band = band < 1 ? 1 : band > h ? h : band;
    int64_t band32 = (band * wd + 31) / 32 * 32; /* bf16 route: pixel rows padded to whole panels */
    void *col = xmalloc(es * (size_t)KK * (size_t)band32);
    int threads = omp_get_max_threads();
    for (int64_t r0 = 0; r0 < h; r0 += band) {
        int64_t nr = h - r0 < band ? h - r0 : band, np = nr * wd;
        if (bf16) {
            int64_t np32 = (np + 31) / 32 * 32;
            im2col_pairs(x, h, wd, k, r0, nr, np32, col);
            conv_band_bf16(y, w, bf, col, np, np32, KK, r0 * wd);
            continue;
        }
        im2col(x, h, wd, k, r0, nr, col);
        conv_panels(y, w, bf, col, np, KK, Cout, threads, r0 * wd);
    }
    free(col);
    free(bf);
}

/* ---- stride-2 downsampling convolution (op_conv2d_down) ---- */

/* col[(ci*3 + ky)*3 + kx][p] = x[ci, 2yo+ky, 2xo+kx] (0 past the last
 * row/column: the bottom/right padding) for output rows [r0, r0+nr) of the
 * (h/2) x (wd/2) output, p = (yo-r0)*wo + xo */
static void im2col_down(const tensor *x, int64_t h, int64_t wd, int64_t r0, int64_t nr, float *col) {
    int64_t Cin = x->rows, wo = wd / 2, np = nr * wo;
#pragma omp parallel if (Cin * np * 9 > CPU_PAR_MIN)
    {
        float *buf = xmalloc((size_t)(h * wd) * sizeof(float));
#pragma omp for
        for (int64_t ci = 0; ci < Cin; ci++) {
            int64_t lo = 2 * r0, hi = 2 * (r0 + nr) + 1 > h ? h : 2 * (r0 + nr) + 1;
            const float *img = row_f32(x, ci, lo * wd, (hi - lo) * wd, buf);
            for (int ky = 0; ky < 3; ky++)
                for (int kx = 0; kx < 3; kx++) {
                    float *dst = col + ((ci * 3 + ky) * 3 + kx) * np;
                    for (int64_t r = 0; r < nr; r++) {
                        int64_t iy = 2 * (r0 + r) + ky;
                        float *d = dst + r * wo;
                        if (iy >= h) { memset(d, 0, (size_t)wo * sizeof(float)); continue; }
                        const float *s = img + (iy - lo) * wd;
                        for (int64_t xo = 0; xo < wo; xo++) {
                            int64_t ix = 2 * xo + kx;
                            d[xo] = ix < wd ? s[ix] : 0.0f;
                        }
                    }
                }
        }
        free(buf);
    }
}

/* The same band / (Cout panel, pixel block) structure as the sgemm route
 * of cpu_conv2d; the downsamplers are a small share of the encoder's work,
 * so they have no bf16 dot-product route of their own. */
void cpu_conv2d_down(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
                     int64_t h, int64_t wd) {
    (void)be;
    int64_t Cin = x->rows, Cout = w->rows, KK = Cin * 9, ho = h / 2, wo = wd / 2;
    CPU_REQUIRE(h % 2 == 0 && wd % 2 == 0 && x->cols == h * wd && y->cols == ho * wo && y->rows == Cout &&
                    w->cols == KK,
                "op_conv2d_down: x [%lld,%lld] w [%lld,%lld] y [%lld,%lld] do not fit %lldx%lld (even sizes)",
                (long long)Cin, (long long)x->cols, (long long)Cout, (long long)w->cols, (long long)y->rows,
                (long long)y->cols, (long long)h, (long long)wd);
    CPU_REQUIRE(!bias || bias->rows * bias->cols == Cout, "op_conv2d_down: bias must have %lld values", (long long)Cout);
    if (ho * wo == 0 || Cout == 0) return;
    float *bf = NULL;
    if (bias) { bf = xmalloc((size_t)Cout * sizeof(float)); convert_to_f32(bf, bias->data, bias->dtype, (size_t)Cout); }
    int64_t band = (int64_t)(cpu_tile_budget(COL_BYTES) / (sizeof(float) * (size_t)KK * (size_t)wo));
    band = band < 1 ? 1 : band > ho ? ho : band;
    float *col = xmalloc(sizeof(float) * (size_t)KK * (size_t)(band * wo));
    int threads = omp_get_max_threads();
    for (int64_t r0 = 0; r0 < ho; r0 += band) {
        int64_t nr = ho - r0 < band ? ho - r0 : band, np = nr * wo;
        im2col_down(x, h, wd, r0, nr, col);
        conv_panels(y, w, bf, col, np, KK, Cout, threads, r0 * wo);
    }
    free(col);
    free(bf);
}
