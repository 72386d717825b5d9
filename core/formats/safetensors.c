/* safetensors reader and atomic writer.
 *
 * The header is parsed with jansson and every entry is validated before the
 * file is handed out, so later reads can trust begin/end: a corrupt or
 * truncated file fails in st_open with a message naming the file and the
 * tensor, never in the middle of a load. */
#include "safetensors.h"
#include "kernels/err.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header above this size is certainly corrupt (real ones are ~100 B per
 * tensor); refusing it avoids a huge allocation from 8 garbage bytes. */
#define ST_MAX_HEADER (256ull << 20)
/* A header with more entries than this is corrupt: the largest real
 * checkpoints have a few thousand tensors per file. */
#define ST_MAX_ENTRIES 200000
/* JSON values of a header (each entry has about 10: dtype, shape, offsets);
 * counted before jansson builds its tree, which costs ~100 bytes a value */
#define ST_MAX_VALUES (16 * ST_MAX_ENTRIES)
/* elements of one tensor, so that element counts times any dtype size (or
 * products of any of its dimensions) fit an int64 */
#define ST_MAX_NUMEL (1ull << 58)

static int cmp_info(const void *a, const void *b) {
    return strcmp(((const st_tensor_info *)a)->name, ((const st_tensor_info *)b)->name);
}

/* pread the whole range, retrying short reads and EINTR. */
static int pread_full(int fd, void *dst, size_t n, uint64_t off, const char *path) {
    char *p = dst;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return tp_error("%s: read failed at byte %llu: %s", path, (unsigned long long)off, strerror(errno));
        if (r == 0) return tp_error("%s: unexpected end of file at byte %llu (the file is truncated; download it again)",
                                    path, (unsigned long long)off);
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

/* Validate one header entry and fill ti (offsets made absolute). */
static int parse_entry(const st_file *f, const char *name, json_t *v, st_tensor_info *ti) {
    const char *path = f->path;
    if (!json_is_object(v))
        return tp_error("%s: header entry '%s' is not an object; the file is not a valid safetensors file", path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
        return tp_error("%s: tensor '%s' needs \"dtype\" (string), \"shape\" (array) and \"data_offsets\" ([begin, end])",
                        path, name);
    if (dtype_from_name(json_string_value(jd), &ti->dtype)) {
        const char *dn = json_string_value(jd);
        if (!strncmp(dn, "F8_", 3) || !strncmp(dn, "F4", 2) || !strncmp(dn, "F6", 2))
            return tp_error("%s: tensor '%s' has the low-precision dtype '%s', which tpgen cannot compute with "
                            "(supported fp8 storage: F8_E4M3, F8_E5M2); use a bf16 or F8_E4M3/F8_E5M2 checkpoint",
                            path, name, dn);
        return tp_error("%s: tensor '%s' has unknown dtype '%s' (supported: F32 BF16 F16 F64 I64 I32 I16 I8 U8 BOOL "
                        "F8_E4M3 F8_E5M2)", path, name, dn);
    }
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return tp_error("%s: tensor '%s' has %zu dimensions (at most %d supported)", path, name, nd, ST_MAX_DIMS);
    ti->ndim = (int)nd;
    /* The product of the non-zero dimensions is bounded too: a zero
     * dimension makes the tensor empty, but [0, 2^40, 2^40] must not reach
     * the plan code, which multiplies the other dimensions. */
    uint64_t numel = 1, nonzero = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return tp_error("%s: tensor '%s': shape entry %zu is not a non-negative integer", path, name, i);
        ti->shape[i] = json_integer_value(d);
        if (ti->shape[i] != 0 && nonzero > ST_MAX_NUMEL / (uint64_t)ti->shape[i])
            return tp_error("%s: tensor '%s': shape is impossibly large (more than 2^58 elements)", path, name);
        if (ti->shape[i] != 0) nonzero *= (uint64_t)ti->shape[i];
        numel *= (uint64_t)ti->shape[i];
    }
    json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 || json_integer_value(e) < 0)
        return tp_error("%s: tensor '%s': data_offsets must be two non-negative integers", path, name);
    uint64_t ob = (uint64_t)json_integer_value(b), oe = (uint64_t)json_integer_value(e);
    uint64_t area = f->file_size - f->data0;
    if (oe < ob || oe > area)
        return tp_error("%s: tensor '%s': data_offsets [%llu, %llu] lie outside the data area of %llu bytes "
                        "(the file is truncated or corrupt)", path, name, (unsigned long long)ob,
                        (unsigned long long)oe, (unsigned long long)area);
    if (numel * dtype_size(ti->dtype) != oe - ob)
        return tp_error("%s: tensor '%s': shape needs %llu bytes of %s but data_offsets span %llu bytes",
                        path, name, (unsigned long long)(numel * dtype_size(ti->dtype)),
                        json_string_value(jd), (unsigned long long)(oe - ob));
    ti->begin = f->data0 + ob;
    ti->end = f->data0 + oe;
    ti->name = xstrdup(name);
    return 0;
}

