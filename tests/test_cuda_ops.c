/* CUDA backend tests.
 * - cuda_select_*: run in every build and on every machine (MPI, np 1/2/4):
 *   --backend cuda must either give a working GPU backend or fail with a
 *   clear message on every rank (no GPU here, or a build without CUDA).
 * - TEST_GPU (only in TPGEN_CUDA builds, run by scripts/gpu-check.sh with
 *   `tpgen_tests --gpu`): every CUDA op against the CPU backend's twin on
 *   fresh random data, outputs poisoned with NaN first; each comparison
 *   prints a line "# op NAME DTYPE rel_l2=... max_abs=..." for the table. */
#include "test.h"
#include "kernels/ops.h"
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "kernels/quant.h"
#include "kernels/cpu/cpu_gemm_qdot.h"
#include "core/formats/checkpoint.h"
#include "core/formats/weights.h"
#include "core/models/flux2/flux2.h"
#include "core/models/model_plan.h"
#include "quant_random.h"
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TEST_MPI(cuda_select_fails_cleanly_or_works) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    tp_error_clear();
    backend *be = NULL;
    int st = backend_select("cuda", rank, size, &be);
    if (!tpgen_has_cuda()) {
        CHECK(st == -1 && !be, "a build without CUDA accepted --backend cuda");
        CHECK(strstr(tp_error_msg(), "built without the CUDA backend") != NULL, "unclear message: %s", tp_error_msg());
    } else if (backend_cuda_device_count() == 0) {
        CHECK(st == -1 && !be, "--backend cuda succeeded without a GPU");
        CHECK(strstr(tp_error_msg(), "no usable GPU") != NULL, "unclear message: %s", tp_error_msg());
    } else {
        CHECK(st == 0 && be && be->kind == BACKEND_CUDA, "GPU visible but no CUDA backend: %s", tp_error_msg());
    }
    /* the failure must reach every rank, naming the rank that failed */
    int agreed = dist_agree(MPI_COMM_WORLD, st);
    CHECK(agreed == st, "dist_agree gave %d for status %d", agreed, st);
    if (st && size > 1) CHECK(strstr(tp_error_msg(), "rank 0") != NULL, "agreed message lacks the rank: %s", tp_error_msg());
    backend_destroy(be);
    tp_error_clear();
}

TEST(cuda_device_count_is_sane) {
    int n = backend_cuda_device_count();
    CHECK(n >= 0, "negative device count %d", n);
    if (!tpgen_has_cuda()) CHECK(n == 0, "a build without CUDA reports %d GPUs", n);
    if (n == 0) {
        tp_error_clear();
        CHECK(backend_cuda_create(0) == NULL && tp_error_msg()[0], "backend_cuda_create without a GPU must fail with a message");
        tp_error_clear();
    }
}

/* The loader keeps GGUF blocks quantised on the CPU and CUDA backends only,
 * and only on a backend that can read them in place (upload_file): a CPU
 * backend stripped of upload_file, and one that calls itself another kind,
 * are refused naming the tensor and the type; the plain CPU backend loads. */
TEST(ggml_load_refuses_backend_without_upload_file) {
    char *dir = xasprintf("%s/flux2-gguf/Q4_K/transformer", test_golden_dir());
    checkpoint *c;
    REQUIRE(checkpoint_open(dir, &c) == 0, "%s", tp_error_msg());
    json_t *cfg = flux2_config_from_bfl(c);
    component_plan cp;
    REQUIRE(cfg && plan_for_component("transformer", cfg, c, 1, &cp) >= 0, "%s", tp_error_msg());
    backend *cpu = backend_cpu_create(1);
    backend_vtable vt = *cpu->vt;
    const backend_vtable *saved = cpu->vt;
    for (int k = 0; k < 3; k++) {
        vt.upload_file = k == 1 ? NULL : saved->upload_file;
        cpu->vt = k ? &vt : saved;
        backend_kind kind = cpu->kind;
        if (k == 2) cpu->kind = (backend_kind)7;   /* neither CPU nor CUDA */
        load_opts o = {.tp = 1, .rank = 0, .be = cpu, .dtype = DT_F32};
        weights *w = NULL;
        load_stats st;
        tp_error_clear();
        int rc = weights_load(c, &cp.p, &o, &w, &st);
        cpu->kind = kind;
        if (k == 0) CHECK(rc == 0, "the CPU backend must load GGUF blocks: %s", tp_error_msg());
        else CHECK(rc == -1 && strstr(tp_error_msg(), "cannot hold quantised weights") &&
                       strstr(tp_error_msg(), "is quantised (GGUF "), "case %d: %s", k, tp_error_msg());
        weights_free(w);
    }
    cpu->vt = saved;
    tp_error_clear();
    backend_destroy(cpu);
    component_plan_free(&cp);
    json_decref(cfg);
    checkpoint_close(c);
    free(dir);
}

#ifdef TPGEN_CUDA

static backend *g_gpu, *g_cpu;

static int backends(void) {
    if (!g_gpu) {
        g_gpu = backend_cuda_create(0);
        g_cpu = backend_cpu_create(0);
    }
    return g_gpu != NULL;
}

static float frand(float lo, float hi) { return lo + (hi - lo) * (float)rand() / (float)RAND_MAX; }

/* the same data on both backends: owned buffers or views of a parent pair */
typedef struct pair {
    tensor g, c;
    tensor *gown, *cown;
} pair;

static pair pair_new(dtype_t dt, int64_t rows, int64_t cols) {
    pair p = {0};
    p.gown = tensor_new(g_gpu, dt, rows, cols);
    p.cown = tensor_new(g_cpu, dt, rows, cols);
    if (!p.gown || !p.cown) tp_fatal("test allocation failed: %s", tp_error_msg());
    p.g = *p.gown;
    p.c = *p.cown;
    return p;
}
static pair pair_cols(const pair *p, int64_t c0, int64_t n) {
    pair v = {tensor_cols(&p->g, c0, n), tensor_cols(&p->c, c0, n), NULL, NULL};
    return v;
}
static void pair_free(pair *p) { tensor_free(p->gown); tensor_free(p->cown); }

static void pair_fill(pair *p, float lo, float hi) {
    size_t n = tensor_numel(&p->g);
    float *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = frand(lo, hi);
    if (tensor_upload_f32(&p->g, h) || tensor_upload_f32(&p->c, h)) tp_fatal("upload: %s", tp_error_msg());
    free(h);
}
static pair pair_rand(dtype_t dt, int64_t rows, int64_t cols, float lo, float hi) {
    pair p = pair_new(dt, rows, cols);
    pair_fill(&p, lo, hi);
    return p;
}
static void pair_poison(pair *p) { pair_fill(p, NAN, NAN); }

/* compare the GPU result with the CPU one; prints the table line */
static void pair_check(pair *p, const char *op, double tol) {
    size_t n = tensor_numel(&p->g);
    float *a = xmalloc(n * sizeof *a), *b = xmalloc(n * sizeof *b);
    int rc = be_sync(g_gpu) || tensor_download_f32(&p->g, a) || tensor_download_f32(&p->c, b);
    if (rc) { test_fail(__FILE__, __LINE__, "%s: %s", op, tp_error_msg()); free(a); free(b); return; }
    double e = rel_l2(a, b, n), m = max_abs_diff(a, b, n);
    printf("# op %-28s %-5s rel_l2=%.3e max_abs=%.3e\n", op, dtype_name(p->g.dtype), e, m);
    CHECK(e <= tol, "%s (%s): rel_l2 %.3e above %.1e", op, dtype_name(p->g.dtype), e, tol);
    free(a);
    free(b);
}

static double tol_for(dtype_t dt) { return dt == DT_F32 ? 2e-5 : 1e-2; }
#define NEED_CPU(op) REQUIRE(g_cpu->vt->op, "the CPU backend has no " #op " yet (cpu-ops helper)")
#define NEED_GPU() REQUIRE(backends(), "no CUDA backend: %s", tp_error_msg())
static const dtype_t k_dts[2] = {DT_F32, DT_BF16};

