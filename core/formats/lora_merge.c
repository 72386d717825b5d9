/* The per-shard LoRA merge (core/formats/lora.h): W' = W + sum_i coef_i * B_i A_i
 * on the rows and columns of W that this rank holds.
 *
 * A rank's shard is a list of plan pieces; each piece is a rectangle of the
 * global matrix (full rows for colwise and packed colwise blocks, a column
 * band of every row for rowwise ones) placed somewhere in the local tensor.
 * For a rectangle, a segment needs only B's rows that fall in it and A's
 * columns that fall in it: a colwise shard reads its rows of B (per packed
 * block) and all of A, a rowwise shard its columns of A and all of B. These
 * pieces are read once per tensor (a cache keyed by source tensor and
 * range), converted to f32, checked for non-finite values, and the deltas
 * are added to the shard in f32 in row chunks (bounded scratch), then
 * rounded once to the tensor's dtype. */
#include "lora.h"
#include "kernels/quant.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* W scratch per chunk: 1 M floats (4 MB), the delta as much again */
#define MERGE_CHUNK_FLOATS ((int64_t)1 << 20)

typedef struct rect {
    int64_t grow0, nr, gcol0, nc;   /* global rows/cols */
    int64_t lrow0, lcol0;           /* where it sits in the local tensor */
} rect;

/* A plan piece as a rectangle: contiguous full-row ranges, or `height`
 * runs of `width` elements one global row apart (plans/plan.h). */
static rect piece_rect(const shard_info *si, const shard_piece *p) {
    int64_t gc = si->global_cols, lc = si->local_cols;
    rect r;
    if (p->height == 1 && p->width % gc == 0 && p->src_off % gc == 0) {
        r = (rect){p->src_off / gc, p->width / gc, 0, gc, p->dst_off / lc, 0};
    } else {
        r = (rect){p->src_off / gc, p->height, p->src_off % gc, p->width, p->dst_off / lc, p->dst_off % lc};
    }
    return r;
}

typedef struct piece_buf {
    const st_tensor_info *src;
    int is_a;
    int64_t off, n;                 /* A: columns [off, off+n) (stored transposed [n, r]); B: rows */
    float *data;                    /* NULL when only counting */
} piece_buf;

typedef struct merge_ctx {
    lora_set *s;
    int dry;
    piece_buf *cache;
    int n_cache, cap_cache;
    float *raw;                     /* read staging (stored dtype) */
    size_t raw_size;
} merge_ctx;

static void *grow(void *buf, size_t *size, size_t need) {
    if (need <= *size) return buf;
    free(buf);
    *size = need;
    return xmalloc(need);
}

/* a new cache entry for `bytes` of the adapter's file that widen to `floats` floats (counted in the
 * adapter's bytes read and the largest piece) */
static piece_buf *cache_push(merge_ctx *M, lora_adapter *ad, const st_tensor_info *src, int is_a, int64_t off,
                             int64_t n, size_t bytes, size_t floats) {
    ad->bytes_read += bytes;
    if (floats * sizeof(float) > M->s->max_piece) M->s->max_piece = floats * sizeof(float);
    if (M->n_cache == M->cap_cache) {
        M->cap_cache = M->cap_cache ? 2 * M->cap_cache : 8;
        M->cache = xrealloc(M->cache, (size_t)M->cap_cache * sizeof *M->cache);
    }
    piece_buf *p = &M->cache[M->n_cache++];
    *p = (piece_buf){src, is_a, off, n, NULL};
    return p;
}

static int check_finite(const lora_adapter *ad, const st_tensor_info *t, const float *v, int64_t n, int64_t first) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return tp_error("%s: key %s has a non-finite value (%g) near element %lld; the adapter file is damaged",
                            ad->path, t->name, v[i], (long long)(first + i));
    return 0;
}

/* A's columns [c0, c0+nc) as A^T [nc, r], or B's rows [b0, b0+nb) as
 * [nb, r]; from the cache when a read already covers the range. *base is
 * the first cached index, so the caller offsets by (c0 - *base). */
