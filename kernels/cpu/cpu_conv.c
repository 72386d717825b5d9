/* 2-D convolutions as im2col + a matrix product:
 *   y[Cout, pixels] = W[Cout, Cin·k·k] · col[Cin·k·k, pixels],
 * for op_conv2d (stride 1, zero padding k/2) and op_conv2d_down (3x3,
 * stride 2, one zero row/column on the bottom/right only). Both are one
 * geometry (stride, padding) over the same code.
 *
 * The output is made in bands of output rows whose im2col columns fit in
 * COL_BYTES (8 MB: the band stays in the last-level cache between im2col
 * writing it and the product reading it; a 3x3 conv over 256 channels at
 * 1024² would need 9.7 GB in one piece). Per band, one of three products:
 * - AMX (bf16 x and w, a CPU with AMX-BF16, cpu_conv_amx.c): the columns
 *   stay bf16 (exact), pair-interleaved as the tiles read them;
 * - vdpbf16ps (bf16 x and w, AVX512-BF16 without AMX): the same columns,
 *   32 pixels at a time packed as a panel for the AVX512-BF16 kernel of
 *   cpu_gemm_bf16.c, the weight rows read in place;
 * - sgemm (everything else): f32 columns and one multi-threaded
 *   cblas_sgemm over the whole band with every output channel. (Splitting
 *   the band into per-thread (channel panel, pixel block) sgemm calls, as
 *   this file did before, made OpenBLAS re-pack the columns once per panel,
 *   through strides of whole 64 MB bands: a third of the time went into
 *   sgemm_itcopy.) bf16 weights are widened once per call (at most
 *   512x4608 values).
 * A 3x3 stride-1 convolution that would take the sgemm route (f32, or bf16
 * without the bf16 kernels) with at least 8 input channels runs as
 * Winograd F(4x4, 3x3) instead (cpu_conv_wino.c: 4x fewer products). */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include "cpu_gemm_bf16.h"
#include "cpu_amx.h"
#include "cpu_conv_amx.h"
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

/* columns per item: f32 columns feed OpenBLAS, which packs them itself;
 * bf16 pair columns are read in place by the tiles and should stay in L2 */
enum { ITEM_BYTES_F32 = 4 << 20, ITEM_BYTES_BF16 = 1 << 20 };
/* AMX items: about this many pixels, K in chunks of at most ITEM_BYTES_BF16 of columns */
enum { AMX_ITEM_PIXELS = 256 };
/* OpenBLAS takes its "small matrix" kernels below about 1.5e5 = M·N·K,
 * which round differently from its blocked kernels, so a pixel's result
 * would depend on how many pixels came with it (a VAE band against the
 * whole image). Below SMALL_MNK the pixels are padded with zero columns up
 * to it (as cpu_gemm.c pads rows), so every product runs the blocked
 * kernels, whose per-pixel sums do not depend on the pixel count. */
#define SMALL_MNK ((int64_t)1 << 20)

/* input h x wd, output ho x wo; input row st*yo + ky - pad feeds output row yo */
typedef struct {
    int64_t h, wd, ho, wo;
    int k, st, pad;
} conv_geom;

/* the output columns [*a, *b) whose tap column st*xo + off lies inside [0, wd) */
static void tap_cols(const conv_geom *g, int64_t off, int64_t *a, int64_t *b) {
    int64_t lo = off >= 0 ? 0 : (-off + g->st - 1) / g->st;
    int64_t hi = g->wd - 1 - off < 0 ? 0 : (g->wd - 1 - off) / g->st + 1;
    lo = lo > g->wo ? g->wo : lo;
    hi = hi > g->wo ? g->wo : hi;
    *a = lo;
    *b = hi < lo ? lo : hi;
}

/* col[(ci*k + ky)*k + kx][p] for output rows [r0, r0+nr), p = (yo-r0)*wo + xo;
 * buf: room for the band's input rows of one channel when x is not f32 */
