/* GGUF writer (the layout gguf-py's GGUFWriter writes, so that a file read
 * and written back is byte-identical: tests/test_gguf.c checks it). */
#include "gguf.h"
#include "kernels/err.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void put(wbuf *b, const void *x, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}

static void put_le(wbuf *b, uint64_t v, int k) {
    uint8_t x[8];
    for (int i = 0; i < k; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, (size_t)k);
}

static void put_str(wbuf *b, const char *s, uint64_t len) {
    put_le(b, len, 8);
    put(b, s, (size_t)len);
}

static const int vsize[GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* an array's element type, length and elements (no type tag of its own) */
static int put_array(wbuf *b, const gguf_value *v, const char *key) {
    if (v->elem >= GGUF_NTYPES) return tp_error("gguf_write: key '%s': array element type %d", key, (int)v->elem);
    put_le(b, (uint64_t)v->elem, 4);
    put_le(b, v->n, 8);
    if (v->elem == GGUF_STRING)
        for (uint64_t i = 0; i < v->n; i++) put_str(b, ((const gguf_str *)v->data)[i].s, ((const gguf_str *)v->data)[i].len);
    else if (v->elem == GGUF_ARRAY) {
        for (uint64_t i = 0; i < v->n; i++)
            if (put_array(b, &((const gguf_value *)v->data)[i], key)) return -1;
    } else put(b, v->data, (size_t)(v->n * (uint64_t)vsize[v->elem]));
    return 0;
}

static int put_value(wbuf *b, const gguf_value *v, const char *key) {
    if (v->type >= GGUF_NTYPES) return tp_error("gguf_write: key '%s': value type %d", key, (int)v->type);
    put_le(b, (uint64_t)v->type, 4);
    switch (v->type) {
    case GGUF_STRING: put_str(b, v->str.s, v->str.len); return 0;
    case GGUF_ARRAY: return put_array(b, v, key);
    case GGUF_F32: {
        float f = (float)v->num.f;
        uint32_t u;
        memcpy(&u, &f, 4);
        put_le(b, u, 4);
        return 0;
    }
    case GGUF_F64: {
        uint64_t u;
        memcpy(&u, &v->num.f, 8);
        put_le(b, u, 8);
        return 0;
    }
    case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64:
        put_le(b, (uint64_t)v->num.i, vsize[v->type]);
        return 0;
    default: put_le(b, v->num.u, vsize[v->type]); return 0;
    }
}

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

/* the tensor's bytes and padding; holes are skipped over */
static int write_tensor(int fd, const char *path, const gguf_write_tensor *t, int i, uint64_t nb, uint64_t padded,
                        gguf_fill_fn fill, void *ctx) {
    static const uint8_t zeros[256];
    if (t->data) {
        if (write_full(fd, t->data, (size_t)nb, path)) return -1;
    } else if (fill) {
        size_t chunk = 16u << 20;
        uint8_t *buf = xmalloc(chunk);
        for (uint64_t o = 0; o < nb; o += chunk) {
            size_t k = nb - o < chunk ? (size_t)(nb - o) : chunk;
            if (fill(ctx, i, buf, o, k) || write_full(fd, buf, k, path)) {
                free(buf);
                return -1;
            }
        }
        free(buf);
    } else {
        if (lseek(fd, (off_t)padded, SEEK_CUR) < 0) return tp_error("%s: seek failed: %s", path, strerror(errno));
        return 0;
    }
    for (uint64_t p = nb; p < padded; p += sizeof zeros)
        if (write_full(fd, zeros, padded - p < sizeof zeros ? (size_t)(padded - p) : sizeof zeros, path)) return -1;
    return 0;
}

static int tensor_bytes(const char *path, const gguf_write_tensor *t, uint64_t *nb) {
    const quant_type *qt = quant_type_get(t->type);
    if (!qt) return tp_error("%s: tensor '%s': unknown ggml type %d", path, t->name, t->type);
    if (t->ndim < 1 || t->ndim > GGUF_MAX_DIMS)
        return tp_error("%s: tensor '%s': %d dimensions (1 to %d)", path, t->name, t->ndim, GGUF_MAX_DIMS);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->ne[d] <= 0 || (uint64_t)t->ne[d] > (1ull << 58) / numel)
            return tp_error("%s: tensor '%s': dimension %d is %lld", path, t->name, d, (long long)t->ne[d]);
        numel *= (uint64_t)t->ne[d];
    }
    if (t->ne[0] % qt->block)
        return tp_error("%s: tensor '%s': rows of %lld are not whole %s blocks of %d", path, t->name,
                        (long long)t->ne[0], qt->name, qt->block);
    *nb = numel / (uint64_t)qt->block * (uint64_t)qt->bytes;
    return 0;
}

