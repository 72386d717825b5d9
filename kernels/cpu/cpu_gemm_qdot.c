/* The int8-dot GEMM for quantised (DT_GGML) weights: y = x · wᵀ with x
 * quantised to int8 per weight block and integer dot products.
 *
 * Weights. Every supported ggml type is written as, per sub-block j of SB
 * (16 or 32) elements, unsigned 8-bit integers u, an f32 scale s_j and (for
 * the types with mins) an f32 offset m_j, with a zero point zp of the type:
 *     w = s_j · (u − zp) + m_j,
 * which is the dequantiser's value (kernels/quant.c) up to the rounding of
 * its own product/sum: Q8_0 u = q + 128 (zp 128), Q4_0 zp 8, Q5_0 zp 16,
 * Q4_1/Q5_1 m = min, Q4_K/Q5_K s = d·sc, m = −dmin·min, Q6_K zp 32, Q3_K zp 4,
 * Q2_K (mins), IQ4_NL/IQ4_XS u = table value + 128 (zp 128).
 *
 * Activations. Each row of x is cut along the weight's blocks: for every
 * segment of the local row (tensor.qseg: a row-parallel shard's covering
 * blocks, column col0 being element `skip` of the first) each covering
 * block gets the segment's activations at their element positions and
 * zeros elsewhere, so the blocks of x and of w line up whatever the skips,
 * and the other columns the covering blocks hold meet zeros. A block of x
 * (32 elements for the legacy types, as llama.cpp's Q8_0; 256 for the
 * K-quants and IQ4_XS, as its Q8_K) is q = round(x / d), d = max|x| / 127,
 * with the integer sums Σq of every weight sub-block. So, exactly,
 *     Σ_k w·x̂ = Σ_blocks d · Σ_j [ s_j · (Σ u·q − zp·Σq) + m_j · Σq ],
 * with x̂ the dequantised activation: the inner Σ u·q − zp·Σq is an exact
 * int32 (|.| < 2^21) and converts to f32 exactly.
 *
 * Kernels. Weights are packed per panel of NR = 32 rows and k range of KR
 * elements as quads: line p (4 consecutive k) holds the 4 bytes of each of
 * the 32 rows (128 bytes), plus the s (and m) of the sub-blocks as [j][32]
 * f32: one 64-byte load is 4 k of 16 rows, met by a 4-byte broadcast of
 * the activation. AVX512-VNNI: vpdpbusd (u8 weights x s8 activations, 16
 * int32 lanes = 16 output columns), MR = 4 token rows x 32 columns. AVX2:
 * vpmaddubsw + vpmaddwd(1) per 8 columns, MR = 2 x 16 columns twice; its
 * pair sums saturate at 2^15, so the zp-128 types (u up to 255) run it on
 * |w| and sign(x, w) as llama.cpp does (|w| <= 128, |x| <= 127: 32512);
 * every other type has u <= 63. AMX-INT8 (M >= 16): per sub-block, TDPBSUD
 * of a 16-token x SB-byte A tile (the activations, read in place from the
 * quantised rows) and a B tile of SB/4 lines x 16 columns (the packed
 * panel is that layout, 128 bytes between lines) gives the 16 x 16 int32
 * sums Σ u·q; they are stored and finished with AVX-512 as the VNNI kernel
 * does, MR = 32 tokens (two A tiles) x 32 columns. The sums must be taken
 * per sub-block (each has its own scale), so a tile product is only SB
 * deep and the AVX-512 finish dominates: measured no faster than VNNI
 * (docs/gguf.md), so it runs only when asked (TPGEN_QDOT=amx). Scalar: the same loops in C, the reference. All four compute the
 * same exact integers and then the same f32 fmas in the same order, so they
 * agree bit for bit (tests/test_quant_dot.c).
 *
 * Threads: as cpu_gemm_bf16.c: x is quantised once per call (rows spread
 * over the threads), then items (panel, row chunk) are shared out; an item
 * packs its panel once per k range and runs all its token rows on it. */
#include "cpu_gemm_qdot.h"
#include "cpu_amx.h"
#include "cpu_ops.h"
#include "cpu_rows.h"
#include "kernels/quant.h"
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 10 || defined(__clang__))
#define HAVE_QDOT_X86 1
#endif
#if defined(HAVE_QDOT_X86) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum { NR = 32, MR_MAX = 4, KR = 4096, MR_AMX = 32, AMX_MIN_M = 16 };

/* ---- weights as u8 + scales ---- */

typedef struct qd_type {
    int id, bs, bytes, sb, nsb, zp, has_min;
    /* one block -> u[bs], s[nsb], m[nsb] (m untouched without mins) */
    void (*decode)(const uint8_t *b, uint8_t *u, float *s, float *m);
} qd_type;

static inline float le_f16(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
/* ggml's IQ4 values (-127 ... 113) + 128: IQ4_NL / IQ4_XS weights as unsigned bytes */
static const uint8_t iq4_u8[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

/* 32 bytes -> their low and high nibbles (32 each) */
static inline void nibbles32(const uint8_t *q, uint8_t *lo, uint8_t *hi) {
#ifdef __AVX2__
    const __m256i f = _mm256_set1_epi8(15);
    __m256i v = _mm256_loadu_si256((const __m256i *)q);
    _mm256_storeu_si256((__m256i *)lo, _mm256_and_si256(v, f));
    _mm256_storeu_si256((__m256i *)hi, _mm256_and_si256(_mm256_srli_epi16(v, 4), f));
#else
    for (int l = 0; l < 32; l++) lo[l] = q[l] & 15, hi[l] = q[l] >> 4;
#endif
}
/* 16 bytes -> their low nibbles, then their high nibbles (32 bytes) */
static inline void nibbles16(const uint8_t *q, uint8_t *u) {
#ifdef __AVX2__
    __m128i v = _mm_loadu_si128((const __m128i *)q), f = _mm_set1_epi8(15);
    _mm_storeu_si128((__m128i *)u, _mm_and_si128(v, f));
    _mm_storeu_si128((__m128i *)(u + 16), _mm_and_si128(_mm_srli_epi16(v, 4), f));
#else
    for (int j = 0; j < 16; j++) u[j] = q[j] & 15, u[j + 16] = q[j] >> 4;
#endif
}
static void de_q8_0(const uint8_t *b, uint8_t *u, float *s, float *m) {
    s[0] = le_f16(b);
#ifdef __AVX2__
    _mm256_storeu_si256((__m256i *)u, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)),
                                                       _mm256_set1_epi8((char)0x80)));
#else
    for (int k = 0; k < 32; k++) u[k] = (uint8_t)(b[2 + k] ^ 0x80);
