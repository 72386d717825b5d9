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
#include "quant_blocks.h"
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* The block types: the shared decoders of quant_blocks.h (the same text the
 * CUDA backend compiles), one unit (16 or 32 elements) at a time. */
#define DQ_BLOCK(name, type)                                                        \
    static void name(const uint8_t *restrict b, float *restrict y) {               \
        float dd[2];                                                                \
        qb_block_scales(type, b, dd);                                               \
        for (int u = 0; u < qb_block(type) / qb_unit(type); u++) qb_dq_unit_s(type, b, u, dd, y + u * qb_unit(type)); \
    }
DQ_BLOCK(dq_q4_0, QB_Q4_0)
DQ_BLOCK(dq_q4_1, QB_Q4_1)
DQ_BLOCK(dq_q5_0, QB_Q5_0)
DQ_BLOCK(dq_q5_1, QB_Q5_1)
DQ_BLOCK(dq_q8_0, QB_Q8_0)
DQ_BLOCK(dq_iq4_nl, QB_IQ4_NL)
DQ_BLOCK(dq_q2_k, QB_Q2_K)
DQ_BLOCK(dq_q3_k, QB_Q3_K)
DQ_BLOCK(dq_q4_k, QB_Q4_K)
DQ_BLOCK(dq_q5_k, QB_Q5_K)
DQ_BLOCK(dq_q6_k, QB_Q6_K)
DQ_BLOCK(dq_iq4_xs, QB_IQ4_XS)

/* ---- plain element types (block 1) ---- */
static void dq_f32(const uint8_t *restrict b, float *restrict y) { memcpy(y, b, 4); }
static void dq_f16(const uint8_t *restrict b, float *restrict y) { *y = qb_le_f16(b); }
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

/* the plain types row by row; the block types block by block */
static void plain_row(int type, const uint8_t *restrict s, float *restrict y, int64_t n) {
    if (type == QUANT_F32) memcpy(y, s, (size_t)n * 4);
    else if (type == QUANT_F16) for (int64_t i = 0; i < n; i++) y[i] = qb_f16((uint16_t)(s[2 * i] | s[2 * i + 1] << 8));
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
