/* y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias) on the CPU.
 *
 * f32 x, f32 w, f32 y: one multi-threaded cblas_sgemm straight on the views.
 * With bf16 x and bf16 or fp8 w on a CPU with AMX (Sapphire Rapids and
 * later), M >= 16: the tile kernel of cpu_gemm_amx.c. Otherwise, with bf16 x and bf16 w on a CPU with AVX512-BF16
 * where vdpbf16ps outruns f32 FMAs (AMD Zen 4/5; cpu_vdpbf16_preferred) the dot products run on
 * vdpbf16ps (cpu_gemm_bf16.c), and bf16 x with fp8 w on the same kernel
 * (cpu_gemm_fp8.c). Anything else (bf16 weights with f32 activations, bf16
 * output, every bf16 GEMM on a CPU without AVX512-BF16 or whose vdpbf16ps is
 * the slower (Intel: half the FMA rate, docs/cpu-backend.md), fp8 weights there)
 * goes through the packed path of cpu_gemm_packed.c: GotoBLAS-style blocking
 * whose packing routines widen bf16/fp8 to f32 as they pack, and an f32 FMA
 * micro-kernel (AVX-512F or AVX2) that writes y once per k block. A bf16
 * weight never has a full f32 copy. Quantised GGUF weights (DT_GGML) take the
 * int8-dot kernel of cpu_gemm_qdot.c when cpu_gemm_qdot_usable (by default
 * bf16 activations; docs/gguf.md "The GEMM"), else the packed path, whose
 * packing decodes their blocks as it reads them. y is rounded once, after
 * the bias. */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include "cpu_gemm_amx.h"
#include "cpu_gemm_bf16.h"
#include "cpu_gemm_fp8.h"
#include "cpu_gemm_packed.h"
#include "cpu_gemm_qdot.h"
#include <cblas.h>
#include <string.h>
#include <stdlib.h>

static cpu_route g_route = CPU_ROUTE_AUTO;
void cpu_kernel_route(cpu_route r) { g_route = r; }
int cpu_bf16_hw_allowed(void) { return g_route != CPU_ROUTE_PORTABLE && cpu_has_avx512bf16(); }
int cpu_bf16_kernels_enabled(void) {
    return cpu_bf16_hw_allowed() && (g_route == CPU_ROUTE_VECTOR || cpu_vdpbf16_preferred());
}

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

/* OpenBLAS takes its "small matrix" kernels below about 1.5e5 = M·N·K
 * (measured, 0.3.x on AVX-512), and they round differently from its
 * blocked kernels, so a row's result would depend on how many rows come
 * with it: a sequence-parallel rank's slice would differ from the one-rank
 * forward. Below SMALL_MNK the rows are padded with zeros up to it, so every
 * call runs the blocked kernels, whose rows do not depend on M. */
#define SMALL_MNK ((int64_t)1 << 20)

static void gemm_f32_padded(tensor *y, const tensor *x, const tensor *w) {
    int64_t M = x->rows, N = w->rows, K = x->cols, Mp = (SMALL_MNK + N * K - 1) / (N * K);
    float *xp = xcalloc((size_t)(Mp * K), sizeof *xp), *yp = xmalloc((size_t)(Mp * N) * sizeof *yp);
    for (int64_t r = 0; r < M; r++) memcpy(xp + r * K, row_ptr(x, r), (size_t)K * sizeof *xp);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)Mp, (int)N, (int)K, 1.0f, xp, (int)K, w->data,
                (int)w->ld, 0.0f, yp, (int)N);
    for (int64_t r = 0; r < M; r++) memcpy(row_ptr(y, r), yp + r * N, (size_t)N * sizeof *yp);
    free(xp), free(yp);
}

static void gemm_f32_direct(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols;
    if (M * N * K < SMALL_MNK) gemm_f32_padded(y, x, w);
    else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, x->data, (int)x->ld,
                     w->data, (int)w->ld, 0.0f, y->data, (int)y->ld);
    if (!bias) return;
#pragma omp parallel for if (M * N > CPU_PAR_MIN)
    for (int64_t r = 0; r < M; r++) {
        float *yr = row_ptr(y, r);
        for (int64_t j = 0; j < N; j++) yr[j] += bias[j];
    }
}

void cpu_gemm(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols;
    CPU_REQUIRE(w->cols == K && y->rows == M && y->cols == N,
                "op_gemm: y [%lld,%lld] = x [%lld,%lld] · w [%lld,%lld]ᵀ: shapes do not match", (long long)y->rows,
                (long long)y->cols, (long long)M, (long long)K, (long long)w->rows, (long long)w->cols);
    CPU_REQUIRE(is_float_dt(x->dtype) && (is_weight_dt(w->dtype) || w->dtype == DT_GGML) && is_float_dt(y->dtype),
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
    } else if (cpu_gemm_qdot_usable(x, w)) {
        cpu_gemm_qdot(y, x, w, b);   /* activations quantised per block, int8 dot products */
    } else if (w->dtype == DT_GGML) {
        cpu_gemm_packed(y, x, w, b); /* ggml blocks decoded in the packing (row_f32_weight): no AMX/bf16 route */
    } else if (cpu_gemm_amx_usable(x, w)) {
        cpu_gemm_amx(y, x, w, b);   /* bf16 x with bf16 or fp8 w on an AMX CPU, M >= 16 */
    } else if (cpu_bf16_kernels_enabled() && x->dtype == DT_BF16 && w->dtype == DT_BF16 && cpu_gemm_bf16_usable(M, N, K)) {
        cpu_gemm_bf16(y, x, w, b);
    } else if (cpu_gemm_fp8_usable(x, w)) {
        cpu_gemm_fp8(y, x, w, b);   /* fp8 codes packed as bf16 pairs, scale in the epilogue */
    } else {
        cpu_gemm_packed(y, x, w, b); /* packed straight from bf16/fp8, f32 FMA micro-kernel */
    }
    if (owned) free(b);
}
