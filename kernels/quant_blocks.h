/* The ggml block decoders, shared by the CPU (kernels/quant.c) and the CUDA
 * backend (kernels/cuda/cuda_ggml.cu): one text that gcc compiles as C17
 * and nvcc as CUDA C++ (no compound literals, VLAs or designated
 * initialisers; f16 -> f32 by bits, not a compiler builtin).
 *
 * A block of `block` elements is decoded in units: a unit is 32 elements
 * for the 32-element types and the K-quants with 32-element sub-blocks
 * (Q4_K, Q5_K, IQ4_XS), 16 for those with 16-element sub-blocks (Q2_K,
 * Q3_K, Q6_K). qb_dq_unit(type, blk, u, y) writes elements
 * [u * unit, (u + 1) * unit) of the block to y[0..unit); a whole-block loop
 * decodes the block's f16 super-scales once (qb_block_scales) and calls
 * qb_dq_unit_s per unit. Every value is
 * computed with the f32 operations of gguf-py's reference dequantiser, each
 * multiply and subtraction rounded separately (QB_MUL / QB_SUB: __fmul_rn
 * and friends on the device, where nvcc would otherwise fuse them; plain
 * operators on the host, where quant.c is built with -ffp-contract=off and
 * the ISO C mode of the tests does not contract), so the CPU and the GPU
 * give the same bits.
 *
 * The tile body (qb_tile_body) decodes rows of a DT_GGML tensor, segment by
 * segment (kernels/tensor.h tensor.qseg), into a row-major f32 or bf16
 * matrix; the CUDA kernel is a one-line wrapper around it, and
 * tests/test_quant_tiles.c runs the same body over the whole grid on the
 * host. */
#ifndef TPGEN_QUANT_BLOCKS_H
#define TPGEN_QUANT_BLOCKS_H
#include <stdint.h>
#include <string.h>
#include "kernels/tensor.h"

#ifdef __CUDACC__
#define QB_FN __host__ __device__
#define QB_RESTRICT __restrict__
#else
#define QB_FN
#define QB_RESTRICT restrict
#endif

#if defined(__clang__) && !defined(__CUDACC__)
#pragma STDC FP_CONTRACT OFF
#endif

#ifdef __CUDA_ARCH__
#define QB_MUL(a, b) __fmul_rn((a), (b))
#define QB_ADD(a, b) __fadd_rn((a), (b))
#define QB_SUB(a, b) __fsub_rn((a), (b))
#else
#define QB_MUL(a, b) ((a) * (b))
#define QB_ADD(a, b) ((a) + (b))
#define QB_SUB(a, b) ((a) - (b))
#endif

/* ggml type ids (the same numbers as kernels/quant.h's QUANT_*) */
enum {
    QB_Q4_0 = 2, QB_Q4_1 = 3, QB_Q5_0 = 6, QB_Q5_1 = 7, QB_Q8_0 = 8, QB_Q2_K = 10, QB_Q3_K = 11, QB_Q4_K = 12,
    QB_Q5_K = 13, QB_Q6_K = 14, QB_IQ4_NL = 20, QB_IQ4_XS = 23,
};
#define QB_MAX_UNIT 32