static void im2col_f32(const tensor *x, const conv_geom *g, int64_t r0, int64_t nr, float *col, float *buf) {
    int64_t Cin = x->rows, wd = g->wd, wo = g->wo, np = nr * wo, k = g->k, st = g->st;
    /* the input rows the band touches */
    int64_t lo = st * r0 - g->pad, hi = st * (r0 + nr - 1) + k - g->pad;
    lo = lo < 0 ? 0 : lo;
    hi = hi > g->h ? g->h : hi;
    hi = hi < lo ? lo : hi;
    for (int64_t ci = 0; ci < Cin; ci++) {
        const float *img = hi > lo ? row_f32(x, ci, lo * wd, (hi - lo) * wd, buf) : NULL; /* input row lo first */
        for (int ky = 0; ky < k; ky++)
            for (int kx = 0; kx < k; kx++) {
                float *dst = col + ((ci * k + ky) * k + kx) * np;
                int64_t off = kx - g->pad, xa, xb;
                tap_cols(g, off, &xa, &xb);
                for (int64_t r = 0; r < nr; r++) {
                    int64_t iy = st * (r0 + r) + ky - g->pad;
                    float *d = dst + r * wo;
                    if (iy < 0 || iy >= g->h) { memset(d, 0, (size_t)wo * sizeof(float)); continue; }
                    const float *s = img + (iy - lo) * wd;
                    for (int64_t xo = 0; xo < xa; xo++) d[xo] = 0.0f;
                    if (st == 1) memcpy(d + xa, s + xa + off, (size_t)(xb - xa) * sizeof(float));
                    else for (int64_t xo = xa; xo < xb; xo++) d[xo] = s[st * xo + off];
                    for (int64_t xo = xb; xo < wo; xo++) d[xo] = 0.0f;
                }
            }
    }
}

static inline uint32_t pair_at(const uint16_t *const s[2], const int64_t a[2], const int64_t b[2], const int64_t off[2],
                               int64_t st, int64_t xo) {
    uint32_t v0 = xo >= a[0] && xo < b[0] ? s[0][st * xo + off[0]] : 0;
    uint32_t v1 = xo >= a[1] && xo < b[1] ? s[1][st * xo + off[1]] : 0;
    return v0 | v1 << 16;
}

/* d[i] = p0[i] | p1[i] << 16 (stride 1) and p0[2i] | p1[2i] << 16 (stride 2): the bulk of the pair im2col */
static void pairs_run1(uint32_t *restrict d, const uint16_t *restrict p0, const uint16_t *restrict p1, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    for (; i + 16 <= n; i += 16) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(p0 + i)), b = _mm256_loadu_si256((const __m256i *)(p1 + i));
        __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b); /* per 128-bit lane */
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(d + i + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
#endif
    for (; i < n; i++) d[i] = (uint32_t)p0[i] | (uint32_t)p1[i] << 16;
}

static void pairs_run2(uint32_t *restrict d, const uint16_t *restrict p0, const uint16_t *restrict p1, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    /* 32-bit loads take p[2i] and p[2i+1]; the last one read, p[2i+15], must be a tap (i + 8 < n) */
    const __m256i low = _mm256_set1_epi32(0xffff);
    for (; i + 8 < n; i += 8) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(p0 + 2 * i)), b = _mm256_loadu_si256((const __m256i *)(p1 + 2 * i));
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_or_si256(_mm256_and_si256(a, low), _mm256_slli_epi32(b, 16)));
    }
#endif
    for (; i < n; i++) d[i] = (uint32_t)p0[2 * i] | (uint32_t)p1[2 * i] << 16;
}

static void im2col_pairs(const tensor *x, const conv_geom *g, int64_t r0, int64_t nr, int64_t KK, int64_t q0,
                         int64_t q1, int64_t ldp, uint32_t *colp) {
    int64_t np = nr * g->wo, np32 = (np + 31) / 32 * 32, k = g->k, st = g->st, wo = g->wo;
    for (int64_t q = q0; q < q1; q++) {
        int64_t ci[2], ky[2], off[2], xa[2], xb[2];
        for (int e = 0; e < 2; e++) { /* the pair's two (channel, ky, kx) taps */
            int64_t kk = 2 * q + e;
            ci[e] = kk < KK ? kk / (k * k) : -1;
            ky[e] = kk / k % k;
            off[e] = kk % k - g->pad;
            tap_cols(g, off[e], &xa[e], &xb[e]);
        }
        uint32_t *dst = colp + (q - q0) * ldp;
        for (int64_t r = 0; r < nr; r++) {
            const uint16_t *s[2];
            int64_t a[2], b[2];
            for (int e = 0; e < 2; e++) {
                int64_t iy = st * (r0 + r) + ky[e] - g->pad;
                int in = ci[e] >= 0 && iy >= 0 && iy < g->h;
                s[e] = in ? (const uint16_t *)row_ptr(x, ci[e]) + iy * g->wd : NULL;
                a[e] = in ? xa[e] : wo; /* no column of an absent tap is read */
                b[e] = in ? xb[e] : wo;
            }
            uint32_t *d = dst + r * wo;
            /* [m0, m1): both taps inside their rows, the vectorised bulk; the edges tap by tap */
            int64_t m0 = a[0] > a[1] ? a[0] : a[1], m1 = b[0] < b[1] ? b[0] : b[1];
            if (!s[0] || !s[1] || m1 < m0) m0 = m1 = wo;
            for (int64_t xo = 0; xo < m0; xo++) d[xo] = pair_at(s, a, b, off, st, xo);
            if (m1 <= m0) {}
            else if (st == 1) pairs_run1(d + m0, s[0] + m0 + off[0], s[1] + m0 + off[1], m1 - m0);
            else pairs_run2(d + m0, s[0] + 2 * m0 + off[0], s[1] + 2 * m0 + off[1], m1 - m0);
            for (int64_t xo = m1; xo < wo; xo++) d[xo] = pair_at(s, a, b, off, st, xo);
        }
        for (int64_t p = np; p < np32; p++) dst[p] = 0;
    }
}