static int parse_metadata(st_file *f, json_t *m) {
    if (!json_is_object(m)) return tp_error("%s: \"__metadata__\" is not an object", f->path);
    size_t n = json_object_size(m);
    f->meta_keys = xcalloc(n, sizeof(char *));
    f->meta_values = xcalloc(n, sizeof(char *));
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v)) return tp_error("%s: \"__metadata__\" value of '%s' is not a string", f->path, k);
        f->meta_keys[f->n_meta] = xstrdup(k);
        f->meta_values[f->n_meta] = xstrdup(json_string_value(v));
        f->n_meta++;
    }
    return 0;
}

static int cmp_begin(const void *a, const void *b) {
    const st_tensor_info *x = *(const st_tensor_info *const *)a, *y = *(const st_tensor_info *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Two tensors sharing bytes means a corrupt header (writes to one would
 * change the other); gaps are allowed. */
static int check_overlaps(const st_file *f) {
    const st_tensor_info **by = xmalloc((size_t)(f->n ? f->n : 1) * sizeof *by);
    for (int i = 0; i < f->n; i++) by[i] = &f->tensors[i];
    qsort(by, (size_t)f->n, sizeof *by, cmp_begin);
    int rc = 0;
    const st_tensor_info *last = NULL;   /* the non-empty tensor reaching furthest so far */
    for (int i = 0; i < f->n && !rc; i++) {
        if (by[i]->end == by[i]->begin) continue;   /* empty tensors own no bytes */
        if (last && by[i]->begin < last->end)
            rc = tp_error("%s: tensors '%s' and '%s' overlap in the data area (corrupt header)", f->path,
                          last->name, by[i]->name);
        if (!last || by[i]->end > last->end) last = by[i];
    }
    free(by);
    return rc;
}

/* Count the separators (':' and ',') outside strings, and the members of
 * the top-level object, without building anything: a 200 MB header of 3.4
 * million entries must be refused before jansson spends gigabytes on it. */
static int check_header_size(const st_file *f, const char *text, size_t len) {
    uint64_t values = 0, entries = 0;
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
            continue;
        }
        if (c == '"') in_str = 1;
        else if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') depth--;
        else if (c == ':' || c == ',') {
            values++;
            if (c == ':' && depth == 1) entries++;
        }
    }
    if (entries > ST_MAX_ENTRIES)
        return tp_error("%s: the header lists %llu entries, more than the limit of %d per file (real checkpoints "
                        "have a few thousand; the file is corrupt, or split it into shards with an index.json)",
                        f->path, (unsigned long long)entries, ST_MAX_ENTRIES);
    if (values > ST_MAX_VALUES)
        return tp_error("%s: the header holds %llu JSON values, more than the limit of %d (the file is corrupt)",
                        f->path, (unsigned long long)values, ST_MAX_VALUES);
    return 0;
}

static int parse_header(st_file *f, const char *text, size_t len) {
    if (check_header_size(f, text, len)) return -1;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return tp_error("%s: malformed JSON header (line %d, column %d: %s); the file is not a valid safetensors file",
                        f->path, jerr.line, jerr.column, jerr.text);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = tp_error("%s: the JSON header is not an object; the file is not a valid safetensors file", f->path);
        goto out;
    }
    f->tensors = xcalloc(json_object_size(root), sizeof *f->tensors);
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (!strcmp(k, "__metadata__")) rc = parse_metadata(f, v);
        else if ((rc = parse_entry(f, k, v, &f->tensors[f->n])) == 0) f->n++;
        if (rc) goto out;
    }
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_info);
    rc = check_overlaps(f);
out:
    json_decref(root);
    return rc;
}