static const float *get_piece(merge_ctx *M, const lora_segment *g, int is_a, int64_t off, int64_t n,
                              int64_t *base) {
    const st_tensor_info *src = is_a ? g->a : g->b;
    for (int i = 0; i < M->n_cache; i++) {
        piece_buf *p = &M->cache[i];
        if (p->src == src && p->is_a == is_a && p->off <= off && off + n <= p->off + p->n) {
            *base = p->off;
            return p->data ? p->data : (const float *)p;   /* non-NULL in dry mode */
        }
    }
    lora_adapter *ad = &M->s->ad[g->adapter];
    int64_t r = g->rank, cols = src->shape[1];
    size_t es = dtype_size(src->dtype), bytes = (size_t)(n * r) * es;
    piece_buf *p = cache_push(M, ad, src, is_a, off, n, bytes, bytes / es);
    *base = off;
    if (M->dry) return (const float *)p;
    M->raw = grow(M->raw, &M->raw_size, bytes);
    float *f = xmalloc((size_t)(n * r) * sizeof *f);
    p->data = f;
    char *raw = (char *)M->raw;
    if (!is_a) {
        /* B [out, r]: rows [off, off+n) are one contiguous range */
        if (st_read_range(ad->f, src->begin + (uint64_t)(off * r) * es, raw, bytes)) goto bad_read;
        convert_to_f32(f, raw, src->dtype, (size_t)(n * r));
        if (check_finite(ad, src, f, n * r, off * r)) return NULL;
        return f;
    }
    /* A [r, in]: r runs of n columns (one read when the range is whole rows) */
    if (n == cols) {
        if (st_read_range(ad->f, src->begin, raw, bytes)) goto bad_read;
    } else {
        for (int64_t i = 0; i < r; i++)
            if (st_read_range(ad->f, src->begin + (uint64_t)(i * cols + off) * es, raw + (size_t)(i * n) * es,
                               (size_t)n * es))
                goto bad_read;
    }
    float *tmp = xmalloc((size_t)(n * r) * sizeof *tmp);
    convert_to_f32(tmp, raw, src->dtype, (size_t)(n * r));
    if (check_finite(ad, src, tmp, n * r, off)) { free(tmp); return NULL; }
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < n; j++) f[j * r + i] = tmp[i * n + j];
    free(tmp);
    return f;
bad_read:
    tp_error_context("%s: key %s", ad->path, src->name);
    return NULL;
}

static void cache_clear(merge_ctx *M) {
    for (int i = 0; i < M->n_cache; i++) free(M->cache[i].data);
    M->n_cache = 0;
}

/* Segments of tensor `name`: [*lo, *hi) of the sorted list. */
static void find_segments(const lora_set *s, const char *name, int *lo, int *hi) {
    int a = 0, b = s->n_seg;
    while (a < b) {
        int m = (a + b) / 2;
        if (strcmp(s->seg[m].tensor, name) < 0) a = m + 1;
        else b = m;
    }
    *lo = a;
    while (b < s->n_seg && !strcmp(s->seg[b].tensor, name)) b++;
    *hi = b < a ? a : b;
}

/* Rows of segment g inside global rows [r0, r0+n): [*lo, *hi). */
static int overlap(const lora_segment *g, int64_t r0, int64_t n, int64_t *lo, int64_t *hi) {
    *lo = r0 > g->row0 ? r0 : g->row0;
    *hi = r0 + n < g->row0 + g->nrows ? r0 + n : g->row0 + g->nrows;
    return *lo < *hi;
}

/* The GEMMs run on the host: the shard's own CPU backend, or for a shard
 * in device memory a CPU backend of the set's (the shard is copied down and
 * up in row chunks). */
static backend *merge_backend(lora_set *s, const tensor *t) {
    if (t->be->kind == BACKEND_CPU) return t->be;
    if (!s->merge_be) s->merge_be = backend_cpu_create(0);
    return s->merge_be;
}

/* A chunk of the shard as f32 and back. A shard in host memory (CPU
 * backend) is converted in place row by row on the rank's threads, with a
 * branch-free rounding the compiler vectorises; a device shard goes through
 * the backend's download/upload. */
static int chunk_load(const tensor *v, float *W, int threads) {
    if (v->be->kind != BACKEND_CPU || (v->dtype != DT_BF16 && v->dtype != DT_F32)) return tensor_download_f32(v, W);
    int64_t nc = v->cols;
#pragma omp parallel for num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < v->rows; i++) {
        float *d = W + i * nc;
        if (v->dtype == DT_F32) { memcpy(d, (const float *)v->data + i * v->ld, (size_t)nc * sizeof *d); continue; }
        const uint16_t *s = (const uint16_t *)v->data + i * v->ld;
        for (int64_t j = 0; j < nc; j++) {
            uint32_t u = (uint32_t)s[j] << 16;
            memcpy(&d[j], &u, 4);
        }
    }
    return 0;
}

static int chunk_store(tensor *v, const float *W, int threads) {
    if (v->be->kind != BACKEND_CPU || (v->dtype != DT_BF16 && v->dtype != DT_F32)) return tensor_upload_f32(v, W);
    int64_t nc = v->cols;
#pragma omp parallel for num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < v->rows; i++) {
        const float *s = W + i * nc;
        if (v->dtype == DT_F32) { memcpy((float *)v->data + i * v->ld, s, (size_t)nc * sizeof *s); continue; }
        uint16_t *d = (uint16_t *)v->data + i * v->ld;
        for (int64_t j = 0; j < nc; j++) {   /* round to nearest even; NaN stays a quiet NaN (f32_to_bf16) */
            uint32_t u;
            memcpy(&u, &s[j], 4);
            uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
            d[j] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
        }
    }
    return 0;
}

/* A merged weight that is not finite: name the adapters and modules that
 * touch the element (global row r, column c) of the tensor. */
