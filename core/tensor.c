#include "tensor.h"
#include "err.h"
#include "../kernels/ops.h"
#include <math.h>
#include <stdlib.h>

static const struct { const char *name; size_t size; } k_dtypes[DT_COUNT] = {
    [DT_F32] = {"F32", 4}, [DT_BF16] = {"BF16", 2}, [DT_F16] = {"F16", 2},
    [DT_F64] = {"F64", 8}, [DT_I64] = {"I64", 8},   [DT_I32] = {"I32", 4},
    [DT_I16] = {"I16", 2}, [DT_I8] = {"I8", 1},     [DT_U8] = {"U8", 1},
    [DT_BOOL] = {"BOOL", 1},
};

size_t dtype_size(dtype_t dt) { return (unsigned)dt < DT_COUNT ? k_dtypes[dt].size : 0; }
const char *dtype_name(dtype_t dt) { return (unsigned)dt < DT_COUNT ? k_dtypes[dt].name : "?"; }
int dtype_from_name(const char *s, dtype_t *out) {
    for (int i = 0; i < DT_COUNT; i++)
        if (strcmp(s, k_dtypes[i].name) == 0) { *out = (dtype_t)i; return 0; }
    return -1;
}

float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) u = s;
        else { /* subnormal */
            float f = ldexpf((float)m, -24);
            return s ? -f : f;
        }
    } else if (e == 31) u = s | 0x7f800000u | (m << 13);
    else u = s | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000, a = u & 0x7fffffff;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00);
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00); /* overflow -> inf */
    if (a < 0x38800000u) {                               /* subnormal or zero */
        float v;
        memcpy(&v, &a, 4);
        return (uint16_t)(s | (uint32_t)lrintf(v * 16777216.0f));
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;
    return (uint16_t)(s | (r >> 13));
}

int convert_to_f32(float *dst, const void *src, dtype_t dt, size_t n) {
    switch (dt) {
    case DT_F32: memmove(dst, src, n * 4); return 0;
    case DT_BF16: { const uint16_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]); return 0; }
    case DT_F16: { const uint16_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]); return 0; }
    case DT_F64: { const double *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    default: return tp_error("cannot convert dtype %s to F32", dtype_name(dt));
    }
}

void convert_from_f32(void *dst, dtype_t dt, const float *src, size_t n) {
    switch (dt) {
    case DT_F32: memmove(dst, src, n * 4); break;
    case DT_BF16: { uint16_t *d = dst; for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]); break; }
    case DT_F16: { uint16_t *d = dst; for (size_t i = 0; i < n; i++) d[i] = f32_to_f16(src[i]); break; }
    case DT_F64: { double *d = dst; for (size_t i = 0; i < n; i++) d[i] = src[i]; break; }
    default: tp_fatal("convert_from_f32: dtype %s", dtype_name(dt));
    }
}

tensor *tensor_new(struct backend *be, dtype_t dt, int64_t rows, int64_t cols) {
    tensor *t = xcalloc(1, sizeof *t);
    t->dtype = dt;
    t->rows = rows;
    t->cols = cols;
    t->ld = cols;
    t->be = be;
    t->owner = 1;
    size_t n = (size_t)rows * (size_t)cols * dtype_size(dt);
    t->data = be_alloc(be, n);
    if (!t->data && n) {
        free(t);
        return NULL;
    }
    return t;
}

void tensor_free(tensor *t) {
    if (!t) return;
    if (t->owner && t->data) be_free(t->be, t->data);
    free(t);
}

tensor tensor_rows(const tensor *t, int64_t r0, int64_t n) {
    if (r0 < 0 || n < 0 || r0 + n > t->rows) tp_fatal("tensor_rows: [%lld,+%lld) of %lld rows", (long long)r0, (long long)n, (long long)t->rows);
    tensor v = *t;
    v.owner = 0;
    v.rows = n;
    v.data = (char *)t->data + (size_t)r0 * (size_t)t->ld * dtype_size(t->dtype);
    return v;
}

tensor tensor_cols(const tensor *t, int64_t c0, int64_t n) {
    if (c0 < 0 || n < 0 || c0 + n > t->cols) tp_fatal("tensor_cols: [%lld,+%lld) of %lld cols", (long long)c0, (long long)n, (long long)t->cols);
    tensor v = *t;
    v.owner = 0;
    v.cols = n;
    v.data = (char *)t->data + (size_t)c0 * dtype_size(t->dtype);
    return v;
}

tensor tensor_reshape(const tensor *t, int64_t rows, int64_t cols) {
    if (!tensor_contiguous(t) || rows * cols != t->rows * t->cols)
        tp_fatal("tensor_reshape: %lldx%lld -> %lldx%lld", (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
    tensor v = *t;
    v.owner = 0;
    v.rows = rows;
    v.cols = cols;
    v.ld = cols;
    return v;
}

tensor tensor_wrap(struct backend *be, dtype_t dt, int64_t rows, int64_t cols, void *data) {
    tensor v = {.dtype = dt, .rows = rows, .cols = cols, .ld = cols, .data = data, .be = be, .owner = 0};
    return v;
}

/* Exponent bits all ones is NaN or Inf. Blocks of 256 are OR-reduced
 * branch-free (the compiler vectorises it); only a block that has one is
 * searched element by element. */
int64_t first_nonfinite_f32(const float *x, size_t n) {
    const uint32_t *u = (const uint32_t *)(const void *)x;
    for (size_t b = 0; b < n; b += 256) {
        size_t e = n - b < 256 ? n : b + 256;
        uint32_t any = 0;
        for (size_t i = b; i < e; i++) any |= (uint32_t)((u[i] & 0x7f800000u) == 0x7f800000u);
        if (!any) continue;
        for (size_t i = b; i < e; i++)
            if ((u[i] & 0x7f800000u) == 0x7f800000u) return (int64_t)i;
    }
    return -1;
}