int st_open(const char *path, st_file **out) {
    *out = NULL;
    st_file *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        tp_error("cannot open %s: %s", path, strerror(errno));
        st_close(f);
        return -1;
    }
    struct stat sb;
    uint8_t len8[8];
    char *text = NULL;
    int rc = -1;
    if (fstat(f->fd, &sb)) { tp_error("cannot stat %s: %s", path, strerror(errno)); goto out; }
    f->file_size = (uint64_t)sb.st_size;
    if (f->file_size < 8) {
        tp_error("%s: file is %llu bytes, too short for a safetensors header (truncated download?)", path,
                 (unsigned long long)f->file_size);
        goto out;
    }
    if (pread_full(f->fd, len8, 8, 0, path)) goto out;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    if (hlen > ST_MAX_HEADER) {
        tp_error("%s: header length %llu is more than the limit of %llu MB (real headers are about 100 bytes per "
                 "tensor; the file is corrupt or not safetensors)", path, (unsigned long long)hlen,
                 ST_MAX_HEADER >> 20);
        goto out;
    }
    if (hlen > f->file_size - 8) {
        tp_error("%s: header length %llu goes beyond the file size %llu (the file is truncated or not safetensors)",
                 path, (unsigned long long)hlen, (unsigned long long)f->file_size);
        goto out;
    }
    f->data0 = 8 + hlen;
    text = xmalloc(hlen + 1);
    if (pread_full(f->fd, text, hlen, 8, path)) goto out;
    text[hlen] = 0;
    rc = parse_header(f, text, hlen);
out:
    free(text);
    if (rc) { st_close(f); return -1; }
    *out = f;
    return 0;
}

void st_close(st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) free(f->meta_keys[i]), free(f->meta_values[i]);
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    free(f);
}

const st_tensor_info *st_find(const st_file *f, const char *name) {
    st_tensor_info key = {.name = (char *)name};
    return bsearch(&key, f->tensors, (size_t)f->n, sizeof key, cmp_info);
}

const char *st_meta(const st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
    return NULL;
}

int64_t st_numel(const st_tensor_info *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int st_read_range(const st_file *f, uint64_t off, void *dst, size_t n) {
    return pread_full(f->fd, dst, n, off, f->path);
}

int st_read_raw(const st_file *f, const st_tensor_info *t, void *dst) {
    return st_read_range(f, t->begin, dst, (size_t)(t->end - t->begin));
}

static const st_tensor_info *find_req(const st_file *f, const char *name) {
    const st_tensor_info *t = st_find(f, name);
    if (!t) tp_error("%s: tensor '%s' not found", f->path, name);
    return t;
}

int st_read_f32(const st_file *f, const char *name, float **out, const st_tensor_info **info) {
    *out = NULL;
    const st_tensor_info *t = find_req(f, name);
    if (!t) return -1;
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16 && t->dtype != DT_F64)
        return tp_error("%s: tensor '%s' is %s, not a float tensor", f->path, name, dtype_name(t->dtype));
    size_t n = (size_t)st_numel(t), bytes = (size_t)(t->end - t->begin);
    float *dst = xmalloc((n ? n : 1) * sizeof(float));
    void *raw = t->dtype == DT_F32 ? (void *)dst : xmalloc(bytes ? bytes : 1);
    int rc = st_read_raw(f, t, raw);
    if (!rc && raw != dst) rc = convert_to_f32(dst, raw, t->dtype, n);
    if (raw != dst) free(raw);
    if (rc) { free(dst); return -1; }
    *out = dst;
    if (info) *info = t;
    return 0;
}

int st_read_i64(const st_file *f, const char *name, int64_t **out, const st_tensor_info **info) {
    *out = NULL;
    const st_tensor_info *t = find_req(f, name);
    if (!t) return -1;
    size_t n = (size_t)st_numel(t), bytes = (size_t)(t->end - t->begin);
    int64_t *dst = xmalloc((n ? n : 1) * sizeof(int64_t));
    void *raw = xmalloc(bytes ? bytes : 1);
    int rc = 0;
    switch (t->dtype) {
    case DT_I64: case DT_I32: case DT_I16: case DT_I8: case DT_U8: case DT_BOOL: break;
    default: rc = tp_error("%s: tensor '%s' is %s, not an integer tensor", f->path, name, dtype_name(t->dtype));
    }
    if (!rc) rc = st_read_raw(f, t, raw);
    for (size_t i = 0; !rc && i < n; i++) {
        switch (t->dtype) {
        case DT_I64: memcpy(&dst[i], (char *)raw + 8 * i, 8); break;
        case DT_I32: { int32_t v; memcpy(&v, (char *)raw + 4 * i, 4); dst[i] = v; break; }
        case DT_I16: { int16_t v; memcpy(&v, (char *)raw + 2 * i, 2); dst[i] = v; break; }
        case DT_I8: dst[i] = ((int8_t *)raw)[i]; break;
        default: dst[i] = ((uint8_t *)raw)[i]; break;   /* U8, BOOL */
        }
    }
    free(raw);
    if (rc) { free(dst); return -1; }
    *out = dst;
    if (info) *info = t;
    return 0;
}