TEST_GPU(gpu_memory_and_transfers) {
    NEED_GPU();
    size_t before = g_gpu->bytes_in_use, n = (size_t)21 << 20;  /* 84 MB of f32: several staging rounds */
    tensor *t = tensor_new(g_gpu, DT_F32, 1, (int64_t)n);
    REQUIRE(t, "alloc: %s", tp_error_msg());
    CHECK(g_gpu->bytes_in_use == before + n * 4 && g_gpu->peak_bytes >= g_gpu->bytes_in_use, "bytes_in_use not tracked");
    float *h = xmalloc(n * 4), *r = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = (float)i * 0.5f - 7.0f;
    CHECK(tensor_upload_f32(t, h) == 0 && tensor_download_f32(t, r) == 0, "transfer: %s", tp_error_msg());
    CHECK(!memcmp(h, r, n * 4), "round trip through the staging ring changed the data");
    /* 2-D upload into a view, odd widths */
    tensor v = tensor_reshape(t, 3 * 1024, (int64_t)n / (3 * 1024));
    tensor vc = tensor_cols(&v, 5, 333);
    CHECK(tensor_upload_f32(&vc, h) == 0 && tensor_download_f32(&vc, r) == 0, "2-D transfer: %s", tp_error_msg());
    CHECK(!memcmp(h, r, tensor_numel(&vc) * 4), "2-D upload/download changed the data");
    tensor_free(t);
    CHECK(g_gpu->bytes_in_use == before, "free did not return the bytes (%zu vs %zu)", g_gpu->bytes_in_use, before);
    tp_error_clear();
    void *huge = be_alloc(g_gpu, (size_t)1 << 50);
    CHECK(!huge && strstr(tp_error_msg(), "out of GPU memory") && strstr(tp_error_msg(), "--tp"),
          "out-of-memory message: %s", tp_error_msg());
    tp_error_clear();
    free(h);
    free(r);
}

/* the upload_file path: strided rows from a file straight into a
 * device matrix (a rowwise shard: every row's slice of columns) */
TEST_GPU(gpu_upload_file_rowwise) {
    NEED_GPU();
    const size_t rows = 3000, cols = 5000, c0 = 1234, w = 1111, hdr = 77;  /* ~60 MB file: several staging runs */
    char path[512];
    snprintf(path, sizeof path, "%s/cuda_upload_file.bin", test_tmp_dir());
    float *full = xmalloc(rows * cols * 4);
    for (size_t i = 0; i < rows * cols; i++) full[i] = (float)(i % 100003) * 0.25f;
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    REQUIRE(fd >= 0, "cannot create %s", path);
    char pad[77] = {0};
    CHECK(write(fd, pad, hdr) == (ssize_t)hdr && write(fd, full, rows * cols * 4) == (ssize_t)(rows * cols * 4),
          "short write");
    tensor *t = tensor_new(g_gpu, DT_F32, (int64_t)rows, (int64_t)w);
    REQUIRE(t, "alloc: %s", tp_error_msg());
    CHECK(be_upload_file(g_gpu, t->data, w * 4, fd, hdr + c0 * 4, cols * 4, w * 4, rows) == 0, "upload_file: %s",
          tp_error_msg());
    float *got = xmalloc(rows * w * 4);
    CHECK(be_sync(g_gpu) == 0 && tensor_download_f32(t, got) == 0, "download: %s", tp_error_msg());
    size_t bad = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < w; c++) bad += got[r * w + c] != full[r * cols + c0 + c];
    CHECK(bad == 0, "%zu elements differ from the file's rowwise slice", bad);
    /* reading past the end of the file is an error, not a crash */
    tp_error_clear();
    CHECK(be_upload_file(g_gpu, t->data, w * 4, fd, hdr + (rows * cols - 10) * 4, cols * 4, w * 4, 2) == -1 &&
              strstr(tp_error_msg(), "file ends"), "short file: %s", tp_error_msg());
    tp_error_clear();
    close(fd);
    unlink(path);
    tensor_free(t);
    free(full);
    free(got);
}

TEST_GPU(gpu_nccl_single_rank) {
    NEED_GPU();
    comm *c = comm_create_nccl(MPI_COMM_WORLD, g_gpu);
    REQUIRE(c, "comm_create_nccl: %s", tp_error_msg());
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int d = 0; d < 2; d++) {
        pair p = pair_rand(k_dts[d], 1, 10000, -1, 1);
        CHECK(comm_allreduce_sum(c, &p.g) == 0, "allreduce: %s", tp_error_msg());
        /* one rank per GPU: the sum over a group of `size` identical inputs */
        if (size == 1) pair_check(&p, "nccl allreduce (1 rank)", 0);
        pair_free(&p);
    }
    CHECK(c->n_allreduce == 2 && c->allreduce_bytes > 0, "statistics not counted");
    comm_destroy(c);
}

/* The collectives of Ulysses SP and CFG parallelism (core/dist/ulysses.h,
 * core/sampler.c) on NCCL (grouped send/recv; the in-place all-gather)
 * against the MPI communicator on host copies of the same tensors, bit for
 * bit: one GPU per rank (at np 1: the own part's device copy). Every rank's
 * values differ, so a part in the wrong place shows. */
TEST_GPU(gpu_nccl_alltoall_allgather) {
    NEED_GPU();
    comm *n = comm_create_nccl(MPI_COMM_WORLD, g_gpu);
    REQUIRE(n, "comm_create_nccl: %s", tp_error_msg());
    comm *h = comm_create_mpi(MPI_COMM_WORLD, g_cpu);
    for (int d = 0; d < 2; d++) {
        int64_t rows = (int64_t)n->size * 37, cols = 24;
        float *v = xmalloc(sizeof(float) * (size_t)(rows * cols));
        for (int64_t i = 0; i < rows * cols; i++) v[i] = bf16r((float)(n->rank * 1000 + i % 997) * 0.01f);
        pair a = pair_new(k_dts[d], rows, cols), b = pair_new(k_dts[d], rows, cols);
        pair_poison(&b);
        CHECK(tensor_upload_f32(&a.g, v) == 0 && tensor_upload_f32(&a.c, v) == 0, "upload: %s", tp_error_msg());
        CHECK(comm_alltoall(n, &a.g, &b.g) == 0 && comm_alltoall(h, &a.c, &b.c) == 0, "all-to-all: %s", tp_error_msg());
        pair_check(&b, "nccl all-to-all vs mpi", 0);
        CHECK(comm_allgather(n, &a.g) == 0 && comm_allgather(h, &a.c) == 0, "all-gather: %s", tp_error_msg());
        pair_check(&a, "nccl all-gather vs mpi", 0);
        CHECK(fabs(n->sent_bytes - h->sent_bytes) < 0.5, "bytes counted: nccl %.0f, mpi %.0f", n->sent_bytes,
              h->sent_bytes);
        pair_free(&a), pair_free(&b);
        free(v);
    }
    comm_destroy(n);
    comm_destroy(h);
}

