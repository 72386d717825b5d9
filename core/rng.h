/* A reproduction of PyTorch's CPU random generator, so that a seed gives
 * the same initial noise (and so the same image) as diffusers:
 *
 *   g = torch.Generator().manual_seed(seed)
 *   torch.randn(shape, generator=g, dtype=torch.float32 | torch.bfloat16)
 *
 * The engine is MT19937 seeded with the low 32 bits of the seed. Normal
 * sampling follows torch's CPU kernel, which has three paths:
 *  - fewer than 16 elements: Box-Muller in float64, one cached spare value;
 *  - f32, 16 or more: uniforms first, then a vectorised Box-Muller over
 *    blocks of 16 with the Cephes-style log/sincos approximations of
 *    avx_mathfun (torch always takes this path on x86 CPUs with AVX2);
 *  - bf16, 16 or more: 8-bit uniforms and the same blocks of 16, computed
 *    with bf16 rounding after each operation.
 * When the size is not a multiple of 16 the last 16 values are redrawn
 * (overlapping the previous block), as torch does. Matches
 * the golden randn.safetensors (tests/data/golden) bit for bit (tests/test_rng.c). */
#ifndef TPGEN_RNG_H
#define TPGEN_RNG_H
#include <stddef.h>
#include <stdint.h>

typedef struct tp_rng {
    uint32_t state[624];
    int next;                 /* index of the next state word to temper */
    int has_spare;            /* torch's cached second Box-Muller value (float64 path) */
    double spare;
} tp_rng;

/* torch.Generator().manual_seed(seed) */
void rng_seed(tp_rng *g, uint64_t seed);
uint32_t rng_u32(tp_rng *g);          /* generator->random() */
uint64_t rng_u64(tp_rng *g);          /* generator->random64(): first draw is the high word */

/* torch.randn(n elements, generator=g) in f32 and in bf16 (raw bf16 bits).
 * Contiguous, so the element order is the row-major order of the shape. */
void rng_randn_f32(tp_rng *g, float *out, size_t n);
void rng_randn_bf16(tp_rng *g, uint16_t *out, size_t n);

#endif