static int nonfinite_error(const lora_set *s, int lo, int hi, int64_t r, int64_t c, float v) {
    char who[512];
    size_t k = 0;
    who[0] = 0;
    for (int i = lo; i < hi && k + 8 < sizeof who; i++) {
        const lora_segment *g = &s->seg[i];
        if (r < g->row0 || r >= g->row0 + g->nrows) continue;
        k += (size_t)snprintf(who + k, sizeof who - k, "%s%s (module %s, coefficient %g)", k ? ", " : "",
                              s->ad[g->adapter].path, g->module, g->coef);
    }
    return tp_error("element [%lld, %lld] is %g after the merge of %s; the adapter's values or its scale are too "
                    "large for this weight (check the file, or lower its --lora weight)", (long long)r, (long long)c,
                    (double)v, k ? who : "the adapters");
}

/* ---- LoKr, LoHa, diff: the delta of a block of rows and columns ----
 * Factors are small (a LoKr w1/w2, a LoHa's rank-r matrices) and read whole,
 * once per tensor; a diff is read by the rows the shard needs. The block is
 * computed element by element with global row and column numbers, so a
 * Kronecker product over a fused weight is right across the q/k/v and
 * gate/up boundaries and across shards (spec: kron[i,j] = w1[i/b, j/d] *
 * w2[i%b, j%d]); no full-size delta is formed. */

/* A whole tensor as f32 (is_a 2) or rows [off, off+n) of a diff (is_a 3). */
static const float *get_whole(merge_ctx *M, const lora_segment *g, const st_tensor_info *src, int is_a, int64_t off,
                              int64_t n) {
    for (int i = 0; i < M->n_cache; i++) {
        piece_buf *p = &M->cache[i];
        if (p->src == src && p->is_a == is_a && p->off <= off && off + n <= p->off + p->n)
            return p->data ? p->data + (off - p->off) * (is_a == 3 ? g->cols : 1) : (const float *)p;
    }
    lora_adapter *ad = &M->s->ad[g->adapter];
    int64_t width = is_a == 3 ? g->cols : 1, count = n * width;
    size_t es = dtype_size(src->dtype), bytes = (size_t)count * es;
    piece_buf *p = cache_push(M, ad, src, is_a, off, n, bytes, (size_t)count);
    if (M->dry) return (const float *)p;
    M->raw = grow(M->raw, &M->raw_size, bytes);
    if (st_read_range(ad->f, src->begin + (uint64_t)(off * width) * es, M->raw, bytes)) {
        tp_error_context("%s: key %s", ad->path, src->name);
        return NULL;
    }
    float *f = xmalloc((size_t)count * sizeof *f);
    p->data = f;
    convert_to_f32(f, M->raw, src->dtype, (size_t)count);
    if (check_finite(ad, src, f, count, off * width)) return NULL;
    return f;
}

static const float *get_factor(merge_ctx *M, const lora_segment *g, int k) {
    return g->x[k] ? get_whole(M, g, g->x[k], 2, 0, st_numel(g->x[k])) : NULL;
}

/* LoKr factor w1 or w2 as a full f32 matrix [*rows, *cols] (malloc'd). */
static float *lokr_w(merge_ctx *M, const lora_segment *g, int second, int64_t *rows, int64_t *cols) {
    int kw = second ? LK_W2 : LK_W1, ka = second ? LK_W2A : LK_W1A, kb = second ? LK_W2B : LK_W1B;
    if (g->x[kw]) {
        const float *w = get_factor(M, g, kw);
        if (!w) return NULL;
        *rows = g->x[kw]->shape[0], *cols = g->x[kw]->shape[1];
        float *c = xmalloc((size_t)(*rows * *cols) * sizeof *c);
        memcpy(c, w, (size_t)(*rows * *cols) * sizeof *c);
        return c;
    }
    const float *a = get_factor(M, g, ka), *b = get_factor(M, g, kb);
    if (!a || !b) return NULL;
    int64_t m = g->x[ka]->shape[0], r = g->x[ka]->shape[1], n = g->x[kb]->shape[1];
    float *c = xcalloc((size_t)(m * n), sizeof *c);
    for (int64_t i = 0; i < m; i++)
        for (int64_t k = 0; k < r; k++) {
            float v = a[i * r + k];
            for (int64_t j = 0; j < n; j++) c[i * n + j] += v * b[k * n + j];
        }
    *rows = m, *cols = n;
    return c;
}

/* Read (or, dry, count) what segment g needs for module rows [b0, b0+n). */
static int structured_prefetch(merge_ctx *M, const lora_segment *g, int64_t b0, int64_t n) {
    if (g->kind == LORA_KIND_DIFF) return get_whole(M, g, g->x[LK_W1], 3, b0, n) ? 0 : -1;
    for (int k = 0; k < LK_N; k++)
        if (g->x[k] && !get_factor(M, g, k)) return -1;
    return 0;
}

/* w [r, in] columns [c0, c0+nc) as [nc, r] (op_gemm's weight layout) */
static float *cols_t(const float *w, int64_t r, int64_t in, int64_t c0, int64_t nc) {
    float *t = xmalloc((size_t)(nc * r) * sizeof *t);
    for (int64_t k = 0; k < r; k++)
        for (int64_t j = 0; j < nc; j++) t[j * r + k] = w[k * in + c0 + j];
    return t;
}

