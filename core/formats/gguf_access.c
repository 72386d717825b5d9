/* GGUF handles: lookups, typed metadata access and tensor reads (the
 * parsing and validation are in gguf.c). */
#include "gguf.h"
#include "kernels/err.h"
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the value types' names (for messages; the parser in gguf.c uses them too) */
static const char *vnames[GGUF_NTYPES] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
                                          "array", "u64", "i64", "f64"};

const char *gguf_vtype_name(int t) { return t >= 0 && t < GGUF_NTYPES ? vnames[t] : "unknown"; }

const gguf_tensor *gguf_find(const gguf_file *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, f->tensors[f->by_name[mid]].name);
        if (!c) return &f->tensors[f->by_name[mid]];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    for (int i = 0; i < f->n_kv; i++)
        if (!strcmp(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

int gguf_check_type(const gguf_file *f, const gguf_tensor *t) {
    if (t->qt && t->qt->dequant) return 0;
    return tp_error("%s: tensor '%s' is stored as %s (ggml type %d), which tpgen cannot decode (supported: %s); use "
                    "a file quantised to one of those, e.g. Q8_0, Q6_K or Q4_K", f->path, t->name,
                    quant_type_name(t->type), t->type, quant_supported_list());
}

/* ---- typed metadata ---- */

static int wrong(const gguf_file *f, const char *key, const gguf_value *v, const char *want) {
    if (v->type == GGUF_ARRAY)
        return tp_error("%s: metadata '%s' is an array of %s, expected %s", f->path, key, gguf_vtype_name(v->elem), want);
    return tp_error("%s: metadata '%s' is a %s, expected %s", f->path, key, gguf_vtype_name(v->type), want);
}

static int is_signed(int t) { return t == GGUF_I8 || t == GGUF_I16 || t == GGUF_I32 || t == GGUF_I64; }
static int is_unsigned(int t) { return t == GGUF_U8 || t == GGUF_U16 || t == GGUF_U32 || t == GGUF_U64; }

/* An integer value of any width, checked to lie in [lo, hi], into *si
 * and/or *ui. */
static int get_int(const gguf_file *f, const char *key, int64_t lo, uint64_t hi, int64_t *si, uint64_t *ui) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 1;
    const gguf_value *v = &kv->v;
    if (is_signed(v->type)) {
        if (v->num.i < lo || (v->num.i >= 0 && (uint64_t)v->num.i > hi)) goto range;
        if (si) *si = v->num.i;
        if (ui) *ui = (uint64_t)v->num.i;
        return 0;
    }
    if (is_unsigned(v->type)) {
        if (v->num.u > hi) goto range;
        if (si) *si = (int64_t)v->num.u;
        if (ui) *ui = v->num.u;
        return 0;
    }
    return wrong(f, key, v, "an integer");
range:
    return tp_error("%s: metadata '%s' = %s%llu is out of range [%lld, %llu]", f->path, key,
                    is_signed(v->type) && v->num.i < 0 ? "-" : "",
                    is_signed(v->type) && v->num.i < 0 ? (unsigned long long)(-(v->num.i + 1)) + 1
                                                        : (unsigned long long)v->num.u,
                    (long long)lo, (unsigned long long)hi);
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    uint64_t u;
    int rc = get_int(f, key, 0, UINT32_MAX, NULL, &u);
    if (!rc) *out = (uint32_t)u;
    return rc;
}

int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out) {
    int64_t i;
    int rc = get_int(f, key, INT32_MIN, INT32_MAX, &i, NULL);
    if (!rc) *out = (int32_t)i;
    return rc;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out) { return get_int(f, key, 0, UINT64_MAX, NULL, out); }

int gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 1;
    if (kv->v.type != GGUF_F32 && kv->v.type != GGUF_F64) return wrong(f, key, &kv->v, "a float");
    *out = (float)kv->v.num.f;
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 1;
    if (kv->v.type != GGUF_BOOL) return wrong(f, key, &kv->v, "a bool");
    *out = (int)kv->v.num.u;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, const char **out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 1;
    if (kv->v.type != GGUF_STRING) return wrong(f, key, &kv->v, "a string");
    *out = kv->v.str.s;
    return 0;
}

