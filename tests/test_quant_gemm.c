/* The CPU GEMM on quantised (DT_GGML) weights: every supported block type,
 * random valid blocks, a local row made of segments that start and end
 * inside blocks (a row-parallel shard's covering blocks with their skips)
 * and a whole-row one, on shapes that cross the packed GEMM's blocking
 * edges, at 1 and 2 threads, f32 and bf16 activations; the reference is the
 * whole rows dequantised (quant_dequant_row, bit-identical to gguf-py),
 * the segments' columns picked out, and the product in double. This is the
 * dequantising packed path (int8-dot route off: cpu_gemm_qdot_policy(-1));
 * tests/test_quant_dot.c tests the int8 one. */
#include "test.h"
#include "quant_random.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_gemm_packed.h"
#include "kernels/cpu/cpu_gemm_qdot.h"
#include "kernels/err.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>


/* N x Kg weights of `type`; the local tensor holds columns `sp` (in that
 * order) as covering blocks; GEMM with M x K activations against double. */
static void quant_case(backend *be, int type, int64_t M, int64_t N, int64_t Kg, const span *sp, int nsp, uint32_t *s) {
    const quant_type *qt = quant_type_get(type);
    int64_t K = 0;
    double *wd = NULL;
    tensor *w = segmented_weight(be, type, N, Kg, sp, nsp, s, &K, &wd);
    REQUIRE(w, "%s", tp_error_msg());
    float *xf = xmalloc((size_t)(M * K) * sizeof(float)), *yf = xmalloc((size_t)(M * N) * sizeof(float));
    float *ref = xmalloc((size_t)(M * N) * sizeof(float));
    for (int64_t i = 0; i < M * K; i++) xf[i] = (float)((int)(rng_next(s) % 2001) - 1000) / 1000.0f;
    for (int xdt = 0; xdt < 2; xdt++) {
        dtype_t dt = xdt ? DT_BF16 : DT_F32;
        if (xdt) for (int64_t i = 0; i < M * K; i++) xf[i] = bf16r(xf[i]);   /* what a bf16 x holds */
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double a = 0;
                for (int64_t k = 0; k < K; k++) a += (double)xf[m * K + k] * wd[n * K + k];
                ref[m * N + n] = (float)a;
            }
        tensor *x = tensor_new(be, dt, M, K), *y = tensor_new(be, DT_F32, M, N);
        REQUIRE(x && y, "alloc");
        convert_from_f32(x->data, dt, xf, (size_t)(M * K));
        static const int thr[] = {1, 2};
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(thr[t]);
            memset(y->data, 0xff, tensor_nbytes(y));   /* NaN: every element must be written */
            op_gemm(be, y, x, w, NULL);
            memcpy(yf, y->data, (size_t)(M * N) * sizeof(float));
            double e = rel_l2(yf, ref, (size_t)(M * N));
            CHECK(e <= 1e-5, "%s x %s, %d segment(s), %lldx%lldx%lld, %d thread(s): rel err %.3g", dtype_name(dt),
                  qt->name, nsp, (long long)M, (long long)N, (long long)K, thr[t], e);
        }
        tensor_free(x), tensor_free(y);
    }
    tensor_free(w);
    free(wd), free(xf), free(yf), free(ref);
}

TEST(quant_gemm_types_segments) {
    static const int types[] = {QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1, QUANT_Q8_0, QUANT_IQ4_NL,
                                QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_IQ4_XS};
    int saved = omp_get_max_threads();
    backend *be = backend_cpu_create(2);
    uint32_t s = test_seed() | 1;
    cpu_gemm_qdot_policy(-1);   /* bf16 x too: the packed path, not the int8-dot kernel */
    /* 64 KB tile budget: k blocks of 64 (inside every 256-block), B blocks of NR rows */
    cpu_set_tile_budget(65536);
    const int64_t M = 75, N = 530, Kg = 1024;
    /* three segments out of global order, each starting and ending inside a block */
    const span split[] = {{100, 600}, {768, 1000}, {0, 37}}, whole[] = {{0, Kg}};
    int64_t b[6];
    cpu_gemm_packed_blocking(M, N, 769, DT_F32, b);
    CHECK(M % b[0] && N % b[1] && 769 > b[2] && 769 % b[2] && N > b[3], "shape %lldx%lldx769 does not cross the "
          "blocking edges (MR %lld NR %lld kc %lld nc %lld)", (long long)M, (long long)N, (long long)b[0],
          (long long)b[1], (long long)b[2], (long long)b[3]);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        REQUIRE(quant_supported(types[i]), "type %d", types[i]);
        quant_case(be, types[i], M, N, Kg, split, 3, &s);
        quant_case(be, types[i], M, N, Kg, whole, 1, &s);
    }
    cpu_set_tile_budget(0);
    /* default blocking, one token and a partial tile */
    quant_case(be, QUANT_Q4_K, 1, 3072, 3072, (const span[]){{384, 768}}, 1, &s);
    quant_case(be, QUANT_Q8_0, 33, 700, 1536, (const span[]){{0, 1536}}, 1, &s);
    cpu_gemm_qdot_policy(0);
    omp_set_num_threads(saved);
    backend_destroy(be);
}