TEST_GPU(gpu_gemm) {
    NEED_GPU(); NEED_CPU(gemm);
    for (int d = 0; d < 2; d++) {
        dtype_t dt = k_dts[d];
        pair x = pair_rand(dt, 77, 200, -1, 1), w = pair_rand(dt, 130, 200, -0.1f, 0.1f);
        pair b = pair_rand(dt, 1, 130, -1, 1), y = pair_new(dt, 77, 130);
        pair_poison(&y);
        op_gemm(g_gpu, &y.g, &x.g, &w.g, NULL); op_gemm(g_cpu, &y.c, &x.c, &w.c, NULL);
        pair_check(&y, "gemm", tol_for(dt));
        pair_poison(&y);
        op_gemm(g_gpu, &y.g, &x.g, &w.g, &b.g); op_gemm(g_cpu, &y.c, &x.c, &w.c, &b.c);
        pair_check(&y, "gemm+bias", tol_for(dt));
        /* views: x a column range of a wider buffer, y a column range too */
        pair xb = pair_rand(dt, 77, 333, -1, 1), yb = pair_new(dt, 77, 300);
        pair xv = pair_cols(&xb, 64, 200), yv = pair_cols(&yb, 32, 130);
        pair_poison(&yb);
        op_gemm(g_gpu, &yv.g, &xv.g, &w.g, NULL); op_gemm(g_cpu, &yv.c, &xv.c, &w.c, NULL);
        pair_check(&yv, "gemm views", tol_for(dt));
        pair_free(&x); pair_free(&w); pair_free(&b); pair_free(&y); pair_free(&xb); pair_free(&yb);
    }
    /* mixed: f32 activations, bf16 weights, f32 output */
    pair x = pair_rand(DT_F32, 50, 96, -1, 1), w = pair_rand(DT_BF16, 40, 96, -1, 1), y = pair_new(DT_F32, 50, 40);
    pair_poison(&y);
    op_gemm(g_gpu, &y.g, &x.g, &w.g, NULL); op_gemm(g_cpu, &y.c, &x.c, &w.c, NULL);
    pair_check(&y, "gemm f32 x bf16 w", 2e-5);
    pair_free(&x); pair_free(&w); pair_free(&y);
}

TEST_GPU(gpu_copy_and_elementwise) {
    NEED_GPU(); NEED_CPU(copy); NEED_CPU(silu); NEED_CPU(swiglu); NEED_CPU(add); NEED_CPU(gated_add);
    for (int d = 0; d < 2; d++) {
        dtype_t dt = k_dts[d], other = k_dts[1 - d];
        pair x = pair_rand(dt, 33, 257, -4, 4), u = pair_rand(dt, 33, 257, -2, 2), y = pair_new(other, 33, 257);
        pair g1 = pair_rand(dt, 1, 257, -1, 1);
        pair_poison(&y);
        op_copy(g_gpu, &y.g, &x.g); op_copy(g_cpu, &y.c, &x.c);
        pair_check(&y, "copy (convert)", 0);
        pair z = pair_new(dt, 33, 257);
        pair_poison(&z);
        op_silu(g_gpu, &z.g, &x.g); op_silu(g_cpu, &z.c, &x.c);
        pair_check(&z, "silu", tol_for(dt));
        pair_poison(&z);
        op_swiglu(g_gpu, &z.g, &x.g, &u.g); op_swiglu(g_cpu, &z.c, &x.c, &u.c);
        pair_check(&z, "swiglu", tol_for(dt));
        pair_poison(&z);
        op_add(g_gpu, &z.g, &x.g, &u.g); op_add(g_cpu, &z.c, &x.c, &u.c);
        pair_check(&z, "add", tol_for(dt));
        pair_poison(&z);
        op_add(g_gpu, &z.g, &x.g, &g1.g); op_add(g_cpu, &z.c, &x.c, &g1.c);
        pair_check(&z, "add (row broadcast)", tol_for(dt));
        op_gated_add(g_gpu, &z.g, &g1.g, &u.g); op_gated_add(g_cpu, &z.c, &g1.c, &u.c);
        pair_check(&z, "gated_add", tol_for(dt));
        op_gated_add(g_gpu, &z.g, NULL, &u.g); op_gated_add(g_cpu, &z.c, NULL, &u.c);
        pair_check(&z, "gated_add (no gate)", tol_for(dt));
        /* a view source: columns of a wider buffer */
        pair xb = pair_rand(dt, 33, 300, -1, 1), xv = pair_cols(&xb, 7, 257);
        pair_poison(&z);
        op_silu(g_gpu, &z.g, &xv.g); op_silu(g_cpu, &z.c, &xv.c);
        pair_check(&z, "silu (view input)", tol_for(dt));
        pair_free(&x); pair_free(&u); pair_free(&y); pair_free(&g1); pair_free(&z); pair_free(&xb);
    }
}

TEST_GPU(gpu_norms) {
    NEED_GPU(); NEED_CPU(layernorm_mod); NEED_CPU(rmsnorm); NEED_CPU(group_norm);
    for (int d = 0; d < 2; d++) {
        dtype_t dt = k_dts[d];
        pair x = pair_rand(dt, 19, 384, -3, 5), y = pair_new(dt, 19, 384);
        pair sh = pair_rand(dt, 1, 384, -1, 1), sc = pair_rand(dt, 1, 384, -1, 1);
        pair_poison(&y);
        op_layernorm_mod(g_gpu, &y.g, &x.g, &sh.g, &sc.g, 1e-6f); op_layernorm_mod(g_cpu, &y.c, &x.c, &sh.c, &sc.c, 1e-6f);
        pair_check(&y, "layernorm_mod", tol_for(dt));
        pair_poison(&y);
        op_layernorm_mod(g_gpu, &y.g, &x.g, NULL, NULL, 1e-6f); op_layernorm_mod(g_cpu, &y.c, &x.c, NULL, NULL, 1e-6f);
        pair_check(&y, "layernorm (plain)", tol_for(dt));
        pair w = pair_rand(dt, 1, 128, 0.5f, 1.5f), wr = pair_rand(dt, 1, 384, 0.5f, 1.5f);
        pair_poison(&y);
        op_rmsnorm(g_gpu, &y.g, &x.g, &w.g, 128, 1e-6f); op_rmsnorm(g_cpu, &y.c, &x.c, &w.c, 128, 1e-6f);
        pair_check(&y, "rmsnorm (per head)", tol_for(dt));
        op_rmsnorm(g_gpu, &x.g, &x.g, &wr.g, 384, 1e-6f); op_rmsnorm(g_cpu, &x.c, &x.c, &wr.c, 384, 1e-6f);
        pair_check(&x, "rmsnorm (row, in place)", tol_for(dt));
        pair cx = pair_rand(dt, 64, 37 * 23, -2, 3), cy = pair_new(dt, 64, 37 * 23);
        pair ga = pair_rand(dt, 1, 64, 0.5f, 1.5f), be = pair_rand(dt, 1, 64, -0.5f, 0.5f);
        for (int s = 0; s < 2; s++) {
            pair_poison(&cy);
            op_group_norm(g_gpu, &cy.g, &cx.g, &ga.g, &be.g, 32, 1e-6f, s);
            op_group_norm(g_cpu, &cy.c, &cx.c, &ga.c, &be.c, 32, 1e-6f, s);
            pair_check(&cy, s ? "group_norm+silu" : "group_norm", tol_for(dt));
        }
        pair_free(&x); pair_free(&y); pair_free(&sh); pair_free(&sc); pair_free(&w); pair_free(&wr);
        pair_free(&cx); pair_free(&cy); pair_free(&ga); pair_free(&be);
    }
}

TEST_GPU(gpu_rope) {
    NEED_GPU(); NEED_CPU(rope);
    for (int d = 0; d < 2; d++) {
        dtype_t dt = k_dts[d];
        for (int mode = 0; mode < 2; mode++) {
            int hd = 64, S = 45;
            pair x = pair_rand(dt, S, 3 * hd, -2, 2);
            pair cs = pair_rand(DT_F32, S, hd, -1, 1), sn = pair_rand(DT_F32, S, hd, -1, 1);
            op_rope(g_gpu, &x.g, &cs.g, &sn.g, hd, (rope_mode)mode);
            op_rope(g_cpu, &x.c, &cs.c, &sn.c, hd, (rope_mode)mode);
            pair_check(&x, mode ? "rope (half)" : "rope (interleaved)", tol_for(dt));
            pair_free(&x); pair_free(&cs); pair_free(&sn);
        }
    }
}

