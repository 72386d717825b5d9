/* PyTorch-compatible CPU generator: MT19937 and torch's normal sampling
 * (see rng.h). Every floating-point step below is a separate, rounded
 * operation in the order torch's kernels perform it (contraction into
 * FMAs is turned off below; never build this file with -ffast-math).
 * Written from a reading of PyTorch's CPU generator and distribution
 * kernels; no code was copied. */
#include "rng.h"
/* no automatic a*b+c -> fma: the fused steps are spelled out with fmaf() */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "kernels/tensor.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <math.h>
#include <string.h>

#define MT_N 624
#define MT_M 397

void rng_seed(tp_rng *g, uint64_t seed) {
    g->state[0] = (uint32_t)seed;
    for (int i = 1; i < MT_N; i++)
        g->state[i] = 1812433253u * (g->state[i - 1] ^ (g->state[i - 1] >> 30)) + (uint32_t)i;
    g->next = MT_N;       /* twist before the first draw */
    g->has_spare = 0;
    g->spare = 0;
}

static void mt_twist(uint32_t *s) {
    for (int i = 0; i < MT_N; i++) {
        uint32_t y = (s[i] & 0x80000000u) | (s[(i + 1) % MT_N] & 0x7fffffffu);
        s[i] = s[(i + MT_M) % MT_N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
}

uint32_t rng_u32(tp_rng *g) {
    if (g->next >= MT_N) {
        mt_twist(g->state);
        g->next = 0;
    }
    uint32_t y = g->state[g->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint64_t rng_u64(tp_rng *g) {
    uint64_t hi = rng_u32(g);
    uint64_t lo = rng_u32(g);
    return (hi << 32) | lo;
}

/* uniform_real_distribution: the low `digits` bits scaled into [0, 1) */
static float uniform_f32(tp_rng *g) { return (float)(rng_u32(g) & 0xffffffu) * (1.0f / 16777216.0f); }
static float uniform_bf16(tp_rng *g) { return (float)(rng_u32(g) & 0xffu) * (1.0f / 256.0f); }
static double uniform_f64(tp_rng *g) {
    return (double)(rng_u64(g) & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

/* ---- float64 path (fewer than 16 elements) ---- */

static double normal_f64(tp_rng *g) {
    if (g->has_spare) {
        g->has_spare = 0;
        return g->spare;
    }
    double u1 = uniform_f64(g);
    double u2 = uniform_f64(g);
    double r = sqrt(-2.0 * log(1.0 - u2));
    double theta = 2.0 * M_PI * u1;
    g->spare = r * sin(theta);
    g->has_spare = 1;
    return r * cos(theta);
}

/* ---- f32 path: the Cephes-style approximations of avx_mathfun ----
 * PyTorch's build lets the compiler fuse some multiply-adds of these
 * routines into FMAs; the fmaf() calls below sit exactly where that
 * happened (found by matching the golden values bit for bit), every other
 * multiply and add is rounded on its own. */

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* natural log for x in (0, 1]: exponent split, then a degree-9 polynomial */
static float cephes_logf(float x) {
    static const float p[9] = {7.0376836292E-2f, -1.1514610310E-1f, 1.1676998740E-1f,
                               -1.2420140846E-1f, 1.4249322787E-1f, -1.6668057665E-1f,
                               2.0000714765E-1f, -2.4999993993E-1f, 3.3333331174E-1f};
    if (x < 1.17549435e-38f) x = 1.17549435e-38f;  /* no denormals */
    uint32_t b = f2u(x);
    float e = (float)((int)(b >> 23) - 127);
    x = u2f((b & ~0x7f800000u) | f2u(0.5f));       /* mantissa in [0.5, 1) */
    e = e + 1.0f;
    int small = x < 0.707106781186547524f;
    float add = small ? x : 0.0f;
    x = x - 1.0f;
    e = e - (small ? 1.0f : 0.0f);
    x = x + add;
    float z = x * x;
    float y = p[0];
    for (int i = 1; i < 9; i++) y = fmaf(y, x, p[i]);
    y = y * x;
    y = fmaf(y, z, e * -2.12194440e-4f);
    y = y - z * 0.5f;
    x = x + y;
    x = x + e * 0.693359375f;
    return x;
}

/* sine and cosine together, range-reduced by multiples of pi/4 */
static void cephes_sincosf(float x, float *s, float *c) {
    uint32_t sign_sin = f2u(x) & 0x80000000u;
    x = fabsf(x);
    int j = (int)(x * 1.27323954473516f);
    j = (j + 1) & ~1;
    float y = (float)j;
    uint32_t swap_sin = (uint32_t)(j & 4) << 29;
    int use_cos_poly_for_cos = (j & 2) == 0;
    x = x + y * -0.78515625f;
    x = x + y * -2.4187564849853515625e-4f;
    x = x + y * -3.77489497744594108e-8f;
    uint32_t sign_cos = (uint32_t)(~(j - 2) & 4) << 29;
    sign_sin ^= swap_sin;
    float z = x * x;
    float yc = 2.443315711809948E-005f;
    yc = yc * z;
    yc = yc + -1.388731625493765E-003f;   /* not fused in torch's build */
    yc = fmaf(yc, z, 4.166664568298827E-002f);
    yc = yc * z;
    yc = fmaf(yc, z, -(z * 0.5f));
    yc = yc + 1.0f;
    float ys = -1.9515295891E-4f;
    ys = fmaf(ys, z, 8.3321608736E-3f);
    ys = fmaf(ys, z, -1.6666654611E-1f);
    ys = ys * z;
    ys = fmaf(ys, x, x);
    float sv = use_cos_poly_for_cos ? ys : yc;
    float cv = use_cos_poly_for_cos ? yc : ys;
    *s = u2f(f2u(sv) ^ sign_sin);
    *c = u2f(f2u(cv) ^ sign_cos);
}

/* Box-Muller over 16 uniforms: u[0..7] give the radii, u[8..15] the angles */
static void box_muller16_f32(float *d) {
    const float two_pi = (float)(2.0 * M_PI);
    for (int j = 0; j < 8; j++) {
        float u1 = 1.0f - d[j];
        float u2 = d[j + 8];
        float radius = sqrtf(-2.0f * cephes_logf(u1));
        float s, c;
        cephes_sincosf(two_pi * u2, &s, &c);
        /* torch ends with fma(n, std, mean) = n + 0 for randn: -0 becomes +0 */
        d[j] = radius * c + 0.0f;
        d[j + 8] = radius * s + 0.0f;
    }
}

void rng_randn_f32(tp_rng *g, float *out, size_t n) {
    if (n < 16) {
        for (size_t i = 0; i < n; i++) out[i] = (float)normal_f64(g);
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = uniform_f32(g);
    for (size_t i = 0; i + 16 <= n; i += 16) box_muller16_f32(out + i);
    if (n % 16) {
        float *tail = out + n - 16;
        for (int i = 0; i < 16; i++) tail[i] = uniform_f32(g);
        box_muller16_f32(tail);
    }
}

/* ---- bf16 path: every operation rounds to bf16, as c10::BFloat16 does ---- */

static void box_muller16_bf16(float *d) {
    for (int j = 0; j < 8; j++) {
        float u1 = bf16r(1.0f - d[j]);
        float u2 = d[j + 8];
        float radius = bf16r(sqrtf(bf16r(-2.0f * bf16r(logf(u1)))));
        /* the angle is computed in double and narrowed to float, then bf16 */
        float theta = bf16r((float)(2.0 * M_PI * (double)u2));
        /* `r * cos * std + mean` in bf16 steps; std 1 and mean 0 leave only
         * the sign of zero to care about (+ 0 turns -0 into +0) */
        d[j] = bf16r(bf16r(radius * bf16r(cosf(theta))) + 0.0f);
        d[j + 8] = bf16r(bf16r(radius * bf16r(sinf(theta))) + 0.0f);
    }
}

static void randn_bf16_torch1(tp_rng *g, uint16_t *out, size_t n) {
    float *d = xmalloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = uniform_bf16(g);
    for (size_t i = 0; i + 16 <= n; i += 16) box_muller16_bf16(d + i);
    if (n % 16) {
        float *tail = d + n - 16;
        for (int i = 0; i < 16; i++) tail[i] = uniform_bf16(g);
        box_muller16_bf16(tail);
    }
    for (size_t i = 0; i < n; i++) out[i] = f32_to_bf16(d[i]);
    free(d);
}

/* torch 2.x: the f32 arithmetic, rounded to bf16 once at the end; the
 * uniforms of the whole blocks are drawn first, then (for a size that is
 * not a multiple of 16) 16 more for the last 16 values. f32's path instead
 * draws all n uniforms first, so from the tail on the two differ. */
static void randn_bf16_torch2(tp_rng *g, uint16_t *out, size_t n) {
    float *d = xmalloc(n * sizeof *d);
    size_t whole = n / 16 * 16;
    for (size_t i = 0; i < whole; i++) d[i] = uniform_f32(g);
    for (size_t i = 0; i < whole; i += 16) box_muller16_f32(d + i);
    if (n % 16) {
        float *tail = d + n - 16;
        for (int i = 0; i < 16; i++) tail[i] = uniform_f32(g);
        box_muller16_f32(tail);
    }
    for (size_t i = 0; i < n; i++) out[i] = f32_to_bf16(d[i]);
    free(d);
}

void rng_randn_bf16_as(tp_rng *g, uint16_t *out, size_t n, tp_rng_kind kind) {
    if (n < 16) {   /* the same in both: float64 Box-Muller, narrowed */
        for (size_t i = 0; i < n; i++) out[i] = f32_to_bf16((float)normal_f64(g));
        return;
    }
    if (kind == TP_RNG_TORCH1) randn_bf16_torch1(g, out, n);
    else randn_bf16_torch2(g, out, n);
}

void rng_randn_bf16(tp_rng *g, uint16_t *out, size_t n) { rng_randn_bf16_as(g, out, n, TP_RNG_TORCH2); }

int rng_kind_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "torch2")) return TP_RNG_TORCH2;
    if (!strcmp(name, "torch1")) return TP_RNG_TORCH1;
    return -1;
}

const char *rng_kind_name(tp_rng_kind kind) { return kind == TP_RNG_TORCH1 ? "torch1" : "torch2"; }
