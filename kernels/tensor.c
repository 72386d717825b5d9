#include "tensor.h"
#include "err.h"
#include "ops.h"
#include <math.h>
#include <stdlib.h>

static const struct { const char *name; size_t size; } k_dtypes[DT_COUNT] = {
    [DT_F32] = {"F32", 4}, [DT_BF16] = {"BF16", 2}, [DT_F16] = {"F16", 2},
    [DT_F64] = {"F64", 8}, [DT_I64] = {"I64", 8},   [DT_I32] = {"I32", 4},
    [DT_I16] = {"I16", 2}, [DT_I8] = {"I8", 1},     [DT_U8] = {"U8", 1},
    [DT_BOOL] = {"BOOL", 1},   [DT_F8_E4M3] = {"F8_E4M3", 1}, [DT_F8_E5M2] = {"F8_E5M2", 1},
    [DT_GGML] = {"GGML", 0},   /* blocks: sizes come from kernels/quant.h */
};

/* ---- fp8 ---- */
static float g_e4m3[256], g_e5m2[256];

/* From the format definitions: exponent field e, mantissa m of mbits bits,
 * bias b: e == 0 subnormal m * 2^(1-b-mbits), else (1 + m/2^mbits) 2^(e-b). */
static float fp8_decode(unsigned code, int ebits, int mbits, int has_inf) {
    int s = code >> 7, e = (code >> mbits) & ((1 << ebits) - 1), m = code & ((1 << mbits) - 1);
    int bias = (1 << (ebits - 1)) - 1, emax = (1 << ebits) - 1;
    float v;
    if (has_inf && e == emax) v = m ? NAN : INFINITY;
    else if (!has_inf && e == emax && m == (1 << mbits) - 1) v = NAN;
    else if (e == 0) v = ldexpf((float)m, 1 - bias - mbits);
    else v = ldexpf((float)((1 << mbits) + m), e - bias - mbits);
    return s ? -v : v;
}

__attribute__((constructor)) static void fp8_tables_init(void) {
    for (unsigned c = 0; c < 256; c++) {
        g_e4m3[c] = fp8_decode(c, 4, 3, 0);
        g_e5m2[c] = fp8_decode(c, 5, 2, 1);
    }
}

const float *fp8_table(dtype_t dt) { return dt == DT_F8_E4M3 ? g_e4m3 : dt == DT_F8_E5M2 ? g_e5m2 : NULL; }
float fp8_max(dtype_t dt) { return dt == DT_F8_E4M3 ? 448.0f : 57344.0f; }

uint8_t f32_to_fp8(dtype_t dt, float f) {
    const float *t = fp8_table(dt);
    uint8_t nan = dt == DT_F8_E4M3 ? 0x7f : 0x7e;
    if (f != f) return nan;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= fp8_max(dt)) return sign | (dt == DT_F8_E4M3 ? 0x7e : 0x7b);
    /* positive codes 0..max are increasing: binary search the bracket, then
     * round to nearest, ties to the even code (even mantissa) */
    int lo = 0, hi = dt == DT_F8_E4M3 ? 0x7e : 0x7b;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (t[mid] <= a) lo = mid;
        else hi = mid;
    }
    double dl = (double)a - t[lo], dh = (double)t[hi] - a;
    int c = dl < dh ? lo : dh < dl ? hi : (lo & 1 ? hi : lo);
    return (uint8_t)(sign | c);
}