/* LoHa block on the host backend's GEMM: (a1 b1[:, cols]) * (a2 b2[:, cols]) */
static int loha_gemm(backend *cpu, const float *a1, const float *b1, const float *a2, const float *b2, int64_t r1,
                     int64_t r2, int64_t in, int64_t n, int64_t c0, int64_t nc, float *delta, int nth) {
    float *t1 = cols_t(b1, r1, in, c0, nc), *t2 = cols_t(b2, r2, in, c0, nc), *p2 = xmalloc((size_t)(n * nc) * sizeof *p2);
    tensor x1 = tensor_wrap(cpu, DT_F32, n, r1, (void *)a1), w1 = tensor_wrap(cpu, DT_F32, nc, r1, t1);
    tensor x2 = tensor_wrap(cpu, DT_F32, n, r2, (void *)a2), w2 = tensor_wrap(cpu, DT_F32, nc, r2, t2);
    tensor y1 = tensor_wrap(cpu, DT_F32, n, nc, delta), y2 = tensor_wrap(cpu, DT_F32, n, nc, p2);
    op_gemm(cpu, &y1, &x1, &w1, NULL);
    op_gemm(cpu, &y2, &x2, &w2, NULL);
    int64_t ne = n * nc;
#pragma omp parallel for num_threads(nth) if (nth > 1 && ne > 65536)
    for (int64_t i = 0; i < ne; i++) delta[i] *= p2[i];
    free(t1), free(t2), free(p2);
    return 0;
}

/* delta [n, nc] of module rows [b0, b0+n) and global columns [c0, c0+nc). */
static int structured_block(merge_ctx *M, const lora_segment *g, int64_t b0, int64_t n, int64_t c0, int64_t nc,
                            float *delta, int nth, backend *cpu) {
    if (g->kind == LORA_KIND_DIFF) {
        const float *d = get_whole(M, g, g->x[LK_W1], 3, b0, n);
        if (!d) return -1;
        for (int64_t i = 0; i < n; i++) memcpy(delta + i * nc, d + i * g->cols + c0, (size_t)nc * sizeof *delta);
        return 0;
    }
    if (g->kind == LORA_KIND_LOKR) {
        int64_t a, c, b, d;
        float *w1 = lokr_w(M, g, 0, &a, &c), *w2 = w1 ? lokr_w(M, g, 1, &b, &d) : NULL;
        if (!w1 || !w2) { free(w1); return -1; }
#pragma omp parallel for num_threads(nth) if (nth > 1 && n * nc > 65536)
        for (int64_t i = 0; i < n; i++) {
            int64_t gi = b0 + i;
            const float *r1 = w1 + (gi / b) * c, *r2 = w2 + (gi % b) * d;
            /* columns in runs of one w1 element: delta = w1[q] * w2 row [m0, m1) */
            for (int64_t j = 0; j < nc;) {
                int64_t gj = c0 + j, q = gj / d, m0 = gj % d, len = d - m0 < nc - j ? d - m0 : nc - j;
                float v = r1[q], *dst = delta + i * nc + j;
                const float *src = r2 + m0;
                for (int64_t m = 0; m < len; m++) dst[m] = v * src[m];
                j += len;
            }
        }
        free(w1), free(w2);
        return 0;
    }
    /* LoHa: (w1a[rows] @ w1b[:, cols]) * (w2a[rows] @ w2b[:, cols]) */
    const float *w1a = get_factor(M, g, LK_W1A), *w1b = get_factor(M, g, LK_W1B), *w2a = get_factor(M, g, LK_W2A),
                *w2b = get_factor(M, g, LK_W2B);
    if (!w1a || !w1b || !w2a || !w2b) return -1;
    int64_t r1 = g->x[LK_W1A]->shape[1], r2 = g->x[LK_W2A]->shape[1], in = g->cols;
    if (cpu) return loha_gemm(cpu, w1a + b0 * r1, w1b, w2a + b0 * r2, w2b, r1, r2, in, n, c0, nc, delta, nth);
#pragma omp parallel for num_threads(nth) if (nth > 1 && n * nc > 65536)
    for (int64_t i = 0; i < n; i++) {
        float *row = delta + i * nc, *tmp = xcalloc((size_t)nc, sizeof *tmp);
        const float *a1 = w1a + (b0 + i) * r1, *a2 = w2a + (b0 + i) * r2;
        for (int64_t j = 0; j < nc; j++) row[j] = 0;
        for (int64_t k = 0; k < r1; k++)
            for (int64_t j = 0; j < nc; j++) row[j] += a1[k] * w1b[k * in + c0 + j];
        for (int64_t k = 0; k < r2; k++)
            for (int64_t j = 0; j < nc; j++) tmp[j] += a2[k] * w2b[k * in + c0 + j];
        for (int64_t j = 0; j < nc; j++) row[j] *= tmp[j];
        free(tmp);
    }
    return 0;
}

