/* cuda_bench: GPU throughput of the CUDA backend's GEMM (against a bare
 * cublasGemmEx call on the same operands) and attention (tensor-core and
 * generic kernels). Built and run by scripts/gpu-check.sh; not part of
 * tpgen itself (it links the same objects).
 *
 *   cuda_bench gemm [M]          klein-4B linear shapes, M tokens (default 4608)
 *   cuda_bench attention [S]     hd 128, 24 and 48 heads, S tokens (default 4608); each kernel
 * Output: one line per case "bench KIND SHAPE ... TFLOP/s". */
#include "kernels/cuda/cuda_internal.h"
#include "kernels/err.h"
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
static double time_ms(backend *be, void (*fn)(void *), void *ctx, int iters) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < 3; i++) fn(ctx);
    cudaEventRecord(a, cuda_stream(be));
    for (int i = 0; i < iters; i++) fn(ctx);
    cudaEventRecord(b, cuda_stream(be));
    if (be_sync(be)) tp_fatal("%s", tp_error_msg());
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / iters;
}

typedef struct { backend *be; tensor *y, *x, *w; cublasHandle_t h; } gemm_ctx;

static void run_op_gemm(void *p) { gemm_ctx *c = p; op_gemm(c->be, c->y, c->x, c->w, NULL); }

static void run_raw_cublas(void *p) {
    gemm_ctx *c = p;
    float one = 1, zero = 0;
    cudaDataType_t t = c->x->dtype == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasGemmEx(c->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)c->w->rows, (int)c->x->rows, (int)c->x->cols, &one, c->w->data, t,
                 (int)c->w->ld, c->x->data, t, (int)c->x->ld, &zero, c->y->data, t, (int)c->y->ld, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
}

static int bench_gemm_shapes(backend *be, int64_t M) {
    /* klein-4B at tp 1: D 3072, M 9216: to_q/k/v/out, linear_in (2M), linear_out, single qkv+mlp, single out */
    static const int64_t shapes[][2] = {{3072, 3072}, {18432, 3072}, {3072, 9216}, {27648, 3072}, {3072, 12288}};
    cublasHandle_t h;
    cublasCreate(&h);
    cublasSetStream(h, cuda_stream(be));
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

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "gemm") && strcmp(argv[1], "attention"))) {
        fprintf(stderr, "usage: cuda_bench gemm [M] | attention [S]\n");
        return 2;
    }
    backend *be = cudaplug_backend_create(0);
    if (!be) {
        fprintf(stderr, "cuda_bench: error: %s\n", tp_error_msg());
        return 1;
    }
    int64_t n = argc > 2 ? atoll(argv[2]) : 4608;
    int rc = !strcmp(argv[1], "gemm") ? bench_gemm_shapes(be, n) : bench_attention(be, n);
    backend_destroy(be);
    return rc;
}
