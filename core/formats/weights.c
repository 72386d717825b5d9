/* Sharded weight loading: each rank reads the byte ranges of its own shard
 * (plan_shard_pieces) straight into backend memory. A tensor kept in its
 * stored dtype goes through the backend's upload_file (CPU: pread into
 * place; CUDA: pread into its pinned ring, overlapped with the DMA);
 * tensors that need a dtype conversion pass through a host staging buffer
 * bounded by the staging cap, in batches of whole runs. Either way no rank
 * ever holds a full-size host copy of a sharded tensor. */
#include "weights.h"
#include "kernels/err.h"
#include "fp8.h"
#include "gguf_shard.h"
#include "kernels/quant.h"
#include "kernels/ops.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct wentry {
    st_tensor_info info;        /* copy: the weights outlive the checkpoint */
    tensor *t;
} wentry;

struct weights {
    char *dir;
    int n;
    wentry *e;                  /* sorted by name */
};

typedef struct loader {
    const checkpoint *c;
    const load_opts *o;
    load_stats *st;
    size_t cap;
    char *raw;                  /* staging: bytes as stored */
    char *conv;                 /* staging: converted to the target dtype */
    float *f32;                 /* conversion scratch for targets other than f32 */
    size_t raw_size, conv_size, f32_size;
    const char **maps;          /* mmap of each file (use_mmap) */
} loader;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int is_float(dtype_t d) { return d == DT_F32 || d == DT_BF16 || d == DT_F16 || d == DT_F64; }

static void *grow(char **buf, size_t *size, size_t need) {
    if (need > *size) {
        free(*buf);
        *buf = xmalloc(need);
        *size = need;
    }
    return *buf;
}

/* Read n bytes at absolute offset off of file fi into dst. Thread-safe
 * (pread, or a copy from a mapping made before any read). */
static int read_bytes(loader *L, int fi, uint64_t off, void *dst, size_t n) {
    const st_file *f = L->c->files[fi];
    if (!L->o->use_mmap) return st_read_range(f, off, dst, n);
    memcpy(dst, L->maps[fi] + off, n);
    return 0;
}

static int map_files(loader *L) {
    for (int i = 0; L->o->use_mmap && i < L->c->n_files; i++) {
        const st_file *f = L->c->files[i];
        void *m = mmap(NULL, f->file_size, PROT_READ, MAP_PRIVATE, f->fd, 0);
        if (m == MAP_FAILED) return tp_error("%s: mmap failed (load without mmap)", f->path);
        L->maps[i] = m;
    }
    return 0;
}

/* Convert n elements from the stored dtype to the target dtype (host). */
static void convert(loader *L, void *dst, dtype_t to, const void *src, dtype_t from, size_t n) {
    if (to == from) { memcpy(dst, src, n * dtype_size(to)); return; }
    if (to == DT_F32) { convert_to_f32(dst, src, from, n); return; }
    if (to == DT_BF16 && from == DT_F32) { convert_from_f32(dst, to, src, n); return; }
    float *tmp = (float *)grow((char **)&L->f32, &L->f32_size, n * sizeof(float));
    convert_to_f32(tmp, src, from, n);
    convert_from_f32(dst, to, tmp, n);
}

/* File path (stored dtype): the backend reads the piece's runs itself. */
static int piece_file(loader *L, int fi, const st_tensor_info *ti, const shard_piece *p, tensor *t) {
    const st_file *f = L->c->files[fi];
    size_t s = dtype_size(ti->dtype);
    if (t->be->vt->upload_file(t->be, (char *)t->data + (size_t)p->dst_off * s, (size_t)p->dst_pitch * s, f->fd,
                               ti->begin + (uint64_t)p->src_off * s, (size_t)p->src_pitch * s, (size_t)p->width * s,
                               (size_t)p->height))
        return tp_error_context("%s", f->path);
    return 0;
}

/* Mapped path (CPU backend, stored dtype, use_mmap): runs copied in place. */
static int piece_mapped(loader *L, int fi, const st_tensor_info *ti, const shard_piece *p, tensor *t) {
    size_t s = dtype_size(ti->dtype);
    for (int64_t r = 0; r < p->height; r++)
        if (read_bytes(L, fi, ti->begin + (uint64_t)(p->src_off + r * p->src_pitch) * s,
                       (char *)t->data + (p->dst_off + r * p->dst_pitch) * s, (size_t)p->width * s))
            return -1;
    return 0;
}

