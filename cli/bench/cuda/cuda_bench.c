/* cuda_bench: GPU throughput of the CUDA backend's GEMM (against a bare
 * cublasGemmEx call on the same operands) and attention (tensor-core and
 * generic kernels). Built and run by scripts/gpu-check.sh; not part of
 * tpgen itself (it links the same objects).
 *
 *   cuda_bench gemm [M]          klein-4B linear shapes, M tokens (default 4608)
 *   cuda_bench attention [S]     hd 128, 24 and 48 heads, S tokens (default 4608); each kernel
 *   cuda_bench verify block|vae  production shapes against the CPU backend: a klein-4B-width
 *                                forward (1 double + 1 single block, 4096 + 512 tokens, random
 *                                weights), its attention (S 4608, 24 heads x 128) and GEMMs (bf16); the VAE
 *                                attention (16384 tokens x 512, f32 and bf16); each timed on one
 *                                call, without warm-up (the VAE's takes seconds on the generic kernel)
 * Output: one line per case "bench KIND SHAPE ... TFLOP/s" or "verify NAME ... PASS|FAIL";
 * exit status 1 on any failure (a cuBLAS or CUDA error aborts with its message). */
#include "kernels/cuda/cuda_internal.h"
#include "kernels/err.h"
#include "kernels/comm.h"
#include "core/models/flux2/flux2.h"
#include <mpi.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fill(tensor *t, unsigned seed) {
    size_t n = tensor_numel(t);
    float *h = xmalloc(n * sizeof *h);
    srand(seed);
    for (size_t i = 0; i < n; i++) h[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.2f;
    if (tensor_upload_f32(t, h)) tp_fatal("upload: %s", tp_error_msg());
    free(h);
}

static tensor *make(backend *be, dtype_t dt, int64_t r, int64_t c, unsigned seed) {
    tensor *t = tensor_new(be, dt, r, c);
    if (!t) tp_fatal("%s", tp_error_msg());
    fill(t, seed);
    return t;
}

/* milliseconds per call of fn(ctx), after warm-up, timed with events on the backend's stream */
static double time_ms_w(backend *be, void (*fn)(void *), void *ctx, int warm, int iters) {
    if (be->kind != BACKEND_CUDA) {   /* the dry run's CPU stand-in: wall time */
        for (int i = 0; i < warm; i++) fn(ctx);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) fn(ctx);
        return (MPI_Wtime() - t0) * 1e3 / iters;
    }
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < warm; i++) fn(ctx);
    CUDA_CHECK(cudaEventRecord(a, cuda_stream(be)));
    for (int i = 0; i < iters; i++) fn(ctx);
    CUDA_CHECK(cudaEventRecord(b, cuda_stream(be)));
    if (be_sync(be)) tp_fatal("%s", tp_error_msg());
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / iters;
}
static double time_ms(backend *be, void (*fn)(void *), void *ctx, int iters) { return time_ms_w(be, fn, ctx, 3, iters); }

typedef struct { backend *be; tensor *y, *x, *w; cublasHandle_t h; } gemm_ctx;

static void run_op_gemm(void *p) { gemm_ctx *c = p; op_gemm(c->be, c->y, c->x, c->w, NULL); }

static void run_raw_cublas(void *p) {
    gemm_ctx *c = p;
    float one = 1, zero = 0;
    cudaDataType_t t = c->x->dtype == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    CUBLAS_CHECK(cublasGemmEx(c->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)c->w->rows, (int)c->x->rows, (int)c->x->cols, &one, c->w->data, t,
                 (int)c->w->ld, c->x->data, t, (int)c->x->ld, &zero, c->y->data, t, (int)c->y->ld, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT));
}