/* A weight stored fp8 or GGUF-quantised keeps its bytes: each segment's
 * part of every rectangle of the shard becomes a low-rank term of the
 * tensor (kernels/tensor.h), y += coef · B_rows (A_cols x_cols), which
 * op_gemm adds to each product. The same rows of B and columns of A are
 * read as for a merge, so a row-parallel shard's partial sums still add up
 * to the whole product in the all-reduce.
 *
 * LoKr and LoHa have low-rank forms of their own, so their block of the
 * shard is a term too, with no delta formed (docs/lora.md):
 *   LoHa  (A1 B1) ⊙ (A2 B2) = Σ_pq (A1[:,p] ⊙ A2[:,q]) (B1[p,:] ⊙ B2[q,:]):  rank r1·r2;
 *   LoKr  kron(U1 V1, U2 V2) = kron(U1, U2) · kron(V1, V2):                 rank R1·R2,
 * where a LoKr factor given as w_a·w_b is (U, V) = (w_a, w_b) and a full one
 * is (I, w) or (w, I), whichever is narrower. A block whose structured rank
 * would cost more than the block itself (a LoKr of two full factors, a diff)
 * becomes a dense term: the delta on one side and the identity on the other. */

typedef struct factor_uv {
    float *u, *v;                   /* U [rows, r], V [r, cols] (malloc'd) */
    int64_t rows, cols, r;
} factor_uv;

static float *identity(int64_t n) {
    float *e = xcalloc((size_t)(n * n), sizeof *e);
    for (int64_t i = 0; i < n; i++) e[i * n + i] = 1;
    return e;
}

/* LoKr factor w1 (second 0) or w2 as U·V */
static int lokr_uv(merge_ctx *M, const lora_segment *g, int second, factor_uv *f) {
    int kw = second ? LK_W2 : LK_W1, ka = second ? LK_W2A : LK_W1A, kb = second ? LK_W2B : LK_W1B;
    int64_t m, n, r;
    const float *a, *b;
    if (g->x[kw]) {
        if (!(a = get_factor(M, g, kw))) return -1;
        m = g->x[kw]->shape[0], n = g->x[kw]->shape[1];
        float *w = xmalloc((size_t)(m * n) * sizeof *w);
        memcpy(w, a, (size_t)(m * n) * sizeof *w);
        if (m <= n) *f = (factor_uv){identity(m), w, m, n, m};
        else *f = (factor_uv){w, identity(n), m, n, n};
        return 0;
    }
    if (!(a = get_factor(M, g, ka)) || !(b = get_factor(M, g, kb))) return -1;
    m = g->x[ka]->shape[0], r = g->x[ka]->shape[1], n = g->x[kb]->shape[1];
    float *u = xmalloc((size_t)(m * r) * sizeof *u), *v = xmalloc((size_t)(r * n) * sizeof *v);
    memcpy(u, a, (size_t)(m * r) * sizeof *u), memcpy(v, b, (size_t)(r * n) * sizeof *v);
    *f = (factor_uv){u, v, m, n, r};
    return 0;
}

/* The structured term of segment g on module rows [b0, b0+n) and global
 * columns [c0, c0+nc): *tb [n, R] (times coef) and *ta [R, nc] as host
 * arrays; 1 when the segment has no structured form worth using (the caller
 * goes dense), -1 on error. */
