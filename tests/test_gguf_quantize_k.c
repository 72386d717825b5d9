/* tpgen quantize's K-quant writers (core/formats/gguf_quantize.c) round
 * tripped through tpgen's dequantiser (kernels/quant.c, bit-identical to
 * gguf-py's): on standard gaussian rows (Box-Muller, 64 rows x 1024, the
 * run's seed) the relative L2 error of dequant(quant(x)) must lie below a
 * bound set from the level spacing, and above a floor (the data really went
 * through the quantiser). Expected error: a uniform rounding error of step s
 * has rms s / sqrt(12); Q4_K spreads 16 levels over the range of 32 values
 * (about 4.1 sigma for gaussian data), s = 0.27 -> 0.079; Q5_K 32 levels,
 * 0.040; Q6_K 64 levels over +-max|x| of 16 values (about 2.0 sigma each
 * side), s = 0.0625 -> 0.018; ggml's scale search lowers each a little.
 * Bounds: 0.1, 0.05, 0.03; floors a third of the estimate. Byte equality
 * with ggml's algorithm is tests/sh/quantize.sh (tests/tools/kquant_ref.py).
 * A zero super-block decodes to 0 exactly; for Q4_K/Q5_K a constant one of
 * -63 * 2^-6 too (its min / 63 is an f16; the min alone). Q6_K's constant
 * block is not exact: every level ties in make_qx_quants's search, so f32
 * rounding picks the scale. */
#include "test.h"
#include "core/formats/gguf_quantize.h"
#include "kernels/quant.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rs;
static double urand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return ((rs >> 11) + 0.5) / 9007199254740992.0;
}

static void roundtrip(int type, double lo, double hi, int constant_exact) {
    enum { R = 64, C = 1024 };
    const quant_type *qt = quant_type_get(type);
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C);
    uint8_t *q = malloc((size_t)quant_row_bytes(qt, C) * R);
    rs = 0x9e3779b97f4a7c15ull ^ test_seed();
    for (int i = 0; i < R * C; i += 2) {
        double u = urand(), v = urand(), r = sqrt(-2 * log(u));
        x[i] = (float)(r * cos(2 * M_PI * v)), x[i + 1] = (float)(r * sin(2 * M_PI * v));
    }
    gguf_quantize_row(type, x, (int64_t)R * C, q);
    quant_dequant_row(type, q, y, (int64_t)R * C);
    double e = rel_l2(y, x, (size_t)R * C);
    printf("# %s gaussian round trip rel L2 %.4g (bound %g)\n", qt->name, e, hi);
    CHECK(e < hi && e > lo, "%s: rel L2 %g not in (%g, %g)", qt->name, e, lo, hi);
    /* a zero super-block and a constant one */
    memset(x, 0, 256 * sizeof(float));
    for (int i = 256; i < 512; i++) x[i] = -0.984375f; /* -63 * 2^-6: the min over 63 is an f16 */
    gguf_quantize_row(type, x, 512, q);
    quant_dequant_row(type, q, y, 512);
    int bad = 0;
    for (int i = 0; i < (constant_exact ? 512 : 256); i++) bad += y[i] != x[i];
    CHECK(!bad, "%s: %d of 512 zero/constant values not decoded exactly", qt->name, bad);
    free(x), free(y), free(q);
}

TEST(gguf_quantize_q4_k_roundtrip) { roundtrip(QUANT_Q4_K, 0.026, 0.1, 1); }
TEST(gguf_quantize_q5_k_roundtrip) { roundtrip(QUANT_Q5_K, 0.013, 0.05, 1); }
TEST(gguf_quantize_q6_k_roundtrip) { roundtrip(QUANT_Q6_K, 0.006, 0.03, 0); }
TEST(gguf_quantize_q2_k_roundtrip) { roundtrip(QUANT_Q2_K, 0.1, 0.4, 0); }
TEST(gguf_quantize_q3_k_roundtrip) { roundtrip(QUANT_Q3_K, 0.043, 0.2, 0); }
TEST(gguf_quantize_iq4_nl_roundtrip) { roundtrip(QUANT_IQ4_NL, 0.026, 0.1, 0); }
TEST(gguf_quantize_iq4_xs_roundtrip) { roundtrip(QUANT_IQ4_XS, 0.026, 0.1, 0); }
