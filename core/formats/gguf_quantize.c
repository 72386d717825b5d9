/* f32 -> GGUF blocks, replicating gguf-py 0.19.0 gguf/quants.py step by step
 * in f32 (numpy float32 arrays with Python-int operands stay float32 under
 * NumPy 2's promotion rules, so every step is one f32 rounding). Nothing is
 * fused: this file is compiled in ISO C mode (-std=c17), where GCC does not
 * contract a * b + c; the pragma asks the same of other compilers. Blocks are
 * quantised on OpenMP threads (each block's bytes depend on it alone). */
#include "gguf_quantize.h"
#include "kernels/quant.h"
#include "kernels/err.h"
#include "kernels/tensor.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static const int k_types[] = {QUANT_F32, QUANT_F16, QUANT_BF16, QUANT_Q8_0, QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1,
                              QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_IQ4_NL, QUANT_IQ4_XS};

int gguf_quantize_supported(int type) {
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (k_types[i] == type) return 1;
    return 0;
}

const char *gguf_quantize_supported_list(void) {
    return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";
}

int gguf_quantize_type_id(const char *name) {
    for (int id = 0; id < 64; id++)
        if (quant_type_get(id) && !strcasecmp(quant_type_name(id), name)) return id;
    return -1;
}

int gguf_quantize_pick(int type, int ndim, const int64_t *ne) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= ne[i];
    if (ndim <= 1 || n <= 1024) return QUANT_F32;
    const quant_type *qt = quant_type_get(type);
    if (ne[0] % qt->block) return QUANT_F16;
    return type;
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

/* numpy's float32 -> float16 (round to nearest even; f32_to_f16 is that for
 * every non-NaN value) */
static uint16_t h16(float f) { return f32_to_f16(f); }

/* gguf-py BF16.quantize_blocks: NaN made quiet, then round to nearest even */
static uint16_t bf16(float f) {
    uint32_t n;
    memcpy(&n, &f, 4);
    if ((n & 0x7fffffffu) > 0x7f800000u) n = (n & 0xffff0000u) | (64u << 16);
    return (uint16_t)(((uint64_t)n + (0x7fffu + ((n >> 16) & 1u))) >> 16);
}

/* np_roundf: round half away from zero, as floor(a) + floor(2 (a - floor(a))) */
static float roundf_np(float v) {
    float a = fabsf(v), fl = floorf(a), t = a - fl;
    t = 2.0f * t;
    float b = fl + floorf(t);
    return v > 0 ? b : v < 0 ? -b : 0.0f;
}

static void q8_0(const float *x, uint8_t *o) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f, id = d == 0 ? 0.0f : 1.0f / d;
    put16(o, h16(d));
    for (int j = 0; j < 32; j++) {
        float v = x[j] * id;
        o[2 + j] = (uint8_t)(int8_t)roundf_np(v);
    }
}

/* the signed value of largest magnitude (numpy argmax: the first) */
static float absmax_signed(const float *x) {
    float m = x[0], am = fabsf(x[0]);
    for (int j = 1; j < 32; j++)
        if (fabsf(x[j]) > am) am = fabsf(x[j]), m = x[j];
    return m;
}

static void minmax(const float *x, float *mn, float *mx) {
    *mn = *mx = x[0];
    for (int j = 1; j < 32; j++) {
        if (x[j] < *mn) *mn = x[j];
        if (x[j] > *mx) *mx = x[j];
    }
}

/* trunc(v) as uint8, clipped to hi (v >= 0 here: the offsets keep it so) */
static unsigned tq(float v, unsigned hi) {
    float t = truncf(v);
    unsigned q = t <= 0 ? 0u : t >= 255 ? 255u : (unsigned)t;
    return q > hi ? hi : q;
}

static void pack4(const unsigned *q, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] << 4) & 0xff));
}

static void packh(const unsigned *q, uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < 32; j++) h |= ((q[j] >> 4) ? 1u : 0u) << j;
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

static void q4_0(const float *x, uint8_t *o) {
    float d = absmax_signed(x) / -8.0f, id = d == 0 ? 0.0f : 1.0f / d;
    unsigned q[32];
    for (int j = 0; j < 32; j++) {
        float v = x[j] * id;
        v = v + 8.5f;
        q[j] = tq(v, 15);
    }
    put16(o, h16(d));
    pack4(q, o + 2);
}