/* Staged path: batches of runs (or chunks of one long run) through the
 * bounded staging buffers, converted, then uploaded by the backend. */
static int piece_staged(loader *L, int fi, const st_tensor_info *ti, const shard_piece *p, tensor *t) {
    size_t ss = dtype_size(ti->dtype), ds = dtype_size(t->dtype);
    size_t cap_el = L->cap / (ss > ds ? ss : ds);
    if (cap_el == 0) cap_el = 1;
    backend *be = t->be;
    int64_t chunk = (int64_t)cap_el < p->width ? (int64_t)cap_el : p->width;   /* elements per read */
    int64_t rows = chunk < p->width ? 1 : (int64_t)cap_el / p->width;          /* runs per batch */
    for (int64_t r0 = 0; r0 < p->height; r0 += rows) {
        int64_t nr = p->height - r0 < rows ? p->height - r0 : rows;
        for (int64_t e0 = 0; e0 < p->width; e0 += chunk) {
            int64_t ne = p->width - e0 < chunk ? p->width - e0 : chunk;
            char *raw = grow(&L->raw, &L->raw_size, (size_t)(ne * nr) * ss);
            for (int64_t r = 0; r < nr; r++)
                if (read_bytes(L, fi, ti->begin + (uint64_t)(p->src_off + (r0 + r) * p->src_pitch + e0) * ss,
                               raw + (size_t)(r * ne) * ss, (size_t)ne * ss))
                    return -1;
            char *src = raw;
            if (t->dtype != ti->dtype) {
                src = grow(&L->conv, &L->conv_size, (size_t)(ne * nr) * ds);
                convert(L, src, t->dtype, raw, ti->dtype, (size_t)(ne * nr));
            }
            char *dst = (char *)t->data + (size_t)(p->dst_off + r0 * p->dst_pitch + e0) * ds;
            int rc = nr == 1 ? be->vt->upload(be, dst, src, (size_t)ne * ds)
                             : be->vt->upload2d(be, dst, (size_t)p->dst_pitch * ds, src, (size_t)ne * ds,
                                                (size_t)ne * ds, (size_t)nr);
            if (rc) return -1;
        }
    }
    /* the staging buffers are reused by the next tensor; CUDA uploads from
     * them must finish first */
    return be->vt->sync(be);
}

typedef enum { PATH_STAGED, PATH_FILE, PATH_MAPPED } load_path;

/* One tensor to load: its shard and where it goes. */
typedef struct job {
    int k;                      /* index in the checkpoint */
    wentry *e;
    shard_info si;
    load_path path;
    int threaded;               /* CPU backend, no staging: on the reader threads */
    int quantize;               /* --quantize fp8: read as stored, then quantised */
    int ggml;                   /* a GGUF block tensor: q's byte runs, read as stored */
    qshard q;
} job;

/* Stored dtype: the backend reads the file itself (or, on the CPU with
 * use_mmap, copies from the mapping); a conversion needs staging. */
static load_path pick_path(const loader *L, dtype_t stored, dtype_t target) {
    backend *be = L->o->be;
    if (stored != target) return PATH_STAGED;
    if (L->o->use_mmap) return be->kind == BACKEND_CPU ? PATH_MAPPED : PATH_STAGED;
    return be->vt->upload_file ? PATH_FILE : PATH_STAGED;
}

/* A GGUF block tensor stays quantised: the local tensor holds the shard's
 * covering blocks (gguf_shard.h), read in place: on the CPU on the reader
 * threads (pread or from the mapping), on CUDA by the backend's 2-D
 * upload_file from the calling thread (its GEMM decodes the blocks,
 * kernels/cuda/cuda_ggml.cu). */
