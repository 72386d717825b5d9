/* Row access helpers shared by the CPU ops (private to kernels/cpu).
 * Ops compute in fp32: a row of an f32 tensor is used in place, a row of a
 * bf16 tensor is widened into a scratch buffer; results are narrowed back
 * with round-to-nearest-even. */
#ifndef TPGEN_CPU_ROWS_H
#define TPGEN_CPU_ROWS_H
#include "../../core/tensor.h"
#include "../../core/err.h"
#include <stdint.h>

static inline void *row_ptr(const tensor *t, int64_t r) {
    return (char *)t->data + (size_t)r * (size_t)t->ld * dtype_size(t->dtype);
}

/* Elements [c0, c0+n) of row r as f32: a pointer into t (f32) or into buf. */
static inline const float *row_f32(const tensor *t, int64_t r, int64_t c0, int64_t n, float *buf) {
    const void *p = row_ptr(t, r);
    switch (t->dtype) {
    case DT_F32: return (const float *)p + c0;
    case DT_BF16: {
        const uint16_t *s = (const uint16_t *)p + c0;
        for (int64_t i = 0; i < n; i++) buf[i] = bf16_to_f32(s[i]);
        return buf;
    }
    case DT_F16: {
        const uint16_t *s = (const uint16_t *)p + c0;
        for (int64_t i = 0; i < n; i++) buf[i] = f16_to_f32(s[i]);
        return buf;
    }
    default: tp_fatal("cpu op: dtype %s is not a float activation/weight type", dtype_name(t->dtype));
    }
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
    case DT_BF16: {
        uint16_t *d = (uint16_t *)p + c0;
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
        break;
    }
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

/* Fatal shape checks (bad shapes are programming errors, see ops.h). */
#define CPU_REQUIRE(cond, ...) do { if (!(cond)) tp_fatal(__VA_ARGS__); } while (0)

/* Minimum element count before an op spreads over OpenMP threads. */
#define CPU_PAR_MIN 16384

#endif