QB_FN static inline float qb_f32_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
QB_FN static inline uint32_t qb_bits_f32(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

/* f16 -> f32, exact (the values of kernels/tensor.c f16_to_f32, NaN
 * payloads included), branch-free so that the CPU row loops vectorise;
 * subnormals come from an exact multiply whose operands and result are
 * normal f32, so flush-to-zero modes do not matter */
QB_FN static inline float qb_f16(uint16_t h) {
    uint32_t sgn = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t subb = qb_bits_f32(QB_MUL((float)m, 5.9604644775390625e-8f)); /* 2^-24 */
    uint32_t u = e == 0 ? subb : e == 31 ? 0x7f800000u | m << 13 : (e + 112) << 23 | m << 13;
    return qb_f32_bits(u | sgn);
}
QB_FN static inline float qb_le_f16(const uint8_t *p) { return qb_f16((uint16_t)(p[0] | p[1] << 8)); }

/* f32 -> bf16, round to nearest even, NaN kept quiet (kernels/tensor.h f32_to_bf16) */
QB_FN static inline uint16_t qb_bf16(float f) {
    uint32_t u = qb_bits_f32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* the IQ4_NL / IQ4_XS non-linear table (constant memory on the device) */
#ifdef __CUDACC__
static __constant__ int8_t qb_iq4_dev[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
#endif
static const int8_t qb_iq4_host[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
QB_FN static inline float qb_iq4(int i) {
#ifdef __CUDA_ARCH__
    return (float)qb_iq4_dev[i];
#else
    return (float)qb_iq4_host[i];
#endif
}

/* ---- legacy 32-element blocks (one unit): f16 scale (+ f16 min) ---- */

/* Q4_0: d, then 16 bytes; element j < 16 is the low nibble of byte j,
 * element j >= 16 the high nibble of byte j - 16; value d * (q - 8). */
QB_FN static inline void qb_q4_0(const uint8_t *QB_RESTRICT b, float *QB_RESTRICT y) {
    float d = qb_le_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = QB_MUL(d, (float)((qs[j] & 15) - 8));
        y[j + 16] = QB_MUL(d, (float)((qs[j] >> 4) - 8));
    }
}

/* Q4_1: d, m, 16 bytes of nibbles as Q4_0; value d * q + m. */
QB_FN static inline void qb_q4_1(const uint8_t *QB_RESTRICT b, float *QB_RESTRICT y) {
    float d = qb_le_f16(b), m = qb_le_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = QB_ADD(QB_MUL(d, (float)(qs[j] & 15)), m);
        y[j + 16] = QB_ADD(QB_MUL(d, (float)(qs[j] >> 4)), m);
    }
}

/* Q5_0: d, a 32-bit little-endian word whose bit j is the fifth bit of
 * element j, then nibbles as Q4_0; value d * (q - 16). */
QB_FN static inline void qb_q5_0(const uint8_t *QB_RESTRICT b, float *QB_RESTRICT y) {
    float d = qb_le_f16(b);
    uint32_t qh = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4, hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = QB_MUL(d, (float)(lo - 16));
        y[j + 16] = QB_MUL(d, (float)(hi - 16));
    }
}

/* Q5_1: d, m, the fifth bits, nibbles; value d * q + m. */
QB_FN static inline void qb_q5_1(const uint8_t *QB_RESTRICT b, float *QB_RESTRICT y) {
    float d = qb_le_f16(b), m = qb_le_f16(b + 2);
    uint32_t qh = (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4, hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = QB_ADD(QB_MUL(d, (float)lo), m);
        y[j + 16] = QB_ADD(QB_MUL(d, (float)hi), m);
    }
}

/* Q8_0: d, 32 signed bytes; value q * d. */
QB_FN static inline void qb_q8_0(const uint8_t *QB_RESTRICT b, float *QB_RESTRICT y) {
    float d = qb_le_f16(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = QB_MUL((float)qs[j], d);
}

/* IQ4_NL: d, nibbles as Q4_0, each an index into the non-linear table. */
QB_FN static inline void qb_iq4_nl(const uint8_t *QB_RESTRICT b, float *QB_RESTRICT y) {
    float d = qb_le_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = QB_MUL(d, qb_iq4(qs[j] & 15));
        y[j + 16] = QB_MUL(d, qb_iq4(qs[j] >> 4));
    }
}

/* ---- K-quants: 256-element super-blocks ---- */

/* Q2_K (84 bytes): 16 scale bytes (low nibble: scale, high nibble: min of
 * sub-block e / 16), 64 bytes of 2-bit quants, d, dmin. Element
 * e = 128h + 32j + 16s + l (sub-block sb = e / 16 = 8h + 2j + s) takes bits
 * 2j of byte 32h + 16s + l; value (d * scale) * q - dmin * min. */
QB_FN static inline void qb_q2_k(const uint8_t *QB_RESTRICT b, int sb, const float *dd, float *QB_RESTRICT y) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = dd[0], dmin = dd[1];
    int h = sb / 8, j = (sb % 8) / 2, s = sb & 1;
    float dl = QB_MUL(d, (float)(sc[sb] & 15)), ml = QB_MUL(dmin, (float)(sc[sb] >> 4));
    const uint8_t *q = qs + 32 * h + 16 * s;
    for (int l = 0; l < 16; l++) y[l] = QB_SUB(QB_MUL(dl, (float)((q[l] >> (2 * j)) & 3)), ml);
}

