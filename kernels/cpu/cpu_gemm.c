/* y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias) on the CPU.
 *
 * f32 x, f32 w, f32 y: one multi-threaded cblas_sgemm straight on the views.
 * Anything else (bf16 weights, bf16 activations or output) goes through a
 * tiled path: blocks of 2048 weight rows x 1024 k and the matching
 * 1024-column slabs of x are widened to f32, and each block is one
 * multi-threaded sgemm (beta 1 after the first k block). So a bf16 weight
 * never has a full f32 copy, each weight value is widened once, and x once
 * per 2048 output columns. (The first design, panels of 128 rows with a
 * single-threaded sgemm per thread, ran at 60-75% of sgemm: sgemm repacked
 * all of x for every 128 columns.) With bf16 x and bf16 w on a CPU with
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

/* Blocking of the tiled path: KC columns of k per sgemm call, panels of NB
 * rows of w (fewer when a test shrinks the tile budget). Buffers: w block
 * NB·KC·4 = 8 MB, x slab M·KC·4, output panel M·NB·4 (bf16 y only).
 * 512/1024/1536 x 1024/2048/4096 measured the same within the noise of the
 * shared machine; larger blocks cost memory for nothing. */
enum { KC = 1024, NB = 2048 };

/* y (+)= x · wᵀ for the f32 copies of x[:, k0:k0+kn] and w[n0:n0+nn, k0:k0+kn]:
 * one multi-threaded sgemm per (panel, k block). Every thread helps widen
 * the blocks (a w block is widened right before sgemm packs it); x is
 * widened once per panel, M·kn
 * values for 2·M·nn·kn flops. Calls are large (M x NB x KC), so sgemm's own
 * repacking of x stays under 0.1% of the work. */
static void gemm_tiled(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols;
    int64_t kc = K < KC ? K : KC;
    int64_t nb = (int64_t)(cpu_tile_budget((size_t)NB * KC * 4) / (4 * (size_t)kc));
    nb = nb < 16 ? 16 : nb > NB ? NB : nb;
    nb = nb > N ? N : nb;
    int direct_x = x->dtype == DT_F32, direct_w = w->dtype == DT_F32, direct_y = y->dtype == DT_F32;
    float *xbuf = direct_x ? NULL : xmalloc((size_t)M * (size_t)kc * sizeof(float));
    float *wbuf = direct_w ? NULL : xmalloc((size_t)nb * (size_t)kc * sizeof(float));
    float *cbuf = direct_y ? NULL : xmalloc((size_t)M * (size_t)nb * sizeof(float));
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t nn = N - n0 < nb ? N - n0 : nb, ldc = direct_y ? y->ld : nn;
        float *cp = direct_y ? (float *)row_ptr(y, 0) + n0 : cbuf;
        for (int64_t k0 = 0; k0 < K; k0 += kc) {
            int64_t kn = K - k0 < kc ? K - k0 : kc;
            const float *xs = direct_x ? (const float *)row_ptr(x, 0) + k0 : xbuf;
            const float *ws = direct_w ? (const float *)row_ptr(w, n0) + k0 : wbuf;
            int64_t ldx = direct_x ? x->ld : kn, ldw = direct_w ? w->ld : kn;
            if (!direct_x) {
#pragma omp parallel for if (M * kn > CPU_PAR_MIN)
                for (int64_t r = 0; r < M; r++) row_f32(x, r, k0, kn, xbuf + r * kn);
            }
            if (!direct_w) {
#pragma omp parallel for if (nn * kn > CPU_PAR_MIN)
                for (int64_t r = 0; r < nn; r++) row_f32(w, n0 + r, k0, kn, wbuf + r * kn);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)nn, (int)kn, 1.0f, xs, (int)ldx, ws,
                        (int)ldw, k0 ? 1.0f : 0.0f, cp, (int)ldc);
        }
#pragma omp parallel for if (M * nn > CPU_PAR_MIN)
        for (int64_t r = 0; r < M; r++) {
            float *cr = cp + r * ldc;
            if (bias) for (int64_t j = 0; j < nn; j++) cr[j] += bias[n0 + j];
            if (!direct_y) row_store(y, r, n0, nn, cr);
        }
    }
    free(xbuf);
    free(wbuf);
    free(cbuf);
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