#endif
}
static void de_q4_0(const uint8_t *b, uint8_t *u, float *s, float *m) {
    s[0] = le_f16(b);
    nibbles16(b + 2, u);
}
static void de_q4_1(const uint8_t *b, uint8_t *u, float *s, float *m) {
    s[0] = le_f16(b), m[0] = le_f16(b + 2);
    nibbles16(b + 4, u);
}
static inline void q5_nibbles(const uint8_t *qhp, const uint8_t *qs, uint8_t *u) {
    uint32_t qh = (uint32_t)qhp[0] | (uint32_t)qhp[1] << 8 | (uint32_t)qhp[2] << 16 | (uint32_t)qhp[3] << 24;
#ifdef __AVX2__
    /* byte l gets bit l of qh: byte l / 8 of qh spread over 8 bytes, one bit each */
    const __m256i sel = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
                  bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i h = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel), bit);
    __m128i v = _mm_loadu_si128((const __m128i *)qs), f = _mm_set1_epi8(15);
    __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), f), _mm_and_si128(v, f));
    h = _mm256_and_si256(_mm256_cmpeq_epi8(h, bit), _mm256_set1_epi8(16));
    _mm256_storeu_si256((__m256i *)u, _mm256_or_si256(nib, h));
#else
    for (int j = 0; j < 16; j++) {
        u[j] = (uint8_t)((qs[j] & 15) | ((qh >> j) & 1) << 4);
        u[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
#endif
}
/* 16 bytes of 4-bit indices -> the IQ4 values of their low, then high nibbles, + 128 */
static inline void iq4_lookup16(const uint8_t *q, uint8_t *u) {
#ifdef __AVX2__
    const __m128i tbl = _mm_loadu_si128((const __m128i *)iq4_u8);
    __m128i v = _mm_loadu_si128((const __m128i *)q), f = _mm_set1_epi8(15);
    _mm_storeu_si128((__m128i *)u, _mm_shuffle_epi8(tbl, _mm_and_si128(v, f)));
    _mm_storeu_si128((__m128i *)(u + 16), _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(v, 4), f)));
#else
    for (int j = 0; j < 16; j++)
        u[j] = iq4_u8[q[j] & 15], u[j + 16] = iq4_u8[q[j] >> 4];
#endif
}
static void de_q5_0(const uint8_t *b, uint8_t *u, float *s, float *m) { s[0] = le_f16(b), q5_nibbles(b + 2, b + 6, u); }
static void de_q5_1(const uint8_t *b, uint8_t *u, float *s, float *m) {
    s[0] = le_f16(b), m[0] = le_f16(b + 2), q5_nibbles(b + 4, b + 8, u);
}
static void de_iq4_nl(const uint8_t *b, uint8_t *u, float *s, float *m) {
    s[0] = le_f16(b);
    iq4_lookup16(b + 2, u);
}
/* Q2_K and Q3_K: sub-blocks 8h + 2j and 8h + 2j + 1 (32 values, u + 128h + 32j) are bits 2j, 2j + 1 of the
 * 32 bytes qs + 32h; Q3_K adds 4 where bit 4h + j of its 32 hmask bytes is set */
static void de_q2_k(const uint8_t *b, uint8_t *u, float *s, float *m) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = le_f16(b + 80), dmin = le_f16(b + 82);
    for (int sbi = 0; sbi < 16; sbi++) s[sbi] = d * (float)(sc[sbi] & 15), m[sbi] = -(dmin * (float)(sc[sbi] >> 4));
    for (int h = 0; h < 2; h++) {
#ifdef __AVX2__
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h)), three = _mm256_set1_epi8(3);
        for (int j = 0; j < 4; j++)
            _mm256_storeu_si256((__m256i *)(u + 128 * h + 32 * j), _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), three));
#else
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) u[128 * h + 32 * j + l] = (qs[32 * h + l] >> (2 * j)) & 3;
#endif
    }
}
static void de_q3_k(const uint8_t *b, uint8_t *u, float *s, float *m) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    float d = le_f16(b + 108);
    for (int sbi = 0; sbi < 16; sbi++) {
        int lo = sbi < 8 ? sc[sbi] & 15 : sc[sbi - 8] >> 4, hi = (sc[8 + sbi % 4] >> (2 * (sbi / 4))) & 3;
        s[sbi] = d * (float)((lo | hi << 4) - 32);
    }
    /* v = q2 - (bit ? 0 : 4), u = v + 4 */
#ifdef __AVX2__
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), mm = _mm256_loadu_si256((const __m256i *)hm);
    for (int h = 0; h < 2; h++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        for (int j = 0; j < 4; j++) {
            __m256i hb = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(mm, 4 * h + j), one), 2);
            _mm256_storeu_si256((__m256i *)(u + 128 * h + 32 * j),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), three), hb));
        }
    }
#else
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                u[128 * h + 32 * j + l] = (uint8_t)(((qs[32 * h + l] >> (2 * j)) & 3) + (((hm[l] >> (4 * h + j)) & 1) ? 4 : 0));
#endif
}
static inline void k_scale_min(const uint8_t *p, int t, int *sc, int *mn) {
    if (t < 4) *sc = p[t] & 63, *mn = p[t + 4] & 63;
    else *sc = (p[t + 4] & 15) | (p[t - 4] >> 6) << 4, *mn = (p[t + 4] >> 4) | (p[t] >> 6) << 4;
}
static void de_q4_k(const uint8_t *b, uint8_t *u, float *s, float *m) {
    float d = le_f16(b), dmin = le_f16(b + 2);
    for (int t = 0; t < 8; t++) {
        int sc, mn;
        k_scale_min(b + 4, t, &sc, &mn);
        s[t] = d * (float)sc, m[t] = -(dmin * (float)mn);
    }
    for (int t = 0; t < 4; t++) nibbles32(b + 16 + 32 * t, u + 64 * t, u + 64 * t + 32);
}
static void de_q5_k(const uint8_t *b, uint8_t *u, float *s, float *m) {
    float d = le_f16(b), dmin = le_f16(b + 2);
    const uint8_t *qh = b + 16;
    for (int t = 0; t < 8; t++) {
        int sc, mn;
        k_scale_min(b + 4, t, &sc, &mn);
        s[t] = d * (float)sc, m[t] = -(dmin * (float)mn);
    }
    for (int t = 0; t < 4; t++) nibbles32(b + 48 + 32 * t, u + 64 * t, u + 64 * t + 32);
#ifdef __AVX2__
    __m256i h = _mm256_loadu_si256((const __m256i *)qh), one = _mm256_set1_epi8(1);
    for (int t = 0; t < 8; t++) {
        __m256i bit = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, t), one), 4);
        _mm256_storeu_si256((__m256i *)(u + 32 * t), _mm256_or_si256(_mm256_loadu_si256((const __m256i *)(u + 32 * t)), bit));
    }
