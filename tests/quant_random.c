/* Random test data for the quantised GEMMs (quant_random.h). */
#include "quant_random.h"
#include "kernels/tensor.h"
#include <string.h>

uint32_t rng_next(uint32_t *s) {
    *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
    return *s;
}

/* Random bytes with valid f16 scales (magnitude 0.002-0.05) at each type's
 * scale fields: random bytes there could be Inf/NaN. */
void random_blocks(int type, uint8_t *b, int64_t nblocks, uint32_t *s) {
    static const struct { int type, off[2]; } k_scales[] = {
        {QUANT_Q4_0, {0, -1}}, {QUANT_Q4_1, {0, 2}}, {QUANT_Q5_0, {0, -1}}, {QUANT_Q5_1, {0, 2}},
        {QUANT_Q8_0, {0, -1}}, {QUANT_IQ4_NL, {0, -1}}, {QUANT_Q2_K, {80, 82}}, {QUANT_Q3_K, {108, -1}},
        {QUANT_Q4_K, {0, 2}}, {QUANT_Q5_K, {0, 2}}, {QUANT_Q6_K, {208, -1}}, {QUANT_IQ4_XS, {0, -1}},
    };
    const quant_type *qt = quant_type_get(type);
    for (int64_t i = 0; i < nblocks * qt->bytes; i++) b[i] = (uint8_t)rng_next(s);
    for (size_t k = 0; k < sizeof k_scales / sizeof k_scales[0]; k++) {
        if (k_scales[k].type != type) continue;
        for (int64_t j = 0; j < nblocks; j++)
            for (int f = 0; f < 2 && k_scales[k].off[f] >= 0; f++) {
                float v = (0.002f + 0.048f * (float)(rng_next(s) % 1000) / 1000.0f) * (rng_next(s) & 1 ? -1 : 1);
                uint16_t h = f32_to_f16(v);
                memcpy(b + j * qt->bytes + k_scales[k].off[f], &h, 2);
            }
    }
}
