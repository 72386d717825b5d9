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
 *  - bf16, 16 or more, torch 2.x (the default, TP_RNG_TORCH2): the f32
 *    computation (24-bit uniforms, the same blocks of 16, avx_mathfun)
 *    rounded to bf16 at the end; but only the whole blocks' uniforms are
 *    drawn first, so a size that is not a multiple of 16 uses 16 fewer
 *    draws than f32 does and its tail block differs from the f32 draw;
 *  - bf16, 16 or more, torch 1.13 (TP_RNG_TORCH1): 8-bit uniforms and the
 *    same blocks of 16, computed with bf16 rounding after each operation.
 * When the size is not a multiple of 16 the last 16 values are redrawn
 * (overlapping the previous block), as torch does. Matches torch 1.13's
 * randn.safetensors and torch 2.15's randn-torch2.safetensors
 * (tests/data/golden) bit for bit (tests/test_rng.c). torch computes these
 * with AVX2 code on x86-64 CPUs that have AVX2 (capability AVX2 or
 * AVX512); torch forced to ATEN_CPU_CAPABILITY=default, or built for other
 * CPUs, draws other values for 16 or more elements. */
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
void rng_randn_bf16(tp_rng *g, uint16_t *out, size_t n);   /* torch 2.x */

/* Which torch's bf16 draw: 2.x (2.15 checked; the default) or 1.13. The f32
 * draw is the same in both. */
typedef enum { TP_RNG_TORCH2 = 0, TP_RNG_TORCH1 = 1 } tp_rng_kind;
void rng_randn_bf16_as(tp_rng *g, uint16_t *out, size_t n, tp_rng_kind kind);
/* "torch2" / "torch1" -> kind; -1 for anything else */
int rng_kind_parse(const char *name);
const char *rng_kind_name(tp_rng_kind kind);

#endif