static void q4_1(const float *x, uint8_t *o) {
    float mn, mx;
    minmax(x, &mn, &mx);
    float r = mx - mn, d = r / 15.0f, id = d == 0 ? 0.0f : 1.0f / d;
    unsigned q[32];
    for (int j = 0; j < 32; j++) {
        float v = x[j] - mn;
        v = v * id;
        v = v + 0.5f;
        q[j] = tq(v, 15);
    }
    put16(o, h16(d)), put16(o + 2, h16(mn));
    pack4(q, o + 4);
}

static void q5_0(const float *x, uint8_t *o) {
    float d = absmax_signed(x) / -16.0f, id = d == 0 ? 0.0f : 1.0f / d;
    unsigned q[32];
    for (int j = 0; j < 32; j++) {
        float v = x[j] * id;
        v = v + 16.5f;
        q[j] = tq(v, 31);
    }
    put16(o, h16(d));
    packh(q, o + 2);
    pack4(q, o + 6);
}

static void q5_1(const float *x, uint8_t *o) {
    float mn, mx;
    minmax(x, &mn, &mx);
    float r = mx - mn, d = r / 31.0f, id = d == 0 ? 0.0f : 1.0f / d;
    unsigned q[32];
    for (int j = 0; j < 32; j++) {
        float v = x[j] - mn;
        v = v * id;
        v = v + 0.5f;
        q[j] = tq(v, 31);
    }
    put16(o, h16(d)), put16(o + 2, h16(mn));
    packh(q, o + 4);
    pack4(q, o + 8);
}

/* ---- K-quants: ggml's imatrix-less reference quantisers (quantize_row_q2_K_ref,
 * _q3_K_ref, _q4_K_ref, _q5_K_ref, _q6_K_ref in ggml-quants.c), re-implemented in f32 with the same
 * operation order (left to right, no contraction) so the bytes are ggml's. */

/* ggml's nearest_int: f + 1.5 * 2^23 in f32 leaves round-to-nearest-even of f
 * in the low mantissa bits (exact for |f| < 2^22; no UB for any input). */
static int nint(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* make_qkx2_quants: a scale and a min (returned as -min >= 0 in *mn) for n
 * values at levels 0..nmax, searched over nstep + 1 scales around the
 * min/max one by weighted least squares; the error kept is the weighted
 * squared (mad 0) or absolute (mad 1) difference. */
static float qkx2(int n, int nmax, const float *x, const float *w, uint8_t *L, float *mn, float rmin, float rdelta,
                  int nstep, int mad) {
    float lo = x[0], hi = x[0], sw = w[0], sx = sw * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *mn = -lo;
        return 0.0f;
    }
    float is = (float)nmax / (hi - lo), scale = 1.0f / is, best = 0;
    for (int i = 0; i < n; i++) {
        int l = nint(is * (x[i] - lo));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float d = scale * L[i] + lo - x[i];
        best += w[i] * (mad ? fabsf(d) : d * d);
    }
    uint8_t La[32];
    for (int s = 0; s <= nstep; s++) {
        is = (rmin + rdelta * (float)s + (float)nmax) / (hi - lo);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            int l = nint(is * (x[i] - lo));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            La[i] = (uint8_t)l;
            sl += w[i] * (float)l;
            sl2 += w[i] * (float)l * (float)l;
            sxl += w[i] * (float)l * x[i];
        }
        float D = sw * sl2 - sl * sl;
        if (D > 0) {
            float ts = (sw * sxl - sx * sl) / D, tm = (sl2 * sx - sl * sxl) / D;
            if (tm > 0) tm = 0, ts = sxl / sl2;
            float err = 0;
            for (int i = 0; i < n; i++) {
                float d = ts * La[i] + tm - x[i];
                err += w[i] * (mad ? fabsf(d) : d * d);
            }
            if (err < best) memcpy(L, La, (size_t)n), best = err, scale = ts, lo = tm;
        }
    }
    *mn = -lo;
    return scale;
}

/* Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes
 * (the inverse of ggml's get_scale_min_k4), the sub-block levels in L. */
