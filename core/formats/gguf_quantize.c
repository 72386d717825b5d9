/* f32 -> GGUF blocks, replicating gguf-py 0.19.0 gguf/quants.py step by step
 * in f32 (numpy float32 arrays with Python-int operands stay float32 under
 * NumPy 2's promotion rules, so every step is one f32 rounding). Nothing is
 * fused: this file is compiled in ISO C mode (-std=c17), where GCC does not
 * contract a * b + c; the pragma asks the same of other compilers. */
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

static const int k_types[] = {QUANT_F32, QUANT_F16, QUANT_BF16, QUANT_Q8_0, QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1};

int gguf_quantize_supported(int type) {
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (k_types[i] == type) return 1;
    return 0;
}

const char *gguf_quantize_supported_list(void) { return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1"; }

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

void gguf_quantize_row(int type, const float *x, int64_t n, void *out) {
    uint8_t *o = out;
    switch (type) {
    case QUANT_F32: memcpy(o, x, (size_t)n * 4); return;
    case QUANT_F16: for (int64_t i = 0; i < n; i++) put16(o + 2 * i, h16(x[i])); return;
    case QUANT_BF16: for (int64_t i = 0; i < n; i++) put16(o + 2 * i, bf16(x[i])); return;
    case QUANT_Q8_0: for (int64_t b = 0; b < n / 32; b++) q8_0(x + 32 * b, o + 34 * b); return;
    case QUANT_Q4_0: for (int64_t b = 0; b < n / 32; b++) q4_0(x + 32 * b, o + 18 * b); return;
    case QUANT_Q4_1: for (int64_t b = 0; b < n / 32; b++) q4_1(x + 32 * b, o + 20 * b); return;
    case QUANT_Q5_0: for (int64_t b = 0; b < n / 32; b++) q5_0(x + 32 * b, o + 22 * b); return;
    case QUANT_Q5_1: for (int64_t b = 0; b < n / 32; b++) q5_1(x + 32 * b, o + 24 * b); return;
    default: tp_fatal("gguf_quantize_row: type %d not supported", type);
    }
}