#else
    for (int t = 0; t < 8; t++)
        for (int l = 0; l < 32; l++) u[32 * t + l] |= (uint8_t)(((qh[l] >> t) & 1) << 4);
#endif
}
static void de_q6_k(const uint8_t *b, uint8_t *u, float *s, float *m) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = le_f16(b + 208);
    for (int t = 0; t < 16; t++) s[t] = d * (float)sc[t];
#ifdef __AVX2__
    const __m256i f = _mm256_set1_epi8(15), h3 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h)),
                l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32)),
                hh = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
        uint8_t *o = u + 128 * h;   /* quarter k: nibble (k >= 2) of l(k & 1) | bits 2k of hh, << 4 */
        _mm256_storeu_si256((__m256i *)o, _mm256_or_si256(_mm256_and_si256(l0, f), _mm256_and_si256(_mm256_slli_epi16(hh, 4), h3)));
        _mm256_storeu_si256((__m256i *)(o + 32), _mm256_or_si256(_mm256_and_si256(l1, f), _mm256_and_si256(_mm256_slli_epi16(hh, 2), h3)));
        _mm256_storeu_si256((__m256i *)(o + 64), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), f), _mm256_and_si256(hh, h3)));
        _mm256_storeu_si256((__m256i *)(o + 96), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), f), _mm256_and_si256(_mm256_srli_epi16(hh, 2), h3)));
    }
    return;
#endif
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++) {
            const uint8_t *lo = ql + 64 * h + 32 * (k & 1), *hi = qh + 32 * h;
            int ls = k >= 2 ? 4 : 0;
            for (int l = 0; l < 32; l++)
                u[128 * h + 32 * k + l] = (uint8_t)(((lo[l] >> ls) & 15) | ((hi[l] >> (2 * k)) & 3) << 4);
        }
}
static void de_iq4_xs(const uint8_t *b, uint8_t *u, float *s, float *m) {
    float d = le_f16(b);
    unsigned sh = (unsigned)b[2] | (unsigned)b[3] << 8;
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int t = 0; t < 8; t++) {
        int ls = ((sl[t / 2] >> (4 * (t % 2))) & 15) | (int)((sh >> (2 * t)) & 3) << 4;
        s[t] = d * (float)(ls - 32);
        iq4_lookup16(qs + 16 * t, u + 32 * t);
    }
}

static const qd_type k_types[] = {
    {QUANT_Q8_0, 32, 34, 32, 1, 128, 0, de_q8_0},   {QUANT_Q4_0, 32, 18, 32, 1, 8, 0, de_q4_0},
    {QUANT_Q4_1, 32, 20, 32, 1, 0, 1, de_q4_1},     {QUANT_Q5_0, 32, 22, 32, 1, 16, 0, de_q5_0},
    {QUANT_Q5_1, 32, 24, 32, 1, 0, 1, de_q5_1},     {QUANT_IQ4_NL, 32, 18, 32, 1, 128, 0, de_iq4_nl},
    {QUANT_Q2_K, 256, 84, 16, 16, 0, 1, de_q2_k},   {QUANT_Q3_K, 256, 110, 16, 16, 4, 0, de_q3_k},
    {QUANT_Q4_K, 256, 144, 32, 8, 0, 1, de_q4_k},   {QUANT_Q5_K, 256, 176, 32, 8, 0, 1, de_q5_k},
    {QUANT_Q6_K, 256, 210, 16, 16, 32, 0, de_q6_k}, {QUANT_IQ4_XS, 256, 136, 32, 8, 128, 0, de_iq4_xs},
};

static const qd_type *qd_get(int id) {
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (k_types[i].id == id) return &k_types[i];
    return NULL;
}
int cpu_gemm_qdot_supports(int qtype) { return qd_get(qtype) != NULL; }

/* ---- the activation quantiser ---- */

/* q and d of n values (the definition in the header), and the sums of q
 * over each run of sb (a multiple of 8 dividing n; sums NULL: none). */
static float quant_block(const float *x, int n, int sb, int8_t *q, int32_t *sums) {
    if (n <= 0) return 0.0f;
    float amax = 0;
    int i = 0;
#ifdef __AVX2__
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vm = _mm256_setzero_ps(), vn = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        vm = _mm256_max_ps(vm, _mm256_and_ps(v, absm));
        vn = _mm256_or_ps(vn, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float t8[8];
    _mm256_storeu_ps(t8, vm);
    for (int k = 0; k < 8; k++) amax = t8[k] > amax ? t8[k] : amax;
    int bad = _mm256_movemask_ps(vn) != 0;
#else
    int bad = 0;
#endif
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
        bad |= x[i] != x[i];
    }
    if (!(amax > 0) || bad || amax > 3.4028234663852886e38f) {
        /* all zero: d = 0; a NaN or an Inf: d = NaN, so that the block's outputs are NaN (and found) */
        memset(q, 0, (size_t)n);
        if (sums) memset(sums, 0, (size_t)(n / sb) * sizeof(int32_t));
        return amax == 0 && !bad ? 0.0f : NAN;
    }
    float d = amax / 127.0f, id = 127.0f / amax;
    i = 0;
#ifdef __AVX2__
    /* round to nearest even (the default MXCSR mode, as rintf); |x * id| <= 127 rounds into [-127, 127] */
    if (sums && sb % 8 == 0 && n % sb == 0) {
        const __m256 vid = _mm256_set1_ps(id);
        for (int j = 0; j < n / sb; j++) {
            __m256i acc = _mm256_setzero_si256();
            for (int e = 0; e < sb; e += 8, i += 8) {
                __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vid));
                v = _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
                acc = _mm256_add_epi32(acc, v);
                __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
                _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(w, w));
            }
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
            h = _mm_hadd_epi32(h, h);
            sums[j] = _mm_cvtsi128_si32(_mm_hadd_epi32(h, h));
        }
        return d;
    }
#endif
    for (; i < n; i++) {
        float v = rintf(x[i] * id);
        q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    if (sums)
        for (int j = 0; j < n / sb; j++) {
            int32_t t = 0;
            for (int e = 0; e < sb; e++) t += q[j * sb + e];
            sums[j] = t;
        }
    return d;
}

float qdot_quantize_block(const float *x, int n, int8_t *q) { return quant_block(x, n, 8, q, NULL); }

/* ---- the GEMM's operands ---- */