static void k_scales(const float *x, int nmax, float rmin, int nstep, uint8_t *o, uint8_t *L) {
    float sc[8], mn[8], w[32], ms = 0, mm = 0;
    for (int j = 0; j < 8; j++) {
        const float *xj = x + 32 * j;
        float s2 = 0;
        for (int l = 0; l < 32; l++) s2 += xj[l] * xj[l];
        float av = sqrtf(s2 / 32.0f);
        for (int l = 0; l < 32; l++) w[l] = av + fabsf(xj[l]);
        sc[j] = qkx2(32, nmax, xj, w, L + 32 * j, &mn[j], rmin, 0.1f, nstep, 0);
        if (sc[j] > ms) ms = sc[j];
        if (mn[j] > mm) mm = mn[j];
    }
    float iS = ms > 0 ? 63.0f / ms : 0.0f, iM = mm > 0 ? 63.0f / mm : 0.0f;
    uint8_t *s = o + 4, ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)nint(iS * sc[j]), lm[j] = (uint8_t)nint(iM * mn[j]);
        if (ls[j] > 63) ls[j] = 63;
        if (lm[j] > 63) lm[j] = 63;
    }
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((ls[j + 4] & 15) | (lm[j + 4] & 15) << 4);
    }
    uint16_t hd = f32_to_f16(ms / 63.0f), hm = f32_to_f16(mm / 63.0f);
    put16(o, hd), put16(o + 2, hm);
    float d0 = f16_to_f32(hd), m0 = f16_to_f32(hm);
    for (int j = 0; j < 8; j++) {
        float d = d0 * (float)ls[j];
        if (d == 0) continue;
        float dm = m0 * (float)lm[j];
        for (int i = 0; i < 32; i++) {
            int l = nint((x[32 * j + i] + dm) / d);
            L[32 * j + i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        }
    }
}

/* block_q4_K: d, dmin (f16), scales[12], qs[128] */
static void q4_k(const float *x, uint8_t *o) {
    uint8_t L[256];
    k_scales(x, 15, -1.0f, 20, o, L);
    uint8_t *q = o + 16;
    for (int j = 0; j < 256; j += 64, q += 32)
        for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
}

/* block_q5_K: d, dmin, scales[12], qh[32], qs[128] */
static void q5_k(const float *x, uint8_t *o) {
    uint8_t L[256];
    k_scales(x, 31, -0.5f, 15, o, L);
    uint8_t *qh = o + 16, *q = o + 48;
    memset(qh, 0, 32);
    for (int j = 0, b = 0; j < 256; j += 64, b += 2, q += 32)
        for (int l = 0; l < 32; l++) {
            unsigned a = L[j + l], c = L[j + l + 32];
            if (a > 15) a -= 16, qh[l] |= (uint8_t)(1u << b);
            if (c > 15) c -= 16, qh[l] |= (uint8_t)(2u << b);
            q[l] = (uint8_t)(a | c << 4);
        }
}

/* make_qx_quants, rmse_type 1 (weights x^2), no imatrix: levels -nmax..nmax-1
 * stored + nmax in L, the scale searched over 19 candidates. */