static int prepare_ggml(loader *L, const st_tensor_info *ti, wentry *e, job *j) {
    backend *be = L->o->be;
    if ((be->kind != BACKEND_CPU && be->kind != BACKEND_CUDA) || !be->vt->upload_file || !be->vt->gemm)
        return tp_error("tensor '%s' is quantised (GGUF %s): the %s backend cannot hold quantised weights (it needs "
                        "upload_file and a GEMM on GGUF blocks; use --backend cpu or cuda, or a bf16 checkpoint)",
                        ti->name, quant_type_name(ti->qtype), be->vt->name);
    if (qshard_plan(ti, &j->si, L->o->tp, L->o->rank, &j->q)) return -1;
    e->t = tensor_new_ggml(be, ti->qtype, j->si.local_rows, j->si.local_cols, j->q.pitch, j->q.seg, j->q.n_seg);
    if (!e->t) return tp_error_context("tensor '%s'", ti->name);
    j->ggml = 1;
    j->path = L->o->use_mmap && be->kind == BACKEND_CPU ? PATH_MAPPED : PATH_FILE;
    j->threaded = be->kind == BACKEND_CPU;
    L->st->bytes_held += tensor_nbytes(e->t);
    return 0;
}

/* the byte runs of a GGUF block tensor's shard */
static int read_ggml(loader *L, const job *j, uint64_t *bytes) {
    int fi = L->c->file_of[j->k];
    const st_file *f = L->c->files[fi];
    tensor *t = j->e->t;
    for (int i = 0; i < j->q.n_run; i++) {
        const qshard_run *r = &j->q.run[i];
        char *dst = (char *)t->data + r->dst;
        if (j->path == PATH_MAPPED) {
            for (int64_t h = 0; h < r->height; h++)
                memcpy(dst + (size_t)h * r->dst_pitch, L->maps[fi] + r->src + (uint64_t)h * r->src_pitch, r->len);
        } else if (t->be->vt->upload_file(t->be, dst, r->dst_pitch, f->fd, r->src, (size_t)r->src_pitch, r->len,
                                          (size_t)r->height)) {
            return tp_error_context("%s", f->path);
        }
    }
    *bytes = j->q.bytes;
    return 0;
}

/* Plan the shard and allocate the local tensor (serial: backends count
 * their bytes without locks). */
static int prepare(loader *L, int k, wentry *e, const plan *p, job *j) {
    const st_tensor_info *ti = L->c->infos[k];
    if (plan_shard(p, st_plan_tensor(ti), p ? L->o->tp : 1, &j->si)) return -1;
    if (ti->dtype == DT_GGML) {
        e->info = *ti;
        e->info.name = xstrdup(ti->name);
        j->k = k, j->e = e;
        return prepare_ggml(L, ti, e, j);
    }
    dtype_t dt = is_float(ti->dtype) ? L->o->dtype : ti->dtype;
    j->quantize = L->o->quantize_fp8 && fp8_quantize_eligible(ti, &j->si);
    if (j->quantize) dt = ti->dtype;   /* no upcast of what becomes fp8 */
    e->info = *ti;
    e->info.name = xstrdup(ti->name);
    e->t = tensor_new(L->o->be, dt, j->si.local_rows, j->si.local_cols);
    if (!e->t) return tp_error_context("tensor '%s'", ti->name);
    j->k = k, j->e = e;
    j->path = pick_path(L, ti->dtype, dt);
    j->threaded = L->o->be->kind == BACKEND_CPU && j->path != PATH_STAGED;
    L->st->bytes_held += tensor_nbytes(e->t);
    /* fp8 weights stay fp8; their scales (this rank's rows) ride on the tensor */
    uint64_t sb;
    if (fp8_attach_scale(L->c, k, &j->si, L->o->tp, L->o->rank, e->t, &sb)) return tp_error_context("tensor '%s'", ti->name);
    L->st->bytes_held += sb;
    return 0;
}

/* Read a job's pieces; *bytes = bytes read from the file. */
static int read_job(loader *L, const job *j, uint64_t *bytes) {
    const st_tensor_info *ti = L->c->infos[j->k];
    if (j->ggml) return read_ggml(L, j, bytes) ? tp_error_context("reading tensor '%s'", ti->name) : 0;
    shard_piece pc[PLAN_MAX_PIECES];
    int np = plan_shard_pieces(&j->si, L->o->tp, L->o->rank, pc);
    *bytes = 0;
    static int (*const piece_fn[])(loader *, int, const st_tensor_info *, const shard_piece *, tensor *) = {
        [PATH_STAGED] = piece_staged, [PATH_FILE] = piece_file, [PATH_MAPPED] = piece_mapped};
    for (int i = 0; i < np; i++) {
        if (piece_fn[j->path](L, L->c->file_of[j->k], ti, &pc[i], j->e->t))
            return tp_error_context("reading tensor '%s'", ti->name);
        *bytes += (uint64_t)(pc[i].width * pc[i].height) * dtype_size(ti->dtype);
    }
    return 0;
}