static int structured_term(merge_ctx *M, const lora_segment *g, int64_t b0, int64_t n, int64_t c0, int64_t nc,
                           float **tb, float **ta, int64_t *rank) {
    int64_t dense = n * nc + (n < nc ? n * n : nc * nc);
    if (g->kind == LORA_KIND_LOHA) {
        const float *a1 = get_factor(M, g, LK_W1A), *b1 = get_factor(M, g, LK_W1B), *a2 = get_factor(M, g, LK_W2A),
                    *b2 = get_factor(M, g, LK_W2B);
        if (!a1 || !b1 || !a2 || !b2) return -1;
        int64_t r1 = g->x[LK_W1A]->shape[1], r2 = g->x[LK_W2A]->shape[1], R = r1 * r2, in = g->cols;
        if (R * (n + nc) >= dense) return 1;
        float *B = xmalloc((size_t)(n * R) * sizeof *B), *A = xmalloc((size_t)(R * nc) * sizeof *A);
        for (int64_t i = 0; i < n; i++)
            for (int64_t p = 0; p < r1; p++)
                for (int64_t q = 0; q < r2; q++)
                    B[i * R + p * r2 + q] = (float)(g->coef * (a1[(b0 + i) * r1 + p] * a2[(b0 + i) * r2 + q]));
        for (int64_t p = 0; p < r1; p++)
            for (int64_t q = 0; q < r2; q++)
                for (int64_t j = 0; j < nc; j++) A[(p * r2 + q) * nc + j] = b1[p * in + c0 + j] * b2[q * in + c0 + j];
        *tb = B, *ta = A, *rank = R;
        return 0;
    }
    if (g->kind != LORA_KIND_LOKR) return 1;
    factor_uv f1, f2;
    if (lokr_uv(M, g, 0, &f1)) return -1;
    if (lokr_uv(M, g, 1, &f2)) { free(f1.u), free(f1.v); return -1; }
    int64_t R = f1.r * f2.r, b = f2.rows, d = f2.cols;
    int rc = R * (n + nc) >= dense;
    if (!rc) {
        /* B[i, p·R2+q] = U1[i/b, p]·U2[i%b, q], A[p·R2+q, j] = V1[p, j/d]·V2[q, j%d] (global i, j) */
        float *B = xmalloc((size_t)(n * R) * sizeof *B), *A = xmalloc((size_t)(R * nc) * sizeof *A);
        for (int64_t i = 0; i < n; i++) {
            int64_t gi = b0 + i;
            for (int64_t p = 0; p < f1.r; p++)
                for (int64_t q = 0; q < f2.r; q++)
                    B[i * R + p * f2.r + q] = (float)(g->coef * (f1.u[(gi / b) * f1.r + p] * f2.u[(gi % b) * f2.r + q]));
        }
        for (int64_t p = 0; p < f1.r; p++)
            for (int64_t q = 0; q < f2.r; q++)
                for (int64_t j = 0; j < nc; j++) {
                    int64_t gj = c0 + j;
                    A[(p * f2.r + q) * nc + j] = f1.v[p * f1.cols + gj / d] * f2.v[q * d + gj % d];
                }
        *tb = B, *ta = A, *rank = R;
    }
    free(f1.u), free(f1.v), free(f2.u), free(f2.v);
    return rc;
}

/* The dense form: the block's delta [n, nc] on one side, the identity on
 * the other, rank min(n, nc) */
static int dense_term(merge_ctx *M, const lora_segment *g, int64_t b0, int64_t n, int64_t c0, int64_t nc,
                      float **tb, float **ta, int64_t *rank) {
    int64_t r = n < nc ? n : nc;
    float *d = xmalloc((size_t)(n * nc) * sizeof *d);
    if (structured_block(M, g, b0, n, c0, nc, d, 1, NULL)) { free(d); return -1; }
    for (int64_t i = 0; i < n * nc; i++) d[i] = (float)(g->coef * d[i]);
    /* y += B (A x): n <= nc: A = delta [n, nc], B = I [n, n]; else A = I [nc, nc], B = delta [n, nc] */
    *ta = n <= nc ? d : identity(r);
    *tb = n <= nc ? identity(r) : d;
    *rank = r;
    return 0;
}

/* A LoKr / LoHa / diff block on a quantised weight as a term of the tensor */
static int attach_structured(merge_ctx *M, const lora_segment *g, const rect *R, int64_t a0, int64_t a1, tensor *t) {
    int64_t n = a1 - a0, nc = R->nc, b0 = g->brow0 + (a0 - g->row0), r = 0;
    if (structured_prefetch(M, g, b0, n)) return -1;
    if (M->dry) return 0;
    float *b = NULL, *a = NULL;
    int rc = structured_term(M, g, b0, n, R->gcol0, nc, &b, &a, &r);
    if (rc == 1) rc = dense_term(M, g, b0, n, R->gcol0, nc, &b, &a, &r), M->s->dense_terms++;
    else if (rc == 0) M->s->structured_terms++;
    int64_t bad = rc ? -1 : first_nonfinite_f32(b, (size_t)(n * r));
    if (bad < 0 && !rc) bad = first_nonfinite_f32(a, (size_t)(r * nc));
    if (bad >= 0)
        rc = tp_error("module %s of %s times its coefficient %g is not finite (element %lld of its term); lower its "
                      "--lora weight", g->module, M->s->ad[g->adapter].path, g->coef, (long long)bad);
    tensor *ta = rc ? NULL : tensor_new(t->be, DT_F32, r, nc), *tb = rc ? NULL : tensor_new(t->be, DT_F32, n, r);
    if (!rc && (!ta || !tb)) rc = -1;
    if (!rc) rc = tensor_upload_f32(ta, a) || tensor_upload_f32(tb, b) ? -1 : 0;
    free(a), free(b);
    if (rc) { tensor_free(ta), tensor_free(tb); return -1; }
    tensor_lowrank_add(t, R->lrow0 + (a0 - R->grow0), n, R->lcol0, nc, ta, tb);
    return 0;
}

