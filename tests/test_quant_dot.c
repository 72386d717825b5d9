/* The int8-dot GEMM on quantised (DT_GGML) weights (kernels/cpu/cpu_gemm_qdot.c):
 * every type with an int8 decoder, each kernel forced (AMX-INT8, AVX512-VNNI,
 * AVX2, scalar: the levels of cpu_gemm_qdot_force; a level this CPU lacks
 * runs the next one), f32 and bf16 activations, 1 and 2 threads, M 1 / 2 /
 * 7 (below the AMX kernel's 16) / 20 / 37 (one and two A tiles), N 45
 * (a full and a partial 32-row panel), K of one block, of many blocks, past
 * a k range, and a local row of three segments out of global order that
 * start and end inside blocks. Two independent references:
 *  (1) the weights dequantised (quant_dequant_row: bit-identical to gguf-py)
 *      times the activation as the kernel quantises it, rebuilt here: each
 *      covering block of each segment filled with the segment's columns at
 *      offset skip and zeros elsewhere, qdot_quantize_block, then d * q;
 *      product in double. Bound: 1e-5 x sum |w| |x^| per output (the
 *      kernel's f32 roundings: a few per sub-block, < 100 in a sum here,
 *      each <= 2^-24 of a partial sum <= sum |w| |x^|; plus the dequantiser's
 *      own rounding of s * q + m, one ulp of each |w|);
 *  (2) the f32 activations: |y - w.x| <= bound (1) + sum_k |w_k| d_b(k) / 2,
 *      since round-to-nearest leaves |x - d q| <= d / 2 with d = max|x| / 127
 *      of the block (computed here in double from the block's values).
 * The kernels compute the same integers and f32 operations in the same
 * order: their outputs must be identical bit for bit. */
#include "test.h"
#include "quant_random.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_gemm_qdot.h"
#include "kernels/err.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

enum { NK = 4 };   /* kernel levels */
/* per level, the earlier level whose kernel it runs on this CPU (a level the CPU lacks falls back), else -1 */
static int g_same_as[NK] = {-1, -1, -1, -1};

/* The activation as the int8 kernel sees it, rebuilt from the definition:
 * xq[m][k] = d * q at local column k, and dh[m][k] = d / 2 of its block. */
static void act_ref(const tensor *w, int bs, const float *xf, int64_t M, int64_t K, double *xq, double *dh) {
    float blk[QUANT_MAX_BLOCK];
    int8_t q[QUANT_MAX_BLOCK];
    for (int64_t m = 0; m < M; m++)
        for (int i = 0; i < w->n_qseg; i++) {
            const tensor_qseg *s = &w->qseg[i];
            int64_t nb = (s->skip + s->ncols + bs - 1) / bs;
            for (int64_t j = 0; j < nb; j++) {
                double amax = 0;
                for (int e = 0; e < bs; e++) {
                    int64_t c = j * bs + e - s->skip;
                    blk[e] = c >= 0 && c < s->ncols ? xf[m * K + s->col0 + c] : 0.0f;
                    amax = fabs(blk[e]) > amax ? fabs(blk[e]) : amax;
                }
                float d = qdot_quantize_block(blk, bs, q);
                for (int e = 0; e < bs; e++) {
                    int64_t c = j * bs + e - s->skip;
                    if (c < 0 || c >= s->ncols) continue;
                    xq[m * K + s->col0 + c] = (double)d * q[e];
                    dh[m * K + s->col0 + c] = amax / 127 / 2 * (1 + 1e-6);
                }
            }
        }
}

static int g_fails;   /* failed comparisons, for a summary line without flooding */

