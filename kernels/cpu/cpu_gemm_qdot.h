/* The int8-dot GEMM for quantised (DT_GGML) weights (private to
 * kernels/cpu; docs/cpu-backend.md, docs/gguf.md "The GEMM"). */
#ifndef TPGEN_CPU_GEMM_QDOT_H
#define TPGEN_CPU_GEMM_QDOT_H
#include "kernels/tensor.h"
#include <stddef.h>
#include <stdint.h>

/* 1 when cpu_gemm dispatches this GEMM to the int8 kernel: w is DT_GGML of
 * a type with an int8 decoder, the policy takes this (type, x dtype) (by
 * default: bf16 activations and the types measured faster than the
 * dequantising packed path), and it is not turned off (TPGEN_QDOT=0). */
int cpu_gemm_qdot_usable(const tensor *x, const tensor *w);
/* y = x · wᵀ (+ bias): x (f32/bf16/f16) quantised per weight block to
 * int8, int32 dot products, f32 scales; y rounded once. */
void cpu_gemm_qdot(tensor *y, const tensor *x, const tensor *w, const float *bias);

/* 1 when the type has an int8 decoder (whatever the policy) */
int cpu_gemm_qdot_supports(int qtype);
/* Testing / benchmark hooks. isa: 0 the CPU's best (AMX-INT8 from 16 rows
 * where present and turned on, below), 1 not AMX (AVX512-VNNI), 2 not
 * AVX-512 (AVX2), 3 scalar; TPGEN_QDOT=vnni|avx2|scalar sets the same
 * levels. The AMX-INT8 kernel (no faster than VNNI where measured) runs only
 * with TPGEN_QDOT=amx or cpu_gemm_qdot_amx(1). policy: 0 default, 1 every
 * supported type and any x dtype, -1 never (the dequantising packed path for
 * everything). */
void cpu_gemm_qdot_force(int isa);
void cpu_gemm_qdot_policy(int policy);
void cpu_gemm_qdot_amx(int on);
const char *cpu_gemm_qdot_kernel(void);   /* "amx-int8", "avx512vnni", "avx2", "scalar" */
/* Bytes of activation buffers one row chunk may use (default 16 MB; 0
 * restores it): a GEMM of more rows runs in chunks of rows. */
void cpu_gemm_qdot_act_budget(size_t bytes);
/* out = {MR, NR (weight rows per panel), KR (elements per k range)} */
void cpu_gemm_qdot_blocking(int64_t out[3]);

/* The activation quantiser: n values -> q[n] = round(x / d) in [-127, 127]
 * with d = max|x| / 127 (d = 0, q = 0 when all are 0; d = NaN, q = 0 when
 * one is NaN or Inf, so that the outputs it meets are NaN); returns d. */
float qdot_quantize_block(const float *x, int n, int8_t *q);

#endif