/* one attention case on both backends; kv_valid: NULL or host flags [sk] */
static void attn_case(const char *name, dtype_t dt, int sq, int sk, int hq, int hkv, int hd, int causal,
                      int64_t q_pos0, const int32_t *kv_valid, int misalign) {
    pair q = pair_rand(dt, sq, (int64_t)hq * hd + misalign, -2, 2), k = pair_rand(dt, sk, (int64_t)hkv * hd, -2, 2);
    pair v = pair_rand(dt, sk, (int64_t)hkv * hd, -1, 1), o = pair_new(dt, sq, (int64_t)hq * hd);
    pair qv = pair_cols(&q, misalign, (int64_t)hq * hd);  /* misalign > 0 forces the generic kernel */
    tensor *mg = NULL, *mc = NULL;
    if (kv_valid) {
        mg = tensor_new(g_gpu, DT_I32, 1, sk);
        mc = tensor_new(g_cpu, DT_I32, 1, sk);
        tensor_upload_raw(mg, kv_valid);
        tensor_upload_raw(mc, kv_valid);
    }
    attn_params pg = {hq, hkv, hd, 1.0f / sqrtf((float)hd), causal, q_pos0, mg}, pc = pg;
    pc.key_valid = mc;
    pair_poison(&o);
    op_attention(g_gpu, &o.g, &qv.g, &k.g, &v.g, &pg);
    op_attention(g_cpu, &o.c, &qv.c, &k.c, &v.c, &pc);
    char full[160];
    const char *kern = getenv("TPGEN_CUDA_ATTENTION");
    snprintf(full, sizeof full, "%s [%s]", name, kern ? kern : "default");
    pair_check(&o, full, dt == DT_F32 ? 1e-5 : 1.5e-2);
    tensor_free(mg); tensor_free(mc);
    pair_free(&q); pair_free(&k); pair_free(&v); pair_free(&o);
}

static void attn_cases(dtype_t dt) {
    int32_t valid[300];
    for (int i = 0; i < 300; i++) valid[i] = (i % 7) != 3 && i < 250;
    attn_case("attention hd128", dt, 200, 200, 3, 3, 128, 0, 0, NULL, 0);
    attn_case("attention hd128 misaligned (generic)", dt, 100, 150, 2, 2, 128, 0, 0, NULL, 1);
    attn_case("attention hd128 GQA+causal", dt, 130, 130, 4, 2, 128, 1, 0, NULL, 0);
    attn_case("attention causal q_pos0", dt, 37, 300, 2, 1, 128, 1, 263, NULL, 0);
    attn_case("attention key_valid", dt, 90, 300, 2, 2, 128, 0, 0, valid, 0);
    /* left padding as in Mistral: the first rows see nothing (causal) -> 0 */
    int32_t left[80];
    for (int i = 0; i < 80; i++) left[i] = i >= 20;
    attn_case("attention fully masked rows", dt, 80, 80, 2, 2, 128, 1, 0, left, 0);
    attn_case("attention fully masked (generic)", dt, 80, 80, 2, 2, 64, 1, 0, left, 0);
    attn_case("attention hd64", dt, 70, 90, 3, 1, 64, 0, 0, NULL, 0);
    attn_case("attention hd512 (VAE)", dt, 96, 96, 1, 1, 512, 0, 0, NULL, 0);
    attn_case("attention hd16", dt, 33, 47, 2, 2, 16, 1, 5, NULL, 0);
}

/* every kernel: the default, then each one forced (bf16 hd 128 cases pick
 * the tensor-core kernels; the rest stay generic whatever the setting) */
TEST_GPU(gpu_attention) {
    NEED_GPU(); NEED_CPU(attention);
    static const char *kernels[] = {NULL, "generic", "wmma", "mma"};
    for (int k = 0; k < 4; k++) {
        if (kernels[k]) setenv("TPGEN_CUDA_ATTENTION", kernels[k], 1);
        else unsetenv("TPGEN_CUDA_ATTENTION");
        printf("# attention kernel: %s\n", kernels[k] ? kernels[k] : "default");
        attn_cases(DT_BF16);
        if (k < 2) attn_cases(DT_F32);  /* f32 always runs the generic kernel */
    }
    unsetenv("TPGEN_CUDA_ATTENTION");
}

TEST_GPU(gpu_image_ops) {
    NEED_GPU(); NEED_CPU(conv2d); NEED_CPU(conv2d_down); NEED_CPU(upsample2x); NEED_CPU(transpose); NEED_CPU(gather_rows);
    for (int d = 0; d < 2; d++) {
        dtype_t dt = k_dts[d];
        int h = 13, wd = 17, cin = 24, cout = 20;
        pair x = pair_rand(dt, cin, h * wd, -1, 1), y = pair_new(dt, cout, h * wd), b = pair_rand(dt, 1, cout, -1, 1);
        for (int k = 1; k <= 3; k += 2) {
            pair w = pair_rand(dt, cout, (int64_t)cin * k * k, -0.2f, 0.2f);
            pair_poison(&y);
            op_conv2d(g_gpu, &y.g, &x.g, &w.g, &b.g, h, wd, k); op_conv2d(g_cpu, &y.c, &x.c, &w.c, &b.c, h, wd, k);
            pair_check(&y, k == 1 ? "conv2d 1x1+bias" : "conv2d 3x3+bias", tol_for(dt));
            pair_poison(&y);
            op_conv2d(g_gpu, &y.g, &x.g, &w.g, NULL, h, wd, k); op_conv2d(g_cpu, &y.c, &x.c, &w.c, NULL, h, wd, k);
            pair_check(&y, k == 1 ? "conv2d 1x1" : "conv2d 3x3", tol_for(dt));
            pair_free(&w);
        }
        {   /* the stride-2 downsampling convolution, on an even-sized image */
            int he = 12, we = 18;
            pair xe = pair_rand(dt, cin, he * we, -1, 1), yd = pair_new(dt, cout, (he / 2) * (we / 2));
            pair w = pair_rand(dt, cout, (int64_t)cin * 9, -0.2f, 0.2f);
            pair_poison(&yd);
            op_conv2d_down(g_gpu, &yd.g, &xe.g, &w.g, &b.g, he, we); op_conv2d_down(g_cpu, &yd.c, &xe.c, &w.c, &b.c, he, we);
            pair_check(&yd, "conv2d_down 3x3 stride 2 + bias", tol_for(dt));
            pair_poison(&yd);
            op_conv2d_down(g_gpu, &yd.g, &xe.g, &w.g, NULL, he, we); op_conv2d_down(g_cpu, &yd.c, &xe.c, &w.c, NULL, he, we);
            pair_check(&yd, "conv2d_down 3x3 stride 2", tol_for(dt));
            pair_free(&xe); pair_free(&yd); pair_free(&w);
        }
        pair up = pair_new(dt, cin, 4 * h * wd);
        pair_poison(&up);
        op_upsample2x(g_gpu, &up.g, &x.g, h, wd); op_upsample2x(g_cpu, &up.c, &x.c, h, wd);
        pair_check(&up, "upsample2x", 0);
        pair t = pair_new(dt, h * wd, cin);
        pair_poison(&t);
        op_transpose(g_gpu, &t.g, &x.g); op_transpose(g_cpu, &t.c, &x.c);
        pair_check(&t, "transpose", 0);
        pair table = pair_rand(dt, 50, 72, -1, 1), g = pair_new(dt, 9, 72);
        int32_t ids[9] = {100, 101, 149, 99, 150, 120, 7, 100, 133};  /* shard rows [100, 150) */
        pair_poison(&g);
        op_gather_rows(g_gpu, &g.g, &table.g, ids, 9, 100); op_gather_rows(g_cpu, &g.c, &table.c, ids, 9, 100);
        pair_check(&g, "gather_rows (sharded)", 0);
        pair_free(&x); pair_free(&y); pair_free(&b); pair_free(&up); pair_free(&t); pair_free(&table); pair_free(&g);
    }
}


/* fp8 weights: the dequantise kernel (op_copy fp8 -> f32 is exact, so it
 * must match the CPU bit for bit) and op_gemm with fp8 weights (per-tensor
 * and per-row scales, both formats, bf16 and f32 activations). */