typedef struct qd_gemm {
    const qd_type *t;
    int64_t M, N, K, VB, VK;     /* VB virtual blocks (all segments' covering blocks), VK = VB * bs */
    int64_t *vboff;               /* byte offset of virtual block b in a stored row */
    int8_t *qa;                   /* [M][VK] activation quants */
    float *dx;                    /* [M][VB] activation scales */
    int32_t *xz;                  /* [M][VB * nsb] -zp * Σq per sub-block */
    float *xf;                    /* [M][VB * nsb] Σq per sub-block (types with mins) */
} qd_gemm;

typedef struct qd_args {
    const int8_t *qa;
    int64_t lda;            /* bytes between rows */
    const float *dx;
    int64_t ldd;
    const int32_t *xz;
    const float *xf;
    int64_t lds;
    const uint8_t *pq;      /* panel quads */
    const float *ps, *pm;   /* panel scales / mins [sub-block][32] */
    int64_t nblk;
    float *acc;             /* mr x 32, row stride 32 */
    int accumulate;
} qd_args;

static void quantise_row(const qd_gemm *g, const tensor *x, const tensor *w, int64_t r, float *xr, float *tmp) {
    const qd_type *t = g->t;
    const float *row = row_f32(x, r, 0, g->K, xr);
    int8_t *qa = g->qa + r * g->VK;
    int64_t vb = 0;
    for (int i = 0; i < w->n_qseg; i++) {
        const tensor_qseg *s = &w->qseg[i];
        int64_t nb = (s->skip + s->ncols + t->bs - 1) / t->bs;
        for (int64_t j = 0; j < nb; j++, vb++) {
            int64_t c0 = j * t->bs - s->skip;   /* segment column of element 0 */
            const float *src = row + s->col0 + c0;
            if (c0 < 0 || c0 + t->bs > s->ncols) { /* a block at a segment edge: zeros outside it */
                for (int e = 0; e < t->bs; e++) tmp[e] = c0 + e >= 0 && c0 + e < s->ncols ? src[e] : 0.0f;
                src = tmp;
            }
            int32_t *xz = g->xz + (r * g->VB + vb) * t->nsb;
            float *xf = g->xf + (r * g->VB + vb) * t->nsb;
            g->dx[r * g->VB + vb] = quant_block(src, t->bs, t->sb, qa + vb * t->bs, xz);
            for (int k = 0; k < t->nsb; k++) xf[k] = (float)xz[k], xz[k] *= -t->zp;
        }
    }
}

/* Pack rows [n0, n0 + nn) over virtual blocks [b0, b1): quads, scales,
 * mins. Per block: the 32 rows decoded into ub[32][bs], then transposed as
 * a matrix of 32-bit quads (8 x 8 in AVX2 registers) into the lines. */
