/* Random test data for the quantised GEMMs (test_quant_gemm.c,
 * test_quant_dot.c). */
#ifndef TPGEN_TEST_QUANT_RANDOM_H
#define TPGEN_TEST_QUANT_RANDOM_H
#include "kernels/quant.h"
#include "kernels/tensor.h"
#include <stdint.h>

/* xorshift32 */
uint32_t rng_next(uint32_t *s);
/* nblocks random blocks of a ggml type into b: random bytes with valid f16
 * scales (magnitude 0.002-0.05) at the type's scale fields (random bytes
 * there could be Inf/NaN) */
void random_blocks(int type, uint8_t *b, int64_t nblocks, uint32_t *s);

/* global columns [c0, c1) of one segment of a local row */
typedef struct { int64_t c0, c1; } span;

/* N random rows of Kg columns of `type` (random_blocks), of which the local
 * DT_GGML tensor holds the columns of `sp` (in that order) as their covering
 * blocks, one segment each, as a row-parallel shard does. *K: the local
 * columns; *wd (malloc'ed): the local weights in double, decoded from whole
 * rows and picked. NULL after tp_error on out of memory. */
tensor *segmented_weight(struct backend *be, int type, int64_t N, int64_t Kg, const span *sp, int nsp, uint32_t *s,
                         int64_t *K, double **wd);

#endif