static pair fp8_pair(dtype_t dt, int64_t rows, int64_t cols, int per_row) {
    pair p = pair_new(dt, rows, cols);
    size_t n = (size_t)(rows * cols);
    uint8_t *codes = xmalloc(n);
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)(rand() & 0xff);
        if (!isfinite(fp8_to_f32(dt, c))) c = 0x30;   /* weights hold no NaN/inf */
        codes[i] = c;
    }
    int64_t ns = per_row ? rows : 1;
    float *sc = xmalloc((size_t)ns * sizeof(float));
    for (int64_t i = 0; i < ns; i++) sc[i] = frand(1e-3f, 2e-2f);
    tensor *ts[2] = {&p.g, &p.c};
    tensor *own[2] = {p.gown, p.cown};
    for (int k = 0; k < 2; k++) {
        if (tensor_upload_raw(ts[k], codes)) tp_fatal("upload: %s", tp_error_msg());
        own[k]->scale = be_alloc(ts[k]->be, (size_t)ns * sizeof(float));
        if (!own[k]->scale || be_upload(ts[k]->be, own[k]->scale, sc, (size_t)ns * sizeof(float))) tp_fatal("scale upload");
        own[k]->scale_per_row = per_row;
        *ts[k] = *own[k];
    }
    free(codes), free(sc);
    return p;
}

TEST_GPU(gpu_fp8_dequant_and_gemm) {
    NEED_GPU(); NEED_CPU(gemm); NEED_CPU(copy);
    const dtype_t fmts[2] = {DT_F8_E4M3, DT_F8_E5M2};
    for (int f = 0; f < 2; f++)
        for (int per_row = 0; per_row < 2; per_row++) {
            /* sizes that are not multiples of 16 keep this on the dequantising path */
            pair w = fp8_pair(fmts[f], 98, 162, per_row);
            pair d = pair_new(DT_F32, 98, 162);
            pair_poison(&d);
            op_copy(g_gpu, &d.g, &w.g); op_copy(g_cpu, &d.c, &w.c);
            pair_check(&d, per_row ? "fp8 dequant per-row" : "fp8 dequant per-tensor", 0);
            pair db = pair_new(DT_BF16, 98, 162);
            pair_poison(&db);
            op_copy(g_gpu, &db.g, &w.g); op_copy(g_cpu, &db.c, &w.c);
            pair_check(&db, "fp8 dequant to bf16", 0);
            /* embedding rows from an fp8 table, some ids outside this shard */
            int32_t ids[5] = {3, 97, 0, 120, 50};
            pair g = pair_new(DT_F32, 5, 162);
            pair_poison(&g);
            op_gather_rows(g_gpu, &g.g, &w.g, ids, 5, 0); op_gather_rows(g_cpu, &g.c, &w.c, ids, 5, 0);
            pair_check(&g, "fp8 gather_rows", 0);
            pair_free(&g);
            /* a row view of the weight moves a per-row scale with it */
            pair wv = {tensor_rows(&w.g, 32, 40), tensor_rows(&w.c, 32, 40), NULL, NULL};
            for (int a = 0; a < 2; a++) {
                dtype_t dt = k_dts[a];
                pair x = pair_rand(dt, 70, 162, -1, 1), y = pair_new(dt, 70, 98), yv = pair_new(dt, 70, 40);
                pair_poison(&y), pair_poison(&yv);
                op_gemm(g_gpu, &y.g, &x.g, &w.g, NULL); op_gemm(g_cpu, &y.c, &x.c, &w.c, NULL);
                pair_check(&y, "gemm fp8 weight", tol_for(dt));
                op_gemm(g_gpu, &yv.g, &x.g, &wv.g, NULL); op_gemm(g_cpu, &yv.c, &x.c, &wv.c, NULL);
                pair_check(&yv, "gemm fp8 weight row view", tol_for(dt));
                pair_free(&x); pair_free(&y); pair_free(&yv);
            }
            pair_free(&w); pair_free(&d); pair_free(&db);
        }
}


/* E4M3 weights x bf16 activations at tensor-core friendly sizes: on sm_89+
 * the cuBLASLt fp8 GEMM (activations quantised to E4M3 with one dynamic
 * scale: E4M3's 3 mantissa bits give ~2-4e-2 relative error), elsewhere the
 * dequantising path (~1e-3). Either must be within 1e-1 of the CPU's
 * exact-weight product; ignoring a scale or the activation scale would be
 * off by ~1. The printed rel_l2 shows which path ran. */
TEST_GPU(gpu_fp8_tensor_core_gemm) {
    NEED_GPU(); NEED_CPU(gemm);
    for (int per_row = 0; per_row < 2; per_row++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            pair w = fp8_pair(DT_F8_E4M3, 256, 512, per_row);
            pair x = pair_rand(DT_BF16, 200, 512, -3, 3), y = pair_new(DT_BF16, 200, 256), b = pair_rand(DT_BF16, 1, 256, -1, 1);
            pair_poison(&y);
            op_gemm(g_gpu, &y.g, &x.g, &w.g, with_bias ? &b.g : NULL);
            op_gemm(g_cpu, &y.c, &x.c, &w.c, with_bias ? &b.c : NULL);
            pair_check(&y, per_row ? (with_bias ? "fp8 TC gemm per-row+bias" : "fp8 TC gemm per-row")
                                   : (with_bias ? "fp8 TC gemm per-tensor+bias" : "fp8 TC gemm per-tensor"), 1e-1);
            pair_free(&w); pair_free(&x); pair_free(&y); pair_free(&b);
        }
}

/* GGUF block weights (DT_GGML): the CUDA GEMM decodes tiles of rows into
 * scratch (cuda_ggml.cu) and runs cuBLAS; the CPU backend's GEMM on the same
 * bytes is the reference, on its exact dequantising path (int8-dot route
 * off, so both multiply the exact decoded weights). Every supported type;
 * whole rows and a row-parallel local row of three segments whose edges fall
 * inside blocks (half a block, 1.5 blocks, a range inside one block); f32 and
 * bf16 activations (y in x's dtype); with and without a bias and a low-rank
 * (LoRA) term; tiles of 7 rows (TPGEN_CUDA_GGML_TILE_BYTES) and one tile; a
 * row view of the weight. Bounds: f32 1e-5 (both sides use the same f32
 * weights; only the summation order differs, ~1e-7); bf16 1e-2: the GPU
 * rounds the weights to bf16 once (relative error <= 2^-8 each, ~2e-3 RMS on
 * a sum of random terms) and both round y to bf16 (another ~2e-3).
 * (float64 simulation of this shape, x in [-1, 1], w ~ N(0, 0.02): 2.3-2.7e-3).
 * f32 x = the identity gives y = Wᵀ exactly on both sides (one nonzero
 * product per output), so the decoded values are checked bit for bit too,
 * and op_gather_rows from the quantised table must match exactly. */
static void ggml_twin(int type, int64_t N, int64_t Kg, const span *sp, int nsp, uint32_t *s, pair *w, int64_t *K) {
    double *wd;
    memset(w, 0, sizeof *w);
    w->cown = segmented_weight(g_cpu, type, N, Kg, sp, nsp, s, K, &wd);
    if (!w->cown) tp_fatal("segmented_weight: %s", tp_error_msg());
    free(wd);
    w->gown = tensor_new_ggml(g_gpu, type, N, *K, w->cown->qpitch, w->cown->qseg, w->cown->n_qseg);
    if (!w->gown || be_upload(g_gpu, w->gown->data, w->cown->data, tensor_nbytes(w->cown)))
        tp_fatal("GGML upload: %s", tp_error_msg());
    w->g = *w->gown, w->c = *w->cown;
}

/* the same low-rank term on both twins: rows [5, 25), columns [3, K - 7), rank 4 */
static void ggml_lowrank(pair *w) {
    int64_t K = w->c.cols, nc = K - 10;
    pair a = pair_rand(DT_F32, 4, nc, -0.05f, 0.05f), b = pair_rand(DT_F32, 20, 4, -0.05f, 0.05f);
    tensor_lowrank_add(w->gown, 5, 20, 3, nc, a.gown, b.gown);
    tensor_lowrank_add(w->cown, 5, 20, 3, nc, a.cown, b.cown);
    w->g = *w->gown, w->c = *w->cown;
}

