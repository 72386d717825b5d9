/* GGUF reader.
 *
 * The file is mapped read-only while its header (metadata + tensor infos)
 * is parsed; everything the handle keeps is copied out and the mapping is
 * dropped, so an open file costs its descriptor and its parsed header.
 * Tensor bytes are read with pread (gguf_read_range), as for safetensors.
 * Every length and count read from the file is checked against the bytes
 * that remain before it is used, so a hostile file fails in bounded time
 * and memory with a message that names the file and the key or tensor. */
#include "gguf.h"
#include "kernels/err.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
/* Real headers are a few MB (a 150k-token vocabulary with its merges is
 * ~10 MB); anything past this is refused before it costs memory. */
#define GGUF_MAX_HEADER (256ull << 20)
#define GGUF_MAX_TENSORS (1 << 20)
#define GGUF_MAX_KV (1 << 20)
#define GGUF_MAX_DEPTH 8            /* arrays of arrays of ... */
#define GGUF_MAX_NESTED (1 << 20)   /* gguf_values made for nested arrays, in all */
#define GGUF_MAX_NAME 4096          /* keys and tensor names (ggml itself allows 63-byte names) */
#define GGUF_MAX_ALIGN (1u << 24)
#define GGUF_MAX_NUMEL (1ull << 58) /* so that element and byte counts fit an int64 */