static void dot_case(backend *be, int type, int64_t M, int64_t N, int64_t Kg, const span *sp, int nsp, uint32_t *s) {
    const quant_type *qt = quant_type_get(type);
    int64_t K = 0;
    double *wd = NULL;
    tensor *w = segmented_weight(be, type, N, Kg, sp, nsp, s, &K, &wd);
    REQUIRE(w, "%s", tp_error_msg());
    float *xf = xmalloc((size_t)(M * K) * sizeof(float)), *yf[NK];
    double *xq = xmalloc((size_t)(M * K) * sizeof(double)), *dh = xmalloc((size_t)(M * K) * sizeof(double));
    for (int i = 0; i < NK; i++) yf[i] = xmalloc((size_t)(M * N) * sizeof(float));
    /* activations of varied magnitude per block (as real ones), a few exact zeros */
    for (int64_t i = 0; i < M * K; i++) {
        float mag = (float)(1 + (i / 37) % 5);
        xf[i] = rng_next(s) % 17 == 0 ? 0.0f : mag * (float)((int)(rng_next(s) % 2001) - 1000) / 1000.0f;
    }
    for (int xdt = 0; xdt < 2; xdt++) {
        dtype_t dt = xdt ? DT_BF16 : DT_F32;
        if (xdt) for (int64_t i = 0; i < M * K; i++) xf[i] = bf16r(xf[i]);
        act_ref(w, qt->block, xf, M, K, xq, dh);
        tensor *x = tensor_new(be, dt, M, K), *y = tensor_new(be, DT_F32, M, N);
        REQUIRE(x && y, "alloc");
        convert_from_f32(x->data, dt, xf, (size_t)(M * K));
        /* the references and bounds, per output */
        double *ref = xmalloc((size_t)(M * N) * 4 * sizeof(double));
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double r1 = 0, r2 = 0, a1 = 0, a2 = 0;
                for (int64_t k = 0; k < K; k++) {
                    double wv = wd[n * K + k];
                    r1 += wv * xq[m * K + k], r2 += wv * xf[m * K + k];
                    a1 += fabs(wv * xq[m * K + k]), a2 += fabs(wv) * dh[m * K + k];
                }
                double *o = ref + (m * N + n) * 4;
                o[0] = r1, o[1] = 1e-5 * a1 + 1e-30, o[2] = r2, o[3] = o[1] + a2;
            }
        for (int t = 1; t <= 2; t++) {
            omp_set_num_threads(t);
            for (int isa = 0; isa < NK; isa++) {
                if (g_same_as[isa] >= 0) {   /* this CPU runs an earlier level's kernel here: tested already */
                    memcpy(yf[isa], yf[g_same_as[isa]], (size_t)(M * N) * sizeof(float));
                    continue;
                }
                cpu_gemm_qdot_force(isa);
                memset(y->data, 0xff, tensor_nbytes(y));   /* NaN: every element must be written */
                op_gemm(be, y, x, w, NULL);
                memcpy(yf[isa], y->data, (size_t)(M * N) * sizeof(float));
                int bad1 = 0, bad2 = 0;
                double worst1 = 0, worst2 = 0;
                for (int64_t i = 0; i < M * N; i++) {
                    const double *o = ref + i * 4, v = yf[isa][i];
                    double e1 = fabs(v - o[0]) / o[1], e2 = fabs(v - o[2]) / o[3];
                    bad1 += !(e1 <= 1), bad2 += !(e2 <= 1);
                    worst1 = e1 > worst1 || e1 != e1 ? e1 : worst1, worst2 = e2 > worst2 || e2 != e2 ? e2 : worst2;
                }
                CHECK(!bad1 && !bad2, "%s %s x %s, %d segment(s), M %lld N %lld K %lld, %d thread(s): %d outputs past "
                      "bound (1) (worst %.3g of it), %d past bound (2) (worst %.3g)", cpu_gemm_qdot_kernel(),
                      dtype_name(dt), qt->name, nsp, (long long)M, (long long)N, (long long)K, t, bad1, worst1, bad2,
                      worst2);
                g_fails += bad1 || bad2;
            }
            for (int isa = 1; isa < NK; isa++)
                CHECK(!memcmp(yf[0], yf[isa], (size_t)(M * N) * sizeof(float)), "%s x %s M %lld K %lld: kernel %d "
                      "differs from kernel 0 bit for bit", dtype_name(dt), qt->name, (long long)M, (long long)K, isa);
        }
        tensor_free(x), tensor_free(y);
        free(ref);
    }
    cpu_gemm_qdot_force(0);
    tensor_free(w);
    free(wd), free(xf), free(xq), free(dh);
    for (int i = 0; i < NK; i++) free(yf[i]);
}

TEST(quant_dot_quantizer) {
    uint32_t s = test_seed() | 1;
    float x[256];
    int8_t q[256];
    for (int rep = 0; rep < 200; rep++) {
        int n = rep % 2 ? 32 : 256;
        float mag = (float)(rep % 7) * 0.3f;
        for (int i = 0; i < n; i++) x[i] = mag * (float)((int)(rng_next(&s) % 2001) - 1000) / 1000.0f;
        float d = qdot_quantize_block(x, n, q);
        double amax = 0;
        for (int i = 0; i < n; i++) amax = fabs(x[i]) > amax ? fabs(x[i]) : amax;
        CHECK(fabs(d - amax / 127) <= 1e-7 * amax, "d %.9g, max|x| / 127 %.9g", d, amax / 127);
        for (int i = 0; i < n; i++) {
            double e = amax > 0 ? fabs(x[i] - (double)d * q[i]) / (d / 2) : fabs((double)q[i]);
            CHECK(q[i] >= -127 && q[i] <= 127 && e <= 1 + 1e-5, "rep %d elem %d: x %.9g q %d d %.9g", rep, i, x[i],
                  q[i], d);
        }
    }
}

