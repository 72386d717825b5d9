/* y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias) on the CPU.
 *
 * f32 x, f32 w, f32 y: one multi-threaded cblas_sgemm straight on the views.
 * With bf16 x and bf16 or fp8 w on a CPU with AMX (Sapphire Rapids and
 * later), M >= 16: the tile kernel of cpu_gemm_amx.c. Otherwise, with bf16 x and bf16 w on a CPU with AVX512-BF16 the dot products run on
 * vdpbf16ps (cpu_gemm_bf16.c), and bf16 x with fp8 w on the same kernel
 * (cpu_gemm_fp8.c). Anything else (bf16 weights with f32 activations, bf16
 * output, every bf16 GEMM on a CPU without AVX512-BF16, fp8 weights there)
 * goes through the tiled path below: bf16/fp8 data are widened to f32 and
 * OpenBLAS's sgemm does the arithmetic, so there is one f32 micro-kernel
 * (OpenBLAS's) for both the f32 and the widened operands. A bf16 weight
 * never has a full f32 copy. y is rounded once, after the bias. */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include "cpu_gemm_amx.h"
#include "cpu_gemm_bf16.h"
#include "cpu_gemm_fp8.h"
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

static int g_force_portable;
void cpu_gemm_force_portable(int on) { g_force_portable = on; }
int cpu_bf16_kernels_enabled(void) { return !g_force_portable && cpu_has_avx512bf16(); }

/* bias as f32 (NULL when absent); *owned set when it was converted */
static float *bias_f32(const tensor *bias, int64_t N, int *owned) {
    *owned = 0;
    if (!bias) return NULL;
    CPU_REQUIRE(bias->rows == 1 && bias->cols == N, "op_gemm: bias must be [1,%lld]", (long long)N);
    if (bias->dtype == DT_F32) return bias->data;
    float *b = xmalloc((size_t)N * sizeof(float));
    convert_to_f32(b, bias->data, bias->dtype, (size_t)N);
    *owned = 1;
    return b;
}

static void gemm_f32_direct(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, x->data, (int)x->ld,
                w->data, (int)w->ld, 0.0f, y->data, (int)y->ld);
    if (!bias) return;
#pragma omp parallel for if (M * N > CPU_PAR_MIN)
    for (int64_t r = 0; r < M; r++) {
        float *yr = row_ptr(y, r);
        for (int64_t j = 0; j < N; j++) yr[j] += bias[j];
    }
}

/* ---- the tiled path (widen to f32, then single-threaded sgemm per thread) ----
 *
 * Work is split by output columns: the weight is cut into panels of nb rows,
 * N / threads each or a few of at most NB_MAX, and each thread owns whole
 * panels (dynamic schedule). So every weight value is widened exactly once,
 * by the thread that uses it, into a piece of nb x kc floats that its own
 * sgemm packs right after: no widened piece is shared between cores or
 * widened twice. x is widened once per call (in chunks of rows when it is
 * large) and shared read-only. Each sgemm call is (mc rows) x (nb columns)
 * x (kc of k), accumulating over the k blocks into an f32 panel of y (y
 * itself when y is f32); bias and rounding come after the last block.
 *
 * The sizes come from measurements of plain sgemm cut the same way (1152 x
 * 3072 x 3072, one thread, CPU time): sgemm packs x once per call, so x is
 * repacked once per panel: panels of 3072 / 2048 / 1536 / 1024 rows ran at
 * 100 / 98 / 96 / 93 % of one sgemm call; k blocks of 768-3072 at 99-100 %,
 * of 512 at 96 %. Widening w then costs 3-5 % and widening x and rounding y
 * another 3-4 % (memory traffic of the f32 copies, which OpenBLAS's packing
 * cannot avoid since it reads only f32).
 *
 * Why not the earlier shapes: panels of 128 rows made sgemm repack all of x
 * for every 128 columns (62-76 % of sgemm); blocks widened by all threads and
 * fed to one multi-threaded sgemm put a fork/join of both threads around
 * every block, so a thread descheduled by another process stalls the other
 * at each block (72-77 % of sgemm against 85-90 % for this path in one
 * interleaved run at load 4-7), and allocated its buffers per call. Here
 * there is one OpenMP region per row chunk, OpenBLAS runs single-threaded
 * inside it, and the scratch buffers belong to their thread and are kept
 * between calls (no page faults per call): at most W_BYTES + X_BYTES / 4
 * per thread, X_BYTES for x. */

enum { NB_MAX = 3072, KC = 1024 };
#define W_BYTES ((size_t)12 << 20) /* one thread's widened weight piece, nb x kc */
#define X_BYTES ((size_t)64 << 20) /* widened x rows (and X_BYTES / 4 per thread for the f32 output panel) */

typedef struct { float *p; size_t n; } scratch;
static _Thread_local scratch t_x, t_w, t_c;

/* a thread's buffer of at least n floats, kept for the next call */
static float *scratch_get(scratch *s, size_t n) {
    if (s->n < n) {
        free(s->p);
        s->p = xmalloc(n * sizeof(float));
        s->n = n;
    }
    return s->p;
}

/* Panel rows: N split evenly into a multiple of `threads` panels of at most
 * nbmax rows, rounded up to 16. */
static int64_t panel_rows(int64_t N, int threads, int64_t nbmax) {
    int64_t per = (N + threads - 1) / threads, q = (per + nbmax - 1) / nbmax, nb = (per + q - 1) / q;
    nb = (nb + 15) / 16 * 16;
    return nb < 16 ? 16 : nb;
}