static int attach_rects(merge_ctx *M, int lo, int hi, const shard_info *si, const shard_piece *pc, int np,
                        tensor *t) {
    for (int ip = 0; ip < np; ip++) {
        rect R = piece_rect(si, &pc[ip]);
        for (int k = lo; k < hi; k++) {
            const lora_segment *g = &M->s->seg[k];
            int64_t a0, a1, bb, ab, r = g->rank;
            if (!overlap(g, R.grow0, R.nr, &a0, &a1)) continue;
            if (g->kind != LORA_KIND_LORA) {
                if (attach_structured(M, g, &R, a0, a1, t)) return -1;
                continue;
            }
            int64_t b0 = g->brow0 + (a0 - g->row0), n = a1 - a0;
            const float *B = get_piece(M, g, 0, b0, n, &bb), *AT = get_piece(M, g, 1, R.gcol0, R.nc, &ab);
            if (!B || !AT) return -1;
            if (M->dry) continue;
            float *a = xmalloc((size_t)(r * R.nc) * sizeof *a), *b = xmalloc((size_t)(n * r) * sizeof *b);
            for (int64_t j = 0; j < R.nc; j++)   /* A^T [nc, r] back to A [r, nc] */
                for (int64_t i = 0; i < r; i++) a[i * R.nc + j] = AT[(R.gcol0 - ab + j) * r + i];
            for (int64_t i = 0; i < n * r; i++) b[i] = (float)(g->coef * B[(b0 - bb) * r + i]);
            tensor *ta = tensor_new(t->be, DT_F32, r, R.nc), *tb = tensor_new(t->be, DT_F32, n, r);
            int rc = ta && tb ? 0 : -1;
            if (!rc) rc = tensor_upload_f32(ta, a) || tensor_upload_f32(tb, b) ? -1 : 0;
            int64_t bad = first_nonfinite_f32(b, (size_t)(n * r));
            if (!rc && bad >= 0)
                rc = tp_error("module %s of %s times its coefficient %g is not finite (element %lld of B); lower its "
                              "--lora weight", g->module, M->s->ad[g->adapter].path, g->coef, (long long)bad);
            free(a), free(b);
            if (rc) {
                tensor_free(ta), tensor_free(tb);
                return -1;
            }
            tensor_lowrank_add(t, R.lrow0 + (a0 - R.grow0), n, R.lcol0, R.nc, ta, tb);
        }
    }
    return 0;
}

/* A 1-D tensor (a norm scale: `.diff` patches only) is replicated and held
 * as one row [1, n] while the plan sees n rows of one column: merge it as a
 * vector. */
static int merge_vector(merge_ctx *M, int lo, int hi, tensor *t) {
    for (int k = lo; k < hi; k++)
        if (structured_prefetch(M, &M->s->seg[k], M->s->seg[k].brow0, M->s->seg[k].nrows)) return -1;
    if (M->dry) return 0;
    int64_t n = t->rows * t->cols;
    float *W = xmalloc((size_t)n * sizeof *W), *d = NULL;
    int rc = tensor_download_f32(t, W);
    for (int k = lo; k < hi && !rc; k++) {
        const lora_segment *g = &M->s->seg[k];
        if (g->kind != LORA_KIND_DIFF || g->row0 + g->nrows > n) {
            rc = tp_error("module %s of %s: only a .diff patches a 1-D tensor", g->module, M->s->ad[g->adapter].path);
            break;
        }
        d = xrealloc(d, (size_t)g->nrows * sizeof *d);
        if (structured_block(M, g, g->brow0, g->nrows, 0, 1, d, 1, NULL)) { rc = -1; break; }
        for (int64_t i = 0; i < g->nrows; i++) W[g->row0 + i] += (float)g->coef * d[i];
    }
    int64_t bad = rc ? -1 : first_nonfinite_f32(W, (size_t)n);
    if (bad >= 0) rc = nonfinite_error(M->s, lo, hi, bad, 0, W[bad]);
    if (!rc) rc = tensor_upload_f32(t, W) ? -1 : 0;
    if (!rc && t->be->kind != BACKEND_CPU) rc = be_sync(t->be);
    free(W), free(d);
    return rc;
}

