/* ggml block types: the size table and one decoder per supported type.
 *
 * Every decoder computes each value with the same f32 operations, in the
 * same order, as gguf-py's numpy reference (scale = d * sub_scale, value =
 * scale * q [- min]), so results are bit-identical to it. That needs the
 * multiply and the subtraction rounded separately: the Makefile compiles
 * this file with -ffp-contract=off, and clang gets the pragma below. */
#include "quant.h"
#include "err.h"
#include "tensor.h"
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static inline float le_f16(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* ---- legacy 32-element blocks: f16 scale (+ f16 min), 4 or 8 bit quants ---- */

/* Q4_0: d, then 16 bytes; element j < 16 is the low nibble of byte j,
 * element j >= 16 the high nibble of byte j - 16; value d * (q - 8). */
static void dq_q4_0(const uint8_t *restrict b, float *restrict y) {
    float d = le_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 15) - 8);
        y[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

/* Q4_1: d, m, 16 bytes of nibbles as Q4_0; value d * q + m. */
static void dq_q4_1(const uint8_t *restrict b, float *restrict y) {
    float d = le_f16(b), m = le_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 15) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

/* Q5_0: d, a 32-bit little-endian word whose bit j is the fifth bit of
 * element j, then nibbles as Q4_0; value d * (q - 16). */
static void dq_q5_0(const uint8_t *restrict b, float *restrict y) {
    float d = le_f16(b);
    uint32_t qh = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4, hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)(lo - 16);
        y[j + 16] = d * (float)(hi - 16);
    }
}

/* Q5_1: d, m, the fifth bits, nibbles; value d * q + m. */
static void dq_q5_1(const uint8_t *restrict b, float *restrict y) {
    float d = le_f16(b), m = le_f16(b + 2);
    uint32_t qh = (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4, hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)lo + m;
        y[j + 16] = d * (float)hi + m;
    }
}

/* Q8_0: d, 32 signed bytes; value q * d. */
static void dq_q8_0(const uint8_t *restrict b, float *restrict y) {
    float d = le_f16(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

/* IQ4_NL: d, nibbles as Q4_0, each an index into a fixed non-linear table. */
static const int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static void dq_iq4_nl(const uint8_t *restrict b, float *restrict y) {
    float d = le_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)iq4_values[qs[j] & 15];
        y[j + 16] = d * (float)iq4_values[qs[j] >> 4];
    }
}

/* ---- K-quants: 256-element super-blocks of 16 or 8 sub-blocks ---- */

/* Q2_K (84 bytes): 16 scale bytes (low nibble: scale, high nibble: min of
 * sub-block e / 16), 64 bytes of 2-bit quants, d, dmin. Element e takes
 * bits 2 * ((e % 128) / 32) of byte 32 * (e / 128) + e % 32; value
 * (d * scale) * q - dmin * min. */
static void dq_q2_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = le_f16(b + 80), dmin = le_f16(b + 82);
    /* e = 128h + 32j + 16s + l: sub-block e / 16 = 8h + 2j + s */
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int s = 0; s < 2; s++) {
                int sb = 8 * h + 2 * j + s;
                float dl = d * (float)(sc[sb] & 15), ml = dmin * (float)(sc[sb] >> 4);
                const uint8_t *q = qs + 32 * h + 16 * s;
                float *o = y + 16 * sb;
                for (int l = 0; l < 16; l++) o[l] = dl * (float)((q[l] >> (2 * j)) & 3) - ml;
            }
}

/* Q3_K (110 bytes): 32 bytes of high bits (element e: bit e / 32 of byte
 * e % 32, a clear bit subtracts 4), 64 bytes of 2-bit quants laid out as
 * Q2_K, 12 bytes of 6-bit scales, d. Scale s: low 4 bits from byte s (s <
 * 8, low nibble) or s - 8 (high nibble), high 2 bits from bits
 * 2 * (s / 4) of byte 8 + s % 4; stored with a bias of 32. */
