/* The AVX512-BF16 GEMM for bf16 activations x bf16 weights (private to
 * kernels/cpu). */
#ifndef TPGEN_CPU_GEMM_BF16_H
#define TPGEN_CPU_GEMM_BF16_H
#include "../../core/tensor.h"

/* 1 when the kernel is compiled in, the CPU has avx512_bf16 and the shape
 * is worth it. */
int cpu_gemm_bf16_usable(int64_t M, int64_t N, int64_t K);
/* y = x · wᵀ (+ bias), x and w bf16, y any float dtype, rounded once. */
void cpu_gemm_bf16(tensor *y, const tensor *x, const tensor *w, const float *bias);

#endif