/* Q3_K (110 bytes): 32 bytes of high bits (element e: bit e / 32 = 4h + j
 * of byte e % 32, a clear bit subtracts 4), 64 bytes of 2-bit quants laid
 * out as Q2_K, 12 bytes of 6-bit scales, d. Scale sb: low 4 bits from byte
 * sb (sb < 8, low nibble) or sb - 8 (high nibble), high 2 bits from bits
 * 2 * (sb / 4) of byte 8 + sb % 4; stored with a bias of 32. */
QB_FN static inline void qb_q3_k(const uint8_t *QB_RESTRICT b, int sb, const float *dd, float *QB_RESTRICT y) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    float d = dd[0];
    int h = sb / 8, j = (sb % 8) / 2, s = sb & 1;
    int lo = sb < 8 ? sc[sb] & 15 : sc[sb - 8] >> 4, hi = (sc[8 + sb % 4] >> (2 * (sb / 4))) & 3;
    float dl = QB_MUL(d, (float)((lo | hi << 4) - 32));
    const uint8_t *q = qs + 32 * h + 16 * s, *m = hm + 16 * s;
    for (int l = 0; l < 16; l++) {
        int v = ((q[l] >> (2 * j)) & 3) - (((m[l] >> (4 * h + j)) & 1) ? 0 : 4);
        y[l] = QB_MUL(dl, (float)v);
    }
}

/* The 6-bit scale and min of sub-block s (0..7) of Q4_K / Q5_K from their
 * 12 packed bytes: s < 4 in the low 6 bits of bytes s and s + 4; s >= 4 as
 * the nibbles of byte s + 4 plus the top 2 bits of bytes s - 4 and s. */