static void ggml_gemm_case(const char *name, pair *w, dtype_t dt, int bias, double tol) {
    int64_t M = 37, N = w->c.rows, K = w->c.cols;
    pair x = pair_rand(dt, M, K, -1, 1), y = pair_new(dt, M, N), b = pair_rand(dt, 1, N, -1, 1);
    pair_poison(&y);
    op_gemm(g_gpu, &y.g, &x.g, &w->g, bias ? &b.g : NULL);
    op_gemm(g_cpu, &y.c, &x.c, &w->c, bias ? &b.c : NULL);
    char what[96];
    snprintf(what, sizeof what, "ggml %s%s %s", quant_type_name(w->c.qtype), bias ? "+bias" : "", name);
    pair_check(&y, what, tol);
    pair_free(&x), pair_free(&y), pair_free(&b);
}

TEST_GPU(gpu_ggml_gemm) {
    NEED_GPU(); NEED_CPU(gemm);
    static const int types[] = {QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1, QUANT_Q8_0, QUANT_IQ4_NL,
                                QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_IQ4_XS};
    uint32_t s = test_seed() | 1;
    cpu_gemm_qdot_policy(-1);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int64_t bs = quant_type_get(types[t])->block, Kg = 4 * bs, N = 45, K;
        span whole[] = {{0, Kg}}, split[] = {{bs / 2, 2 * bs}, {3 * bs + 5, 4 * bs - 3}, {0, bs / 2}};
        for (int c = 0; c < 2; c++) {
            pair w;
            ggml_twin(types[t], N, Kg, c ? split : whole, c ? 3 : 1, &s, &w, &K);
            const char *lay = c ? "segments" : "whole rows";
            /* exact: x = I (f32) gives y = Wᵀ */
            pair x = pair_new(DT_F32, K, K), y = pair_new(DT_F32, K, N);
            float *eye = xcalloc((size_t)(K * K), sizeof(float));
            for (int64_t i = 0; i < K; i++) eye[i * K + i] = 1;
            if (tensor_upload_f32(&x.g, eye) || tensor_upload_f32(&x.c, eye)) tp_fatal("upload");
            free(eye);
            pair_poison(&y);
            op_gemm(g_gpu, &y.g, &x.g, &w.g, NULL); op_gemm(g_cpu, &y.c, &x.c, &w.c, NULL);
            char what[96];
            snprintf(what, sizeof what, "ggml %s decoded (x = I) %s", quant_type_name(types[t]), lay);
            pair_check(&y, what, 0);
            pair_free(&x), pair_free(&y);
            /* a quantised embedding table: decoded rows, exact in f32 and bf16 (one rounding), others' rows 0 */
            int32_t ids[6] = {3, 44, 0, 45, 100, 17};
            for (int d = 0; d < 2; d++) {
                pair g = pair_new(k_dts[d], 6, K);
                pair_poison(&g);
                op_gather_rows(g_gpu, &g.g, &w.g, ids, 6, 0); op_gather_rows(g_cpu, &g.c, &w.c, ids, 6, 0);
                snprintf(what, sizeof what, "ggml %s gather_rows %s", quant_type_name(types[t]), lay);
                pair_check(&g, what, 0);
                pair_free(&g);
            }
            for (int d = 0; d < 2; d++) {
                dtype_t dt = k_dts[d];
                double tol = dt == DT_F32 ? 1e-5 : 1e-2;
                char tile[32];
                snprintf(tile, sizeof tile, "%lld", (long long)(7 * K * (int64_t)dtype_size(dt)));
                setenv("TPGEN_CUDA_GGML_TILE_BYTES", tile, 1);   /* 7 rows a tile: 6 full + 3 */
                ggml_gemm_case(c ? "segments, 7-row tiles" : "whole rows, 7-row tiles", &w, dt, 0, tol);
                ggml_gemm_case(c ? "segments, 7-row tiles" : "whole rows, 7-row tiles", &w, dt, 1, tol);
                unsetenv("TPGEN_CUDA_GGML_TILE_BYTES");
                ggml_gemm_case(c ? "segments" : "whole rows", &w, dt, 1, tol);
                pair wv = {tensor_rows(&w.g, 10, 30), tensor_rows(&w.c, 10, 30), NULL, NULL};
                ggml_gemm_case(c ? "segments, row view" : "whole rows, row view", &wv, dt, 0, tol);
            }
            ggml_lowrank(&w);
            for (int d = 0; d < 2; d++) {
                double tol = k_dts[d] == DT_F32 ? 1e-5 : 1e-2;
                ggml_gemm_case(c ? "segments + LoRA" : "whole rows + LoRA", &w, k_dts[d], 0, tol);
                ggml_gemm_case(c ? "segments + LoRA" : "whole rows + LoRA", &w, k_dts[d], 1, tol);
                pair wv = {tensor_rows(&w.g, 10, 30), tensor_rows(&w.c, 10, 30), NULL, NULL};
                ggml_gemm_case(c ? "segments + LoRA, row view" : "whole rows + LoRA, row view", &wv, k_dts[d], 1, tol);
            }
            pair_free(&w);
        }
    }
    cpu_gemm_qdot_policy(0);
}

/* The GGUF loader path on CUDA: the golden flux2-gguf Q4_K and mixed
 * transformers' shards of every rank of tp 1 and 2 (tp 2: row-parallel
 * segments of half a Q4_K block) read by the CUDA backend's upload_file hold
 * exactly the bytes of the CPU backend's load of the same shard, with the
 * same layout (qpitch, segments). */
TEST_GPU(gpu_ggml_load_matches_cpu) {
    NEED_GPU();
    static const char *vars[] = {"Q4_K", "mixed"};
    for (int v = 0; v < 2; v++)
        for (int tp = 1; tp <= 2; tp++)
            for (int rank = 0; rank < tp; rank++) {
                char *dir = xasprintf("%s/flux2-gguf/%s/transformer", test_golden_dir(), vars[v]);
                checkpoint *c;
                REQUIRE(checkpoint_open(dir, &c) == 0, "%s", tp_error_msg());
                json_t *cfg = flux2_config_from_bfl(c);
                component_plan cp;
                REQUIRE(cfg && plan_for_component("transformer", cfg, c, tp, &cp) >= 0, "%s", tp_error_msg());
                weights *wg = NULL, *wc = NULL;
                load_stats sg, sc;
                load_opts og = {.tp = tp, .rank = rank, .be = g_gpu, .dtype = DT_F32};
                load_opts oc = {.tp = tp, .rank = rank, .be = g_cpu, .dtype = DT_F32};
                REQUIRE(weights_load(c, &cp.p, &og, &wg, &sg) == 0, "CUDA load: %s", tp_error_msg());
                REQUIRE(weights_load(c, &cp.p, &oc, &wc, &sc) == 0, "CPU load: %s", tp_error_msg());
                CHECK(sg.bytes_read == sc.bytes_read, "%s tp %d rank %d: bytes read %llu vs %llu", vars[v], tp, rank,
                      (unsigned long long)sg.bytes_read, (unsigned long long)sc.bytes_read);
                int n_ggml = 0, n_seg = 0;
                for (int i = 0; i < weights_count(wc); i++) {
                    const char *name = weights_name(wc, i);
                    const tensor *tc = weights_get(wc, name), *tg = weights_get(wg, name);
                    REQUIRE(tg, "%s missing from the CUDA load", name);
                    if (tc->dtype != DT_GGML) continue;
                    n_ggml++, n_seg += tc->n_qseg > 1 || tc->qseg[0].skip;
                    CHECK(tg->dtype == DT_GGML && tg->qpitch == tc->qpitch && tg->n_qseg == tc->n_qseg &&
                              !memcmp(tg->qseg, tc->qseg, sizeof tc->qseg[0] * (size_t)tc->n_qseg),
                          "%s: layout differs", name);
                    size_t nb = tensor_nbytes(tc);
                    uint8_t *h = xmalloc(nb ? nb : 1);
                    CHECK(be_download(g_gpu, h, tg->data, nb) == 0 && !memcmp(h, tc->data, nb),
                          "%s (%s tp %d rank %d): the CUDA shard's %zu bytes differ from the CPU's", name, vars[v], tp,
                          rank, nb);
                    free(h);
                }
                CHECK(n_ggml > 0, "%s: no quantised tensor loaded", vars[v]);
                printf("# ggml load %s tp %d rank %d: %d block tensors (%d of several segments or a skip), %llu bytes read\n",
                       vars[v], tp, rank, n_ggml, n_seg, (unsigned long long)sg.bytes_read);
                weights_free(wg), weights_free(wc);
                component_plan_free(&cp);
                json_decref(cfg);
                checkpoint_close(c);
                free(dir);
            }
}

