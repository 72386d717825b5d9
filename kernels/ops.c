/* Dispatch from the op interface to the backend's vtable, plus the
 * host<->tensor helpers shared by all backends. */
#include "ops.h"
#include "err.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

void backend_destroy(backend *be) {
    if (be && be->vt->destroy) be->vt->destroy(be);
}

int be_upload_file(backend *be, void *dst, size_t dpitch, int fd, uint64_t off, size_t spitch, size_t width,
                   size_t height) {
    if (!be->vt->upload_file) return tp_error("backend %s cannot read files directly (no upload_file)", be->vt->name);
    return be->vt->upload_file(be, dst, dpitch, fd, off, spitch, width, height);
}

int tensor_upload_raw(tensor *t, const void *host) {
    size_t es = dtype_size(t->dtype), w = (size_t)t->cols * es;
    if (tensor_contiguous(t)) return be_upload(t->be, t->data, host, w * (size_t)t->rows);
    return t->be->vt->upload2d(t->be, t->data, (size_t)t->ld * es, host, w, w, (size_t)t->rows);
}

int tensor_download_raw(const tensor *t, void *host) {
    size_t es = dtype_size(t->dtype), w = (size_t)t->cols * es;
    if (tensor_contiguous(t)) return be_download(t->be, host, t->data, w * (size_t)t->rows);
    for (int64_t r = 0; r < t->rows; r++)
        if (be_download(t->be, (char *)host + (size_t)r * w, (char *)t->data + (size_t)r * t->ld * es, w)) return -1;
    return 0;
}

int tensor_upload_f32(tensor *t, const float *host) {
    if (t->dtype == DT_F32) return tensor_upload_raw(t, host);
    size_t n = tensor_numel(t);
    void *tmp = xmalloc(n * dtype_size(t->dtype));
    convert_from_f32(tmp, t->dtype, host, n);
    int rc = tensor_upload_raw(t, tmp);
    free(tmp);
    return rc;
}

int tensor_download_f32(const tensor *t, float *host) {
    if (t->dtype == DT_F32) return tensor_download_raw(t, host);
    size_t n = tensor_numel(t);
    void *tmp = xmalloc(n * dtype_size(t->dtype));
    int rc = tensor_download_raw(t, tmp);
    if (!rc) rc = convert_to_f32(host, tmp, t->dtype, n);
    free(tmp);
    return rc;
}

#define DISPATCH(op, ...) do { \
    if (!be->vt->op) tp_fatal("backend %s has no op " #op, be->vt->name); \
    be->vt->op(be, __VA_ARGS__); } while (0)

/* y[:, rows of a term] += (x[:, its columns] · aᵀ) · bᵀ for each low-rank
 * term of w (tensor.h), restricted to the rows of w's view: two small f32
 * GEMMs of rank r and one add, on the weight's backend. */
static void gemm_lowrank(backend *be, tensor *y, const tensor *x, const tensor *w) {
    const tensor_lowrank *L = w->lowrank;
    for (int i = 0; i < L->n; i++) {
        const tensor_lowrank_term *t = &L->t[i];
        int64_t r0 = t->row0 - w->lowrank_row0, lo = r0 > 0 ? r0 : 0;
        int64_t hi = r0 + t->nrows < w->rows ? r0 + t->nrows : w->rows;
        if (lo >= hi) continue;
        tensor xa = tensor_cols(x, t->col0, t->ncols), bv = tensor_rows(t->b, lo - r0, hi - lo);
        tensor *ax = tensor_new(be, DT_F32, x->rows, t->a->rows), *u = tensor_new(be, DT_F32, x->rows, hi - lo);
        if (!ax || !u) tp_fatal("op_gemm: out of memory for a LoRA term of a [%lld, %lld] weight: %s",
                                (long long)w->rows, (long long)w->cols, tp_error_msg());
        DISPATCH(gemm, ax, &xa, t->a, NULL);
        DISPATCH(gemm, u, ax, &bv, NULL);
        tensor yv = tensor_cols(y, lo, hi - lo);
        DISPATCH(add, &yv, &yv, u);
        tensor_free(ax);
        tensor_free(u);
    }
}

void op_gemm(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias) {
    DISPATCH(gemm, y, x, w, bias);
    if (w->lowrank) gemm_lowrank(be, y, x, w);
}
void op_copy(backend *be, tensor *y, const tensor *x) { DISPATCH(copy, y, x); }
void op_layernorm_mod(backend *be, tensor *y, const tensor *x, const tensor *shift, const tensor *scale, float eps) { DISPATCH(layernorm_mod, y, x, shift, scale, eps); }
void op_rmsnorm(backend *be, tensor *y, const tensor *x, const tensor *w, int group, float eps) { DISPATCH(rmsnorm, y, x, w, group, eps); }
void op_rope(backend *be, tensor *x, const tensor *cos, const tensor *sin, int head_dim, rope_mode mode) { DISPATCH(rope, x, cos, sin, head_dim, mode); }
void op_attention(backend *be, tensor *o, const tensor *q, const tensor *k, const tensor *v, const attn_params *p) { DISPATCH(attention, o, q, k, v, p); }
void op_swiglu(backend *be, tensor *y, const tensor *gate, const tensor *up) { DISPATCH(swiglu, y, gate, up); }
void op_silu(backend *be, tensor *y, const tensor *x) { DISPATCH(silu, y, x); }
void op_add(backend *be, tensor *y, const tensor *a, const tensor *b) { DISPATCH(add, y, a, b); }
void op_gated_add(backend *be, tensor *x, const tensor *gate, const tensor *y) { DISPATCH(gated_add, x, gate, y); }
void op_gather_rows(backend *be, tensor *y, const tensor *table, const int32_t *ids, int64_t n, int64_t row0) { DISPATCH(gather_rows, y, table, ids, n, row0); }
void op_conv2d(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias, int64_t h, int64_t wd, int k) { DISPATCH(conv2d, y, x, w, bias, h, wd, k); }
void op_conv2d_down(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias, int64_t h, int64_t wd) { DISPATCH(conv2d_down, y, x, w, bias, h, wd); }
void op_group_norm(backend *be, tensor *y, const tensor *x, const tensor *gamma, const tensor *beta, int groups, float eps, int apply_silu) { DISPATCH(group_norm, y, x, gamma, beta, groups, eps, apply_silu); }

