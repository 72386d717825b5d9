/* The AMX matrix product of the bf16 convolution (private to kernels/cpu;
 * see cpu_conv_amx.c for the layouts). */
#ifndef TPGEN_CPU_CONV_AMX_H
#define TPGEN_CPU_CONV_AMX_H
#include "../../core/tensor.h"

/* 1 when the kernel is compiled in, the CPU has AMX-BF16 with the OS's
 * permission for the tile state, the bf16 kernels are not forced off
 * (cpu_gemm_force_portable, TPGEN_NO_AVX512) and neither is AMX
 * (cpu_conv_amx_force_off, TPGEN_NO_AMX). */
int cpu_conv_amx_enabled(void);
/* the bf16 weight [Cout, K] as AMX A tiles; *kp = K/2 padded to 16 pairs.
 * The caller frees it. */
uint16_t *amx_pack_weights(const tensor *w, int64_t *kp);
/* load / release the tile configuration: once per thread around its
 * amx_conv_block calls */
void amx_tiles_begin(void);
void amx_tiles_end(void);
/* y[co, b0 + p] = bias[co] + sum_k W[co][k] col[k][p] for p < np, every
 * co < y->rows, on the calling thread; colp: kp pair rows of ldp words
 * (ldp >= np rounded up to 32, the padding zero), rounded once into y's
 * dtype */
void amx_conv_block(tensor *y, const uint16_t *wp, int64_t kp, const float *bias, const uint32_t *colp, int64_t ldp,
                    int64_t np, int64_t b0);
#endif