static void dq_q3_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    float d = le_f16(b + 108);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int s = 0; s < 2; s++) {
                int sb = 8 * h + 2 * j + s;   /* as in Q2_K; the high bit is bit e / 32 = 4h + j */
                int lo = sb < 8 ? sc[sb] & 15 : sc[sb - 8] >> 4, hi = (sc[8 + sb % 4] >> (2 * (sb / 4))) & 3;
                float dl = d * (float)((lo | hi << 4) - 32);
                const uint8_t *q = qs + 32 * h + 16 * s, *m = hm + 16 * s;
                float *o = y + 16 * sb;
                for (int l = 0; l < 16; l++) {
                    int v = ((q[l] >> (2 * j)) & 3) - (((m[l] >> (4 * h + j)) & 1) ? 0 : 4);
                    o[l] = dl * (float)v;
                }
            }
}

/* The 6-bit scale and min of sub-block s (0..7) of Q4_K / Q5_K from their
 * 12 packed bytes: s < 4 in the low 6 bits of bytes s and s + 4; s >= 4 as
 * the nibbles of byte s + 4 plus the top 2 bits of bytes s - 4 and s. */
static inline void k_scale_min(const uint8_t *p, int s, int *sc, int *mn) {
    if (s < 4) {
        *sc = p[s] & 63;
        *mn = p[s + 4] & 63;
    } else {
        *sc = (p[s + 4] & 15) | (p[s - 4] >> 6) << 4;
        *mn = (p[s + 4] >> 4) | (p[s] >> 6) << 4;
    }
}

/* Q4_K (144 bytes): d, dmin, 12 scale bytes, 128 bytes of nibbles. Sub-block
 * s of 32 takes byte 32 * (s / 2) + e % 32, low nibble for even s, high
 * for odd; value (d * scale) * q - dmin * min. */
static void dq_q4_k(const uint8_t *restrict b, float *restrict y) {
    float d = le_f16(b), dmin = le_f16(b + 2);
    const uint8_t *sp = b + 4, *qs = b + 16;
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        k_scale_min(sp, s, &sc, &mn);
        float dl = d * (float)sc, ml = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (s / 2);
        int shift = (s & 1) * 4;
        for (int l = 0; l < 32; l++) y[s * 32 + l] = dl * (float)((q[l] >> shift) & 15) - ml;
    }
}

/* Q5_K (176 bytes): as Q4_K with 32 bytes of fifth bits after the scales:
 * element e's is bit e / 32 of byte e % 32. */
static void dq_q5_k(const uint8_t *restrict b, float *restrict y) {
    float d = le_f16(b), dmin = le_f16(b + 2);
    const uint8_t *sp = b + 4, *qh = b + 16, *qs = b + 48;
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        k_scale_min(sp, s, &sc, &mn);
        float dl = d * (float)sc, ml = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (s / 2);
        int shift = (s & 1) * 4;
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 15) | ((qh[l] >> s) & 1) << 4;
            y[s * 32 + l] = dl * (float)v - ml;
        }
    }
}

/* Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of high 2-bit
 * pairs, 16 signed scales, d. In half h = e / 128, quarter k = (e % 128) /
 * 32, l = e % 32: low nibble of byte 64h + 32 (k & 1) + l (high nibble for
 * k >= 2), high bits 2k of byte 32h + l; value (d * scale[e / 16]) * (q - 32). */
static void dq_q6_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = le_f16(b + 208);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int s = 0; s < 2; s++) {
                int sb = 8 * h + 2 * k + s;   /* e / 16 */
                float dl = d * (float)sc[sb];
                const uint8_t *lo = ql + 64 * h + 32 * (k & 1) + 16 * s, *hi = qh + 32 * h + 16 * s;
                int ls = k >= 2 ? 4 : 0;
                float *o = y + 16 * sb;
                for (int l = 0; l < 16; l++) o[l] = dl * (float)((((lo[l] >> ls) & 15) | ((hi[l] >> (2 * k)) & 3) << 4) - 32);
            }
}

/* IQ4_XS (136 bytes): d, a 16-bit word of scale high bits (2 per
 * sub-block), 4 bytes of scale low nibbles, 128 bytes of table indices
 * (sub-block s of 32: bytes 16s..16s+15, low nibbles then high). */
