/* bf16 activations x fp8 weights on AVX512-BF16 (private to kernels/cpu). */
#ifndef TPGEN_CPU_GEMM_FP8_H
#define TPGEN_CPU_GEMM_FP8_H
#include "kernels/tensor.h"

/* 1 when x is bf16, w fp8, K even and the AVX512-BF16 kernels are enabled */
int cpu_gemm_fp8_usable(const tensor *x, const tensor *w);
/* y = x · (decode(w) * scale)ᵀ (+ bias), rounded once to y's dtype */
void cpu_gemm_fp8(tensor *y, const tensor *x, const tensor *w, const float *bias);
/* n E4M3 (e5m2 = 0) or E5M2 codes -> their exact bf16 values (no scale);
 * also used by the AMX GEMM (cpu_gemm_amx.c) to pack fp8 weight panels */
void fp8_decode_bf16(const uint8_t *q, int64_t n, int e5m2, uint16_t *out);

#endif