static void pack_panel(const qd_gemm *g, const tensor *w, int64_t n0, int64_t nn, int64_t b0, int64_t b1,
                       uint8_t *pq, float *ps, float *pm) {
    const qd_type *t = g->t;
    _Alignas(64) uint8_t ub[NR * QUANT_MAX_BLOCK];
    float s[16], m[16] = {0};
    int64_t lines = t->bs / 4;
    for (int64_t b = b0; b < b1; b++) {
        uint8_t *line0 = pq + (b - b0) * lines * 128;
        for (int64_t r = 0; r < NR; r++) {
            uint8_t *u = ub + r * t->bs;
            if (r < nn) {
                t->decode((const uint8_t *)w->data + (size_t)(n0 + r) * (size_t)w->qpitch + g->vboff[b], u, s, m);
            } else {
                memset(u, 0, (size_t)t->bs), memset(s, 0, sizeof s), memset(m, 0, sizeof m);
            }
            for (int j = 0; j < t->nsb; j++) {
                ps[((b - b0) * t->nsb + j) * NR + r] = s[j];
                pm[((b - b0) * t->nsb + j) * NR + r] = m[j];
            }
        }
#ifdef __AVX2__
        for (int64_t rg = 0; rg < NR; rg += 8)
            for (int64_t qg = 0; qg < lines; qg += 8) {
                __m256i v[8], t0[8], t1[8];
                for (int i = 0; i < 8; i++) v[i] = _mm256_load_si256((const __m256i *)(ub + (rg + i) * t->bs + 4 * qg));
                for (int i = 0; i < 4; i++) {
                    t0[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
                    t0[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
                }
                for (int i = 0; i < 2; i++)
                    for (int k = 0; k < 2; k++) {
                        t1[4 * i + k] = _mm256_unpacklo_epi64(t0[4 * i + k], t0[4 * i + 2 + k]);
                        t1[4 * i + 2 + k] = _mm256_unpackhi_epi64(t0[4 * i + k], t0[4 * i + 2 + k]);
                    }
                /* t1[0] = rows 0-3 of quads 0 and 4 (per 128-bit lane), t1[2] quads 1, 5, t1[1] quads 2, 6, t1[3] 3, 7 */
                static const int qi[4] = {0, 2, 1, 3};
                for (int k = 0; k < 4; k++) {
                    __m256i a = t1[qi[k]], c = t1[4 + qi[k]];
                    _mm256_storeu_si256((__m256i *)(line0 + (qg + k) * 128 + rg * 4), _mm256_permute2x128_si256(a, c, 0x20));
                    _mm256_storeu_si256((__m256i *)(line0 + (qg + k + 4) * 128 + rg * 4), _mm256_permute2x128_si256(a, c, 0x31));
                }
            }
#else
        for (int64_t r = 0; r < NR; r++)
            for (int64_t p = 0; p < lines; p++) memcpy(line0 + p * 128 + r * 4, ub + r * t->bs + 4 * p, 4);
#endif
    }
}

/* ---- micro-kernels ---- */

/* The reference: out[i][c] for i < mr, c < 32, in the order the vector
 * kernels use (per column: sub-block sums in order, fma). */
static void uk_scalar(const qd_type *t, const qd_args *a, int mr) {
    for (int i = 0; i < mr; i++)
        for (int c = 0; c < NR; c++) {
            float acc = a->accumulate ? a->acc[i * NR + c] : 0.0f;
            const uint8_t *pq = a->pq;
            const float *ps = a->ps, *pm = a->pm;
            const int8_t *qa = a->qa + i * a->lda;
            for (int64_t b = 0; b < a->nblk; b++) {
                float fb = 0;
                for (int j = 0; j < t->nsb; j++) {
                    int32_t is = t->zp ? a->xz[i * a->lds + b * t->nsb + j] : 0;
                    for (int p = 0; p < t->sb / 4; p++, pq += 128, qa += 4)
                        for (int e = 0; e < 4; e++) is += (int32_t)pq[c * 4 + e] * qa[e];
                    fb = j == 0 ? (float)is * ps[c] : fmaf((float)is, ps[c], fb);
                    if (t->has_min) fb = fmaf(a->xf[i * a->lds + b * t->nsb + j], pm[c], fb);
                    ps += NR, pm += NR;
                }
                acc = fmaf(fb, a->dx[i * a->ldd + b], acc);
            }
            a->acc[i * NR + c] = acc;
        }
}

#ifdef HAVE_QDOT_X86
#define VNNI_T __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define AVX2_T __attribute__((target("avx2,fma")))
#define INL inline __attribute__((always_inline))

static inline int32_t ld32(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

static INL VNNI_T void uk_vnni_t(const qd_args *a, const int mr, const int sb, const int nsb, const int zp,
                                 const int mn) {
    __m512 facc[MR_MAX][2];
    #pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        #pragma GCC unroll 2
        for (int c = 0; c < 2; c++)
            facc[i][c] = a->accumulate ? _mm512_loadu_ps(a->acc + i * NR + 16 * c) : _mm512_setzero_ps();
    const uint8_t *pq = a->pq;
    const float *ps = a->ps, *pm = a->pm;
    for (int64_t b = 0; b < a->nblk; b++) {
        __m512 fb[MR_MAX][2];
        #pragma GCC unroll 4
        for (int i = 0; i < mr; i++) fb[i][0] = fb[i][1] = _mm512_setzero_ps(); /* set at j = 0 */
        for (int j = 0; j < nsb; j++) {
            __m512i ia[MR_MAX][2];
            int64_t sj = b * nsb + j;
            #pragma GCC unroll 4
            for (int i = 0; i < mr; i++)
                ia[i][0] = ia[i][1] = zp ? _mm512_set1_epi32(a->xz[i * a->lds + sj]) : _mm512_setzero_si512();
            const int8_t *qa = a->qa + sj * sb;
            #pragma GCC unroll 8
            for (int p = 0; p < sb / 4; p++, pq += 128) {
                __m512i w0 = _mm512_loadu_si512(pq), w1 = _mm512_loadu_si512(pq + 64);
                #pragma GCC unroll 4
                for (int i = 0; i < mr; i++) {
                    __m512i xb = _mm512_set1_epi32(ld32(qa + i * a->lda + 4 * p));
                    ia[i][0] = _mm512_dpbusd_epi32(ia[i][0], w0, xb);
                    ia[i][1] = _mm512_dpbusd_epi32(ia[i][1], w1, xb);
                }
            }
            __m512 s0 = _mm512_loadu_ps(ps), s1 = _mm512_loadu_ps(ps + 16);
            ps += NR;
            #pragma GCC unroll 4
            for (int i = 0; i < mr; i++) {
                __m512 v0 = _mm512_cvtepi32_ps(ia[i][0]), v1 = _mm512_cvtepi32_ps(ia[i][1]);
                fb[i][0] = j == 0 ? _mm512_mul_ps(v0, s0) : _mm512_fmadd_ps(v0, s0, fb[i][0]);
                fb[i][1] = j == 0 ? _mm512_mul_ps(v1, s1) : _mm512_fmadd_ps(v1, s1, fb[i][1]);
            }
            if (mn) {
                __m512 m0 = _mm512_loadu_ps(pm), m1 = _mm512_loadu_ps(pm + 16);
                #pragma GCC unroll 4
                for (int i = 0; i < mr; i++) {
                    __m512 xs = _mm512_set1_ps(a->xf[i * a->lds + sj]);
                    fb[i][0] = _mm512_fmadd_ps(xs, m0, fb[i][0]);
                    fb[i][1] = _mm512_fmadd_ps(xs, m1, fb[i][1]);
                }
            }
            pm += NR;
        }
        #pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m512 d = _mm512_set1_ps(a->dx[i * a->ldd + b]);
            facc[i][0] = _mm512_fmadd_ps(fb[i][0], d, facc[i][0]);
            facc[i][1] = _mm512_fmadd_ps(fb[i][1], d, facc[i][1]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        #pragma GCC unroll 2
        for (int c = 0; c < 2; c++) _mm512_storeu_ps(a->acc + i * NR + 16 * c, facc[i][c]);
}

/* half h: columns [16h, 16h + 16); mr <= 2 */
static INL AVX2_T void uk_avx2_t(const qd_args *a, const int h, const int mr, const int sb, const int nsb,
                                 const int zp, const int mn, const int sgn) {
    __m256 facc[2][2];
    float *acc = a->acc + 16 * h;
    #pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        #pragma GCC unroll 2
        for (int c = 0; c < 2; c++)
            facc[i][c] = a->accumulate ? _mm256_loadu_ps(acc + i * NR + 8 * c) : _mm256_setzero_ps();
    const uint8_t *pq = a->pq + 64 * h;
    const float *ps = a->ps + 16 * h, *pm = a->pm + 16 * h;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < a->nblk; b++) {
        __m256 fb[2][2];
        #pragma GCC unroll 4
        for (int i = 0; i < mr; i++) fb[i][0] = fb[i][1] = _mm256_setzero_ps(); /* set at j = 0 */
        for (int j = 0; j < nsb; j++) {
            __m256i ia[2][2];
            int64_t sj = b * nsb + j;
            #pragma GCC unroll 4
            for (int i = 0; i < mr; i++)
                ia[i][0] = ia[i][1] = zp && !sgn ? _mm256_set1_epi32(a->xz[i * a->lds + sj]) : _mm256_setzero_si256();
            const int8_t *qa = a->qa + sj * sb;
            #pragma GCC unroll 8
            for (int p = 0; p < sb / 4; p++, pq += 128) {
                __m256i w[2], aw[2];
                #pragma GCC unroll 2
                for (int c = 0; c < 2; c++) {
                    w[c] = _mm256_loadu_si256((const __m256i *)(pq + 32 * c));
                    if (sgn) w[c] = _mm256_xor_si256(w[c], flip), aw[c] = _mm256_abs_epi8(w[c]);
                }
                #pragma GCC unroll 4
                for (int i = 0; i < mr; i++) {
                    __m256i xb = _mm256_set1_epi32(ld32(qa + i * a->lda + 4 * p));
                    #pragma GCC unroll 2
                    for (int c = 0; c < 2; c++) {
                        __m256i t = sgn ? _mm256_maddubs_epi16(aw[c], _mm256_sign_epi8(xb, w[c]))
                                        : _mm256_maddubs_epi16(w[c], xb);
                        ia[i][c] = _mm256_add_epi32(ia[i][c], _mm256_madd_epi16(t, ones));
                    }
                }
            }
            #pragma GCC unroll 4
            for (int i = 0; i < mr; i++)
                #pragma GCC unroll 2
                for (int c = 0; c < 2; c++) {
                    __m256 v = _mm256_cvtepi32_ps(ia[i][c]), s = _mm256_loadu_ps(ps + 8 * c);
                    fb[i][c] = j == 0 ? _mm256_mul_ps(v, s) : _mm256_fmadd_ps(v, s, fb[i][c]);
                    if (mn)
                        fb[i][c] = _mm256_fmadd_ps(_mm256_set1_ps(a->xf[i * a->lds + sj]), _mm256_loadu_ps(pm + 8 * c),
                                                   fb[i][c]);
                }
            ps += NR, pm += NR;
        }
        #pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m256 d = _mm256_set1_ps(a->dx[i * a->ldd + b]);
            #pragma GCC unroll 2
            for (int c = 0; c < 2; c++) facc[i][c] = _mm256_fmadd_ps(fb[i][c], d, facc[i][c]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
        #pragma GCC unroll 2
        for (int c = 0; c < 2; c++) _mm256_storeu_ps(acc + i * NR + 8 * c, facc[i][c]);
}

/* one instance per (mr, type shape): the shapes of k_types */
#define QD_SHAPES(X, ...)                                                                        \
    switch (t->sb * 1000 + t->nsb * 10 + (t->zp != 0) * 2 + t->has_min) {                       \
    case 32012: X(__VA_ARGS__, 32, 1, 1, 0); break;   /* Q8_0 Q4_0 Q5_0 IQ4_NL */                  \
    case 32011: X(__VA_ARGS__, 32, 1, 0, 1); break;   /* Q4_1 Q5_1 */                              \
    case 32081: X(__VA_ARGS__, 32, 8, 0, 1); break;   /* Q4_K Q5_K */                              \
    case 32082: X(__VA_ARGS__, 32, 8, 1, 0); break;   /* IQ4_XS */                                 \
    case 16162: X(__VA_ARGS__, 16, 16, 1, 0); break;  /* Q6_K Q3_K */                              \
    case 16161: X(__VA_ARGS__, 16, 16, 0, 1); break;  /* Q2_K */                                   \
    default: tp_fatal("qdot: no kernel for type %d", t->id);                                      \
    }

#define VNNI_CALL(mr_, sb_, nsb_, zp_, mn_) uk_vnni_t(a, mr_, sb_, nsb_, zp_, mn_)
static VNNI_T void uk_vnni_4(const qd_type *t, const qd_args *a) { QD_SHAPES(VNNI_CALL, 4) }
static VNNI_T void uk_vnni_3(const qd_type *t, const qd_args *a) { QD_SHAPES(VNNI_CALL, 3) }
static VNNI_T void uk_vnni_2(const qd_type *t, const qd_args *a) { QD_SHAPES(VNNI_CALL, 2) }
static VNNI_T void uk_vnni_1(const qd_type *t, const qd_args *a) { QD_SHAPES(VNNI_CALL, 1) }
static void uk_vnni(const qd_type *t, const qd_args *a, int mr) {
    switch (mr) {
    case 4: uk_vnni_4(t, a); break;
    case 3: uk_vnni_3(t, a); break;
    case 2: uk_vnni_2(t, a); break;
    default: uk_vnni_1(t, a); break;
    }
}

#define AVX2_CALL(h_, mr_, sg_, sb_, nsb_, zp_, mn_) uk_avx2_t(a, h_, mr_, sb_, nsb_, zp_, mn_, sg_)
static AVX2_T void uk_avx2_2(const qd_type *t, const qd_args *a, int h) {
    if (t->zp == 128) { if (h) { QD_SHAPES(AVX2_CALL, 1, 2, 1) } else { QD_SHAPES(AVX2_CALL, 0, 2, 1) } }
    else if (h) { QD_SHAPES(AVX2_CALL, 1, 2, 0) } else { QD_SHAPES(AVX2_CALL, 0, 2, 0) }
}
static AVX2_T void uk_avx2_1(const qd_type *t, const qd_args *a, int h) {
    if (t->zp == 128) { if (h) { QD_SHAPES(AVX2_CALL, 1, 1, 1) } else { QD_SHAPES(AVX2_CALL, 0, 1, 1) } }
    else if (h) { QD_SHAPES(AVX2_CALL, 1, 1, 0) } else { QD_SHAPES(AVX2_CALL, 0, 1, 0) }
}
static void uk_avx2(const qd_type *t, const qd_args *a, int mr) {
    for (int h = 0; h < 2; h++) (mr == 2 ? uk_avx2_2 : uk_avx2_1)(t, a, h);
}
#endif

#if defined(HAVE_QDOT_X86) && defined(__linux__) && (__GNUC__ >= 11 || defined(__clang__))
#define HAVE_QDOT_AMX 1
#define AMX8_T __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl")))

/* mr <= 32 tokens x 32 columns on the tiles of cpu_amx_tiles_begin_int8(sb).
 * The A tiles read 16 (or 32) rows of qa whatever mr: the rows past mr are
 * padding the caller allocated, and their sums are never used. */
static INL AMX8_T void uk_amx_t(const qd_args *a, const int mr, const int sb, const int nsb, const int zp,
                                const int mn) {
    _Alignas(64) int32_t ci[MR_AMX][NR];
    _Alignas(64) float fb[MR_AMX][NR];
    const int two = mr > 16;
    float *acc = a->acc;
    if (!a->accumulate) memset(acc, 0, (size_t)mr * NR * sizeof(float));
    const uint8_t *pq = a->pq;
    const float *ps = a->ps, *pm = a->pm;
    const size_t lda = (size_t)a->lda;
    for (int64_t b = 0; b < a->nblk; b++) {
        for (int j = 0; j < nsb; j++) {
            int64_t sj = b * nsb + j;
            const int8_t *qa = a->qa + sj * sb;
            _tile_zero(0);
            _tile_zero(1);
            _tile_loadd(4, qa, lda);
            _tile_loadd(6, pq, 128);
            _tile_loadd(7, pq + 64, 128);
            _tile_dpbsud(0, 4, 6);
            _tile_dpbsud(1, 4, 7);
            _tile_stored(0, &ci[0][0], NR * 4);
            _tile_stored(1, &ci[0][16], NR * 4);
            if (two) {
                _tile_zero(2);
                _tile_zero(3);
                _tile_loadd(5, qa + 16 * lda, lda);
                _tile_dpbsud(2, 5, 6);
                _tile_dpbsud(3, 5, 7);
                _tile_stored(2, &ci[16][0], NR * 4);
                _tile_stored(3, &ci[16][16], NR * 4);
            }
            __m512 s0 = _mm512_loadu_ps(ps), s1 = _mm512_loadu_ps(ps + 16), m0, m1;
            if (mn) m0 = _mm512_loadu_ps(pm), m1 = _mm512_loadu_ps(pm + 16);
            for (int i = 0; i < mr; i++) {
                __m512i i0 = _mm512_load_si512(&ci[i][0]), i1 = _mm512_load_si512(&ci[i][16]);
                if (zp) {
                    __m512i z = _mm512_set1_epi32(a->xz[i * a->lds + sj]);
                    i0 = _mm512_add_epi32(z, i0), i1 = _mm512_add_epi32(z, i1);
                }
                __m512 v0 = _mm512_cvtepi32_ps(i0), v1 = _mm512_cvtepi32_ps(i1), f0, f1;
                if (j == 0) f0 = _mm512_mul_ps(v0, s0), f1 = _mm512_mul_ps(v1, s1);
                else
                    f0 = _mm512_fmadd_ps(v0, s0, _mm512_load_ps(&fb[i][0])),
                    f1 = _mm512_fmadd_ps(v1, s1, _mm512_load_ps(&fb[i][16]));
                if (mn) {
                    __m512 xs = _mm512_set1_ps(a->xf[i * a->lds + sj]);
                    f0 = _mm512_fmadd_ps(xs, m0, f0), f1 = _mm512_fmadd_ps(xs, m1, f1);
                }
                _mm512_store_ps(&fb[i][0], f0);
                _mm512_store_ps(&fb[i][16], f1);
            }
            pq += (sb / 4) * 128, ps += NR, pm += NR;
        }
        for (int i = 0; i < mr; i++) {
            __m512 d = _mm512_set1_ps(a->dx[i * a->ldd + b]);
            float *o = acc + i * NR;
            _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_load_ps(&fb[i][0]), d, _mm512_loadu_ps(o)));
            _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(_mm512_load_ps(&fb[i][16]), d, _mm512_loadu_ps(o + 16)));
        }
    }
}

#define AMX_CALL(mr_, sb_, nsb_, zp_, mn_) uk_amx_t(a, mr_, sb_, nsb_, zp_, mn_)
static AMX8_T void uk_amx(const qd_type *t, const qd_args *a, int mr) { QD_SHAPES(AMX_CALL, mr) }
#endif

/* ---- selection ---- */

typedef struct {
    const char *name;
    int mr, amx;
    void (*fn)(const qd_type *, const qd_args *, int);
} qd_kernel;
static const qd_kernel K_SCALAR = {"scalar", 4, 0, uk_scalar};
#ifdef HAVE_QDOT_X86
static const qd_kernel K_VNNI = {"avx512vnni", 4, 0, uk_vnni}, K_AVX2 = {"avx2", 2, 0, uk_avx2};
#endif
#ifdef HAVE_QDOT_AMX
static const qd_kernel K_AMX = {"amx-int8", MR_AMX, 1, uk_amx};
#endif

/* set by the tests and bench (cpu_gemm_qdot.h); g_amx < 0: as TPGEN_QDOT says */
static _Atomic int g_isa, g_policy, g_amx = -1;
void cpu_gemm_qdot_force(int isa) { g_isa = isa; }
void cpu_gemm_qdot_amx(int on) { g_amx = on; }
void cpu_gemm_qdot_policy(int policy) { g_policy = policy; }

/* What the CPU and the environment allow, found once (pthread_once: every
 * thread sees the whole result, never a half-written "unset"). */
static struct {
    int amx, vnni, avx2;
    int env;     /* TPGEN_QDOT as a level: 1 vnni, 2 avx2, 3 scalar, else 0 */
    int env_amx; /* TPGEN_QDOT=amx */
    int env_off; /* TPGEN_QDOT=0 */
} g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void detect_cpu(void) {
    const char *e = getenv("TPGEN_QDOT"), *off = getenv("TPGEN_NO_AVX512");
    int no512 = off && *off && strcmp(off, "0");
#ifdef HAVE_QDOT_X86
    __builtin_cpu_init();
    g_cpu.vnni = !no512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    g_cpu.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    g_cpu.amx = g_cpu.vnni && cpu_amx_int8_available(); /* AVX-512 finishes the tile sums */
#else
    (void)no512;
#endif
    g_cpu.env = !e ? 0 : !strcmp(e, "vnni") ? 1 : !strcmp(e, "avx2") ? 2 : !strcmp(e, "scalar") ? 3 : 0;
    g_cpu.env_amx = e && !strcmp(e, "amx");
    g_cpu.env_off = e && !strcmp(e, "0");
}

/* the kernel for a GEMM of M rows (M < 0: whatever M) */
static const qd_kernel *kernel_for(int64_t M) {
    pthread_once(&g_cpu_once, detect_cpu);
    int lvl = g_isa > g_cpu.env ? g_isa : g_cpu.env;
#ifdef HAVE_QDOT_AMX
    /* below 16 rows most of every A tile would be padding */
    if (g_cpu.amx && (g_amx < 0 ? g_cpu.env_amx : g_amx) > 0 && lvl < 1 && (M < 0 || M >= AMX_MIN_M)) return &K_AMX;
#endif
#ifdef HAVE_QDOT_X86
    if (g_cpu.vnni && lvl < 2) return &K_VNNI;
    if (g_cpu.avx2 && lvl < 3) return &K_AVX2;
#endif
    return &K_SCALAR;
}
const char *cpu_gemm_qdot_kernel(void) { return kernel_for(-1)->name; }
void cpu_gemm_qdot_blocking(int64_t out[3]) { out[0] = kernel_for(-1)->mr, out[1] = NR, out[2] = KR; }

/* Default policy (docs/gguf.md, "The GEMM"): bf16 activations only (f32
 * runs keep the exact dequantising path: int8 activations cannot meet the
 * f32 checks' 1e-5), and the types measured faster on the int8 kernel than
 * on the dequantising packed path at klein-4B widths. */
static int default_type(int qtype) {
    switch (qtype) {
    case QUANT_Q8_0: case QUANT_Q4_0: case QUANT_Q4_1: case QUANT_Q5_0: case QUANT_Q5_1: case QUANT_IQ4_NL:
    case QUANT_Q2_K: case QUANT_Q3_K: case QUANT_Q4_K: case QUANT_Q5_K: case QUANT_Q6_K: case QUANT_IQ4_XS:
        return 1;
    default: return 0;
    }
}

int cpu_gemm_qdot_usable(const tensor *x, const tensor *w) {
    pthread_once(&g_cpu_once, detect_cpu);
    int off = g_cpu.env_off;
    if (w->dtype != DT_GGML || !qd_get(w->qtype) || g_policy < 0 || (off && g_policy == 0)) return 0;
    if (g_policy == 1) return 1;
    return x->dtype == DT_BF16 && default_type(w->qtype);
}

/* ---- the GEMM ---- */

static void gemm_item(const qd_gemm *g, const qd_kernel *kn, tensor *y, const tensor *w, const float *bias, int64_t n0,
                      int64_t m0, int64_t m1, uint8_t *pq, float *ps, float *pm, float *acc) {
    const qd_type *t = g->t;
    int64_t nn = g->N - n0 < NR ? g->N - n0 : NR, rb = KR / t->bs, nsb = t->nsb;
    for (int64_t b0 = 0; b0 < g->VB; b0 += rb) {
        int64_t b1 = b0 + rb < g->VB ? b0 + rb : g->VB;
        pack_panel(g, w, n0, nn, b0, b1, pq, ps, pm);
        for (int64_t m = m0; m < m1; m += kn->mr) {
            int mr = m1 - m < kn->mr ? (int)(m1 - m) : kn->mr;
            qd_args a = {.qa = g->qa + m * g->VK + b0 * t->bs, .lda = g->VK, .dx = g->dx + m * g->VB + b0,
                         .ldd = g->VB, .xz = g->xz + (m * g->VB + b0) * nsb, .xf = g->xf + (m * g->VB + b0) * nsb,
                         .lds = g->VB * nsb, .pq = pq, .ps = ps, .pm = pm, .nblk = b1 - b0,
                         .acc = acc + (m - m0) * NR, .accumulate = b0 > 0};
            kn->fn(t, &a, mr);
        }
    }
    for (int64_t m = m0; m < m1; m++) {
        float *o = acc + (m - m0) * NR;
        if (bias) for (int64_t j = 0; j < nn; j++) o[j] += bias[n0 + j];
        row_store(y, m, n0, nn, o);
    }
}

/* The activation buffers (quants, scales, sub-block sums: about 1.3 bytes
 * per element) are bounded: a GEMM of more rows runs in row chunks of at
 * most this many bytes (each chunk decodes the weight panels again, which
 * costs 1/rows of the chunk's dot products). */
static size_t g_act_budget = (size_t)16 << 20;
void cpu_gemm_qdot_act_budget(size_t bytes) { g_act_budget = bytes ? bytes : (size_t)16 << 20; }

static void gemm_rows(tensor *y, const tensor *x, const tensor *w, const float *bias, const qd_type *t,
                      const qd_kernel *kn);

void cpu_gemm_qdot(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    const qd_type *t = qd_get(w->qtype);
    CPU_REQUIRE(t, "cpu_gemm_qdot: no int8 kernel for %s", quant_type_name(w->qtype));
    const qd_kernel *kn = kernel_for(x->rows);
    int64_t VB = 0;
    for (int i = 0; i < w->n_qseg; i++) VB += (w->qseg[i].skip + w->qseg[i].ncols + t->bs - 1) / t->bs;
    size_t row_bytes = (size_t)VB * ((size_t)t->bs + sizeof(float) + (size_t)t->nsb * (sizeof(int32_t) + sizeof(float)));
    int64_t chunk = row_bytes ? (int64_t)(g_act_budget / row_bytes) : x->rows;
    chunk = chunk < 4 * kn->mr ? 4 * kn->mr : chunk / kn->mr * kn->mr;
    for (int64_t m0 = 0; m0 < x->rows; m0 += chunk) {
        int64_t n = x->rows - m0 < chunk ? x->rows - m0 : chunk;
        tensor xs = tensor_rows(x, m0, n), ys = tensor_rows(y, m0, n);
        gemm_rows(&ys, &xs, w, bias, t, kn);
    }
}

static void gemm_rows(tensor *y, const tensor *x, const tensor *w, const float *bias, const qd_type *t,
                      const qd_kernel *kn) {
    qd_gemm g = {.t = t, .M = x->rows, .N = w->rows, .K = x->cols};
    for (int i = 0; i < w->n_qseg; i++) g.VB += (w->qseg[i].skip + w->qseg[i].ncols + t->bs - 1) / t->bs;
    g.VK = g.VB * t->bs;
    g.vboff = xmalloc((size_t)g.VB * sizeof(int64_t));
    for (int i = 0, vb = 0; i < w->n_qseg; i++) {
        int64_t nb = (w->qseg[i].skip + w->qseg[i].ncols + t->bs - 1) / t->bs;
        for (int64_t j = 0; j < nb; j++) g.vboff[vb++] = w->qseg[i].off + j * t->bytes;
    }
    /* the AMX kernel's A tiles read up to MR_AMX rows past a tail's last one */
    size_t pad = kn->amx ? (size_t)MR_AMX * (size_t)g.VK : 0;
    g.qa = xmalloc((size_t)(g.M * g.VK) + pad);
    memset(g.qa + g.M * g.VK, 0, pad);
    g.dx = xmalloc((size_t)(g.M * g.VB) * sizeof(float));
    g.xz = xmalloc((size_t)(g.M * g.VB * t->nsb) * sizeof(int32_t));
    g.xf = xmalloc((size_t)(g.M * g.VB * t->nsb) * sizeof(float));
    int64_t M = g.M, npanel = (g.N + NR - 1) / NR;
    int threads = omp_get_max_threads();
    int64_t mchunks = npanel >= 2 * threads ? 1 : (2 * threads + npanel - 1) / npanel;
    int64_t mc = (M + mchunks - 1) / mchunks;
    mc = (mc + kn->mr - 1) / kn->mr * kn->mr;
    mchunks = (M + mc - 1) / mc;
    int64_t rb = KR / t->bs, lines = rb * t->bs / 4;
#pragma omp parallel if (npanel * mchunks > 1 || M * g.K > CPU_PAR_MIN)
    {
        float *xr = xmalloc((size_t)(g.K + QUANT_MAX_BLOCK) * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < M; r++) quantise_row(&g, x, w, r, xr, xr + g.K);
        free(xr);
        uint8_t *pq = aligned_alloc(64, (size_t)lines * 128);
        float *ps = xmalloc((size_t)(rb * t->nsb * NR) * sizeof(float));
        float *pm = xmalloc((size_t)(rb * t->nsb * NR) * sizeof(float));
        float *acc = xmalloc((size_t)mc * NR * sizeof(float));
        if (!pq) tp_fatal("cpu_gemm_qdot: out of memory");
        if (kn->amx) cpu_amx_tiles_begin_int8(t->sb);
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t pi = 0; pi < npanel; pi++)
            for (int64_t mi = 0; mi < mchunks; mi++) {
                int64_t m0 = mi * mc, m1 = m0 + mc < M ? m0 + mc : M;
                if (m0 < m1) gemm_item(&g, kn, y, w, bias, pi * NR, m0, m1, pq, ps, pm, acc);
            }
        if (kn->amx) cpu_amx_tiles_end();
        free(pq), free(ps), free(pm), free(acc);
    }
    free(g.vboff), free(g.qa), free(g.dx), free(g.xz), free(g.xf);
}