static void dq_iq4_xs(const uint8_t *restrict b, float *restrict y) {
    float d = le_f16(b);
    unsigned sh = (unsigned)b[2] | (unsigned)b[3] << 8;
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int s = 0; s < 8; s++) {
        int ls = ((sl[s / 2] >> (4 * (s % 2))) & 15) | (int)((sh >> (2 * s)) & 3) << 4;
        float dl = d * (float)(ls - 32);
        for (int j = 0; j < 16; j++) {
            y[32 * s + j] = dl * (float)iq4_values[qs[16 * s + j] & 15];
            y[32 * s + j + 16] = dl * (float)iq4_values[qs[16 * s + j] >> 4];
        }
    }
}

/* ---- plain element types (block 1) ---- */
static void dq_f32(const uint8_t *restrict b, float *restrict y) { memcpy(y, b, 4); }
static void dq_f16(const uint8_t *restrict b, float *restrict y) { *y = le_f16(b); }
static void dq_bf16(const uint8_t *restrict b, float *restrict y) { *y = bf16_to_f32((uint16_t)(b[0] | b[1] << 8)); }

/* every type of ggml's GGUF files (gguf-py 0.19.0's GGML_QUANT_SIZES) */
static const quant_type types[] = {
    {QUANT_F32, "F32", 1, 4, dq_f32},
    {QUANT_F16, "F16", 1, 2, dq_f16},
    {QUANT_Q4_0, "Q4_0", 32, 18, dq_q4_0},
    {QUANT_Q4_1, "Q4_1", 32, 20, dq_q4_1},
    {QUANT_Q5_0, "Q5_0", 32, 22, dq_q5_0},
    {QUANT_Q5_1, "Q5_1", 32, 24, dq_q5_1},
    {QUANT_Q8_0, "Q8_0", 32, 34, dq_q8_0},
    {QUANT_Q8_1, "Q8_1", 32, 40, NULL},
    {QUANT_Q2_K, "Q2_K", 256, 84, dq_q2_k},
    {QUANT_Q3_K, "Q3_K", 256, 110, dq_q3_k},
    {QUANT_Q4_K, "Q4_K", 256, 144, dq_q4_k},
    {QUANT_Q5_K, "Q5_K", 256, 176, dq_q5_k},
    {QUANT_Q6_K, "Q6_K", 256, 210, dq_q6_k},
    {QUANT_Q8_K, "Q8_K", 256, 292, NULL},
    {16, "IQ2_XXS", 256, 66, NULL},
    {17, "IQ2_XS", 256, 74, NULL},
    {18, "IQ3_XXS", 256, 98, NULL},
    {19, "IQ1_S", 256, 50, NULL},
    {QUANT_IQ4_NL, "IQ4_NL", 32, 18, dq_iq4_nl},
    {21, "IQ3_S", 256, 110, NULL},
    {22, "IQ2_S", 256, 82, NULL},
    {QUANT_IQ4_XS, "IQ4_XS", 256, 136, dq_iq4_xs},
    {24, "I8", 1, 1, NULL},
    {25, "I16", 1, 2, NULL},
    {26, "I32", 1, 4, NULL},
    {27, "I64", 1, 8, NULL},
    {28, "F64", 1, 8, NULL},
    {29, "IQ1_M", 256, 56, NULL},
    {QUANT_BF16, "BF16", 1, 2, dq_bf16},
    {34, "TQ1_0", 256, 54, NULL},
    {35, "TQ2_0", 256, 66, NULL},
    {39, "MXFP4", 32, 17, NULL},
    {40, "NVFP4", 64, 36, NULL},
    {41, "Q1_0", 128, 18, NULL},
};
#define N_TYPES (int)(sizeof types / sizeof types[0])

const quant_type *quant_type_get(int id) {
    for (int i = 0; i < N_TYPES; i++)
        if (types[i].id == id) return &types[i];
    return NULL;
}

const char *quant_type_name(int id) {
    const quant_type *t = quant_type_get(id);
    return t ? t->name : "unknown";
}

int quant_supported(int id) {
    const quant_type *t = quant_type_get(id);
    return t && t->dequant;
}

const char *quant_supported_list(void) {
    return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";
}