/* y[m0 + .., n0 .. n0+nn) = xs[.., :] · w[n0 .. n0+nn, :]ᵀ (+ bias) for mn rows */
static void tiled_panel(tensor *y, const tensor *w, const float *bias, const float *xs, int64_t ldx, int64_t m0,
                        int64_t mn, int64_t n0, int64_t nn, int64_t kc, float *wb, float *cb) {
    int64_t K = w->cols, ldc = nn;
    float *cp = cb;
    if (!cb) { cp = (float *)row_ptr(y, m0) + n0; ldc = y->ld; }
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
        int64_t kn = K - k0 < kc ? K - k0 : kc, ldw = kn;
        const float *ws = wb;
        if (!wb) { ws = (const float *)row_ptr(w, n0) + k0; ldw = w->ld; }
        else for (int64_t r = 0; r < nn; r++) row_f32(w, n0 + r, k0, kn, wb + r * kn);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)mn, (int)nn, (int)kn, 1.0f, xs + k0, (int)ldx, ws,
                    (int)ldw, k0 ? 1.0f : 0.0f, cp, (int)ldc);
    }
    for (int64_t r = 0; r < mn; r++) {
        float *cr = cp + r * ldc;
        if (bias) for (int64_t j = 0; j < nn; j++) cr[j] += bias[n0 + j];
        if (cb) row_store(y, m0 + r, n0, nn, cr);
    }
}

static void gemm_tiled(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols;
    int threads = omp_get_max_threads();
    int direct_x = x->dtype == DT_F32, direct_w = w->dtype == DT_F32, direct_y = y->dtype == DT_F32;
    /* tests shrink the budgets (cpu_set_tile_budget) to cross every block edge with small shapes */
    size_t wbytes = cpu_tile_budget(W_BYTES), xbytes = cpu_tile_budget(X_BYTES);
    int64_t nbmax = (int64_t)(wbytes / (4 * 256)) / 16 * 16;
    nbmax = nbmax < 16 ? 16 : nbmax > NB_MAX ? NB_MAX : nbmax;
    int64_t nb = panel_rows(N, threads, nbmax), npanel = (N + nb - 1) / nb;
    int64_t kc = (int64_t)(wbytes / (4 * (size_t)nb));
    kc = kc < 8 ? 8 : kc > KC ? KC : kc;
    kc = kc > K ? K : kc;
    int64_t mc = M;
    if (!direct_x && (int64_t)(xbytes / (4 * (size_t)K)) < mc) mc = (int64_t)(xbytes / (4 * (size_t)K));
    if (!direct_y && (int64_t)(xbytes / 4 / (4 * (size_t)nb)) < mc) mc = (int64_t)(xbytes / 4 / (4 * (size_t)nb));
    mc = mc < 1 ? 1 : mc;
    float *xbuf = direct_x ? NULL : scratch_get(&t_x, (size_t)mc * (size_t)K);
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        int64_t mn = M - m0 < mc ? M - m0 : mc, ldx = direct_x ? x->ld : K;
        const float *xs = direct_x ? (const float *)row_ptr(x, m0) : xbuf;
#pragma omp parallel if (npanel > 1 || mn * K > CPU_PAR_MIN)
        {
            if (!direct_x) {
#pragma omp for
                for (int64_t r = 0; r < mn; r++) row_f32(x, m0 + r, 0, K, xbuf + r * K);
            }
            float *wb = direct_w ? NULL : scratch_get(&t_w, (size_t)nb * (size_t)kc);
            float *cb = direct_y ? NULL : scratch_get(&t_c, (size_t)mn * (size_t)nb);
#pragma omp for schedule(dynamic)
            for (int64_t p = 0; p < npanel; p++) {
                int64_t n0 = p * nb, nn = N - n0 < nb ? N - n0 : nb;
                tiled_panel(y, w, bias, xs, ldx, m0, mn, n0, nn, kc, wb, cb);
            }
        }
    }
}


void cpu_gemm(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols;
    CPU_REQUIRE(w->cols == K && y->rows == M && y->cols == N,
                "op_gemm: y [%lld,%lld] = x [%lld,%lld] · w [%lld,%lld]ᵀ: shapes do not match", (long long)y->rows,
                (long long)y->cols, (long long)M, (long long)K, (long long)w->rows, (long long)w->cols);
    CPU_REQUIRE(is_float_dt(x->dtype) && is_weight_dt(w->dtype) && is_float_dt(y->dtype),
                "op_gemm: dtypes %s/%s/%s", dtype_name(y->dtype), dtype_name(x->dtype), dtype_name(w->dtype));
    if (M == 0 || N == 0) return;
    int owned;
    float *b = bias_f32(bias, N, &owned);
    if (K == 0) { /* empty sum: y = bias or 0 */
        float *zero = xcalloc((size_t)N, sizeof(float));
        for (int64_t r = 0; r < M; r++) row_store(y, r, 0, N, b ? b : zero);
        free(zero);
    } else if (x->dtype == DT_F32 && w->dtype == DT_F32 && y->dtype == DT_F32) {
        gemm_f32_direct(y, x, w, b);
    } else if (cpu_gemm_amx_usable(x, w)) {
        cpu_gemm_amx(y, x, w, b);   /* bf16 x with bf16 or fp8 w on an AMX CPU, M >= 16 */
    } else if (cpu_bf16_kernels_enabled() && x->dtype == DT_BF16 && w->dtype == DT_BF16 && cpu_gemm_bf16_usable(M, N, K)) {
        cpu_gemm_bf16(y, x, w, b);
    } else if (cpu_gemm_fp8_usable(x, w)) {
        cpu_gemm_fp8(y, x, w, b);   /* fp8 codes packed as bf16 pairs, scale in the epilogue */
    } else {
        gemm_tiled(y, x, w, b);
    }
    if (owned) free(b);
}