/* The product for one item's pixels [b0, b0+np) with every output channel, on the calling thread. */

/* vdpbf16ps: 32 pixels at a time packed as a panel, the weight rows read in place */
static void item_vdp(tensor *y, const tensor *w, const float *bias, const uint32_t *colp, int64_t np, int64_t ldp,
                     int64_t kp, int64_t b0, uint32_t *panel, float *out) {
    int64_t Cout = w->rows;
    for (int64_t p0 = 0; p0 < np; p0 += BF16_PANEL_ROWS) {
        int64_t nn = np - p0 < BF16_PANEL_ROWS ? np - p0 : BF16_PANEL_ROWS;
        for (int64_t q = 0; q < kp; q++)
            memcpy(panel + q * BF16_PANEL_ROWS, colp + q * ldp + p0, BF16_PANEL_ROWS * sizeof(uint32_t));
        bf16_panel_gemm(row_ptr(w, 0), w->ld, Cout, panel, BF16_PANEL_ROWS, kp, out, BF16_PANEL_ROWS, nn);
        for (int64_t r = 0; r < Cout; r++) {
            float *o = out + r * BF16_PANEL_ROWS;
            if (bias) for (int64_t j = 0; j < nn; j++) o[j] += bias[r];
            row_store(y, r, b0 + p0, nn, o);
        }
    }
}

/* c [Cout, np] (ldc) = w [Cout, KK] · col [KK, np] through the blocked kernels: col copied into np' >= np
 * zero-padded columns with Cout·np'·KK >= SMALL_MNK */
static void sgemm_padded(const float *wf, int64_t ldw, const float *col, int64_t Cout, int64_t np, int64_t KK,
                         float *c, int64_t ldc) {
    int64_t npp = (SMALL_MNK + Cout * KK - 1) / (Cout * KK);
    float *cp = xcalloc((size_t)(KK * npp), sizeof *cp), *yp = xmalloc((size_t)(Cout * npp) * sizeof *yp);
    for (int64_t k = 0; k < KK; k++) memcpy(cp + k * npp, col + k * np, (size_t)np * sizeof *cp);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Cout, (int)npp, (int)KK, 1.0f, wf, (int)ldw, cp,
                (int)npp, 0.0f, yp, (int)npp);
    for (int64_t r = 0; r < Cout; r++) memcpy(c + r * ldc, yp + r * npp, (size_t)np * sizeof *yp);
    free(cp), free(yp);
}

/* sgemm, single-threaded (OpenBLAS runs so inside a parallel region): the
 * columns are packed once, the weight once per item */
static void item_sgemm(tensor *y, const float *wf, int64_t ldw, const float *bias, const float *col, int64_t np,
                       int64_t KK, int64_t b0, float *ybuf) {
    int64_t Cout = y->rows;
    int direct = y->dtype == DT_F32;
    float *c = direct ? (float *)y->data + b0 : ybuf;
    int64_t ldc = direct ? y->ld : np;
    if (Cout * np * KK < SMALL_MNK) {
        sgemm_padded(wf, ldw, col, Cout, np, KK, c, ldc);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Cout, (int)np, (int)KK, 1.0f, wf, (int)ldw, col,
                    (int)np, 0.0f, c, (int)ldc);
    }
    if (!bias && direct) return;
    for (int64_t r = 0; r < Cout; r++) {
        float *cr = c + r * ldc;
        if (bias) for (int64_t j = 0; j < np; j++) cr[j] += bias[r];
        if (!direct) row_store(y, r, b0, np, cr);
    }
}