static const gguf_value *get_arr(const gguf_file *f, const char *key, int *rc) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    *rc = kv ? 0 : 1;
    if (kv && kv->v.type != GGUF_ARRAY) *rc = wrong(f, key, &kv->v, "an array");
    return *rc ? NULL : &kv->v;
}

int gguf_get_arr_str(const gguf_file *f, const char *key, const gguf_str **items, uint64_t *n) {
    int rc;
    const gguf_value *v = get_arr(f, key, &rc);
    if (!v) return rc;
    if (v->elem != GGUF_STRING) return wrong(f, key, v, "an array of strings");
    *items = v->data, *n = v->n;
    return 0;
}

static uint64_t elem_le(const gguf_value *v, uint64_t i, int size) {
    const uint8_t *p = (const uint8_t *)v->data + i * (uint64_t)size;
    uint64_t x = 0;
    for (int k = 0; k < size; k++) x |= (uint64_t)p[k] << (8 * k);
    return x;
}

int gguf_get_arr_i64(const gguf_file *f, const char *key, int64_t **out, uint64_t *n) {
    int rc;
    const gguf_value *v = get_arr(f, key, &rc);
    if (!v) return rc;
    static const int size[] = {1, 1, 2, 2, 4, 4, 0, 0, 0, 0, 8, 8};
    if (!is_signed(v->elem) && !is_unsigned(v->elem)) return wrong(f, key, v, "an array of integers");
    int sz = size[v->elem];
    int64_t *o = xmalloc((v->n ? v->n : 1) * sizeof *o);
    for (uint64_t i = 0; i < v->n; i++) {
        uint64_t x = elem_le(v, i, sz);
        if (is_signed(v->elem) && sz < 8) {   /* sign-extend */
            uint64_t m = 1ull << (8 * sz - 1);
            x = (x ^ m) - m;
        }
        if (v->elem == GGUF_U64 && x > INT64_MAX) {
            free(o);
            return tp_error("%s: metadata '%s': element %llu = %llu does not fit an int64", f->path, key,
                            (unsigned long long)i, (unsigned long long)x);
        }
        o[i] = (int64_t)x;
    }
    *out = o, *n = v->n;
    return 0;
}

int gguf_get_arr_f32(const gguf_file *f, const char *key, float **out, uint64_t *n) {
    int rc;
    const gguf_value *v = get_arr(f, key, &rc);
    if (!v) return rc;
    if (v->elem != GGUF_F32 && v->elem != GGUF_F64) return wrong(f, key, v, "an array of floats");
    float *o = xmalloc((v->n ? v->n : 1) * sizeof *o);
    for (uint64_t i = 0; i < v->n; i++) {
        if (v->elem == GGUF_F32) {
            uint32_t u = (uint32_t)elem_le(v, i, 4);
            memcpy(&o[i], &u, 4);
        } else {
            uint64_t u = elem_le(v, i, 8);
            double d;
            memcpy(&d, &u, 8);
            o[i] = (float)d;
        }
    }
    *out = o, *n = v->n;
    return 0;
}

/* ---- tensor bytes ---- */

void gguf_rows_range(const gguf_tensor *t, int64_t r0, int64_t r1, uint64_t *begin, uint64_t *end) {
    *begin = t->begin + (uint64_t)r0 * t->row_bytes;
    *end = t->begin + (uint64_t)r1 * t->row_bytes;
}