/* ---- issue 40: the first GPU run's debugging aids and fixes ---- */

static int env_on(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

/* TPGEN_CUDA_POISON (set by scripts/gpu-check.sh): every allocation is
 * handed out as 0xff bytes (NaN in f32 and bf16), fresh or reused from the
 * pool, so that a kernel reading memory nobody wrote shows NaN against the
 * CPU's result. Without the variable, allocations are not touched. */
TEST_GPU(gpu_pool_poisoning) {
    NEED_GPU();
    int on = env_on("TPGEN_CUDA_POISON");
    printf("# TPGEN_CUDA_POISON %s, TPGEN_CUDA_SYNC %s\n", on ? "on" : "off", env_on("TPGEN_CUDA_SYNC") ? "on" : "off");
    for (int round = 0; round < 2; round++) {   /* the second round reuses the first's pool memory */
        tensor *t = tensor_new(g_gpu, DT_F32, 64, 1000);
        REQUIRE(t, "alloc: %s", tp_error_msg());
        size_t n = tensor_numel(t);
        float *h = xmalloc(n * sizeof *h);
        REQUIRE(be_sync(g_gpu) == 0 && tensor_download_f32(t, h) == 0, "download: %s", tp_error_msg());
        size_t nan = 0;
        for (size_t i = 0; i < n; i++) nan += isnan(h[i]);
        if (on) CHECK(nan == n, "round %d: %zu of %zu elements poisoned", round, nan, n);
        /* written data reads back as written (the poison is applied once, at allocation) */
        for (size_t i = 0; i < n; i++) h[i] = (float)i;
        CHECK(tensor_upload_f32(t, h) == 0 && be_sync(g_gpu) == 0, "upload: %s", tp_error_msg());
        float *r = xmalloc(n * sizeof *r);
        CHECK(tensor_download_f32(t, r) == 0 && !memcmp(h, r, n * sizeof *r), "round trip after poisoning");
        free(h), free(r);
        tensor_free(t);
    }
}

/* The cuBLAS handle disallows reduced-precision split-K reductions: a long-K
 * bf16 GEMM (where cuBLAS splits K) stays within bf16 tolerance of the CPU
 * and gives the same bits twice. */
TEST_GPU(gpu_gemm_long_k_deterministic) {
    NEED_GPU(); NEED_CPU(gemm);
    for (int d = 0; d < 2; d++) {
        dtype_t dt = k_dts[d];
        pair x = pair_rand(dt, 48, 32768, -1, 1), w = pair_rand(dt, 64, 32768, -0.05f, 0.05f), y = pair_new(dt, 48, 64);
        pair_poison(&y);
        op_gemm(g_gpu, &y.g, &x.g, &w.g, NULL); op_gemm(g_cpu, &y.c, &x.c, &w.c, NULL);
        pair_check(&y, "gemm K=32768 (split-K)", dt == DT_F32 ? 1e-5 : 1e-2);
        size_t n = tensor_numel(&y.g);
        float *a = xmalloc(n * 4), *b = xmalloc(n * 4);
        CHECK(tensor_download_f32(&y.g, a) == 0, "download");
        op_gemm(g_gpu, &y.g, &x.g, &w.g, NULL);
        CHECK(be_sync(g_gpu) == 0 && tensor_download_f32(&y.g, b) == 0, "download: %s", tp_error_msg());
        CHECK(!memcmp(a, b, n * 4), "%s: the same GEMM gave different bits twice", dtype_name(dt));
        free(a), free(b);
        pair_free(&x), pair_free(&w), pair_free(&y);
    }
}

/* cuBLASLt fp8: the algorithm is searched once per shape and cached; the
 * cached algorithm must give the same result on the next calls, for two
 * shapes interleaved (a cache keyed wrongly would hand one shape's algorithm
 * to the other) */
TEST_GPU(gpu_fp8_algo_cache) {
    NEED_GPU(); NEED_CPU(gemm);
    pair w1 = fp8_pair(DT_F8_E4M3, 256, 512, 0), w2 = fp8_pair(DT_F8_E4M3, 512, 256, 1);
    pair x1 = pair_rand(DT_BF16, 96, 512, -3, 3), x2 = pair_rand(DT_BF16, 160, 256, -3, 3);
    pair y1 = pair_new(DT_BF16, 96, 256), y2 = pair_new(DT_BF16, 160, 512);
    for (int it = 0; it < 3; it++) {
        pair_poison(&y1), pair_poison(&y2);
        op_gemm(g_gpu, &y1.g, &x1.g, &w1.g, NULL); op_gemm(g_cpu, &y1.c, &x1.c, &w1.c, NULL);
        op_gemm(g_gpu, &y2.g, &x2.g, &w2.g, NULL); op_gemm(g_cpu, &y2.c, &x2.c, &w2.c, NULL);
        pair_check(&y1, it ? "fp8 TC gemm per-tensor (cached)" : "fp8 TC gemm per-tensor (searched)", 1e-1);
        pair_check(&y2, it ? "fp8 TC gemm per-row (cached)" : "fp8 TC gemm per-row (searched)", 1e-1);
    }
    pair_free(&w1), pair_free(&w2), pair_free(&x1), pair_free(&x2), pair_free(&y1), pair_free(&y2);
}

/* GGUF tiles and convolution chunks start 256-byte aligned: a GGUF weight in
 * tiles of 300 rows (rounded down to 256: tiles of 256 + 44 rows) and a 3x3
 * convolution over 512 channels x 96x96 pixels (f32: chunks of 7168 pixels,
 * two of them; bf16: one) against the CPU */
TEST_GPU(gpu_aligned_tiles_and_conv_chunks) {
    NEED_GPU(); NEED_CPU(gemm); NEED_CPU(conv2d);
    uint32_t s = test_seed() | 1;
    cpu_gemm_qdot_policy(-1);
    int64_t bs = quant_type_get(QUANT_Q8_0)->block, K;
    span whole[] = {{0, 8 * bs}};
    pair w;
    ggml_twin(QUANT_Q8_0, 300, 8 * bs, whole, 1, &s, &w, &K);
    for (int d = 0; d < 2; d++) {
        char tile[32];
        snprintf(tile, sizeof tile, "%lld", (long long)(300 * K * (int64_t)dtype_size(k_dts[d])));
        setenv("TPGEN_CUDA_GGML_TILE_BYTES", tile, 1);
        ggml_gemm_case("300 rows, aligned tiles", &w, k_dts[d], 1, k_dts[d] == DT_F32 ? 1e-5 : 1e-2);
    }
    unsetenv("TPGEN_CUDA_GGML_TILE_BYTES");
    pair_free(&w);
    cpu_gemm_qdot_policy(0);
    for (int d = 0; d < 2; d++) {
        dtype_t dt = k_dts[d];
        int h = 96, wd = 96, cin = 512, cout = 8;
        pair x = pair_rand(dt, cin, h * wd, -1, 1), y = pair_new(dt, cout, h * wd), b = pair_rand(dt, 1, cout, -1, 1);
        pair cw = pair_rand(dt, cout, (int64_t)cin * 9, -0.05f, 0.05f);
        pair_poison(&y);
        op_conv2d(g_gpu, &y.g, &x.g, &cw.g, &b.g, h, wd, 3); op_conv2d(g_cpu, &y.c, &x.c, &cw.c, &b.c, h, wd, 3);
        pair_check(&y, "conv2d 3x3 512ch 96x96 (chunks)", tol_for(dt));
        pair_free(&x), pair_free(&y), pair_free(&b), pair_free(&cw);
    }
}

/* Ranks sharing one GPU (run under mpirun -np 2 by scripts/gpu-check.sh):
 * NCCL must refuse them on every rank, naming the GPU by its UUID (device
 * numbers do not identify GPUs), without hanging; the MPI communicator
 * (TPGEN_COMM=mpi) stages device tensors through the host and sums them. At
 * np 1 only the staged communicator is checked. */
TEST_GPU(gpu_ranks_sharing_a_gpu) {
    NEED_GPU();
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) {
        tp_error_clear();
        comm *n = comm_create_nccl(MPI_COMM_WORLD, g_gpu);
        CHECK(!n, "NCCL accepted %d ranks on one GPU", size);
        CHECK(strstr(tp_error_msg(), "same GPU (GPU-") || strstr(tp_error_msg(), "same GPU (PCI"),
              "rank %d: the refusal does not name the GPU: %s", rank, tp_error_msg());
        comm_destroy(n);
        tp_error_clear();
    }
    setenv("TPGEN_COMM", "mpi", 1);
    comm *c = comm_create(MPI_COMM_WORLD, g_gpu);
    unsetenv("TPGEN_COMM");
    REQUIRE(c, "TPGEN_COMM=mpi: %s", tp_error_msg());
    CHECK(!strcmp(c->vt->name, "mpi"), "TPGEN_COMM=mpi gave the %s communicator", c->vt->name);
    for (int d = 0; d < 2; d++) {
        tensor *t = tensor_new(g_gpu, k_dts[d], 3, 1001);
        REQUIRE(t, "alloc: %s", tp_error_msg());
        size_t n = tensor_numel(t);
        float *h = xmalloc(n * 4);
        for (size_t i = 0; i < n; i++) h[i] = (float)((i % 7) + rank);   /* small integers: exact in bf16 */
        CHECK(tensor_upload_f32(t, h) == 0, "upload");
        CHECK(comm_allreduce_sum(c, t) == 0, "allreduce: %s", tp_error_msg());
        CHECK(be_sync(g_gpu) == 0 && tensor_download_f32(t, h) == 0, "download: %s", tp_error_msg());
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += h[i] != (float)(size * (int)(i % 7) + size * (size - 1) / 2);
        CHECK(bad == 0, "%s: %zu elements of the staged all-reduce are wrong", dtype_name(k_dts[d]), bad);
        if (rank == 0) for (size_t i = 0; i < n; i++) h[i] = 5.0f;
        CHECK(tensor_upload_f32(t, h) == 0 && comm_bcast(c, t, 0) == 0, "bcast: %s", tp_error_msg());
        CHECK(be_sync(g_gpu) == 0 && tensor_download_f32(t, h) == 0 && h[0] == 5.0f && h[n - 1] == 5.0f,
              "staged broadcast");
        free(h);
        tensor_free(t);
    }
    comm_destroy(c);
}