static const int vsize[GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

typedef struct cur {
    const uint8_t *p;
    uint64_t n, pos;         /* n: the bytes the header may use (file size, capped) */
    uint64_t file_size;
    const char *path;
    uint64_t nested;         /* nested-array values made so far */
} cur;

static int need(cur *c, uint64_t k, const char *what) {
    if (k <= c->n - c->pos) return 0;
    if (c->n < c->file_size)
        return tp_error("%s: %s at byte %llu would take the header past %llu MiB, the limit (the file is corrupt)",
                        c->path, what, (unsigned long long)c->pos, GGUF_MAX_HEADER >> 20);
    return tp_error("%s: %s at byte %llu runs past the end of the file (%llu bytes); the file is truncated or "
                    "corrupt (download it again)", c->path, what, (unsigned long long)c->pos,
                    (unsigned long long)c->file_size);
}

static uint64_t rd_le(const uint8_t *p, int k) {
    uint64_t v = 0;
    for (int i = 0; i < k; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int rd_u32(cur *c, uint32_t *v, const char *what) {
    if (need(c, 4, what)) return -1;
    *v = (uint32_t)rd_le(c->p + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cur *c, uint64_t *v, const char *what) {
    if (need(c, 8, what)) return -1;
    *v = rd_le(c->p + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* A string's length and where its bytes are, checked to lie in the file. */
static int rd_str_span(cur *c, uint64_t *len, const uint8_t **bytes, const char *what) {
    if (rd_u64(c, len, what) || need(c, *len, what)) return -1;
    *bytes = c->p + c->pos;
    c->pos += *len;
    return 0;
}

/* A key or tensor name: non-empty, bounded, no NUL, copied. */
static int rd_name(cur *c, char **out, const char *what) {
    uint64_t len;
    const uint8_t *b;
    if (rd_str_span(c, &len, &b, what)) return -1;
    if (len == 0 || len > GGUF_MAX_NAME || memchr(b, 0, len))
        return tp_error("%s: %s at byte %llu is %s (names are 1 to %d bytes without NUL); the file is corrupt",
                        c->path, what, (unsigned long long)(c->pos - len - 8),
                        len == 0 ? "empty" : len > GGUF_MAX_NAME ? "too long" : "holding a NUL byte", GGUF_MAX_NAME);
    *out = xmalloc(len + 1);
    memcpy(*out, b, len);
    (*out)[len] = 0;
    return 0;
}

static void value_free(gguf_value *v) {
    if (v->type == GGUF_STRING) free(v->str.s);
    if (v->type != GGUF_ARRAY || !v->data) return;   /* no data: it failed before its elements */
    if (v->elem == GGUF_STRING && v->n) free(((gguf_str *)v->data)[0].s);   /* one arena for all */
    if (v->elem == GGUF_ARRAY)
        for (uint64_t i = 0; i < v->n; i++) value_free(&((gguf_value *)v->data)[i]);
    free(v->data);
}

static int read_value(cur *c, int type, gguf_value *v, int depth, const char *key);

/* "WHAT of key 'KEY'" for the messages of need() */
static const char *of_key(char *buf, size_t n, const char *what, const char *key) {
    snprintf(buf, n, "%s of key '%.200s'", what, key);
    return buf;
}

/* An array of strings: the lengths are walked once to bound and size them,
 * then the bytes go into one arena (so a million tiny strings cost two
 * allocations, not a million). */
static int read_str_array(cur *c, gguf_value *v, const char *key) {
    uint64_t start = c->pos, total = 0;
    char w[280];
    if (v->n > (c->n - c->pos) / 8) return need(c, UINT64_MAX, of_key(w, sizeof w, "the string array", key));
    of_key(w, sizeof w, "a string in the array", key);   /* once: a vocabulary has ~150k strings */
    for (uint64_t i = 0; i < v->n; i++) {
        uint64_t len;
        const uint8_t *b;
        if (rd_str_span(c, &len, &b, w)) return -1;
        total += len + 1;
    }
    gguf_str *s = xcalloc(v->n ? v->n : 1, sizeof *s);
    v->data = s;
    if (!v->n) return 0;   /* no arena: value_free frees s[0].s only when n > 0 */
    char *arena = xmalloc(total);
    c->pos = start;
    for (uint64_t i = 0; i < v->n; i++) {
        uint64_t len = rd_le(c->p + c->pos, 8);
        memcpy(arena, c->p + c->pos + 8, len);
        arena[len] = 0;
        s[i].len = len, s[i].s = arena;
        arena += len + 1, c->pos += 8 + len;
    }
    return 0;
}

static int read_array(cur *c, gguf_value *v, int depth, const char *key) {
    uint32_t et;
    char w[280];
    if (rd_u32(c, &et, of_key(w, sizeof w, "the array element type", key)) ||
        rd_u64(c, &v->n, of_key(w, sizeof w, "the array length", key)))
        return -1;
    if (et >= GGUF_NTYPES)
        return tp_error("%s: key '%s': array element type %u is not a GGUF value type (0..12); the file is corrupt",
                        c->path, key, et);
    v->elem = (gguf_vtype)et;
    if (et == GGUF_STRING) return read_str_array(c, v, key);
    if (et == GGUF_ARRAY) {
        if (depth >= GGUF_MAX_DEPTH)
            return tp_error("%s: key '%s': arrays nested more than %d deep; the file is corrupt", c->path, key,
                            GGUF_MAX_DEPTH);
        /* each nested array takes at least 12 bytes (type + length) */
        if (v->n > (c->n - c->pos) / 12) return need(c, UINT64_MAX, of_key(w, sizeof w, "the nested arrays", key));
        if (v->n > GGUF_MAX_NESTED - c->nested)
            return tp_error("%s: key '%s': more than %d nested arrays in all; the file is corrupt", c->path, key,
                            GGUF_MAX_NESTED);
        c->nested += v->n;
        gguf_value *items = xcalloc(v->n ? v->n : 1, sizeof *items);
        v->data = items;
        for (uint64_t i = 0; i < v->n; i++) {
            items[i].type = GGUF_ARRAY;
            if (read_array(c, &items[i], depth + 1, key)) {
                v->n = i + 1;   /* value_free releases what was made */
                return -1;
            }
        }
        return 0;
    }
    uint64_t sz = (uint64_t)vsize[et];
    if (v->n > (c->n - c->pos) / sz) return need(c, UINT64_MAX, of_key(w, sizeof w, "the array elements", key));
    v->data = xmalloc(v->n ? v->n * sz : 1);
    memcpy(v->data, c->p + c->pos, v->n * sz);
    c->pos += v->n * sz;
    return 0;
}

static int read_value(cur *c, int type, gguf_value *v, int depth, const char *key) {
    if (type < 0 || type >= GGUF_NTYPES)
        return tp_error("%s: key '%s' has value type %d, which is not a GGUF value type (0..12); the file is corrupt",
                        c->path, key, type);
    v->type = (gguf_vtype)type;
    char w[280];
    if (type == GGUF_STRING) {
        const uint8_t *b;
        if (rd_str_span(c, &v->str.len, &b, of_key(w, sizeof w, "the string value", key))) return -1;
        v->str.s = xmalloc(v->str.len + 1);
        memcpy(v->str.s, b, v->str.len);
        v->str.s[v->str.len] = 0;
        return 0;
    }
    if (type == GGUF_ARRAY) return read_array(c, v, depth + 1, key);
    int sz = vsize[type];
    if (need(c, (uint64_t)sz, of_key(w, sizeof w, "the value", key))) return -1;
    uint64_t raw = rd_le(c->p + c->pos, sz);
    c->pos += (uint64_t)sz;
    switch (type) {
    case GGUF_I8: v->num.i = (int8_t)raw; break;
    case GGUF_I16: v->num.i = (int16_t)raw; break;
    case GGUF_I32: v->num.i = (int32_t)raw; break;
    case GGUF_I64: v->num.i = (int64_t)raw; break;
    case GGUF_F32: { uint32_t u = (uint32_t)raw; float x; memcpy(&x, &u, 4); v->num.f = x; break; }
    case GGUF_F64: memcpy(&v->num.f, &raw, 8); break;
    case GGUF_BOOL:
        if (raw > 1) return tp_error("%s: key '%s': bool value %llu is neither 0 nor 1; the file is corrupt", c->path,
                                     key, (unsigned long long)raw);
        /* fall through */
    default: v->num.u = raw;
    }
    return 0;
}

static const char *of_tensor(char *buf, size_t n, const char *what, const char *name) {
    snprintf(buf, n, "%s of tensor '%.200s'", what, name);
    return buf;
}

static int cmp_kv(const void *a, const void *b) {
    return strcmp(((const gguf_kv *)a)->key, ((const gguf_kv *)b)->key);
}

/* Keys sorted for the duplicate check live in a copy: the handle keeps
 * file order (what inspect shows). */
static int check_kv(gguf_file *f) {
    gguf_kv *s = xmalloc((size_t)(f->n_kv ? f->n_kv : 1) * sizeof *s);
    memcpy(s, f->kv, (size_t)f->n_kv * sizeof *s);
    qsort(s, (size_t)f->n_kv, sizeof *s, cmp_kv);
    int rc = 0;
    for (int i = 1; i < f->n_kv && !rc; i++)
        if (!strcmp(s[i - 1].key, s[i].key))
            rc = tp_error("%s: metadata key '%s' appears twice; the file is corrupt", f->path, s[i].key);
    free(s);
    if (rc) return rc;
    const gguf_kv *a = gguf_find_kv(f, "general.alignment");
    f->alignment = 32;
    if (a) {
        int isint = a->v.type <= GGUF_I32 || a->v.type == GGUF_U64 || a->v.type == GGUF_I64;
        uint64_t al = a->v.type == GGUF_I8 || a->v.type == GGUF_I16 || a->v.type == GGUF_I32 || a->v.type == GGUF_I64
                          ? (a->v.num.i < 0 ? 0 : (uint64_t)a->v.num.i) : a->v.num.u;
        if (!isint || a->v.type == GGUF_BOOL || al == 0 || (al & (al - 1)) || al > GGUF_MAX_ALIGN)
            return tp_error("%s: general.alignment must be a power of two from 1 to %u (got a %s%s); the file is "
                            "corrupt", f->path, GGUF_MAX_ALIGN, gguf_vtype_name(a->v.type),
                            isint ? " outside that range" : "");
        f->alignment = (uint32_t)al;
    }
    return 0;
}

static int read_tensor_info(cur *c, gguf_file *f, int idx, gguf_tensor *t) {
    char what[64], w[280];
    snprintf(what, sizeof what, "the name of tensor #%d", idx);
    if (rd_name(c, &t->name, what)) return -1;
    uint32_t nd, type;
    if (rd_u32(c, &nd, of_tensor(w, sizeof w, "the dimension count", t->name))) return -1;
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return tp_error("%s: tensor '%s' has %u dimensions (1 to %d are allowed); the file is corrupt", f->path,
                        t->name, nd, GGUF_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (int i = 0; i < GGUF_MAX_DIMS; i++) t->ne[i] = 1;
    for (uint32_t i = 0; i < nd; i++) {
        uint64_t d;
        if (rd_u64(c, &d, of_tensor(w, sizeof w, "a dimension", t->name))) return -1;
        if (d == 0 || d > GGUF_MAX_NUMEL / numel)
            return tp_error("%s: tensor '%s': dimension %u is %llu%s; the file is corrupt", f->path, t->name, i,
                            (unsigned long long)d, d == 0 ? "" : ", making more than 2^58 elements");
        numel *= d;
        t->ne[i] = (int64_t)d;
    }
    for (int i = 0; i < t->ndim; i++) t->shape[i] = t->ne[t->ndim - 1 - i];
    for (int i = t->ndim; i < GGUF_MAX_DIMS; i++) t->shape[i] = 1;
    if (rd_u32(c, &type, of_tensor(w, sizeof w, "the type", t->name))) return -1;
    t->type = (int)type;
    t->qt = quant_type_get((int)type);
    if (!t->qt)
        return tp_error("%s: tensor '%s' has ggml type id %u, which no ggml version known to tpgen defines (the file "
                        "is corrupt, or newer than tpgen; supported types: %s)", f->path, t->name, type,
                        quant_supported_list());
    int64_t rb = quant_row_bytes(t->qt, t->ne[0]);
    if (rb < 0)
        return tp_error("%s: tensor '%s': its rows of %lld elements are not whole %s blocks of %d; the file is "
                        "corrupt", f->path, t->name, (long long)t->ne[0], t->qt->name, t->qt->block);
    t->row_len = t->ne[0];
    t->rows = (int64_t)(numel / (uint64_t)t->ne[0]);
    t->row_bytes = (uint64_t)rb;
    uint64_t off;
    if (rd_u64(c, &off, of_tensor(w, sizeof w, "the offset", t->name))) return -1;
    if (off % f->alignment)
        return tp_error("%s: tensor '%s': offset %llu is not a multiple of the alignment %u; the file is corrupt",
                        f->path, t->name, (unsigned long long)off, f->alignment);
    t->begin = off;   /* made absolute (and end set) once the data section's start is known */
    return 0;
}

static int cmp_begin(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const gguf_tensor *const *)a)->name, (*(const gguf_tensor *const *)b)->name);
}

/* Offsets made absolute and checked: inside the file, no overlaps, names unique. */
static int place_tensors(gguf_file *f) {
    uint64_t area = f->file_size - f->data0;
    for (int i = 0; i < f->n; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t off = t->begin, nb = (uint64_t)t->rows * t->row_bytes;
        if (off > area || nb > area - off)
            return tp_error("%s: tensor '%s': bytes [%llu, %llu) of the data section lie outside it (%llu bytes); "
                            "the file is truncated or corrupt", f->path, t->name, (unsigned long long)off,
                            (unsigned long long)(off + nb), (unsigned long long)area);
        t->begin = f->data0 + off;
        t->end = t->begin + nb;
    }
    int rc = 0;
    const gguf_tensor **by = xmalloc((size_t)(f->n ? f->n : 1) * sizeof *by);
    for (int i = 0; i < f->n; i++) by[i] = &f->tensors[i];
    qsort(by, (size_t)f->n, sizeof *by, cmp_begin);
    for (int i = 1; i < f->n && !rc; i++)
        if (by[i]->begin < by[i - 1]->end)   /* tensors are never empty, so sorted neighbours suffice */
            rc = tp_error("%s: tensors '%s' and '%s' overlap in the data section; the file is corrupt", f->path,
                          by[i - 1]->name, by[i]->name);
    free(by);
    /* the name index: tensors sorted by name (pointers, turned into indices) */
    const gguf_tensor **nm = xmalloc((size_t)(f->n ? f->n : 1) * sizeof *nm);
    for (int i = 0; i < f->n; i++) nm[i] = &f->tensors[i];
    qsort(nm, (size_t)f->n, sizeof *nm, cmp_name);
    f->by_name = xmalloc((size_t)(f->n ? f->n : 1) * sizeof(int));
    for (int i = 0; i < f->n; i++) f->by_name[i] = (int)(nm[i] - f->tensors);
    for (int i = 1; i < f->n && !rc; i++)
        if (!strcmp(nm[i - 1]->name, nm[i]->name))
            rc = tp_error("%s: tensor '%s' appears twice; the file is corrupt", f->path, nm[i]->name);
    free(nm);
    return rc;
}

static int parse(gguf_file *f, const uint8_t *p) {
    cur c = {p, f->file_size < GGUF_MAX_HEADER ? f->file_size : GGUF_MAX_HEADER, 0, f->file_size, f->path, 0};
    if (f->file_size < 4 || memcmp(p, GGUF_MAGIC, 4))
        return tp_error("%s: not a GGUF file (it does not start with \"GGUF\")", f->path);
    uint64_t nt, nkv;
    c.pos = 4;
    if (rd_u32(&c, &f->version, "the version")) return -1;
    if (f->version == 1)
        return tp_error("%s: GGUF version 1 is not supported (only 2 and 3); convert it again with a current "
                        "llama.cpp or gguf-py", f->path);
    if (f->version == 0x02000000u || f->version == 0x03000000u)
        return tp_error("%s: a big-endian GGUF file; tpgen reads little-endian GGUF only", f->path);
    if (f->version != 2 && f->version != 3)
        return tp_error("%s: GGUF version %u is not supported (only 2 and 3)", f->path, f->version);
    if (rd_u64(&c, &nt, "the tensor count") || rd_u64(&c, &nkv, "the metadata key count")) return -1;
    /* a tensor info takes at least 33 bytes, a key-value pair at least 14 */
    if (nt > GGUF_MAX_TENSORS || nt > (c.n - c.pos) / 33)
        return tp_error("%s: the header claims %llu tensors, more than %s; the file is corrupt", f->path,
                        (unsigned long long)nt, nt > GGUF_MAX_TENSORS ? "the limit of 1048576" : "the file can hold");
    if (nkv > GGUF_MAX_KV || nkv > (c.n - c.pos) / 14)
        return tp_error("%s: the header claims %llu metadata keys, more than %s; the file is corrupt", f->path,
                        (unsigned long long)nkv, nkv > GGUF_MAX_KV ? "the limit of 1048576" : "the file can hold");
    f->kv = xcalloc(nkv ? nkv : 1, sizeof *f->kv);
    for (uint64_t i = 0; i < nkv; i++) {
        gguf_kv *kv = &f->kv[i];
        uint32_t type;
        char what[64];
        snprintf(what, sizeof what, "metadata key #%llu", (unsigned long long)i);
        if (rd_name(&c, &kv->key, what)) return -1;
        f->n_kv++;
        char w[280];
        if (rd_u32(&c, &type, of_key(w, sizeof w, "the value type", kv->key))) return -1;
        if (read_value(&c, (int)type, &kv->v, 0, kv->key)) return -1;
    }
    if (check_kv(f)) return -1;
    f->tensors = xcalloc(nt ? nt : 1, sizeof *f->tensors);
    for (uint64_t i = 0; i < nt; i++) {
        f->n++;
        if (read_tensor_info(&c, f, (int)i, &f->tensors[i])) return -1;
    }
    uint64_t a = f->alignment;
    f->data0 = (c.pos + a - 1) / a * a;
    if (f->data0 > f->file_size) {
        if (nt) return tp_error("%s: the file ends before its data section (truncated)", f->path);
        f->data0 = f->file_size;
    }
    return place_tensors(f);
}

int gguf_open_mem(const void *data, size_t n, const char *name, gguf_file **out) {
    gguf_file *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(name);
    f->fd = -1;
    f->mem = data;
    f->file_size = n;
    *out = NULL;
    if (parse(f, data)) {
        gguf_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

int gguf_open(const char *path, gguf_file **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tp_error("%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tp_error("%s: not a regular file", path);
    }
    gguf_file *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    f->fd = fd;
    f->file_size = (uint64_t)sb.st_size;
    /* only the header is mapped (its extent is unknown until parsed, so at
     * most the limit); an empty file has nothing to map */
    size_t maplen = (size_t)(f->file_size < GGUF_MAX_HEADER ? f->file_size : GGUF_MAX_HEADER);
    static const uint8_t none[1];
    const uint8_t *p = none;
    if (maplen) {
        void *m = mmap(NULL, maplen, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            gguf_close(f);
            return tp_error("%s: cannot map the file: %s", path, strerror(e));
        }
        p = m;
    }
    int rc = parse(f, p);
    if (maplen) munmap((void *)p, maplen);
    if (rc) {
        gguf_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n_kv; i++) {
        free(f->kv[i].key);
        value_free(&f->kv[i].v);
    }
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
}

int gguf_is_gguf(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char m[4];
    int ok = pread(fd, m, 4, 0) == 4 && !memcmp(m, GGUF_MAGIC, 4);
    close(fd);
    return ok;
}