static float qx1(int n, int nmax, const float *x, uint8_t *L) {
    float mx = 0, am = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > am) am = fabsf(x[i]), mx = x[i];
    if (am < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float is = (float)-nmax / mx, slx = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nint(is * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (uint8_t)(l + nmax);
        float w = x[i] * x[i];
        slx += w * x[i] * (float)l;
        sl2 += w * (float)l * (float)l;
    }
    float scale = sl2 != 0 ? slx / sl2 : 0.0f, best = scale * slx;
    for (int s = -9; s <= 9; s++) {
        if (!s) continue;
        is = -((float)nmax + 0.1f * (float)s) / mx;
        slx = sl2 = 0;
        for (int i = 0; i < n; i++) {
            int l = nint(is * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            float w = x[i] * x[i];
            slx += w * x[i] * (float)l;
            sl2 += w * (float)l * (float)l;
        }
        if (sl2 > 0 && slx * slx > best * sl2) {
            for (int i = 0; i < n; i++) {
                int l = nint(is * x[i]);
                L[i] = (uint8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
            }
            scale = slx / sl2, best = scale * slx;
        }
    }
    return scale;
}

/* block_q6_K: ql[128], qh[64], scales[16] (int8), d (f16) */
static void q6_k(const float *x, uint8_t *o) {
    uint8_t L[256];
    float sc[16], ms = 0, mas = 0;
    for (int b = 0; b < 16; b++) {
        sc[b] = qx1(16, 32, x + 16 * b, L + 16 * b);
        if (fabsf(sc[b]) > mas) mas = fabsf(sc[b]), ms = sc[b];
    }
    memset(o, 0, 210);
    if (mas < 1e-15f) return;
    float is = -128.0f / ms;
    uint16_t hd = f32_to_f16(1.0f / is);
    put16(o + 208, hd);
    int8_t *s = (int8_t *)(o + 192);
    for (int b = 0; b < 16; b++) {
        int v = nint(is * sc[b]);
        s[b] = (int8_t)(v > 127 ? 127 : v);
    }
    float d0 = f16_to_f32(hd);
    for (int b = 0; b < 16; b++) {
        float d = d0 * (float)s[b];
        if (d == 0) continue;
        for (int i = 0; i < 16; i++) {
            int l = nint(x[16 * b + i] / d);
            L[16 * b + i] = (uint8_t)((l < -32 ? -32 : l > 31 ? 31 : l) + 32);
        }
    }
    uint8_t *ql = o, *qh = o + 128;
    for (int j = 0; j < 256; j += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            const uint8_t *p = L + j + l;
            ql[l] = (uint8_t)((p[0] & 15) | (p[64] & 15) << 4);
            ql[l + 32] = (uint8_t)((p[32] & 15) | (p[96] & 15) << 4);
            qh[l] = (uint8_t)(p[0] >> 4 | (p[32] >> 4) << 2 | (p[64] >> 4) << 4 | (p[96] >> 4) << 6);
        }
}

/* pack 2-bit levels: byte l of each 32-byte quarter of a 128-value half holds
 * values l, l + 32, l + 64, l + 96 of that half (Q2_K and Q3_K qs) */
static void pack2(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < 256; j += 128, qs += 32)
        for (int l = 0; l < 32; l++)
            qs[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 | L[j + l + 96] << 6);
}

/* block_q2_K (quantize_row_q2_K_ref): scales[16] (low nibble the 4-bit scale,
 * high the 4-bit min of each 16-value sub-block), qs[64], d, dmin (f16). Each
 * sub-block by make_qkx2_quants at levels 0..3, weights |x|, 16 steps from
 * rmin -0.5 by 0.1, absolute error. */
static void q2_k(const float *x, uint8_t *o) {
    uint8_t L[256];
    float sc[16], mn[16], w[16], ms = 0, mm = 0;
    for (int j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
        sc[j] = qkx2(16, 3, x + 16 * j, w, L + 16 * j, &mn[j], -0.5f, 0.1f, 15, 1);
        if (sc[j] > ms) ms = sc[j];
        if (mn[j] > mm) mm = mn[j];
    }
    uint8_t *s = o;
    uint16_t hd = 0, hm = 0;
    memset(s, 0, 16);
    if (ms > 0) {
        float is = 15.0f / ms;
        for (int j = 0; j < 16; j++) s[j] = (uint8_t)nint(is * sc[j]);
        hd = f32_to_f16(ms / 15.0f);
    }
    if (mm > 0) {
        float is = 15.0f / mm;
        for (int j = 0; j < 16; j++) s[j] = (uint8_t)(s[j] | (unsigned)nint(is * mn[j]) << 4);
        hm = f32_to_f16(mm / 15.0f);
    }
    put16(o + 80, hd), put16(o + 82, hm);
    float d0 = f16_to_f32(hd), m0 = f16_to_f32(hm);
    for (int j = 0; j < 16; j++) {
        float d = d0 * (float)(s[j] & 15);
        if (d == 0) continue;
        float dm = m0 * (float)(s[j] >> 4);
        for (int i = 0; i < 16; i++) {
            int l = nint((x[16 * j + i] + dm) / d);
            L[16 * j + i] = (uint8_t)(l < 0 ? 0 : l > 3 ? 3 : l);
        }
    }
    pack2(L, o + 16);
}

/* make_q3_quants with do_rmse (weights x^2): levels -nmax..nmax-1 from the
 * max-magnitude scale, then up to 5 passes moving single levels to the value
 * that keeps (sum w x l)^2 / sum w l^2 growing; L gets level + nmax (0 where
 * the sub-block is all zero). */
static float q3(int n, int nmax, const float *x, int8_t *L) {
    float mx = 0, am = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > am) am = fabsf(x[i]), mx = x[i];
    if (am < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float is = (float)-nmax / mx, slx = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nint(is * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        slx += w * x[i] * (float)l;
        sl2 += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i], a = slx - w * x[i] * (float)L[i];
            if (!(a > 0)) continue;
            float b = sl2 - w * (float)L[i] * (float)L[i];
            int l = nint(x[i] * b / a);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            if (l == L[i]) continue;
            a += w * x[i] * (float)l;
            b += w * (float)l * (float)l;
            if (b > 0 && a * a * sl2 > slx * slx * b) L[i] = (int8_t)l, slx = a, sl2 = b, changed++;
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return sl2 > 0 ? slx / sl2 : 0.0f;
}

/* block_q3_K (quantize_row_q3_K_ref): hmask[32], qs[64], scales[12] (16
 * 6-bit scales + 32: low nibbles in bytes 0..7, the 2-bit tops in 8..11),
 * d (f16). Levels 0..7 (-4..3): the low 2 bits in qs, bit 2 in hmask. */
static void q3_k(const float *x, uint8_t *o) {
    int8_t L[256];
    float sc[16], ms = 0, am = 0;
    for (int j = 0; j < 16; j++) {
        sc[j] = q3(16, 4, x + 16 * j, L + 16 * j);
        if (fabsf(sc[j]) > am) am = fabsf(sc[j]), ms = sc[j];
    }
    uint8_t *hmask = o, *qs = o + 32, *s = o + 96;
    memset(s, 0, 12);
    uint16_t hd = 0;
    if (ms != 0) {
        float is = -32.0f / ms;
        for (int j = 0; j < 16; j++) {
            int v = (int8_t)nint(is * sc[j]);
            v = (v < -32 ? -32 : v > 31 ? 31 : v) + 32;
            if (j < 8) s[j] = (uint8_t)(v & 15);
            else s[j - 8] = (uint8_t)(s[j - 8] | (v & 15) << 4);
            s[8 + j % 4] = (uint8_t)(s[8 + j % 4] | (v >> 4) << (2 * (j / 4)));
        }
        hd = f32_to_f16(1.0f / is);
    }
    put16(o + 108, hd);
    float d0 = f16_to_f32(hd);
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4, v = (lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
        float d = d0 * (float)v;
        if (d == 0) continue;
        for (int i = 0; i < 16; i++) {
            int l = nint(x[16 * j + i] / d);
            L[16 * j + i] = (int8_t)((l < -4 ? -4 : l > 3 ? 3 : l) + 4);
        }
    }
    uint8_t U[256];
    memset(hmask, 0, 32);
    for (int j = 0; j < 256; j++) {
        U[j] = (uint8_t)L[j];
        if (U[j] > 3) hmask[j % 32] = (uint8_t)(hmask[j % 32] | 1u << (j / 32)), U[j] = (uint8_t)(U[j] - 4);
    }
    pack2(U, qs);
}

/* ---- IQ4_NL / IQ4_XS: ggml's quantize_row_iq4_nl_impl without an imatrix
 * (weights x^2) and with ntry 7, as ggml_quantize_chunk calls it (quantize_iq4_nl,
 * quantize_iq4_xs) for both types: 4-bit indices into the non-linear table
 * kvalues_iq4nl. */
static const int8_t k_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* the index of the table value nearest v (ggml's best_index_int8: a tie
 * goes to the upper one) */
static int iq4_index(float v) {
    if (v <= k_iq4nl[0]) return 0;
    if (v >= k_iq4nl[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int m = (lo + hi) / 2;
        if (v < k_iq4nl[m]) hi = m;
        else lo = m;
    }
    return v - k_iq4nl[hi - 1] < k_iq4nl[hi] - v ? hi - 1 : hi;
}

/* the scale of one 32-value sub-block: least squares for the indices of
 * 15 trial scales (itry - 127) / max around the max-magnitude one */
static float iq4_scale(const float *x) {
    float am = 0, mx = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > am) am = fabsf(x[j]), mx = x[j];
    if (am < 1e-15f) return 0.0f;
    float d = -mx / (float)k_iq4nl[0], id = 1.0f / d, sqx = 0, sq2 = 0;
    for (int j = 0; j < 32; j++) {
        float q = k_iq4nl[iq4_index(id * x[j])], w = x[j] * x[j];
        sqx += w * q * x[j];
        sq2 += w * q * q;
    }
    d = sq2 > 0 ? sqx / sq2 : 0.0f;
    float best = d * sqx;
    for (int t = -7; t <= 7; t++) {
        id = (float)(t + k_iq4nl[0]) / mx;
        sqx = sq2 = 0;
        for (int j = 0; j < 32; j++) {
            float q = k_iq4nl[iq4_index(id * x[j])], w = x[j] * x[j];
            sqx += w * q * x[j];
            sq2 += w * q * q;
        }
        if (sq2 > 0 && sqx * sqx > best * sq2) d = sqx / sq2, best = d * sqx;
    }
    return d;
}

/* 32 indices as 16 bytes: value j in the low nibble of byte j, value j + 16 in the high */
static void iq4_pack(const uint8_t *L, uint8_t *q) {
    for (int j = 0; j < 16; j++) q[j] = (uint8_t)(L[j] | L[j + 16] << 4);
}

/* block_iq4_nl: d (f16), qs[16]; the indices for the f32 scale */
static void iq4_nl(const float *x, uint8_t *o) {
    float d = iq4_scale(x), id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t L[32];
    for (int j = 0; j < 32; j++) L[j] = (uint8_t)iq4_index(id * x[j]);
    put16(o, f32_to_f16(d));
    iq4_pack(L, o + 2);
}

/* block_iq4_xs: d (f16), scales_h (u16: 2 top bits per sub-block), scales_l[4]
 * (4 low bits), qs[128]; the 6-bit sub-block scales (+32) of d = -max/32, the
 * indices for the f32 d * scale */
static void iq4_xs(const float *x, uint8_t *o) {
    float sc[8], ms = 0, am = 0;
    for (int b = 0; b < 8; b++) {
        sc[b] = iq4_scale(x + 32 * b);
        if (fabsf(sc[b]) > am) am = fabsf(sc[b]), ms = sc[b];
    }
    float d = -ms / 32.0f, id = d != 0 ? 1.0f / d : 0.0f;
    unsigned sh = 0;
    uint8_t *sl = o + 4, L[32];
    memset(sl, 0, 4);
    for (int b = 0; b < 8; b++) {
        int l = nint(id * sc[b]);
        l = l < -32 ? -32 : l > 31 ? 31 : l;
        float dl = d * (float)l, idl = dl != 0 ? 1.0f / dl : 0.0f;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)iq4_index(idl * x[32 * b + j]);
        iq4_pack(L, o + 8 + 16 * b);
        l += 32;
        sl[b / 2] = (uint8_t)(sl[b / 2] | (l & 15) << 4 * (b % 2));
        sh |= (unsigned)(l >> 4) << 2 * b;
    }
    put16(o, f32_to_f16(d)), put16(o + 2, (uint16_t)sh);
}

