/* The seeded random inputs of `tpgen check` (FLUX.2 and FLUX.3 cases):
 * splitmix64 and Box-Muller, so that a seed gives the same cases on every
 * rank and every run. */
#ifndef TPGEN_CHECK_RNG_H
#define TPGEN_CHECK_RNG_H
#include <math.h>
#include <stdint.h>

static inline uint64_t check_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double check_rng_unit(uint64_t *s) {
    return ((double)(check_rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static inline float check_rng_normal(uint64_t *s) {
    return (float)(sqrt(-2.0 * log(check_rng_unit(s))) * cos(6.283185307179586 * check_rng_unit(s)));
}

#endif