static void count(load_stats *st, const job *j, uint64_t bytes) {
    st->bytes_read += bytes;
    if (j->si.style == STYLE_REPLICATED) st->bytes_replicated += bytes;
    else st->bytes_sharded += bytes;
}

/* Jobs that share the staging buffers or a device's copy engine run one
 * after the other on the calling thread (CUDA calls come from the thread
 * that made the backend); CPU-backend reads in place run on io_threads
 * threads. A final sync makes the backend's last copies complete. */
static int read_all(loader *L, const job *jobs, int n) {
    for (int i = 0; i < n; i++) {
        uint64_t b;
        if (!jobs[i].threaded && read_job(L, &jobs[i], &b)) return -1;
        if (!jobs[i].threaded) count(L->st, &jobs[i], b);
    }
    if (L->o->be->vt->sync(L->o->be)) return -1;
    int nt = L->o->io_threads > 0 ? L->o->io_threads : WEIGHTS_IO_THREADS, failed = 0;
    uint64_t *got = xcalloc((size_t)(n ? n : 1), sizeof *got);
    char msg[4096] = "";
    /* tp_error's message is per thread: the first failure is carried out */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int i = 0; i < n; i++) {
        int stop;
#pragma omp atomic read
        stop = failed;
        if (stop || !jobs[i].threaded || read_job(L, &jobs[i], &got[i]) == 0) continue;
#pragma omp critical(weights_read_error)
        if (!failed) {
            snprintf(msg, sizeof msg, "%s", tp_error_msg());
#pragma omp atomic write
            failed = 1;
        }
    }
    for (int i = 0; i < n && !failed; i++)
        if (jobs[i].threaded) count(L->st, &jobs[i], got[i]);
    free(got);
    return failed ? tp_error("%s", msg) : 0;
}

/* file, then offset: reads move forward through each file (qsort_r: the
 * checkpoint is the context, not a global) */
static int cmp_file_order(const void *a, const void *b, void *ctx) {
    int i = *(const int *)a, j = *(const int *)b;
    const checkpoint *c = ctx;
    if (c->file_of[i] != c->file_of[j]) return c->file_of[i] - c->file_of[j];
    return c->infos[i]->begin < c->infos[j]->begin ? -1 : c->infos[i]->begin > c->infos[j]->begin;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const wentry *)a)->info.name, ((const wentry *)b)->info.name);
}

static void loader_done(loader *L) {
    for (int i = 0; L->maps && i < L->c->n_files; i++)
        if (L->maps[i]) munmap((void *)L->maps[i], L->c->files[i]->file_size);
    free(L->maps), free(L->raw), free(L->conv), free(L->f32);
}

int weights_load(const checkpoint *c, const plan *p, const load_opts *o, weights **out, load_stats *st) {
    *out = NULL;
    load_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    double t0 = now_s();
    if (o->tp < 1 || o->rank < 0 || o->rank >= o->tp) return tp_error("bad shard: rank %d of tp %d", o->rank, o->tp);
    if (o->dtype != DT_F32 && o->dtype != DT_BF16) return tp_error("weights can be loaded as F32 or BF16 only");
    if (p && checkpoint_validate_plan(c, p, o->tp)) return -1;
    loader L = {.c = c, .o = o, .st = st, .cap = o->staging_cap ? o->staging_cap : WEIGHTS_STAGING_CAP};
    L.maps = xcalloc((size_t)c->n_files, sizeof *L.maps);
    int *order = xmalloc((size_t)(c->n ? c->n : 1) * sizeof *order);
    for (int k = 0; k < c->n; k++) order[k] = k;
    qsort_r(order, (size_t)c->n, sizeof *order, cmp_file_order, (void *)c);
    weights *w = xcalloc(1, sizeof *w);
    w->dir = xstrdup(c->dir);
    w->e = xcalloc((size_t)(c->n ? c->n : 1), sizeof *w->e);
    job *jobs = xcalloc((size_t)(c->n ? c->n : 1), sizeof *jobs);
    int rc = map_files(&L);
    for (int i = 0; i < c->n && !rc; i++) {
        int k = order[i];
        if (o->want && !o->want(c->infos[k]->name, o->want_ctx)) continue;
        rc = prepare(&L, k, &w->e[w->n], p, &jobs[w->n]);
        if (w->e[w->n].info.name) w->n++;   /* partly built entries are freed below */
    }
    if (!rc) rc = read_all(&L, jobs, w->n);
    for (int i = 0; i < w->n && !rc && o->transform; i++)
        rc = o->transform(o->transform_ctx, &w->e[i].info, &jobs[i].si, o->tp, o->rank, w->e[i].t);
    for (int i = 0; i < w->n && !rc; i++) {
        if (!jobs[i].quantize) continue;
        tensor *t = w->e[i].t;
        st->bytes_held -= tensor_nbytes(t);
        rc = fp8_quantize_tensor(t, w->e[i].info.name);
        st->bytes_held += tensor_nbytes(t) + (uint64_t)t->rows * sizeof(float);
    }
    st->max_staging = L.raw_size + L.conv_size + L.f32_size;
    loader_done(&L);
    free(order), free(jobs);
    if (rc) {
        weights_free(w);
        return tp_error_context("loading %s (rank %d of tp %d)", c->dir, o->rank, o->tp);
    }
    qsort(w->e, (size_t)w->n, sizeof *w->e, cmp_entry);
    st->n_tensors = w->n;
    st->seconds = now_s() - t0;
    *out = w;
    return 0;
}