void op_channel_row_sums(backend *be, const tensor *x, int64_t W, const double *center, int p, double *out) {
    if (be->vt->channel_row_sums) { be->vt->channel_row_sums(be, x, W, center, p, out); return; }
    int64_t rows = x->cols / W, C = x->rows;
    double *tmp = xmalloc((size_t)C * sizeof *tmp);
    for (int64_t r = 0; r < rows; r++) {
        tensor row = tensor_cols(x, r * W, W);
        op_channel_sums(be, &row, center, p, tmp);
        for (int64_t c = 0; c < C; c++) out[c * rows + r] = tmp[c];
    }
    free(tmp);
}

int op_rows_invariant(backend *be, dtype_t dt) { return be->vt->rows_invariant ? be->vt->rows_invariant(be, dt) : 0; }

/* Host fallbacks of the group-norm halves, for backends without them (both
 * CPU and CUDA have them): a row at a time through download/upload. Slow but exact in f64. */
void op_channel_sums(backend *be, const tensor *x, const double *center, int p, double *out) {
    if (be->vt->channel_sums) { be->vt->channel_sums(be, x, center, p, out); return; }
    float *row = xmalloc((size_t)x->cols * sizeof(float));
    for (int64_t c = 0; c < x->rows; c++) {
        tensor r = tensor_rows(x, c, 1);
        if (tensor_download_f32(&r, row)) tp_fatal("op_channel_sums: download failed");
        double s = 0, m = center ? center[c] : 0;
        for (int64_t i = 0; i < x->cols; i++) s += p == 1 ? (double)row[i] : ((double)row[i] - m) * ((double)row[i] - m);
        out[c] = s;
    }
    free(row);
}

void op_channel_affine(backend *be, tensor *y, const tensor *x, const float *a, const float *b, int apply_silu) {
    if (be->vt->channel_affine) { be->vt->channel_affine(be, y, x, a, b, apply_silu); return; }
    float *row = xmalloc((size_t)x->cols * sizeof(float));
    for (int64_t c = 0; c < x->rows; c++) {
        tensor rx = tensor_rows(x, c, 1), ry = tensor_rows(y, c, 1);
        if (tensor_download_f32(&rx, row)) tp_fatal("op_channel_affine: download failed");
        for (int64_t i = 0; i < x->cols; i++) {
            float t = row[i] * a[c] + b[c];
            if (apply_silu) { if (y->dtype == DT_BF16) t = bf16r(t); t = t / (1.0f + expf(-t)); }
            row[i] = t;
        }
        if (tensor_upload_f32(&ry, row)) tp_fatal("op_channel_affine: upload failed");
    }
    free(row);
}
void op_upsample2x(backend *be, tensor *y, const tensor *x, int64_t h, int64_t wd) { DISPATCH(upsample2x, y, x, h, wd); }
void op_transpose(backend *be, tensor *y, const tensor *x) { DISPATCH(transpose, y, x); }

static int g_cpu_threads;   /* set from the rank's CPU binding (core/dist/affinity.c) */
void backend_set_cpu_threads(int threads) { g_cpu_threads = threads; }

int backend_select(const char *name, int local_rank, int local_size, backend **out) {
    *out = NULL;
    if (!name || !strcmp(name, "auto")) name = backend_cuda_device_count() > 0 ? "cuda" : "cpu";
    if (!strcmp(name, "cpu")) {
        int cores = omp_get_num_procs();
        const char *env = getenv("OMP_NUM_THREADS");
        int threads = env && atoi(env) > 0 ? atoi(env)
                      : g_cpu_threads > 0 ? g_cpu_threads : cores / (local_size > 0 ? local_size : 1);
        *out = backend_cpu_create(threads > 0 ? threads : 1);
        return 0;
    }
    if (!strcmp(name, "cuda")) {
        int n = backend_cuda_device_count();
        if (!tpgen_has_cuda())
            return tp_error("--backend cuda: this tpgen was built without the CUDA backend; use --backend cpu or rebuild with CUDA=1");
        if (n <= 0) return tp_error("--backend cuda: no usable GPU is visible on this node; use --backend cpu");
        *out = backend_cuda_create(local_rank % n);
        return *out ? 0 : -1;
    }
    return tp_error("unknown --backend '%s': use cpu, cuda or auto", name);
}

int op_swap_ggml_row_halves(tensor *w, int64_t d) {
    size_t n = (size_t)d * (size_t)w->qpitch;
    char *a = w->data, *tmp = xmalloc(2 * n);
    int rc = be_download(w->be, tmp, a, 2 * n) || be_upload(w->be, a, tmp + n, n) || be_upload(w->be, a + n, tmp, n) ||
             be_sync(w->be);
    free(tmp);
    return rc ? tp_error("swapping two halves of quantised rows failed on the %s backend", w->be->vt->name) : 0;
}