static int bench_gemm_shapes(backend *be, int64_t M) {
    /* klein-4B at tp 1: D 3072, M 9216: to_q/k/v/out, linear_in (2M), linear_out, single qkv+mlp, single out */
    static const int64_t shapes[][2] = {{3072, 3072}, {18432, 3072}, {3072, 9216}, {27648, 3072}, {3072, 12288}};
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    CUBLAS_CHECK(cublasSetStream(h, cuda_stream(be)));
    CUBLAS_CHECK(cublasSetMathMode(h, cuda_blas_math_mode()));   /* the backend's own mode: a fair comparison */
    for (int d = 0; d < 2; d++) {
        dtype_t dt = d ? DT_F32 : DT_BF16;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            if (dt == DT_F32 && s > 1) break;  /* f32 is the reference mode: two shapes are enough */
            int64_t N = shapes[s][0], K = shapes[s][1];
            gemm_ctx c = {be, make(be, dt, M, N, 1), make(be, dt, M, K, 2), make(be, dt, N, K, 3), h};
            double flop = 2.0 * M * N * K;
            double t_op = time_ms(be, run_op_gemm, &c, 20), t_raw = time_ms(be, run_raw_cublas, &c, 20);
            printf("bench gemm %-5s M=%lld N=%lld K=%lld op_gemm %.3f ms %.1f TFLOP/s | cublasGemmEx %.3f ms %.1f TFLOP/s\n",
                   dtype_name(dt), (long long)M, (long long)N, (long long)K, t_op, flop / t_op / 1e9, t_raw,
                   flop / t_raw / 1e9);
            tensor_free(c.y); tensor_free(c.x); tensor_free(c.w);
        }
    }
    /* E4M3 weights (per-tensor and per-row scales) with bf16 activations: the
     * fp8 tensor-core path (sm_89+) against the dequantising path */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int per_row = 0; per_row < 2; per_row++) {
            int64_t N = shapes[s][0], K = shapes[s][1];
            tensor *w = tensor_new(be, DT_F8_E4M3, N, K);
            if (!w) tp_fatal("%s", tp_error_msg());
            uint8_t *q = xmalloc((size_t)(N * K));
            srand(9);
            for (int64_t i = 0; i < N * K; i++) q[i] = (uint8_t)((rand() & 0x3f) | (rand() & 0x80));
            int64_t ns = per_row ? N : 1;
            float *sc = xmalloc((size_t)ns * sizeof(float));
            for (int64_t i = 0; i < ns; i++) sc[i] = 1e-3f;
            w->scale = be_alloc(be, (size_t)ns * sizeof(float));
            w->scale_per_row = per_row;
            if (tensor_upload_raw(w, q) || !w->scale || be_upload(be, w->scale, sc, (size_t)ns * sizeof(float)))
                tp_fatal("%s", tp_error_msg());
            free(q), free(sc);
            gemm_ctx c = {be, make(be, DT_BF16, M, N, 1), make(be, DT_BF16, M, K, 2), w, h};
            double flop = 2.0 * M * N * K;
            double t_fp8 = time_ms(be, run_op_gemm, &c, 20);
            setenv("TPGEN_FP8_GEMM", "0", 1);
            double t_deq = time_ms(be, run_op_gemm, &c, 20);
            unsetenv("TPGEN_FP8_GEMM");
            printf("bench gemm FP8 M=%lld N=%lld K=%lld scale=%s op_gemm %.3f ms %.1f TFLOP/s | dequant path %.3f ms %.1f TFLOP/s\n",
                   (long long)M, (long long)N, (long long)K, per_row ? "row" : "tensor", t_fp8, flop / t_fp8 / 1e9, t_deq,
                   flop / t_deq / 1e9);
            tensor_free(c.y); tensor_free(c.x); tensor_free(w);
        }
    cublasDestroy(h);
    return 0;
}

typedef struct { backend *be; tensor *o, *q, *k, *v; attn_params p; } attn_ctx;
static void run_attn(void *p) { attn_ctx *c = p; op_attention(c->be, c->o, c->q, c->k, c->v, &c->p); }