/* a NaN or Inf activation must come out as NaN (the finiteness checks find it), not as a finite value */
TEST(quant_dot_nonfinite) {
    float x[256] = {0};
    int8_t q[256];
    CHECK(qdot_quantize_block(x, 256, q) == 0.0f && q[7] == 0, "zeros: d must be 0");
    x[17] = NAN;
    CHECK(isnan(qdot_quantize_block(x, 256, q)), "a NaN gave a finite d");
    x[17] = INFINITY;
    CHECK(isnan(qdot_quantize_block(x, 32, q)), "an Inf gave a finite d");
    backend *be = backend_cpu_create(1);
    tensor_qseg whole = {0, 256, 0, 0};
    tensor *w = tensor_new_ggml(be, QUANT_Q4_K, 2, 256, 144, &whole, 1);
    tensor *xb = tensor_new(be, DT_BF16, 3, 256), *y = tensor_new(be, DT_F32, 3, 2);
    REQUIRE(w && xb && y, "alloc");
    memset(w->data, 0, 2 * 144);
    uint16_t one = f32_to_f16(1.0f);
    for (int r = 0; r < 2; r++) memcpy((uint8_t *)w->data + r * 144, &one, 2);
    uint16_t *xd = xb->data;
    for (int i = 0; i < 3 * 256; i++) xd[i] = f32_to_bf16(0.5f);
    xd[256 + 9] = f32_to_bf16(NAN);
    cpu_gemm_qdot_policy(1);
    op_gemm(be, y, xb, w, NULL);
    cpu_gemm_qdot_policy(0);
    const float *yf = y->data;
    CHECK(isfinite(yf[0]) && isnan(yf[2]) && isnan(yf[3]) && isfinite(yf[4]), "row 1 holds a NaN: y %g %g %g %g %g %g",
          yf[0], yf[1], yf[2], yf[3], yf[4], yf[5]);
    tensor_free(w), tensor_free(xb), tensor_free(y);
    backend_destroy(be);
}

TEST(quant_dot_kernels) {
    static const int types[] = {QUANT_Q8_0, QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1, QUANT_IQ4_NL,
                                QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_IQ4_XS};
    int saved = omp_get_max_threads();
    backend *be = backend_cpu_create(2);
    uint32_t s = test_seed() | 1;
    cpu_gemm_qdot_policy(1);   /* every type, f32 activations too */
    cpu_gemm_qdot_amx(1);      /* level 0: AMX-INT8 where the CPU has it */
    /* a level this CPU lacks runs the next one: say so, and run each kernel once */
    static const char *const level_name[NK] = {"amx-int8", "avx512vnni", "avx2", "scalar"};
    const char *ran[NK];
    for (int isa = 0; isa < NK; isa++) {
        cpu_gemm_qdot_force(isa);
        ran[isa] = cpu_gemm_qdot_kernel();
        g_same_as[isa] = -1;
        for (int j = 0; j < isa && g_same_as[isa] < 0; j++)
            if (!strcmp(ran[j], ran[isa])) g_same_as[isa] = j;
        if (strcmp(ran[isa], level_name[isa]))
            printf("SKIP - quant_dot_kernels level %d (%s): not on this CPU (or off by TPGEN_QDOT/TPGEN_NO_AVX512); "
                   "it falls back to %s, tested at its own level\n", isa, level_name[isa], ran[isa]);
    }
    cpu_gemm_qdot_force(0);
    int64_t b[3];
    cpu_gemm_qdot_blocking(b);
    const int64_t N = 45;
    CHECK(N % b[1] && N > b[1] && 4608 > b[2] && 4608 % b[2], "N %lld / K 4608 do not cross NR %lld / KR %lld",
          (long long)N, (long long)b[1], (long long)b[2]);
    /* three segments out of global order, each starting and ending inside a block (of 32 and of 256) */
    const span split[] = {{100, 600}, {768, 1000}, {0, 37}}, whole[] = {{0, 1024}};
    static const int64_t Ms[] = {1, 2, 7, 20, 37};
    g_fails = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        REQUIRE(cpu_gemm_qdot_supports(types[i]), "type %d has no int8 kernel", types[i]);
        int bs = quant_type_get(types[i])->block;
        for (size_t j = 0; j < sizeof Ms / sizeof Ms[0]; j++) {
            dot_case(be, types[i], Ms[j], N, 1024, split, 3, &s);
            dot_case(be, types[i], Ms[j], N, 1024, whole, 1, &s);
        }
        dot_case(be, types[i], 3, N, bs, (const span[]){{0, bs}}, 1, &s);   /* one block */
        dot_case(be, types[i], 5, N, 4608, (const span[]){{0, 4608}}, 1, &s); /* two k ranges */
        dot_case(be, types[i], 5, N, 4608, (const span[]){{1000, 4500}, {5, 17}}, 2, &s);
    }
    /* the tp-8 klein-4B shard: 384 columns from inside a Q4_K block */
    dot_case(be, QUANT_Q4_K, 9, 70, 3072, (const span[]){{384, 768}}, 1, &s);
    printf("# quant_dot_kernels: %d failing comparisons (level 0: %s)\n", g_fails, cpu_gemm_qdot_kernel());
    cpu_gemm_qdot_amx(0);
    cpu_gemm_qdot_policy(0);
    omp_set_num_threads(saved);
    backend_destroy(be);
}