int gguf_read_range(const gguf_file *f, uint64_t off, void *dst, size_t n) {
    if (off > f->file_size || n > f->file_size - off)
        return tp_error("%s: bytes [%llu, %llu) lie past the end of the file (%llu bytes)", f->path,
                        (unsigned long long)off, (unsigned long long)(off + n), (unsigned long long)f->file_size);
    if (f->fd < 0) {
        memcpy(dst, f->mem + off, n);
        return 0;
    }
    char *p = dst;
    while (n > 0) {
        ssize_t r = pread(f->fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return tp_error("%s: read failed at byte %llu: %s", f->path, (unsigned long long)off, strerror(errno));
        if (r == 0)
            return tp_error("%s: unexpected end of file at byte %llu (the file was truncated after it was opened)",
                            f->path, (unsigned long long)off);
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

int gguf_read_raw(const gguf_file *f, const gguf_tensor *t, void *dst) {
    return gguf_read_range(f, t->begin, dst, (size_t)(t->end - t->begin));
}

static int check_window(const gguf_file *f, const gguf_tensor *t, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (r0 < 0 || r1 > t->rows || r0 >= r1 || c0 < 0 || c1 > t->row_len || c0 >= c1)
        return tp_error("%s: tensor '%s': rows [%lld, %lld) x columns [%lld, %lld) are outside its %lld x %lld",
                        f->path, t->name, (long long)r0, (long long)r1, (long long)c0, (long long)c1,
                        (long long)t->rows, (long long)t->row_len);
    return 0;
}

int gguf_read_blocks(const gguf_file *f, const gguf_tensor *t, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                     void *dst, int64_t *pitch, int64_t *skip, uint64_t *bytes_read) {
    if (bytes_read) *bytes_read = 0;
    if (check_window(f, t, r0, r1, c0, c1)) return -1;
    int64_t off, len;
    quant_col_span(t->qt, c0, c1, &off, &len, skip);
    *pitch = len;
    uint8_t *d = dst;
    if ((uint64_t)len == t->row_bytes) {   /* whole rows: one contiguous range */
        uint64_t b0, b1;
        gguf_rows_range(t, r0, r1, &b0, &b1);
        if (gguf_read_range(f, b0, d, (size_t)(b1 - b0))) return -1;
        if (bytes_read) *bytes_read = b1 - b0;
        return 0;
    }
    for (int64_t r = r0; r < r1; r++) {
        if (gguf_read_range(f, t->begin + (uint64_t)r * t->row_bytes + (uint64_t)off, d + (r - r0) * len, (size_t)len))
            return -1;
        if (bytes_read) *bytes_read += (uint64_t)len;
    }
    return 0;
}

int gguf_read_f32_block(const gguf_file *f, const gguf_tensor *t, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                        float *dst, uint64_t *bytes_read) {
    if (bytes_read) *bytes_read = 0;
    if (gguf_check_type(f, t) || check_window(f, t, r0, r1, c0, c1)) return -1;
    int64_t off, len, skip, pitch;
    quant_col_span(t->qt, c0, c1, &off, &len, &skip);
    /* a bounded staging buffer: up to 4 MB of rows at a time */
    int64_t step = (4 << 20) / len > 0 ? (4 << 20) / len : 1;
    uint8_t *buf = xmalloc((size_t)(len * (step < r1 - r0 ? step : r1 - r0)));
    int rc = 0;
    for (int64_t r = r0; r < r1 && !rc; r += step) {
        int64_t e = r + step < r1 ? r + step : r1;
        uint64_t got;
        rc = gguf_read_blocks(f, t, r, e, c0, c1, buf, &pitch, &skip, &got);
        for (int64_t i = r; i < e && !rc; i++)
            quant_dequant_span(t->type, buf + (i - r) * pitch, skip, c1 - c0, dst + (i - r0) * (c1 - c0));
        if (!rc && bytes_read) *bytes_read += got;
    }
    free(buf);
    return rc;
}

int gguf_read_f32(const gguf_file *f, const char *name, float **out, const gguf_tensor **info) {
    const gguf_tensor *t = gguf_find(f, name);
    if (!t) return tp_error("%s: no tensor '%s' in the file", f->path, name);
    if (info) *info = t;
    if (gguf_check_type(f, t)) return -1;
    /* bounded by the file: the tensor's bytes are in it, and no type
     * decodes to more than about 3 values per byte (Q2_K: 256 in 84) */
    float *o = malloc((size_t)t->rows * (size_t)t->row_len * sizeof(float));
    uint8_t *raw = malloc((size_t)(t->end - t->begin));
    if (!o || !raw) {
        free(o), free(raw);
        return tp_error("%s: tensor '%s': out of memory for %lld x %lld floats", f->path, name, (long long)t->rows,
                        (long long)t->row_len);
    }
    int rc = gguf_read_raw(f, t, raw);
    if (!rc)
        for (int64_t r = 0; r < t->rows; r++)
            quant_dequant_row(t->type, raw + (uint64_t)r * t->row_bytes, o + r * t->row_len, t->row_len);
    free(raw);
    if (rc) free(o);
    else *out = o;
    return rc;
}