/* Merge (or, dry, count) every segment of si's tensor into the shard. */
static int merge_rects(merge_ctx *M, const st_tensor_info *ti, const shard_info *si, int tp, int rank, tensor *t) {
    int lo, hi;
    find_segments(M->s, ti->name, &lo, &hi);
    if (lo == hi) return 0;
    if (ti->ndim == 1) return merge_vector(M, lo, hi, t);
    shard_piece pc[PLAN_MAX_PIECES];
    int np = plan_shard_pieces(si, si->style == STYLE_REPLICATED ? 1 : tp, rank, pc);
    if (dtype_is_fp8(ti->dtype) || ti->dtype == DT_GGML) return attach_rects(M, lo, hi, si, pc, np, t);
    float *W = NULL, *delta = NULL;
    backend *cpu = M->dry ? NULL : merge_backend(M->s, t);
    int rc = cpu || M->dry ? 0 : tp_error("no host backend for the LoRA merge");
    int nth = cpu && cpu->threads > 0 ? cpu->threads : 1;
    for (int ip = 0; ip < np && !rc; ip++) {
        rect R = piece_rect(si, &pc[ip]);
        /* read (or find) every piece this rectangle needs first */
        for (int k = lo; k < hi && !rc; k++) {
            const lora_segment *g = &M->s->seg[k];
            int64_t a0, a1, base;
            if (!overlap(g, R.grow0, R.nr, &a0, &a1)) continue;
            if (g->kind != LORA_KIND_LORA) {
                rc = structured_prefetch(M, g, g->brow0 + (a0 - g->row0), a1 - a0);
                continue;
            }
            if (!get_piece(M, g, 0, g->brow0 + (a0 - g->row0), a1 - a0, &base) ||
                !get_piece(M, g, 1, R.gcol0, R.nc, &base))
                rc = -1;
        }
        if (rc || M->dry) continue;
        int64_t ch = MERGE_CHUNK_FLOATS / R.nc;
        if (ch < 1) ch = 1;
        if (ch > R.nr) ch = R.nr;
        if (!W) {
            W = xmalloc((size_t)(ch * R.nc) * sizeof *W);
            delta = xmalloc((size_t)(ch * R.nc) * sizeof *delta);
        } else {
            W = xrealloc(W, (size_t)(ch * R.nc) * sizeof *W);
            delta = xrealloc(delta, (size_t)(ch * R.nc) * sizeof *delta);
        }
        for (int64_t c0 = 0; c0 < R.nr && !rc; c0 += ch) {
            int64_t n = R.nr - c0 < ch ? R.nr - c0 : ch;
            tensor rows = tensor_rows(t, R.lrow0 + c0, n), view = tensor_cols(&rows, R.lcol0, R.nc);
            if (chunk_load(&view, W, nth)) { rc = -1; break; }
            for (int k = lo; k < hi; k++) {
                const lora_segment *g = &M->s->seg[k];
                int64_t a0, a1, bb, ab;
                if (!overlap(g, R.grow0 + c0, n, &a0, &a1)) continue;
                int64_t b0 = g->brow0 + (a0 - g->row0);
                if (g->kind != LORA_KIND_LORA) {
                    if (structured_block(M, g, b0, a1 - a0, R.gcol0, R.nc, delta, nth, cpu)) { rc = -1; break; }
                } else {
                    const float *B = get_piece(M, g, 0, b0, a1 - a0, &bb);
                    const float *AT = get_piece(M, g, 1, R.gcol0, R.nc, &ab);
                    tensor x = tensor_wrap(cpu, DT_F32, a1 - a0, g->rank, (void *)(B + (b0 - bb) * g->rank));
                    tensor w = tensor_wrap(cpu, DT_F32, R.nc, g->rank, (void *)(AT + (R.gcol0 - ab) * g->rank));
                    tensor y = tensor_wrap(cpu, DT_F32, a1 - a0, R.nc, delta);
                    op_gemm(cpu, &y, &x, &w, NULL);
                }
                float coef = (float)g->coef, *dst = W + (a0 - (R.grow0 + c0)) * R.nc;
                int64_t ne = (a1 - a0) * R.nc;
#pragma omp parallel for num_threads(nth) if (nth > 1 && ne > 65536)
                for (int64_t i = 0; i < ne; i++) dst[i] += coef * delta[i];
            }
            if (rc) break;
            int64_t bad = first_nonfinite_f32(W, (size_t)(n * R.nc));
            if (bad >= 0) {
                rc = nonfinite_error(M->s, lo, hi, R.grow0 + c0 + bad / R.nc, R.gcol0 + bad % R.nc, W[bad]);
                break;
            }
            if (chunk_store(&view, W, nth)) rc = -1;
        }
    }
    free(W), free(delta);
    if (!rc && !M->dry && t->be->kind != BACKEND_CPU) rc = be_sync(t->be);
    return rc;
}

int lora_merge_shard(void *set, const st_tensor_info *ti, const shard_info *si, int tp, int rank, tensor *t) {
    merge_ctx M = {.s = set};
    int rc = merge_rects(&M, ti, si, tp, rank, t);
    cache_clear(&M);
    free(M.cache), free(M.raw);
    if (rc) return tp_error_context("merging LoRA adapters into tensor '%s' (rank %d of tp %d)", ti->name,
                                    rank, tp);
    return 0;
}

int lora_estimate(const lora_set *s, const checkpoint *ck, const plan *p, int tp, int rank, uint64_t *bytes) {
    lora_set *w = (lora_set *)s;   /* counters only: saved and restored */
    uint64_t saved[LORA_MAX_ADAPTERS];
    size_t saved_piece = w->max_piece;
    for (int i = 0; i < s->n; i++) saved[i] = w->ad[i].bytes_read, w->ad[i].bytes_read = 0;
    int rc = 0;
    for (int k = 0; k < ck->n && !rc; k++) {
        shard_info si;
        if (plan_shard(p, st_plan_tensor(ck->infos[k]), tp, &si)) { rc = -1; break; }
        merge_ctx M = {.s = w, .dry = 1};
        rc = merge_rects(&M, ck->infos[k], &si, tp, rank, NULL);
        free(M.cache);
    }
    for (int i = 0; i < s->n; i++) bytes[i] = w->ad[i].bytes_read, w->ad[i].bytes_read = saved[i];
    w->max_piece = saved_piece;
    return rc;
}