typedef enum { ROUTE_SGEMM, ROUTE_VDP, ROUTE_AMX } conv_route;

/* The work is cut into items of whole output rows, about ITEM_BYTES of
 * columns each (at least one row, at least two items per thread when there
 * are enough rows), and every item makes its own columns in a buffer of
 * its thread: one parallel region per convolution, no barrier between the
 * im2col and the product (on a busy machine a barrier per band cost more
 * than the product), and the columns are still in L2 when the product
 * reads them. */
static void conv_run(tensor *y, const tensor *x, const tensor *w, const tensor *bias, const conv_geom *g) {
    int64_t Cout = w->rows, KK = x->rows * g->k * g->k, wo = g->wo;
    if (g->ho * wo == 0 || Cout == 0) return;
    float *bf = NULL;
    if (bias) { bf = xmalloc((size_t)Cout * sizeof(float)); convert_to_f32(bf, bias->data, bias->dtype, (size_t)Cout); }
    int bf16 = x->dtype == DT_BF16 && w->dtype == DT_BF16;
    conv_route route = bf16 && cpu_conv_amx_enabled()                      ? ROUTE_AMX
                       : bf16 && KK % 2 == 0 && cpu_bf16_kernels_enabled() ? ROUTE_VDP
                                                                           : ROUTE_SGEMM;
    if (route == ROUTE_SGEMM && cpu_conv_wino_usable(x->rows, g->k, g->st)) { /* 3x3 in f32 arithmetic: cpu_conv_wino.c */
        cpu_conv_wino(y, x, w, bf, g->h, g->wd);
        free(bf);
        return;
    }
    int64_t kp = (KK + 1) / 2;
    uint16_t *wp = route == ROUTE_AMX ? amx_pack_weights(w, &kp) : NULL;
    size_t per_row = route == ROUTE_SGEMM ? sizeof(float) * (size_t)KK * (size_t)wo : sizeof(uint32_t) * (size_t)kp * (size_t)wo;
    size_t budget = cpu_tile_budget(route == ROUTE_SGEMM ? ITEM_BYTES_F32 : ITEM_BYTES_BF16);
    int threads = omp_get_max_threads();
    int64_t rows = (int64_t)(budget / (per_row ? per_row : 1));
    if (route == ROUTE_AMX) rows = (AMX_ITEM_PIXELS + wo - 1) / wo; /* K comes in chunks, the item's size is free */
    int64_t fair = (g->ho + 2 * threads - 1) / (2 * threads);
    rows = rows > fair ? fair : rows;
    rows = rows < 1 ? 1 : rows;
    int64_t nitems = (g->ho + rows - 1) / rows, npx = rows * wo;
    /* pair rows: whole panels of 32 pixels, and ldp/16 odd so that a tile's 16 rows fall in distinct cache sets */
    int64_t ldp = (npx + 31) / 32 * 32 + 16;
    /* AMX: pairs of K per chunk, so that a chunk's columns stay in L2 (a multiple of the 16-pair tile step) */
    int64_t kc = (int64_t)(cpu_tile_budget(ITEM_BYTES_BF16) / (sizeof(uint32_t) * (size_t)ldp)) / 16 * 16;
    kc = route != ROUTE_AMX ? kp : kc < 16 ? 16 : kc > kp ? kp : kc;
    const float *wf = NULL;
    float *wbuf = NULL;
    int64_t ldw = KK;
    if (route == ROUTE_SGEMM) {
        if (w->dtype == DT_F32) { wf = w->data; ldw = w->ld; }
        else { /* widened once per call */
            wbuf = xmalloc(sizeof(float) * (size_t)(Cout * KK));
#pragma omp parallel for if (Cout * KK > CPU_PAR_MIN)
            for (int64_t r = 0; r < Cout; r++) {
                const float *s = row_f32(w, r, 0, KK, wbuf + r * KK);
                if (s != wbuf + r * KK) memcpy(wbuf + r * KK, s, (size_t)KK * sizeof(float));
            }
            wf = wbuf;
        }
    }
#pragma omp parallel if (nitems > 1)
    {
        void *col = route == ROUTE_SGEMM ? xmalloc(sizeof(float) * (size_t)KK * (size_t)npx)
                                         : xmalloc(sizeof(uint32_t) * (size_t)kc * (size_t)ldp);
        float *acc = kc < kp ? xmalloc(sizeof(float) * (size_t)((Cout + 31) / 32 * 32) * (size_t)ldp) : NULL;
        int64_t in_rows = g->st * (rows - 1) + g->k; /* input rows an item reads */
        float *xbuf = route == ROUTE_SGEMM && x->dtype != DT_F32 ? xmalloc(sizeof(float) * (size_t)(in_rows * g->wd)) : NULL;
        float *ybuf = route == ROUTE_SGEMM && y->dtype != DT_F32 ? xmalloc(sizeof(float) * (size_t)(Cout * npx)) : NULL;
        uint32_t *panel = route == ROUTE_VDP ? xmalloc(sizeof(uint32_t) * BF16_PANEL_ROWS * (size_t)kp) : NULL;
        float *out = route == ROUTE_VDP ? xmalloc(sizeof(float) * BF16_PANEL_ROWS * (size_t)Cout) : NULL;
        if (route == ROUTE_AMX) cpu_amx_tiles_begin();
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < nitems; it++) {
            int64_t r0 = it * rows, nr = g->ho - r0 < rows ? g->ho - r0 : rows, np = nr * wo;
            if (route == ROUTE_SGEMM) {
                im2col_f32(x, g, r0, nr, col, xbuf);
                item_sgemm(y, wf, ldw, bf, col, np, KK, r0 * wo, ybuf);
                continue;
            }
            if (route == ROUTE_VDP) {
                im2col_pairs(x, g, r0, nr, KK, 0, kp, ldp, col);
                item_vdp(y, w, bf, col, np, ldp, kp, r0 * wo, panel, out);
                continue;
            }
            for (int64_t q0 = 0; q0 < kp; q0 += kc) {
                int64_t q1 = q0 + kc < kp ? q0 + kc : kp;
                im2col_pairs(x, g, r0, nr, KK, q0, q1, ldp, col);
                amx_conv_block(y, wp, kp, q0 / 16, (q1 - q0) / 16, bf, col, ldp, np, r0 * wo, acc, q0 == 0, q1 == kp);
            }
        }
        if (route == ROUTE_AMX) cpu_amx_tiles_end();
        free(col), free(acc), free(xbuf), free(ybuf), free(panel), free(out);
    }
    free(wp), free(wbuf), free(bf);
}

