/* The AVX512-BF16 GEMM for bf16 activations x bf16 weights (private to
 * kernels/cpu). */
#ifndef TPGEN_CPU_GEMM_BF16_H
#define TPGEN_CPU_GEMM_BF16_H
#include "kernels/tensor.h"

/* 1 when the kernel is compiled in, the CPU has avx512_bf16 and the shape
 * is worth it. */
int cpu_gemm_bf16_usable(int64_t M, int64_t N, int64_t K);
/* y = x · wᵀ (+ bias), x and w bf16, y any float dtype, rounded once. */
void cpu_gemm_bf16(tensor *y, const tensor *x, const tensor *w, const float *bias);

/* The building blocks, for other ops (attention scores); only valid when
 * cpu_has_avx512bf16(). A panel covers 32 rows of the right-hand matrix. */
enum { BF16_PANEL_ROWS = 32 };
/* pack nn <= 32 rows (row r at base + r*ld, 2*kp bf16 values each) into
 * panel[kp][32] 32-bit words (pairs of k); missing rows are zero */
void bf16_pack_panel(const uint16_t *base, int64_t ld, int64_t nn, int64_t kp, uint32_t *panel);
/* c[i][j] = sum_k x[i][k] · row_j[k] for i < m, j < ncols (<= 32); x bf16
 * rows with stride ldx, c f32. The 32 words of pair p are at panel + p*ldp
 * (ldp = 32 for a packed panel; larger for a pair-interleaved image). */
void bf16_panel_gemm(const uint16_t *x, int64_t ldx, int64_t m, const uint32_t *panel, int64_t ldp, int64_t kp,
                     float *c, int64_t ldc, int64_t ncols);

#endif
