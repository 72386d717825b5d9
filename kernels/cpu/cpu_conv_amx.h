/* The AMX matrix product of the bf16 convolution (private to kernels/cpu;
 * see cpu_conv_amx.c for the layouts). */
#ifndef TPGEN_CPU_CONV_AMX_H
#define TPGEN_CPU_CONV_AMX_H
#include "kernels/tensor.h"

/* 1 when the kernel is compiled in, the CPU has AMX-BF16 with the OS's
 * permission for the tile state, the bf16 kernels are not forced off
 * (cpu_kernel_route PORTABLE, TPGEN_NO_AVX512) and neither is AMX
 * (cpu_conv_amx_force_off, TPGEN_NO_AMX). */
int cpu_conv_amx_enabled(void);
/* the bf16 weight [Cout, K] as AMX A tiles; *kp = K/2 padded to 16 pairs.
 * The caller frees it. */
uint16_t *amx_pack_weights(const tensor *w, int64_t *kp);
/* y[co, b0 + p] = bias[co] + sum_k W[co][k] col[k][p] for p < np, every
 * co < y->rows, on the calling thread, one chunk of K at a time: colp holds
 * the pair rows of tile steps [ks0, ks0 + nk) (16 pairs a step), ldp words
 * apart (ldp >= np rounded up to 32, the padding zero; ldp/16 odd). The
 * partial sums of a K split into several chunks wait in acc (Cout rounded
 * up to 32 rows of ldp floats; unused when first && last); the last chunk
 * rounds once into y's dtype. kp: all pairs (amx_pack_weights). The thread
 * holds the tile configuration (cpu_amx_tiles_begin, cpu_amx.h). */
void amx_conv_block(tensor *y, const uint16_t *wp, int64_t kp, int64_t ks0, int64_t nk, const float *bias,
                    const uint32_t *colp, int64_t ldp, int64_t np, int64_t b0, float *acc, int first, int last);
#endif
