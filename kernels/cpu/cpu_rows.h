/* Row access helpers shared by the CPU ops (private to kernels/cpu).
 * Ops compute in fp32: a row of an f32 tensor is used in place, a row of a
 * bf16 tensor is widened into a scratch buffer; results are narrowed back
 * with round-to-nearest-even. */
#ifndef TPGEN_CPU_ROWS_H
#define TPGEN_CPU_ROWS_H
#include "kernels/tensor.h"
#include "kernels/err.h"
#include "kernels/quant.h"
#include <stdint.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* bf16 -> f32 (exact: a 16-bit shift) and f32 -> bf16 (round to nearest
 * even, NaN kept quiet, the same as f32_to_bf16), 8 at a time with AVX2. */
static inline void widen_bf16(const uint16_t *s, float *d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
#endif
    for (; i < n; i++) d[i] = bf16_to_f32(s[i]);
}

static inline void narrow_bf16(const float *s, uint16_t *d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), qnan = _mm256_set1_epi32(0x40);
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_castps_si256(_mm256_loadu_ps(s + i));
        __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
        r = _mm256_srli_epi32(_mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_slli_epi32(qnan, 16)), isnan), 16);
        /* pack the 8 low halves: packus works per 128-bit lane, then reorder the lanes */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_castsi256_si128(p));
    }
#endif
    for (; i < n; i++) d[i] = f32_to_bf16(s[i]);
}

static inline void *row_ptr(const tensor *t, int64_t r) {
    if (t->dtype == DT_GGML) return (char *)t->data + (size_t)r * (size_t)t->qpitch;
    return (char *)t->data + (size_t)r * (size_t)t->ld * dtype_size(t->dtype);
}

/* Elements [c0, c0+n) of row r as f32: a pointer into t (f32) or into buf. */
static inline const float *row_f32(const tensor *t, int64_t r, int64_t c0, int64_t n, float *buf) {
    const void *p = row_ptr(t, r);
    switch (t->dtype) {
    case DT_F32: return (const float *)p + c0;
    case DT_BF16: widen_bf16((const uint16_t *)p + c0, buf, n); return buf;
    case DT_F16: {
        const uint16_t *s = (const uint16_t *)p + c0;
        for (int64_t i = 0; i < n; i++) buf[i] = f16_to_f32(s[i]);
        return buf;
    }
    case DT_F8_E4M3:
    case DT_F8_E5M2: {
        /* fp8 weight: decode(code) * scale, one exactly rounded f32 multiply
         * (the dequantised value of the checkpoint, bit for bit) */
        const uint8_t *s = (const uint8_t *)p + c0;
        const float *lut = fp8_table(t->dtype);
        float sc = t->scale ? ((const float *)t->scale)[t->scale_per_row ? r : 0] : 1.0f;
        for (int64_t i = 0; i < n; i++) buf[i] = lut[s[i]] * sc;
        return buf;
    }
    case DT_GGML:
        tp_fatal("cpu op: a quantised (GGUF %s) weight [%lld, %lld] reached an op other than a linear layer's GEMM; "
                 "only GEMM weights may stay quantised (tensors read by other ops must be F32/F16/BF16 in the file)",
                 quant_type_name(t->qtype), (long long)t->rows, (long long)t->cols);
    default: tp_fatal("cpu op: dtype %s is not a float activation/weight type", dtype_name(t->dtype));
    }
}

/* Elements [c0, c0+n) of row r of a GEMM weight as f32: row_f32, and for a
 * quantised (DT_GGML) weight the blocks of each segment of the local row
 * decoded straight into buf (only the blocks that hold those columns). */
static inline const float *row_f32_weight(const tensor *t, int64_t r, int64_t c0, int64_t n, float *buf) {
    if (t->dtype != DT_GGML) return row_f32(t, r, c0, n, buf);
    const char *p = row_ptr(t, r);
    for (int i = 0; i < t->n_qseg; i++) {
        const tensor_qseg *s = &t->qseg[i];
        int64_t lo = c0 > s->col0 ? c0 : s->col0, hi = c0 + n < s->col0 + s->ncols ? c0 + n : s->col0 + s->ncols;
        if (lo < hi) quant_dequant_span(t->qtype, p + s->off, s->skip + (lo - s->col0), hi - lo, buf + (lo - c0));
    }
    return buf;
}

/* Store n f32 values at elements [c0, c0+n) of row r, rounding to t's dtype. */
static inline void row_store(tensor *t, int64_t r, int64_t c0, int64_t n, const float *src) {
    void *p = row_ptr(t, r);
    switch (t->dtype) {
    case DT_F32: {
        float *d = (float *)p + c0;
        if (d != src) for (int64_t i = 0; i < n; i++) d[i] = src[i];
        break;
    }
    case DT_BF16: narrow_bf16(src, (uint16_t *)p + c0, n); break;
    case DT_F16: {
        uint16_t *d = (uint16_t *)p + c0;
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_f16(src[i]);
        break;
    }
    default: tp_fatal("cpu op: dtype %s is not a float activation type", dtype_name(t->dtype));
    }
}

/* Round v to the precision of dtype dt (identity for f32): the rounding
 * points where eager bf16 PyTorch rounds. */
static inline float round_to(dtype_t dt, float v) {
    return dt == DT_BF16 ? bf16r(v) : dt == DT_F16 ? f16_to_f32(f32_to_f16(v)) : v;
}

static inline int is_float_dt(dtype_t dt) { return dt == DT_F32 || dt == DT_BF16 || dt == DT_F16; }
/* weights may also be fp8 (widened by row_f32 with their scales) */
static inline int is_weight_dt(dtype_t dt) { return is_float_dt(dt) || dtype_is_fp8(dt); }

/* Fatal shape checks (bad shapes are programming errors, see ops.h). */
#define CPU_REQUIRE(cond, ...) do { if (!(cond)) tp_fatal(__VA_ARGS__); } while (0)

/* Minimum element count before an op spreads over OpenMP threads. */
#define CPU_PAR_MIN 16384

#endif