int gguf_write(const char *path, const gguf_kv *kv, int n_kv, const gguf_write_tensor *t, int n, gguf_fill_fn fill,
               void *ctx) {
    uint64_t align = 32;
    for (int i = 0; i < n_kv; i++)
        if (!strcmp(kv[i].key, "general.alignment")) {
            const gguf_value *v = &kv[i].v;
            int signed_int = v->type == GGUF_I8 || v->type == GGUF_I16 || v->type == GGUF_I32 || v->type == GGUF_I64;
            int unsigned_int = v->type == GGUF_U8 || v->type == GGUF_U16 || v->type == GGUF_U32 || v->type == GGUF_U64;
            align = signed_int ? (v->num.i < 0 ? 0 : (uint64_t)v->num.i) : unsigned_int ? v->num.u : 0;
            if (align == 0 || (align & (align - 1)) || align > (1u << 24))
                return tp_error("%s: general.alignment must be an integer power of two up to 2^24", path);
        }
    wbuf b = {0};
    put(&b, "GGUF", 4);
    put_le(&b, 3, 4);
    put_le(&b, (uint64_t)n, 8);
    put_le(&b, (uint64_t)n_kv, 8);
    int rc = 0;
    for (int i = 0; i < n_kv && !rc; i++) {
        put_str(&b, kv[i].key, strlen(kv[i].key));
        rc = put_value(&b, &kv[i].v, kv[i].key);
    }
    uint64_t *nb = xcalloc((size_t)(n ? n : 1), sizeof *nb), off = 0;
    for (int i = 0; i < n && !rc; i++) {
        if ((rc = tensor_bytes(path, &t[i], &nb[i]))) break;
        put_str(&b, t[i].name, strlen(t[i].name));
        put_le(&b, (uint64_t)t[i].ndim, 4);
        for (int d = 0; d < t[i].ndim; d++) put_le(&b, (uint64_t)t[i].ne[d], 8);
        put_le(&b, (uint64_t)t[i].type, 4);
        put_le(&b, off, 8);
        off += (nb[i] + align - 1) / align * align;
    }
    static const uint8_t zero[1];
    while (!rc && b.n % align) put(&b, zero, 1);
    char *tmp = NULL;
    int fd = -1;
    if (!rc) {
        tmp = xasprintf("%s.tmp.XXXXXX", path);
        fd = mkstemp(tmp);
        if (fd < 0) rc = tp_error("cannot create %s: %s (is the folder writable?)", tmp, strerror(errno));
    }
    if (!rc) rc = write_full(fd, b.p, b.n, tmp);
    for (int i = 0; i < n && !rc; i++)
        rc = write_tensor(fd, tmp, &t[i], i, nb[i], (nb[i] + align - 1) / align * align, fill, ctx);
    if (!rc && ftruncate(fd, (off_t)(b.n + off))) rc = tp_error("%s: cannot set size: %s", tmp, strerror(errno));
    if (!rc && fchmod(fd, 0644)) rc = tp_error("%s: chmod failed: %s", tmp, strerror(errno));
    if (fd >= 0 && close(fd) && !rc) rc = tp_error("%s: close failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path)) rc = tp_error("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (rc && fd >= 0) unlink(tmp);
    free(tmp), free(nb), free(b.p);
    return rc;
}