static int bench_attention(backend *be, int64_t S) {
    static const int heads[] = {24, 48};
    for (int i = 0; i < 2; i++) {
        int H = heads[i], hd = 128;
        attn_ctx c = {be, make(be, DT_BF16, S, (int64_t)H * hd, 4), make(be, DT_BF16, S, (int64_t)H * hd, 5),
                      make(be, DT_BF16, S, (int64_t)H * hd, 6), make(be, DT_BF16, S, (int64_t)H * hd, 7),
                      {H, H, hd, 0.08838834764831845f, 0, 0, NULL}};
        double flop = 4.0 * S * S * hd * H;
        static const char *kinds[] = {"wmma", "mma", "generic"};
        for (int g = 0; g < 3; g++) {
            setenv("TPGEN_CUDA_ATTENTION", kinds[g], 1);
            double t = time_ms(be, run_attn, &c, g == 2 ? 2 : 10);
            printf("bench attention bf16 S=%lld heads=%d hd=%d %-7s %.3f ms %.1f TFLOP/s\n", (long long)S, H, hd,
                   kinds[g], t, flop / t / 1e9);
        }
        unsetenv("TPGEN_CUDA_ATTENTION");
        tensor_free(c.o); tensor_free(c.q); tensor_free(c.k); tensor_free(c.v);
    }
    return 0;
}

/* ---- production shapes against the CPU backend ---- */

/* the same random data on the GPU and the CPU */
static void twin(backend *g, backend *c, dtype_t dt, int64_t r, int64_t n, unsigned seed, float amp, tensor **tg,
                 tensor **tc) {
    *tg = tensor_new(g, dt, r, n);
    *tc = tensor_new(c, dt, r, n);
    if (!*tg || !*tc) tp_fatal("%s", tp_error_msg());
    size_t m = (size_t)(r * n);
    float *h = xmalloc(m * sizeof *h);
    srand(seed);
    for (size_t i = 0; i < m; i++) h[i] = ((float)rand() / RAND_MAX - 0.5f) * 2 * amp;
    if (tensor_upload_f32(*tg, h) || tensor_upload_f32(*tc, h)) tp_fatal("upload: %s", tp_error_msg());
    free(h);
}

/* rel L2 of the GPU result against the CPU's; prints the verdict line; 1 on failure */
static int verdict(const char *name, backend *g, const tensor *yg, const tensor *yc, double tol, double gpu_ms) {
    size_t n = tensor_numel(yg);
    float *a = xmalloc(n * sizeof *a), *b = xmalloc(n * sizeof *b);
    if (be_sync(g) || tensor_download_f32(yg, a) || tensor_download_f32(yc, b)) tp_fatal("%s: %s", name, tp_error_msg());
    double num = 0, den = 0, mx = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) bad++;
        double d = (double)a[i] - b[i];
        num += d * d, den += (double)b[i] * b[i];
        if (fabs(d) > mx) mx = fabs(d);
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    int fail = bad || !(e <= tol);
    printf("verify %s rel_l2=%.3e max_abs=%.3e non_finite=%zu tol=%.0e gpu=%.2f ms %s\n", name, e, mx, bad, tol, gpu_ms,
           fail ? "FAIL" : "PASS");
    fflush(stdout);
    free(a), free(b);
    return fail;
}

typedef struct { backend *be; tensor *y; const tensor *x, *w; } vgemm_ctx;
static void run_vgemm(void *p) { vgemm_ctx *c = p; op_gemm(c->be, c->y, c->x, c->w, NULL); }

