/* The portable packed GEMM (private to kernels/cpu): every GEMM that is not
 * f32 x f32 -> f32 (OpenBLAS) and not on the AMX / AVX512-BF16 kernels. */
#ifndef TPGEN_CPU_GEMM_PACKED_H
#define TPGEN_CPU_GEMM_PACKED_H
#include "kernels/tensor.h"

/* y = x · wᵀ (+ bias, f32 or NULL); any float x/y dtype, any weight dtype
 * (bf16, f32, f16, fp8 with its scale); f32 sums, y rounded once. */
void cpu_gemm_packed(tensor *y, const tensor *x, const tensor *w, const float *bias);

/* The micro-kernel in use: "avx512f" (CPU with AVX-512F), "avx2" (AVX2 and
 * FMA, or TPGEN_NO_AVX512=2, or forced), "scalar" (neither). */
const char *cpu_gemm_packed_kernel(void);
/* Testing / benchmark hook: 0 = the CPU's best kernel, 1 = never the
 * AVX-512F one (as on an AVX2-only CPU), 2 = the scalar one. */
void cpu_gemm_packed_force(int level);

/* The blocking the next call with these sizes would use (current threads,
 * kernel and cpu_set_tile_budget): out = {MR, NR, kc, mc, nb (weight rows
 * per thread panel), mch (rows per f32 accumulator chunk, M when y is f32)},
 * so that tests can check that their shapes cross every edge. */
void cpu_gemm_packed_blocking(int64_t M, int64_t N, int64_t K, dtype_t ydt, int64_t out[6]);

#endif