int quant_dtype(int type, dtype_t *dt) {
    switch (type) {
    case QUANT_F32: *dt = DT_F32; return 0;
    case QUANT_F16: *dt = DT_F16; return 0;
    case QUANT_BF16: *dt = DT_BF16; return 0;
    case 28: *dt = DT_F64; return 0;
    case 24: *dt = DT_I8; return 0;
    case 25: *dt = DT_I16; return 0;
    case 26: *dt = DT_I32; return 0;
    case 27: *dt = DT_I64; return 0;
    default: return -1;
    }
}

int64_t quant_row_bytes(const quant_type *qt, int64_t n) {
    if (n < 0 || n % qt->block) return -1;
    return n / qt->block * qt->bytes;
}

void quant_col_span(const quant_type *qt, int64_t c0, int64_t c1, int64_t *off, int64_t *len, int64_t *skip) {
    int64_t b0 = c0 / qt->block, b1 = (c1 + qt->block - 1) / qt->block;
    *off = b0 * qt->bytes;
    *len = (b1 - b0) * qt->bytes;
    *skip = c0 % qt->block;
}

static const quant_type *need(int type) {
    const quant_type *t = quant_type_get(type);
    if (!t || !t->dequant) tp_fatal("quant: dequantising type %d (%s), which is not supported", type, quant_type_name(type));
    return t;
}

/* f16 -> f32, exact (the same values as f16_to_f32), branch-free so that
 * the row loop vectorises; subnormals come from an exact multiply whose
 * operands and result are normal f32, so flush-to-zero modes do not matter */
static inline float f16_exact(uint16_t h) {
    uint32_t sgn = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float sub = (float)m * 0x1p-24f;
    uint32_t subb, u;
    memcpy(&subb, &sub, 4);
    u = e == 0 ? subb : e == 31 ? 0x7f800000u | m << 13 : (e + 112) << 23 | m << 13;
    u |= sgn;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* the plain types row by row; the block types block by block */
static void plain_row(int type, const uint8_t *restrict s, float *restrict y, int64_t n) {
    if (type == QUANT_F32) memcpy(y, s, (size_t)n * 4);
    else if (type == QUANT_F16) for (int64_t i = 0; i < n; i++) y[i] = f16_exact((uint16_t)(s[2 * i] | s[2 * i + 1] << 8));
    else for (int64_t i = 0; i < n; i++) y[i] = bf16_to_f32((uint16_t)(s[2 * i] | s[2 * i + 1] << 8));
}

void quant_dequant_row(int type, const void *blocks, float *out, int64_t n) {
    const quant_type *t = need(type);
    const uint8_t *b = blocks;
    if (t->block == 1) {
        plain_row(type, b, out, n);
        return;
    }
    if (n % t->block) tp_fatal("quant_dequant_row: %lld elements of %s are not whole blocks of %d", (long long)n,
                               t->name, t->block);
    for (int64_t i = 0; i < n / t->block; i++) t->dequant(b + i * t->bytes, out + i * t->block);
}

void quant_dequant_span(int type, const void *blocks, int64_t skip, int64_t n, float *out) {
    const quant_type *t = need(type);
    const uint8_t *b = blocks;
    if (n <= 0) return;
    if (t->block == 1) {
        plain_row(type, b + skip * t->bytes, out, n);
        return;
    }
    b += skip / t->block * t->bytes;
    skip %= t->block;
    float tmp[QUANT_MAX_BLOCK];
    if (skip) {   /* the partial first block */
        int64_t k = t->block - skip < n ? t->block - skip : n;
        t->dequant(b, tmp);
        memcpy(out, tmp + skip, (size_t)k * sizeof(float));
        out += k, n -= k, b += t->bytes;
    }
    for (; n >= t->block; n -= t->block, out += t->block, b += t->bytes) t->dequant(b, out);
    if (n > 0) {  /* the partial last block */
        t->dequant(b, tmp);
        memcpy(out, tmp, (size_t)n * sizeof(float));
    }
}

void quant_dequant_cols(int type, const void *row, int64_t c0, int64_t n, float *out) {
    quant_dequant_span(type, row, c0, n, out);
}