int weights_estimate(const checkpoint *c, const plan *p, int tp, int rank, load_estimate *out) {
    return weights_estimate_want(c, p, tp, rank, NULL, NULL, out);
}

int weights_estimate_want(const checkpoint *c, const plan *p, int tp, int rank,
                          int (*want)(const char *name, void *ctx), void *want_ctx, load_estimate *out) {
    memset(out, 0, sizeof *out);
    if (checkpoint_validate_plan(c, p, tp)) return -1;
    for (int k = 0; k < c->n; k++) {
        if (want && !want(c->infos[k]->name, want_ctx)) continue;
        shard_info si;
        if (plan_shard(p, st_plan_tensor(c->infos[k]), tp, &si)) return -1;
        shard_piece pc[PLAN_MAX_PIECES];
        int np = plan_shard_pieces(&si, tp, rank, pc);
        uint64_t bytes = 0;
        if (c->infos[k]->dtype == DT_GGML) {   /* the covering blocks, as read and held */
            qshard q;
            if (qshard_plan(c->infos[k], &si, tp, rank, &q)) return -1;
            bytes = q.bytes, np = 0;
        }
        for (int j = 0; j < np; j++) bytes += (uint64_t)(pc[j].width * pc[j].height) * dtype_size(c->infos[k]->dtype);
        bytes += fp8_scale_bytes(c, k, &si, tp);   /* fp8 scales held with the weight */
        if (si.style == STYLE_REPLICATED) out->bytes_replicated += bytes;
        else out->bytes_sharded += bytes, out->n_sharded++;
        if (bytes > out->max_local_tensor) out->max_local_tensor = bytes;
        out->n_tensors++;
    }
    out->max_staging = out->max_local_tensor < WEIGHTS_STAGING_CAP ? out->max_local_tensor : WEIGHTS_STAGING_CAP;
    return 0;
}

static const wentry *find(const weights *w, const char *name) {
    st_tensor_info key = {.name = (char *)name};
    wentry ke = {.info = key};
    return bsearch(&ke, w->e, (size_t)w->n, sizeof *w->e, cmp_entry);
}

const tensor *weights_get(const weights *w, const char *name) {
    const wentry *e = find(w, name);
    return e ? e->t : NULL;
}

const st_tensor_info *weights_info(const weights *w, const char *name) {
    const wentry *e = find(w, name);
    return e ? &e->info : NULL;
}

const tensor *weights_req(const weights *w, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const tensor *t = weights_get(w, name);
    if (!t) tp_error("tensor '%s' missing from %s (wrong model folder, or a filter skipped it)", name, w->dir);
    return t;
}

int weights_count(const weights *w) { return w->n; }
const char *weights_name(const weights *w, int i) { return w->e[i].info.name; }

void weights_free(weights *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        tensor_free(w->e[i].t);
        free(w->e[i].info.name);
    }
    free(w->e), free(w->dir);
    free(w);
}