typedef void (*block_fn)(const float *x, uint8_t *o);
static const struct {
    int type, block, bytes;
    block_fn fn;
} k_block[] = {
    {QUANT_Q8_0, 32, 34, q8_0},     {QUANT_Q4_0, 32, 18, q4_0},     {QUANT_Q4_1, 32, 20, q4_1},
    {QUANT_Q5_0, 32, 22, q5_0},     {QUANT_Q5_1, 32, 24, q5_1},     {QUANT_Q2_K, 256, 84, q2_k},
    {QUANT_Q3_K, 256, 110, q3_k},   {QUANT_Q4_K, 256, 144, q4_k},   {QUANT_Q5_K, 256, 176, q5_k},
    {QUANT_Q6_K, 256, 210, q6_k},   {QUANT_IQ4_NL, 32, 18, iq4_nl}, {QUANT_IQ4_XS, 256, 136, iq4_xs},
};

void gguf_quantize_row(int type, const float *x, int64_t n, void *out) {
    uint8_t *o = out;
    switch (type) {
    case QUANT_F32: memcpy(o, x, (size_t)n * 4); return;
    case QUANT_F16: for (int64_t i = 0; i < n; i++) put16(o + 2 * i, h16(x[i])); return;
    case QUANT_BF16: for (int64_t i = 0; i < n; i++) put16(o + 2 * i, bf16(x[i])); return;
    }
    for (size_t k = 0; k < sizeof k_block / sizeof k_block[0]; k++) {
        if (k_block[k].type != type) continue;
        /* blocks are independent: the bytes do not depend on the thread count */
        const int64_t bs = k_block[k].block, nb = n / bs, by = k_block[k].bytes;
        const block_fn fn = k_block[k].fn;
#pragma omp parallel for schedule(static) if (nb >= 64)
        for (int64_t b = 0; b < nb; b++) fn(x + bs * b, o + by * b);
        return;
    }
    tp_fatal("gguf_quantize_row: type %d not supported", type);
}