QB_FN static inline void qb_k_scale_min(const uint8_t *p, int s, int *sc, int *mn) {
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
QB_FN static inline void qb_q4_k(const uint8_t *QB_RESTRICT b, int s, const float *dd, float *QB_RESTRICT y) {
    float d = dd[0], dmin = dd[1];
    int sc, mn;
    qb_k_scale_min(b + 4, s, &sc, &mn);
    float dl = QB_MUL(d, (float)sc), ml = QB_MUL(dmin, (float)mn);
    const uint8_t *q = b + 16 + 32 * (s / 2);
    int shift = (s & 1) * 4;
    for (int l = 0; l < 32; l++) y[l] = QB_SUB(QB_MUL(dl, (float)((q[l] >> shift) & 15)), ml);
}

/* Q5_K (176 bytes): as Q4_K with 32 bytes of fifth bits after the scales:
 * element e's is bit e / 32 of byte e % 32. */
QB_FN static inline void qb_q5_k(const uint8_t *QB_RESTRICT b, int s, const float *dd, float *QB_RESTRICT y) {
    float d = dd[0], dmin = dd[1];
    const uint8_t *qh = b + 16;
    int sc, mn;
    qb_k_scale_min(b + 4, s, &sc, &mn);
    float dl = QB_MUL(d, (float)sc), ml = QB_MUL(dmin, (float)mn);
    const uint8_t *q = b + 48 + 32 * (s / 2);
    int shift = (s & 1) * 4;
    for (int l = 0; l < 32; l++) {
        int v = ((q[l] >> shift) & 15) | ((qh[l] >> s) & 1) << 4;
        y[l] = QB_SUB(QB_MUL(dl, (float)v), ml);
    }
}

/* Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of high 2-bit
 * pairs, 16 signed scales, d. Sub-block sb = 8h + 2k + s (half h = e / 128,
 * quarter k = (e % 128) / 32): low nibble of byte 64h + 32 (k & 1) + 16s + l
 * (high nibble for k >= 2), high bits 2k of byte 32h + 16s + l; value
 * (d * scale[sb]) * (q - 32). */
QB_FN static inline void qb_q6_k(const uint8_t *QB_RESTRICT b, int sb, const float *dd, float *QB_RESTRICT y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = dd[0];
    int h = sb / 8, k = (sb % 8) / 2, s = sb & 1;
    float dl = QB_MUL(d, (float)sc[sb]);
    const uint8_t *lo = ql + 64 * h + 32 * (k & 1) + 16 * s, *hi = qh + 32 * h + 16 * s;
    int ls = k >= 2 ? 4 : 0;
    for (int l = 0; l < 16; l++) y[l] = QB_MUL(dl, (float)((((lo[l] >> ls) & 15) | ((hi[l] >> (2 * k)) & 3) << 4) - 32));
}

/* IQ4_XS (136 bytes): d, a 16-bit word of scale high bits (2 per
 * sub-block), 4 bytes of scale low nibbles, 128 bytes of table indices
 * (sub-block s of 32: bytes 16s..16s+15, low nibbles then high). */
QB_FN static inline void qb_iq4_xs(const uint8_t *QB_RESTRICT b, int s, const float *dd, float *QB_RESTRICT y) {
    float d = dd[0];
    unsigned sh = (unsigned)b[2] | (unsigned)b[3] << 8;
    const uint8_t *sl = b + 4, *qs = b + 8 + 16 * s;
    int ls = ((sl[s / 2] >> (4 * (s % 2))) & 15) | (int)((sh >> (2 * s)) & 3) << 4;
    float dl = QB_MUL(d, (float)(ls - 32));
    for (int j = 0; j < 16; j++) {
        y[j] = QB_MUL(dl, qb_iq4(qs[j] & 15));
        y[j + 16] = QB_MUL(dl, qb_iq4(qs[j] >> 4));
    }
}

/* ---- by type id ---- */

/* elements per block, bytes per block, elements per unit; 0 for a type
 * these decoders do not handle (the plain types F32/F16/BF16 are no block
 * types: kernels/quant.c converts them row by row) */
QB_FN static inline int qb_block(int type) {
    switch (type) {
    case QB_Q4_0: case QB_Q4_1: case QB_Q5_0: case QB_Q5_1: case QB_Q8_0: case QB_IQ4_NL: return 32;
    case QB_Q2_K: case QB_Q3_K: case QB_Q4_K: case QB_Q5_K: case QB_Q6_K: case QB_IQ4_XS: return 256;
    default: return 0;
    }
}
QB_FN static inline int qb_bytes(int type) {
    switch (type) {
    case QB_Q4_0: return 18;
    case QB_Q4_1: return 20;
    case QB_Q5_0: return 22;
    case QB_Q5_1: return 24;
    case QB_Q8_0: return 34;
    case QB_IQ4_NL: return 18;
    case QB_Q2_K: return 84;
    case QB_Q3_K: return 110;
    case QB_Q4_K: return 144;
    case QB_Q5_K: return 176;
    case QB_Q6_K: return 210;
    case QB_IQ4_XS: return 136;
    default: return 0;
    }
}
QB_FN static inline int qb_unit(int type) {
    switch (type) {
    case QB_Q2_K: case QB_Q3_K: case QB_Q6_K: return 16;
    default: return qb_block(type) ? 32 : 0;
    }
}

/* the block's f16 super-scales decoded once for all its units: dd[0] = d,
 * dd[1] = dmin (the K-quants; the 32-element types have one unit and decode
 * their own) */
QB_FN static inline void qb_block_scales(int type, const uint8_t *b, float *dd) {
    dd[0] = dd[1] = 0;
    switch (type) {
    case QB_Q2_K: dd[0] = qb_le_f16(b + 80), dd[1] = qb_le_f16(b + 82); break;
    case QB_Q3_K: dd[0] = qb_le_f16(b + 108); break;
    case QB_Q4_K: case QB_Q5_K: dd[0] = qb_le_f16(b), dd[1] = qb_le_f16(b + 2); break;
    case QB_Q6_K: dd[0] = qb_le_f16(b + 208); break;
    case QB_IQ4_XS: dd[0] = qb_le_f16(b); break;
    default: break;
    }
}

/* unit u of the block at b into y[0..qb_unit(type)), dd from qb_block_scales */
QB_FN static inline void qb_dq_unit_s(int type, const uint8_t *QB_RESTRICT b, int u, const float *dd,
                                      float *QB_RESTRICT y) {
    switch (type) {
    case QB_Q4_0: qb_q4_0(b, y); break;
    case QB_Q4_1: qb_q4_1(b, y); break;
    case QB_Q5_0: qb_q5_0(b, y); break;
    case QB_Q5_1: qb_q5_1(b, y); break;
    case QB_Q8_0: qb_q8_0(b, y); break;
    case QB_IQ4_NL: qb_iq4_nl(b, y); break;
    case QB_Q2_K: qb_q2_k(b, u, dd, y); break;
    case QB_Q3_K: qb_q3_k(b, u, dd, y); break;
    case QB_Q4_K: qb_q4_k(b, u, dd, y); break;
    case QB_Q5_K: qb_q5_k(b, u, dd, y); break;
    case QB_Q6_K: qb_q6_k(b, u, dd, y); break;
    case QB_IQ4_XS: qb_iq4_xs(b, u, dd, y); break;
    default: break;
    }
}

/* unit u of the block at b into y[0..qb_unit(type)) */
QB_FN static inline void qb_dq_unit(int type, const uint8_t *QB_RESTRICT b, int u, float *QB_RESTRICT y) {
    float dd[2];
    qb_block_scales(type, b, dd);
    qb_dq_unit_s(type, b, u, dd, y);
}

/* ---- the tile: rows of a DT_GGML tensor -> a row-major f32/bf16 matrix ---- */

/* One work item (a "thread") decodes one unit of one covering block of one
 * segment of one row and stores the unit's elements that fall inside the
 * segment's columns. Items are numbered row-major: item g is unit
 * g % units of row g / units; a segment's units are numbered from
 * useg[i]. */
typedef struct qb_tile_args {
    const uint8_t *w;          /* the first row's blocks */
    int64_t qpitch;            /* bytes between rows */
    int type, block, bytes, unit, per_block;   /* per_block = block / unit */
    int n_seg;
    int64_t col0[TENSOR_MAX_QSEGS], ncols[TENSOR_MAX_QSEGS], off[TENSOR_MAX_QSEGS], skip[TENSOR_MAX_QSEGS];
    int64_t useg[TENSOR_MAX_QSEGS + 1];   /* first unit of each segment; useg[n_seg] = units */
    int64_t units;             /* units per row */
    int64_t rows;
    void *out;                 /* row r, column c at element r * ld + c */
    int64_t ld;
    int out_bf16;              /* 1: bf16 (round to nearest even), 0: f32 */
} qb_tile_args;

/* Fill a for `rows` rows of qpitch bytes of `type` blocks starting at w,
 * each local row made of the n segments seg (kernels/tensor.h), decoded to
 * out (f32, or bf16 when out_bf16; row pitch ld elements). Returns -1 for a
 * type without block decoders, no or too many segments, or a segment whose
 * covering blocks leave its row. Host code (pointer arithmetic only: w and
 * out may be device memory). */
static inline int qb_tile_init(qb_tile_args *a, int type, const void *w, int64_t qpitch, const tensor_qseg *seg,
                               int n, int64_t rows, void *out, int64_t ld, int out_bf16) {
    memset(a, 0, sizeof *a);
    a->type = type;
    a->block = qb_block(type);
    a->bytes = qb_bytes(type);
    a->unit = qb_unit(type);
    if (!a->block || n < 1 || n > TENSOR_MAX_QSEGS || rows < 0) return -1;
    a->per_block = a->block / a->unit;
    a->w = (const uint8_t *)w;
    a->qpitch = qpitch;
    a->n_seg = n;
    a->rows = rows;
    a->out = out;
    a->ld = ld;
    a->out_bf16 = out_bf16;
    int64_t u = 0;
    for (int i = 0; i < n; i++) {
        int64_t nb = (seg[i].skip + seg[i].ncols + a->block - 1) / a->block;   /* covering blocks */
        if (seg[i].skip < 0 || seg[i].skip >= a->block || seg[i].ncols < 0 || seg[i].off < 0 ||
            seg[i].off + nb * a->bytes > qpitch)
            return -1;
        a->col0[i] = seg[i].col0;
        a->ncols[i] = seg[i].ncols;
        a->off[i] = seg[i].off;
        a->skip[i] = seg[i].skip;
        a->useg[i] = u;
        u += nb * a->per_block;
    }
    a->useg[n] = u;
    a->units = u;
    return 0;
}

/* total work items of a tile */
static inline int64_t qb_tile_items(const qb_tile_args *a) { return a->rows * a->units; }

/* 16-byte stores of 4 f32 / 8 bf16 values at a 16-byte aligned p (the
 * device's vector stores; memcpy on the little-endian host) */
QB_FN static inline void qb_store4_f32(float *p, const float *v) {
#ifdef __CUDA_ARCH__
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
#else
    memcpy(p, v, 16);
#endif
}
QB_FN static inline void qb_store8_bf16(uint16_t *p, const float *v) {
    uint32_t w[4];
    for (int i = 0; i < 4; i++) w[i] = (uint32_t)qb_bf16(v[2 * i]) | (uint32_t)qb_bf16(v[2 * i + 1]) << 16;
#ifdef __CUDA_ARCH__
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
#else
    memcpy(p, w, 16);
#endif
}

/* The kernel body: item blk * nthr + thr (a CUDA block index, its size and
 * a thread index). A unit wholly inside its segment whose destination is
 * 16-byte aligned is stored 16 bytes at a time, else element by element. */
QB_FN static inline void qb_tile_body(const qb_tile_args *a, int64_t blk, int nthr, int thr) {
    int64_t g = blk * nthr + thr;
    if (g >= a->rows * a->units) return;
    int64_t r = g / a->units, u = g - r * a->units;
    int i = 0;
    while (i + 1 < a->n_seg && u >= a->useg[i + 1]) i++;
    int64_t us = u - a->useg[i], bi = us / a->per_block;
    int ub = (int)(us - bi * a->per_block);
    const uint8_t *b = a->w + r * a->qpitch + a->off[i] + bi * a->bytes;
    float v[QB_MAX_UNIT];
    qb_dq_unit(a->type, b, ub, v);
    /* element k of the unit is element e of the segment's covering blocks, column e - skip of the segment */
    int64_t e0 = bi * a->block + (int64_t)ub * a->unit - a->skip[i], n = a->ncols[i];
    int64_t o = r * a->ld + a->col0[i] + e0;
    if (e0 >= 0 && e0 + a->unit <= n) {
        if (!a->out_bf16 && ((uintptr_t)((float *)a->out + o) & 15) == 0) {
            for (int k = 0; k < a->unit; k += 4) qb_store4_f32((float *)a->out + o + k, v + k);
            return;
        }
        if (a->out_bf16 && ((uintptr_t)((uint16_t *)a->out + o) & 15) == 0) {
            for (int k = 0; k < a->unit; k += 8) qb_store8_bf16((uint16_t *)a->out + o + k, v + k);
            return;
        }
    }
    for (int k = 0; k < a->unit; k++) {
        if (e0 + k < 0 || e0 + k >= n) continue;
        if (a->out_bf16) ((uint16_t *)a->out)[o + k] = qb_bf16(v[k]);
        else ((float *)a->out)[o + k] = v[k];
    }
}

#endif