size_t dtype_size(dtype_t dt) { return (unsigned)dt < DT_COUNT ? k_dtypes[dt].size : 0; }
const char *dtype_name(dtype_t dt) { return (unsigned)dt < DT_COUNT ? k_dtypes[dt].name : "?"; }
int dtype_from_name(const char *s, dtype_t *out) {
    for (int i = 0; i < DT_COUNT; i++)   /* DT_GGML is no file dtype: only GGUF block types make it */
        if (i != DT_GGML && strcmp(s, k_dtypes[i].name) == 0) { *out = (dtype_t)i; return 0; }
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
    case DT_F8_E4M3: case DT_F8_E5M2: {   /* the code's value, scale 1 */
        const uint8_t *s = src;
        const float *t = fp8_table(dt);
        for (size_t i = 0; i < n; i++) dst[i] = t[s[i]];
        return 0;
    }
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
    if (dt == DT_GGML) tp_fatal("tensor_new: a DT_GGML tensor needs its block layout (tensor_new_ggml)");
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

tensor *tensor_new_ggml(struct backend *be, int qtype, int64_t rows, int64_t cols, int64_t pitch,
                        const tensor_qseg *seg, int n) {
    if (n < 1 || n > TENSOR_MAX_QSEGS) tp_fatal("tensor_new_ggml: %d segments", n);
    tensor *t = xcalloc(1, sizeof *t);
    t->dtype = DT_GGML;
    t->rows = rows;
    t->cols = cols;
    t->ld = cols;
    t->be = be;
    t->owner = 1;
    t->qtype = qtype;
    t->qpitch = pitch;
    t->n_qseg = n;
    memcpy(t->qseg, seg, (size_t)n * sizeof *seg);
    size_t bytes = (size_t)rows * (size_t)pitch;
    t->data = be_alloc(be, bytes);
    if (!t->data && bytes) {
        free(t);
        return NULL;
    }
    return t;
}

void tensor_lowrank_add(tensor *w, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, tensor *a, tensor *b) {
    if (!w->owner || row0 < 0 || nrows < 1 || row0 + nrows > w->rows || col0 < 0 || ncols < 1 ||
        col0 + ncols > w->cols || a->cols != ncols || b->rows != nrows || a->rows != b->cols)
        tp_fatal("tensor_lowrank_add: a [%lld, %lld] / b [%lld, %lld] at rows %lld+%lld, cols %lld+%lld of a "
                 "[%lld, %lld] weight", (long long)a->rows, (long long)a->cols, (long long)b->rows,
                 (long long)b->cols, (long long)row0, (long long)nrows, (long long)col0, (long long)ncols,
                 (long long)w->rows, (long long)w->cols);
    tensor_lowrank *L = w->lowrank;
    if (!L) L = w->lowrank = xcalloc(1, sizeof *L);
    L->t = xrealloc(L->t, (size_t)(L->n + 1) * sizeof *L->t);
    L->t[L->n++] = (tensor_lowrank_term){row0, nrows, col0, ncols, a, b};
}

size_t tensor_lowrank_bytes(const tensor *w) {
    size_t n = 0;
    for (int i = 0; w->lowrank && i < w->lowrank->n; i++)
        n += tensor_nbytes(w->lowrank->t[i].a) + tensor_nbytes(w->lowrank->t[i].b);
    return n;
}

void tensor_free(tensor *t) {
    if (!t) return;
    if (t->owner && t->lowrank) {
        for (int i = 0; i < t->lowrank->n; i++) tensor_free(t->lowrank->t[i].a), tensor_free(t->lowrank->t[i].b);
        free(t->lowrank->t);
        free(t->lowrank);
    }
    if (t->owner && t->scale) be_free(t->be, t->scale);
    if (t->owner && t->data) be_free(t->be, t->data);
    free(t);
}

tensor tensor_rows(const tensor *t, int64_t r0, int64_t n) {
    if (r0 < 0 || n < 0 || r0 + n > t->rows) tp_fatal("tensor_rows: [%lld,+%lld) of %lld rows", (long long)r0, (long long)n, (long long)t->rows);
    tensor v = *t;
    v.owner = 0;
    v.rows = n;
    v.lowrank_row0 = t->lowrank_row0 + r0;
    v.data = (char *)t->data + (t->dtype == DT_GGML ? (size_t)r0 * (size_t)t->qpitch
                                                     : (size_t)r0 * (size_t)t->ld * dtype_size(t->dtype));
    if (t->scale && t->scale_per_row) v.scale = (float *)t->scale + r0;
    return v;
}

tensor tensor_cols(const tensor *t, int64_t c0, int64_t n) {
    if (t->dtype == DT_GGML) tp_fatal("tensor_cols: a quantised (GGML) weight has no column views");
    if (t->lowrank) tp_fatal("tensor_cols: a weight with low-rank (LoRA) terms has no column views");
    if (c0 < 0 || n < 0 || c0 + n > t->cols) tp_fatal("tensor_cols: [%lld,+%lld) of %lld cols", (long long)c0, (long long)n, (long long)t->cols);
    tensor v = *t;
    v.owner = 0;
    v.cols = n;
    v.data = (char *)t->data + (size_t)c0 * dtype_size(t->dtype);
    return v;
}

tensor tensor_reshape(const tensor *t, int64_t rows, int64_t cols) {
    if (t->dtype == DT_GGML) tp_fatal("tensor_reshape: a quantised (GGML) weight cannot be reshaped");
    if (!tensor_contiguous(t) || rows * cols != t->rows * t->cols)
        tp_fatal("tensor_reshape: %lldx%lld -> %lldx%lld", (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
    if (t->scale && t->scale_per_row && rows != t->rows) tp_fatal("tensor_reshape: a per-row scaled fp8 tensor keeps its rows");
    if (t->lowrank && (rows != t->rows || cols != t->cols)) tp_fatal("tensor_reshape: a weight with low-rank (LoRA) terms keeps its shape");
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
