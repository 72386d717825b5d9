/* The AMX GEMM for bf16 activations x bf16 or fp8 weights (private to
 * kernels/cpu). */
#ifndef TPGEN_CPU_GEMM_AMX_H
#define TPGEN_CPU_GEMM_AMX_H
#include "kernels/tensor.h"

/* 1 when AMX is enabled (cpu_amx_enabled), x is bf16, w bf16 or fp8, and x
 * has enough rows for 16-row tiles to pay (M >= 16). */
int cpu_gemm_amx_usable(const tensor *x, const tensor *w);
/* y = x · wᵀ (+ bias) with bf16 products and fp32 sums; fp8 weights are
 * decoded exactly to bf16 and their scale (per tensor or per output
 * channel) multiplies the fp32 sums, as in cpu_gemm_fp8.c. y is f32, bf16
 * or f16, rounded once. */
void cpu_gemm_amx(tensor *y, const tensor *x, const tensor *w, const float *bias);

/* Test hooks: turn the AMX route off in this process (1) or back on (0);
 * the number of op_gemm calls that took the route so far. */
void cpu_gemm_amx_force_off(int on);
long cpu_gemm_amx_calls(void);

#endif
