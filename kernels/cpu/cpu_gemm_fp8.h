/* bf16 activations x fp8 weights on AVX512-BF16 (private to kernels/cpu). */
#ifndef TPGEN_CPU_GEMM_FP8_H
#define TPGEN_CPU_GEMM_FP8_H
#include "../../core/tensor.h"

/* 1 when x is bf16, w fp8, K even and the AVX512-BF16 kernels are enabled */
int cpu_gemm_fp8_usable(const tensor *x, const tensor *w);
/* y = x · (decode(w) * scale)ᵀ (+ bias), rounded once to y's dtype */
void cpu_gemm_fp8(tensor *y, const tensor *x, const tensor *w, const float *bias);

#endif
