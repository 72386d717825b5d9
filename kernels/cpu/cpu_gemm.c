/* y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias) on the CPU.
 *
 * f32 x, f32 w, f32 y: one multi-threaded cblas_sgemm straight on the views.
 * Anything else (bf16 weights, bf16 activations or output) goes through a
 * tiled path: x is widened to f32 in chunks of rows, and the weight is cut
 * into panels of nb rows; each OpenMP thread widens its own panel into a
 * cache-sized f32 buffer and calls a single-threaded sgemm on it (OpenBLAS
 * runs single-threaded inside a parallel region). So a bf16 weight never
 * has a full f32 copy, and the widening cost (N·K per row chunk) is small
 * next to the 2·M·N·K flops. With bf16 x and bf16 w on a CPU with
 * AVX512-BF16 the dot products can instead run on vdpbf16ps, see
 * cpu_gemm_bf16.c. y is rounded once, after the bias. */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include "cpu_gemm_bf16.h"
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

/* Rows [m0, m0+mc) of x as f32 with leading dimension *ld. */
static const float *x_chunk_f32(const tensor *x, int64_t m0, int64_t mc, float *buf, int64_t *ld) {
    if (x->dtype == DT_F32) { *ld = x->ld; return (const float *)row_ptr(x, m0); }
    int64_t K = x->cols;
#pragma omp parallel for if (mc * K > CPU_PAR_MIN)
    for (int64_t r = 0; r < mc; r++) row_f32(x, m0 + r, 0, K, buf + r * K); /* non-f32 rows land in buf */
    *ld = K;
    return buf;
}

/* Panel width: enough panels for every thread to get two, at most 128 rows
 * (a 128 x 3072 f32 panel is 1.5 MB, near the per-core L2). */
static int64_t panel_rows(int64_t N, int threads) {
    int64_t nb = (N + 2 * threads - 1) / (2 * threads);
    nb = (nb + 15) / 16 * 16;
    return nb < 16 ? 16 : nb > 128 ? 128 : nb;
}

static void gemm_tiled(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols;
    int threads = omp_get_max_threads();
    int64_t nb = panel_rows(N, threads), npanel = (N + nb - 1) / nb;
    /* x chunk of at most ~16 MB f32 */
    int64_t mc = (int64_t)(cpu_tile_budget(16u << 20) / (4 * (size_t)K));
    mc = mc < 1 ? 1 : mc > M ? M : mc;
    float *xbuf = x->dtype == DT_F32 ? NULL : xmalloc((size_t)mc * (size_t)K * sizeof(float));
    int direct_w = w->dtype == DT_F32, direct_y = y->dtype == DT_F32;
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        int64_t mn = M - m0 < mc ? M - m0 : mc, ldx;
        const float *xs = x_chunk_f32(x, m0, mn, xbuf, &ldx);
#pragma omp parallel
        {
            float *wbuf = direct_w ? NULL : xmalloc((size_t)nb * (size_t)K * sizeof(float));
            float *cbuf = direct_y ? NULL : xmalloc((size_t)mn * (size_t)nb * sizeof(float));
#pragma omp for schedule(dynamic)
            for (int64_t p = 0; p < npanel; p++) {
                int64_t n0 = p * nb, nn = N - n0 < nb ? N - n0 : nb, ldw = K, ldc = nb;
                const float *wp = direct_w ? (const float *)row_ptr(w, n0) : wbuf;
                if (direct_w) ldw = w->ld;
                else for (int64_t r = 0; r < nn; r++) row_f32(w, n0 + r, 0, K, wbuf + r * K);
                float *cp = cbuf;
                if (direct_y) { cp = (float *)row_ptr(y, m0) + n0; ldc = y->ld; }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)mn, (int)nn, (int)K, 1.0f, xs, (int)ldx,
                            wp, (int)ldw, 0.0f, cp, (int)ldc);
                for (int64_t r = 0; r < mn; r++) {
                    float *cr = cp + r * ldc;
                    if (bias) for (int64_t j = 0; j < nn; j++) cr[j] += bias[n0 + j];
                    if (!direct_y) row_store(y, m0 + r, n0, nn, cr);
                }
            }
            free(wbuf);
            free(cbuf);
        }
    }
    free(xbuf);
}

void cpu_gemm(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols;
    CPU_REQUIRE(w->cols == K && y->rows == M && y->cols == N,
                "op_gemm: y [%lld,%lld] = x [%lld,%lld] · w [%lld,%lld]ᵀ: shapes do not match", (long long)y->rows,
                (long long)y->cols, (long long)M, (long long)K, (long long)w->rows, (long long)w->cols);
    CPU_REQUIRE(is_float_dt(x->dtype) && is_float_dt(w->dtype) && is_float_dt(y->dtype),
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
    } else if (cpu_bf16_kernels_enabled() && x->dtype == DT_BF16 && w->dtype == DT_BF16 && cpu_gemm_bf16_usable(M, N, K)) {
        cpu_gemm_bf16(y, x, w, b);
    } else {
        gemm_tiled(y, x, w, b);
    }
    if (owned) free(b);
}
