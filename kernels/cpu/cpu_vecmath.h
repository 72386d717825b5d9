/* Vectorised softmax pieces for the CPU attention (private to kernels/cpu):
 * AVX2+FMA when the build targets it (the Makefile's x86-64-v3), plain C
 * otherwise. exp is a degree-7 polynomial after Cody-Waite range reduction,
 * within ~2 ulp of expf; arguments below -87.3 (and -inf) give exactly 0. */
#ifndef TPGEN_CPU_VECMATH_H
#define TPGEN_CPU_VECMATH_H
#include <math.h>
#include <stdint.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CPU_VEC_AVX2 1
#endif

static inline float exp_scalar(float x) { return expf(x); }

#ifdef CPU_VEC_AVX2
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.3762f);
    __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_LT_OQ); /* also true for -inf; NaN handled below */
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);   /* ln2 split: exact high part */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(zero_mask, p);
}

/* round 8 floats to bf16 precision (nearest even, NaN kept), as bf16r() */
static inline __m256 bf16_round8(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                     _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u));
    __m256i nan = _mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)), _mm256_set1_epi32(0x400000));
    __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(nan), isnan);
}

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static inline float hsum8(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
#endif

/* s[j] *= scale for j < n; returns max_j s[j] (-inf for n == 0) */
static inline float scale_max(float *s, int64_t n, float scale) {
    int64_t j = 0;
    float mx = -INFINITY;
#ifdef CPU_VEC_AVX2
    __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= n; j += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + j), vs);
        _mm256_storeu_ps(s + j, v);
        vm = _mm256_max_ps(vm, v);
    }
    mx = hmax8(vm);
#endif
    for (; j < n; j++) { s[j] *= scale; if (s[j] > mx) mx = s[j]; }
    return mx;
}

/* s[j] = exp(s[j] - m) for j < n; returns the sum */
static inline float exp_sum(float *s, int64_t n, float m) {
    int64_t j = 0;
    float sum = 0.0f;
#ifdef CPU_VEC_AVX2
    __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, p);
        acc = _mm256_add_ps(acc, p);
    }
    sum = hsum8(acc);
#endif
    for (; j < n; j++) { s[j] = exp_scalar(s[j] - m); sum += s[j]; }
    return sum;
}

static inline void scale_row(float *o, int64_t n, float c) {
    for (int64_t j = 0; j < n; j++) o[j] *= c; /* auto-vectorised */
}

#endif