/* ---- writer ---- */

static int write_full(int fd, const void *src, size_t n, const char *path) {
    const char *p = src;
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return tp_error("%s: write failed: %s", path, strerror(errno));
        p += w, n -= (size_t)w;
    }
    return 0;
}

static size_t write_nbytes(const st_write_tensor *t) {
    size_t n = dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* The JSON header, padded with spaces so the data area starts 8-aligned. */
static char *build_header(const char *path, const st_write_tensor *t, int n, const char *const *meta_kv,
                          size_t *len) {
    json_t *root = json_object();
    if (meta_kv && meta_kv[0]) {
        json_t *m = json_object();
        for (int i = 0; meta_kv[i] && meta_kv[i + 1]; i += 2) json_object_set_new(m, meta_kv[i], json_string(meta_kv[i + 1]));
        json_object_set_new(root, "__metadata__", m);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS || (unsigned)t[i].dtype >= DT_COUNT || json_object_get(root, t[i].name)) {
            json_decref(root);
            tp_error("%s: cannot write tensor '%s' (duplicate name, bad dtype or ndim)", path, t[i].name);
            return NULL;
        }
        json_t *e = json_object(), *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        uint64_t nb = write_nbytes(&t[i]);
        json_object_set_new(e, "dtype", json_string(dtype_name(t[i].dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + nb)));
        json_object_set_new(root, t[i].name, e);
        off += nb;
    }
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    size_t l = strlen(s), padded = (l + 7) & ~(size_t)7;
    char *h = xmalloc(8 + padded);
    uint64_t L = padded;
    for (int i = 0; i < 8; i++) h[i] = (char)(L >> (8 * i) & 0xff);
    memcpy(h + 8, s, l);
    memset(h + 8 + l, ' ', padded - l);
    free(s);
    *len = 8 + padded;
    return h;
}

/* Data of tensor i: from t->data, from fill(), or a hole (sparse zeros). */
static int write_data(int fd, const char *path, const st_write_tensor *t, int i, uint64_t *pos, st_fill_fn fill,
                      void *ctx) {
    size_t nb = write_nbytes(&t[i]);
    if (t[i].data) {
        if (write_full(fd, t[i].data, nb, path)) return -1;
    } else if (fill && fill(ctx, i, NULL, 0, 0) == 0) {   /* asked with no buffer: 1 leaves a hole */
        size_t chunk = 16u << 20;
        char *buf = xmalloc(chunk);
        for (size_t o = 0; o < nb; o += chunk) {
            size_t k = nb - o < chunk ? nb - o : chunk;
            if (fill(ctx, i, buf, o, k) || write_full(fd, buf, k, path)) { free(buf); return -1; }
        }
        free(buf);
    } else if (lseek(fd, (off_t)nb, SEEK_CUR) < 0) {
        return tp_error("%s: seek failed: %s", path, strerror(errno));
    }
    *pos += nb;
    return 0;
}

int st_write_stream(const char *path, const st_write_tensor *t, int n, const char *const *meta_kv, st_fill_fn fill,
                    void *ctx) {
    size_t hlen;
    char *h = build_header(path, t, n, meta_kv, &hlen);
    if (!h) return -1;
    char *tmp = xasprintf("%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int rc = tp_error("cannot create %s: %s (is the folder writable?)", tmp, strerror(errno));
        free(h), free(tmp);
        return rc;
    }
    uint64_t pos = hlen;
    int rc = write_full(fd, h, hlen, tmp);
    for (int i = 0; !rc && i < n; i++) rc = write_data(fd, tmp, t, i, &pos, fill, ctx);
    /* trailing holes need the size set explicitly */
    if (!rc && ftruncate(fd, (off_t)pos)) rc = tp_error("%s: cannot set size: %s", tmp, strerror(errno));
    if (!rc && fchmod(fd, 0644)) rc = tp_error("%s: chmod failed: %s", tmp, strerror(errno));
    if (close(fd) && !rc) rc = tp_error("%s: close failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path)) rc = tp_error("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    free(h), free(tmp);
    return rc;
}

int st_write(const char *path, const st_write_tensor *t, int n, const char *const *meta_kv) {
    return st_write_stream(path, t, n, meta_kv, NULL, NULL);
}