TEST(quant_dot_dispatch) {
    backend *be = backend_cpu_create(1);
    tensor_qseg whole = {0, 256, 0, 0};
    tensor *w = tensor_new_ggml(be, QUANT_Q8_0, 4, 256, 8 * 34, &whole, 1);
    tensor *xb = tensor_new(be, DT_BF16, 2, 256), *xf = tensor_new(be, DT_F32, 2, 256);
    REQUIRE(w && xb && xf, "alloc");
    const char *env = getenv("TPGEN_QDOT");
    int off = env && !strcmp(env, "0");
    /* default policy: bf16 activations take the int8 kernel, f32 ones the exact dequantising path */
    CHECK(cpu_gemm_qdot_usable(xb, w) == !off, "bf16 x Q8_0: usable %d", cpu_gemm_qdot_usable(xb, w));
    CHECK(!cpu_gemm_qdot_usable(xf, w), "f32 x Q8_0 must keep the exact path");
    cpu_gemm_qdot_policy(-1);
    CHECK(!cpu_gemm_qdot_usable(xb, w), "policy -1 still takes the int8 kernel");
    cpu_gemm_qdot_policy(0);
    CHECK(!cpu_gemm_qdot_supports(QUANT_F16) && !cpu_gemm_qdot_supports(QUANT_Q8_1), "F16/Q8_1 claimed");
    tensor_free(w), tensor_free(xb), tensor_free(xf);
    backend_destroy(be);
}

/* A GEMM of more rows than the activation budget runs in row chunks: the
 * same bits as one pass (each row's sums do not depend on the chunking),
 * every output written, for a whole-row and an in-block segmented weight. */
TEST(quant_dot_row_chunks) {
    backend *be = backend_cpu_create(2);
    uint32_t s = test_seed() | 1;
    int64_t b[3];
    cpu_gemm_qdot_amx(1);
    cpu_gemm_qdot_blocking(b);
    const int64_t M = 4 * b[0] + 5, N = 45;   /* a whole chunk of 4 x MR rows and a tail */
    static const int types[] = {QUANT_Q8_0, QUANT_Q4_K, QUANT_Q6_K};
    const span split[] = {{100, 600}, {768, 1000}}, whole[] = {{0, 1024}};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        for (int sp = 0; sp < 2; sp++) {
            int64_t K = 0;
            double *wd = NULL;
            tensor *w = segmented_weight(be, types[i], N, 1024, sp ? split : whole, sp ? 2 : 1, &s, &K, &wd);
            REQUIRE(w, "%s", tp_error_msg());
            tensor *x = tensor_new(be, DT_BF16, M, K), *y = tensor_new(be, DT_F32, M, N);
            REQUIRE(x && y, "alloc");
            float *xf = xmalloc((size_t)(M * K) * sizeof(float)), *one = xmalloc((size_t)(M * N) * sizeof(float));
            for (int64_t k = 0; k < M * K; k++) xf[k] = (float)((int)(rng_next(&s) % 2001) - 1000) / 500.0f;
            convert_from_f32(x->data, DT_BF16, xf, (size_t)(M * K));
            op_gemm(be, y, x, w, NULL);
            memcpy(one, y->data, (size_t)(M * N) * sizeof(float));
            cpu_gemm_qdot_act_budget(1);   /* the smallest chunk: 4 x MR rows */
            memset(y->data, 0xff, tensor_nbytes(y));
            op_gemm(be, y, x, w, NULL);
            cpu_gemm_qdot_act_budget(0);
            CHECK(!memcmp(one, y->data, (size_t)(M * N) * sizeof(float)), "%s, %s: chunked rows differ from one pass",
                  quant_type_name(types[i]), sp ? "segments" : "whole rows");
            tensor_free(w), tensor_free(x), tensor_free(y);
            free(wd), free(xf), free(one);
        }
    cpu_gemm_qdot_amx(0);
    backend_destroy(be);
}