/* The GroupNorm halves of the band-parallel VAE decode on the device
 * (op_channel_sums: f64 partial sums added in a fixed order; op_channel_affine)
 * against the CPU; at a 1024x1024 VAE's widest shape too (128 channels of
 * 512x512 pixels), where the host fallback took two copies per channel */
TEST_GPU(gpu_channel_sums_and_affine) {
    NEED_GPU(); NEED_CPU(channel_sums); NEED_CPU(channel_affine);
    static const int64_t shapes[][2] = {{64, 5000}, {7, 33}, {128, 512 * 512}};
    for (int sh = 0; sh < 3; sh++)
        for (int d = 0; d < 2; d++) {
            dtype_t dt = k_dts[d];
            int64_t C = shapes[sh][0], HW = shapes[sh][1];
            pair x = pair_rand(dt, C, HW, -2, 3);
            double *cg = xmalloc((size_t)C * sizeof(double)), *cc = xmalloc((size_t)C * sizeof(double));
            double *center = xmalloc((size_t)C * sizeof(double));
            for (int64_t c = 0; c < C; c++) center[c] = frand(-1, 1);
            for (int p = 1; p <= 2; p++) {
                op_channel_sums(g_gpu, &x.g, p == 2 ? center : NULL, p, cg);
                op_channel_sums(g_cpu, &x.c, p == 2 ? center : NULL, p, cc);
                double worst = 0;
                for (int64_t c = 0; c < C; c++) {
                    double e = fabs(cg[c] - cc[c]) / (fabs(cc[c]) + 1e-300);
                    if (e > worst) worst = e;
                }
                printf("# op channel_sums p=%d [%lld,%lld] %-5s max_rel=%.3e\n", p, (long long)C, (long long)HW,
                       dtype_name(dt), worst);
                CHECK(worst <= 1e-10, "channel_sums p=%d %s [%lld,%lld]: relative error %.3e", p, dtype_name(dt),
                      (long long)C, (long long)HW, worst);
            }
            float *a = xmalloc((size_t)C * sizeof(float)), *b = xmalloc((size_t)C * sizeof(float));
            for (int64_t c = 0; c < C; c++) a[c] = frand(0.5f, 2), b[c] = frand(-1, 1);
            pair y = pair_new(dt, C, HW);
            for (int silu = 0; silu < 2; silu++) {
                pair_poison(&y);
                op_channel_affine(g_gpu, &y.g, &x.g, a, b, silu);
                op_channel_affine(g_cpu, &y.c, &x.c, a, b, silu);
                pair_check(&y, silu ? "channel_affine + silu" : "channel_affine", dt == DT_F32 ? 1e-6 : 1e-2);
            }
            free(a), free(b), free(cg), free(cc), free(center);
            pair_free(&x), pair_free(&y);
        }
}

/* The tiled head-dim-512 kernel (the VAE's attention) against the CPU and
 * against the generic kernel it replaces: query rows not a multiple of its 32
 * and keys not a multiple of its 16, a key mask with fully masked rows, causal
 * with q_pos0, GQA, a column view (ld > cols), and the VAE's 64x64-latent
 * shape (4096 tokens x 512) */
TEST_GPU(gpu_attention_hd512_tiled) {
    NEED_GPU(); NEED_CPU(attention);
    int32_t valid[777];
    for (int i = 0; i < 777; i++) valid[i] = (i % 5) != 2 && i > 3;
    for (int k = 0; k < 2; k++) {
        if (k) setenv("TPGEN_CUDA_ATTENTION", "generic", 1);
        else unsetenv("TPGEN_CUDA_ATTENTION");
        for (int d = 0; d < 2; d++) {
            dtype_t dt = k_dts[d];
            attn_case("attention hd512 ragged tiles", dt, 1000, 777, 1, 1, 512, 0, 0, NULL, 0);
            attn_case("attention hd512 key_valid", dt, 77, 777, 1, 1, 512, 0, 0, valid, 0);
            attn_case("attention hd512 causal q_pos0 GQA", dt, 45, 300, 4, 2, 512, 1, 255, NULL, 0);
            attn_case("attention hd512 view", dt, 65, 70, 2, 2, 512, 0, 0, NULL, 3);
            if (!k) attn_case("attention hd512 VAE 64x64 latent", dt, 4096, 4096, 1, 1, 512, 0, 0, NULL, 0);
        }
    }
    unsetenv("TPGEN_CUDA_ATTENTION");
}

#endif /* TPGEN_CUDA */