int cpu_rows_invariant(backend *be, dtype_t dt) {
    (void)be;
    /* bf16 with the AMX or vdpbf16ps kernels never takes the sgemm route's Winograd replacement */
    int bf16_kernels = dt == DT_BF16 && (cpu_conv_amx_enabled() || cpu_bf16_kernels_enabled());
    return bf16_kernels || !cpu_conv_wino_usable(8, 3, 1);
}

void cpu_conv2d(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
                int64_t h, int64_t wd, int k) {
    (void)be;
    int64_t Cin = x->rows, Cout = w->rows, KK = Cin * k * k;
    CPU_REQUIRE(k == 1 || k == 3, "op_conv2d: kernel size %d (1 or 3 supported)", k);
    CPU_REQUIRE(x->cols == h * wd && y->cols == h * wd && y->rows == Cout && w->cols == KK,
                "op_conv2d: x [%lld,%lld] w [%lld,%lld] y [%lld,%lld] do not fit %lldx%lld, k %d", (long long)Cin,
                (long long)x->cols, (long long)Cout, (long long)w->cols, (long long)y->rows, (long long)y->cols,
                (long long)h, (long long)wd, k);
    CPU_REQUIRE(!bias || bias->rows * bias->cols == Cout, "op_conv2d: bias must have %lld values", (long long)Cout);
    conv_geom g = {.h = h, .wd = wd, .ho = h, .wo = wd, .k = k, .st = 1, .pad = k / 2};
    conv_run(y, x, w, bias, &g);
}

/* Downsample2D(padding=0) after its (0,1,0,1) pad: output (yo, xo) reads
 * input rows 2yo..2yo+2 and columns 2xo..2xo+2, the ones past the last
 * row/column being the zero padding. */
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
    conv_geom g = {.h = h, .wd = wd, .ho = ho, .wo = wo, .k = 3, .st = 2, .pad = 0};
    conv_run(y, x, w, bias, &g);
}
