/* Random test data for the quantised GEMMs (test_quant_gemm.c,
 * test_quant_dot.c). */
#ifndef TPGEN_TEST_QUANT_RANDOM_H
#define TPGEN_TEST_QUANT_RANDOM_H
#include "kernels/quant.h"
#include <stdint.h>

/* xorshift32 */
uint32_t rng_next(uint32_t *s);
/* nblocks random blocks of a ggml type into b: random bytes with valid f16
 * scales (magnitude 0.002-0.05) at the type's scale fields (random bytes
 * there could be Inf/NaN) */
void random_blocks(int type, uint8_t *b, int64_t nblocks, uint32_t *s);

#endif