/* div > 1: the dry run (CUDA_BENCH_BACKEND=cpu), token counts divided by div */
static int verify(backend *g, const char *what, int div) {
    backend *c = backend_cpu_create(omp_get_num_procs());
    if (!c) tp_fatal("CPU backend: %s", tp_error_msg());
    int fails = 0;
    if (!strcmp(what, "block")) {
        /* FLUX.2-klein-4B at 1024x1024: 4096 image + 512 text tokens, 24 heads x 128 (D 3072) */
        int64_t S = 4608 / div, H = 24, hd = 128;
        tensor *qg, *qc, *kg, *kc, *vg, *vc, *og, *oc;
        twin(g, c, DT_BF16, S, H * hd, 11, 2.0f, &qg, &qc);
        twin(g, c, DT_BF16, S, H * hd, 12, 2.0f, &kg, &kc);
        twin(g, c, DT_BF16, S, H * hd, 13, 1.0f, &vg, &vc);
        twin(g, c, DT_BF16, S, H * hd, 14, 1.0f, &og, &oc);
        static const char *kinds[] = {NULL, "wmma", "mma"};
        for (int k = 0; k < 3; k++) {
            attn_ctx a = {g, og, qg, kg, vg, {(int)H, (int)H, (int)hd, 1.0f / sqrtf((float)hd), 0, 0, NULL}};
            if (kinds[k]) setenv("TPGEN_CUDA_ATTENTION", kinds[k], 1);
            double t = time_ms_w(g, run_attn, &a, 0, 1);
            unsetenv("TPGEN_CUDA_ATTENTION");
            if (k == 0) op_attention(c, oc, qc, kc, vc, &a.p);
            char name[96];
            snprintf(name, sizeof name, "attention-S%lld-%lldx%lld-bf16-%s", (long long)S, (long long)H, (long long)hd,
                     kinds[k] ? kinds[k] : "default");
            fails += verdict(name, g, og, oc, 1e-2, t);
        }
        tensor_free(qg), tensor_free(qc), tensor_free(kg), tensor_free(kc), tensor_free(vg), tensor_free(vc);
        tensor_free(og), tensor_free(oc);
        /* one double and one single block at klein-4B widths, random weights from the same seed on both
         * backends, bf16, the whole forward (embedders, modulation, RoPE, norms, attention, MLPs, all-reduce
         * of a 1-rank group, final layer) */
        {
            flux2_config cfg = {.patch_size = 1, .in_channels = 128, .out_channels = 128, .num_layers = 1,
                                .num_single_layers = 1, .head_dim = 128, .heads = 24, .joint_dim = 7680,
                                .time_channels = 256, .mlp_ratio = 3.0, .n_axes = 4, .axes_dims = {32, 32, 32, 32},
                                .rope_theta = 2000, .eps = 1e-6f, .guidance_embeds = 0};
            cfg.D = 3072, cfg.M = 9216, cfg.out_dim = 128;
            int64_t N = 4096 / div, L = 512 / div;
            float *x = xmalloc((size_t)(N * 128) * 4), *txt = xmalloc((size_t)(L * 7680) * 4);
            float *og = xmalloc((size_t)(N * 128) * 4), *oc = xmalloc((size_t)(N * 128) * 4);
            int32_t *img_ids = xcalloc((size_t)N * 4, 4), *txt_ids = xcalloc((size_t)L * 4, 4);
            for (int64_t i = 0; i < N * 128; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
            for (int64_t i = 0; i < L * 7680; i++) txt[i] = (float)((i * 13) % 97) / 48.0f - 1.0f;
            for (int64_t i = 0; i < N; i++) img_ids[i * 4 + 1] = (int32_t)(i / 64), img_ids[i * 4 + 2] = (int32_t)(i % 64);
            for (int64_t l = 0; l < L; l++) txt_ids[l * 4 + 3] = (int32_t)l;
            comm *cg = comm_create_mpi(MPI_COMM_SELF, g), *cc = comm_create_mpi(MPI_COMM_SELF, c);
            flux2_model *mg = NULL, *mc = NULL;
            if (flux2_init_random(&cfg, g, cg, DT_BF16, 1234, &mg) || flux2_init_random(&cfg, c, cc, DT_BF16, 1234, &mc))
                tp_fatal("random klein-4B block: %s", tp_error_msg());
            double t0 = MPI_Wtime();
            if (flux2_forward(mg, x, N, img_ids, txt, L, txt_ids, 0.5f, NULL, og) || be_sync(g))
                tp_fatal("forward (cuda): %s", tp_error_msg());
            double t_gpu = (MPI_Wtime() - t0) * 1e3;
            if (flux2_forward(mc, x, N, img_ids, txt, L, txt_ids, 0.5f, NULL, oc)) tp_fatal("forward (cpu): %s", tp_error_msg());
            tensor tg = tensor_wrap(c, DT_F32, N, 128, og), tc = tensor_wrap(c, DT_F32, N, 128, oc);
            char name[96];
            snprintf(name, sizeof name, "klein4B-widths-1-double-1-single-S%lld-bf16-forward", (long long)(N + L));
            fails += verdict(name, c, &tg, &tc, 3e-2, t_gpu);
            flux2_free(mg), flux2_free(mc);
            comm_destroy(cg), comm_destroy(cc);
            free(x), free(txt), free(og), free(oc), free(img_ids), free(txt_ids);
        }
        /* the block's GEMMs: attention projection (K 3072) and the single block's output (K 12288) */
        static const int64_t shapes[][2] = {{3072, 3072}, {3072, 12288}};
        for (int s = 0; s < 2; s++) {
            int64_t N = shapes[s][0], K = shapes[s][1];
            tensor *xg, *xc, *wg, *wc, *yg, *yc;
            twin(g, c, DT_BF16, S, K, 21, 1.0f, &xg, &xc);
            twin(g, c, DT_BF16, N, K, 22, 0.02f, &wg, &wc);
            twin(g, c, DT_BF16, S, N, 23, 0.0f, &yg, &yc);
            vgemm_ctx v = {g, yg, xg, wg};
            double t = time_ms_w(g, run_vgemm, &v, 1, 2);
            op_gemm(c, yc, xc, wc, NULL);
            char name[96];
            snprintf(name, sizeof name, "gemm-M%lld-N%lld-K%lld-bf16", (long long)S, (long long)N, (long long)K);
            fails += verdict(name, g, yg, yc, 1e-2, t);
            tensor_free(xg), tensor_free(xc), tensor_free(wg), tensor_free(wc), tensor_free(yg), tensor_free(yc);
        }
    } else {
        /* the VAE's attention at 1024x1024: 128x128 latent pixels, one head of 512 */
        int64_t S = 16384 / (2 * div), hd = 512;
        for (int d = 0; d < 2; d++) {
            dtype_t dt = d ? DT_BF16 : DT_F32;
            tensor *qg, *qc, *kg, *kc, *vg, *vc, *og, *oc;
            twin(g, c, dt, S, hd, 31, 1.0f, &qg, &qc);
            twin(g, c, dt, S, hd, 32, 1.0f, &kg, &kc);
            twin(g, c, dt, S, hd, 33, 1.0f, &vg, &vc);
            twin(g, c, dt, S, hd, 34, 1.0f, &og, &oc);
            attn_ctx a = {g, og, qg, kg, vg, {1, 1, (int)hd, 1.0f / sqrtf((float)hd), 0, 0, NULL}};
            double t = time_ms_w(g, run_attn, &a, 0, 1);
            op_attention(c, oc, qc, kc, vc, &a.p);
            char name[96];
            snprintf(name, sizeof name, "vae-attention-S%lld-hd%lld-%s", (long long)S, (long long)hd, dtype_name(dt));
            fails += verdict(name, g, og, oc, dt == DT_F32 ? 1e-4 : 1e-2, t);
            tensor_free(qg), tensor_free(qc), tensor_free(kg), tensor_free(kc), tensor_free(vg), tensor_free(vc);
            tensor_free(og), tensor_free(oc);
        }
    }
    backend_destroy(c);
    return fails ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "gemm") && strcmp(argv[1], "attention") && strcmp(argv[1], "verify")) ||
        (!strcmp(argv[1], "verify") && (argc < 3 || (strcmp(argv[2], "block") && strcmp(argv[2], "vae"))))) {
        fprintf(stderr, "usage: cuda_bench gemm [M] | attention [S] | verify block|vae\n");
        return 2;
    }
    MPI_Init(&argc, &argv);   /* the block check's 1-rank communicators */
    /* CUDA_BENCH_BACKEND=cpu: verify with a CPU backend standing in for the GPU, shapes / 8 (VAE / 16; gpu-check's dry run) */
    const char *fake = getenv("CUDA_BENCH_BACKEND");
    int dry = fake && !strcmp(fake, "cpu");
    if (dry && strcmp(argv[1], "verify")) {
        fprintf(stderr, "cuda_bench: CUDA_BENCH_BACKEND=cpu runs verify only\n");
        MPI_Finalize();
        return 2;
    }
    backend *be = dry ? backend_cpu_create(omp_get_num_procs()) : cudaplug_backend_create(0);
    if (!be) {
        fprintf(stderr, "cuda_bench: error: %s\n", tp_error_msg());
        MPI_Finalize();
        return 1;
    }
    int64_t n = argc > 2 ? atoll(argv[2]) : 4608;
    int rc = !strcmp(argv[1], "verify") ? verify(be, argv[2], dry ? 8 : 1)
             : !strcmp(argv[1], "gemm") ? bench_gemm_shapes(be, n) : bench_attention(be, n);
    backend_destroy(be);
    MPI_Finalize();
    return rc;
}
