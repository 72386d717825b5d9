/* CPU op tests: every op of kernels/ops.h against a naive reference written
 * here (plain loops, double accumulation) on fresh random data. Outputs are
 * NaN-poisoned before each op runs and live in views with ld > cols, whose
 * pad columns must stay untouched. f32 results must agree to ~1e-5
 * (relative L2); bf16 results are compared with the reference rounded at the
 * same points and may differ by one bf16 ulp (fp32 vs double). */
#include "test.h"
#include "kernels/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_amx.h"
#include "kernels/cpu/cpu_gemm_amx.h"
#include "kernels/cpu/cpu_gemm_packed.h"
#include "kernels/err.h"
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

static backend *cpu(void) {
    static backend *be;
    if (!be) be = backend_cpu_create(0);
    return be;
}

static uint64_t g_rng;
static double urand(void) { /* splitmix64, seeded from the harness's srand */
    if (!g_rng) g_rng = (uint64_t)rand() * 2654435761u + 1;
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }
static float rnd_to(dtype_t dt, double v) {
    return dt == DT_BF16 ? bf16r((float)v) : dt == DT_F16 ? f16_to_f32(f32_to_f16((float)v)) : (float)v;
}

/* A tensor view with one pad column on the left and `pad` on the right, so
 * ld > cols and data is not at the start of the allocation. */
typedef struct { tensor *base; tensor t; } tbuf;

static tbuf tb_new(dtype_t dt, int64_t rows, int64_t cols, int pad) {
    tbuf b;
    b.base = tensor_new(cpu(), dt, rows, cols + (pad ? pad + 1 : 0));
    b.t = pad ? tensor_cols(b.base, 1, cols) : *b.base;
    b.t.owner = 0;
    return b;
}
static void tb_free(tbuf *b) { tensor_free(b->base); }

static void poison(tbuf *b) {
    size_t n = tensor_numel(b->base);
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    tensor_upload_f32(b->base, nan);
    free(nan);
}

/* random values (already representable in the dtype) -> tensor; returns the host copy */
static float *tb_rand(tbuf *b, float lo, float hi) {
    poison(b);
    size_t n = tensor_numel(&b->t);
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = rnd_to(b->t.dtype, frand(lo, hi));
    tensor_upload_f32(&b->t, v);
    return v;
}
static float *tb_get(const tbuf *b) {
    float *v = malloc(tensor_numel(&b->t) * sizeof(float));
    tensor_download_f32(&b->t, v);
    return v;
}
static tbuf tb_out(dtype_t dt, int64_t rows, int64_t cols) { tbuf b = tb_new(dt, rows, cols, 2); poison(&b); return b; }

/* the pad columns of a poisoned output must still be NaN */
static int pads_untouched(const tbuf *b) {
    if (b->t.ld == b->t.cols) return 1;
    size_t n = tensor_numel(b->base);
    float *all = malloc(n * sizeof(float));
    tensor_download_f32(b->base, all);
    int ok = 1;
    int64_t ld = b->base->cols;
    for (int64_t r = 0; r < b->base->rows && ok; r++)
        for (int64_t c = 0; c < ld; c++)
            if ((c == 0 || c > b->t.cols) && !isnan(all[r * ld + c])) { ok = 0; break; }
    free(all);
    return ok;
}

static double bf16_ulp(double v) {
    int e;
    if (v == 0) return 0;
    frexp(v, &e); /* v = m 2^e, m in [0.5,1): 8 significant bits -> ulp 2^(e-8) */
    return ldexp(1.0, e - 8);
}

/* got vs ref: f32 -> relative L2 <= tol; bf16 -> every element within one
 * ulp of the rounded reference (+ atol for values that cancel to ~0). */
static void check_close_(const char *file, int line, const char *what, dtype_t dt, const float *got,
                         const float *ref, size_t n, double tol, int max_ulps) {
    double rms = 0;
    for (size_t i = 0; i < n; i++) rms += (double)ref[i] * ref[i];
    rms = sqrt(rms / (n ? n : 1));
    for (size_t i = 0; i < n; i++)
        if (isnan(got[i]) != isnan(ref[i])) {
            test_fail(file, line, "%s: element %zu is %g, reference %g", what, i, got[i], ref[i]);
            return;
        }
    if (dt == DT_F32) {
        double e = rel_l2(got, ref, n);
        if (!(e <= tol)) test_fail(file, line, "%s: relative L2 error %.3g > %.3g", what, e, tol);
        return;
    }
    size_t inexact = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        inexact += d != 0;
        if (!(d <= bf16_ulp(ref[i]) * max_ulps * 1.001 + 1e-3 * rms)) {
            test_fail(file, line, "%s: element %zu is %.8g, reference %.8g (more than %d bf16 ulp)", what, i, got[i],
                      ref[i], max_ulps);
            return;
        }
    }
    /* rounding at the wrong points shows up as many 1-ulp differences;
     * fp32-vs-double accumulation only rarely crosses a rounding boundary */
    if (inexact > n / 50 + 1)
        test_fail(file, line, "%s: %zu of %zu elements differ from the reference by one bf16 ulp (max %zu)", what,
                  inexact, n, n / 50 + 1);
}
#define check_close(what, dt, got, ref, n, tol) check_close_(__FILE__, __LINE__, what, dt, got, ref, n, tol, 1)
/* two chained bf16 roundings (e.g. GroupNorm, then SiLU): an fp32-vs-double
 * difference at the first rounding boundary can become 2 ulps after the second */
#define check_close2(what, dt, got, ref, n, tol) check_close_(__FILE__, __LINE__, what, dt, got, ref, n, tol, 2)
#define F32_TOL 1e-5

/* ------------------------------------------------------------------- GEMM */

static void gemm_case(int64_t M, int64_t N, int64_t K, dtype_t xd, dtype_t wd, dtype_t yd, int with_bias) {
    char what[128];
    snprintf(what, sizeof what, "gemm %lldx%lldx%lld x=%s w=%s y=%s bias=%d", (long long)M, (long long)N, (long long)K,
             dtype_name(xd), dtype_name(wd), dtype_name(yd), with_bias);
    tbuf x = tb_new(xd, M, K, 3), w = tb_new(wd, N, K, 0), b = tb_new(wd, 1, N, 0), y = tb_out(yd, M, N);
    float *hx = tb_rand(&x, -1, 1), *hw = tb_rand(&w, -1, 1), *hb = tb_rand(&b, -1, 1);
    op_gemm(cpu(), &y.t, &x.t, &w.t, with_bias ? &b.t : NULL);
    float *got = tb_get(&y), *ref = malloc((size_t)(M * N) * sizeof(float));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = with_bias ? hb[j] : 0;
            for (int64_t k = 0; k < K; k++) s += (double)hx[i * K + k] * hw[j * K + k];
            ref[i * N + j] = rnd_to(yd, s);
        }
    check_close(what, yd, got, ref, (size_t)(M * N), F32_TOL);
    CHECK(pads_untouched(&y), "%s: wrote outside the output view", what);
    free(hx); free(hw); free(hb); free(got); free(ref);
    tb_free(&x); tb_free(&w); tb_free(&b); tb_free(&y);
}

static void gemm_all_dtypes(int64_t M, int64_t N, int64_t K) {
    const dtype_t c[][3] = {{DT_F32, DT_F32, DT_F32}, {DT_F32, DT_BF16, DT_F32}, {DT_BF16, DT_BF16, DT_BF16},
                            {DT_BF16, DT_BF16, DT_F32}, {DT_F32, DT_F32, DT_BF16}, {DT_BF16, DT_F32, DT_F32}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        for (int bias = 0; bias < 2; bias++) gemm_case(M, N, K, c[i][0], c[i][1], c[i][2], bias);
}

TEST(ops_gemm_odd_sizes) {
    gemm_all_dtypes(37, 70, 45);
    gemm_all_dtypes(1, 19, 33);     /* one token (a GEMV) */
    gemm_all_dtypes(130, 300, 257); /* several weight panels */
}

TEST(ops_gemm_bf16_paths) { /* the AVX512-BF16 kernel (when present) and the portable path agree with the reference */
    for (int portable = 0; portable < 2; portable++) {
        cpu_kernel_route(portable ? CPU_ROUTE_PORTABLE : CPU_ROUTE_VECTOR);
        gemm_case(67, 131, 96, DT_BF16, DT_BF16, DT_BF16, 1);
        gemm_case(200, 64, 258, DT_BF16, DT_BF16, DT_F32, 0);
        gemm_case(5, 33, 7, DT_BF16, DT_BF16, DT_BF16, 0);
        gemm_case(20, 40, 8200, DT_BF16, DT_BF16, DT_F32, 1); /* K over two blocks of the AVX512 kernel, plus a tail */
    }
    cpu_kernel_route(CPU_ROUTE_AUTO);
}

TEST(ops_gemm_row_chunks) { /* the packed path with a small budget (rows in chunks, short k blocks), a long K */
    cpu_set_tile_budget(4096);
    gemm_case(50, 40, 100, DT_BF16, DT_BF16, DT_BF16, 1);
    gemm_case(50, 40, 100, DT_F32, DT_BF16, DT_F32, 0);
    cpu_kernel_route(CPU_ROUTE_PORTABLE);
    gemm_case(30, 50, 2100, DT_BF16, DT_BF16, DT_BF16, 1);
    gemm_case(30, 50, 2100, DT_F32, DT_BF16, DT_F32, 1);
    cpu_kernel_route(CPU_ROUTE_AUTO);
    cpu_set_tile_budget(0);
}

/* One kernel of the packed path (cpu_gemm_packed.c) on shapes that cross
 * every edge of its blocking at the current budget and thread count: M not
 * a multiple of MR and over several row chunks (non-f32 y), N not a
 * multiple of NR, of the B block nc or of the thread panel nb, K over
 * several k blocks with a tail; then M < MR, N < NR and K < 8 (the scalar
 * tail of the packing). Every dtype combination that takes the path, with
 * and without bias, against the double reference. The blocking is read
 * back (cpu_gemm_packed_blocking) so that a change of the defaults cannot
 * silently stop the shapes from crossing the edges. */
static void packed_edges(int64_t M, int64_t N, int64_t K) {
    int64_t b[6], bf[6];
    cpu_gemm_packed_blocking(M, N, K, DT_BF16, b);
    cpu_gemm_packed_blocking(M, N, K, DT_F32, bf);
    int64_t MR = b[0], NR = b[1], kc = b[2], nc = b[3], nb = b[4], mch = b[5];
    CHECK(M % MR && N % NR && N % nb % nc && K > kc && K % kc && N > nb && M > mch && M % mch && bf[5] >= M,
          "%s kernel, shape %lldx%lldx%lld: MR %lld NR %lld kc %lld nc %lld nb %lld rows per chunk %lld/%lld do not "
          "cross every edge", cpu_gemm_packed_kernel(), (long long)M, (long long)N, (long long)K, (long long)MR,
          (long long)NR, (long long)kc, (long long)nc, (long long)nb, (long long)mch, (long long)bf[5]);
    const dtype_t c[][3] = {{DT_BF16, DT_BF16, DT_BF16}, {DT_BF16, DT_BF16, DT_F32}, {DT_F32, DT_BF16, DT_F32},
                            {DT_F32, DT_BF16, DT_BF16}, {DT_F32, DT_F32, DT_BF16}, {DT_BF16, DT_F32, DT_F32},
                            {DT_F16, DT_BF16, DT_F32}}; /* f16 x: packed through row_f32 */
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        for (int bias = 0; bias < 2; bias++) gemm_case(M, N, K, c[i][0], c[i][1], c[i][2], bias);
    gemm_case(MR - 1, NR - 3, 7, DT_BF16, DT_BF16, DT_BF16, 1); /* one partial tile, k only in the tail */
    gemm_case(1, N, K, DT_BF16, DT_BF16, DT_BF16, 0);          /* one token */
    gemm_case(MR + 1, 2, K, DT_F32, DT_BF16, DT_F32, 1);       /* two output columns */
}

TEST(ops_gemm_packed_edges) {
    int saved = omp_get_max_threads();
    cpu_kernel_route(CPU_ROUTE_PORTABLE);
    int have512 = 0;
    for (int level = 0; level < 3; level++) { /* AVX-512F (when the CPU has it), AVX2, scalar */
        cpu_gemm_packed_force(level);
        if (level == 0 && strcmp(cpu_gemm_packed_kernel(), "avx512f")) {
            printf("# ops_gemm_packed_edges: no AVX-512F kernel on this CPU/run: the avx2 and scalar kernels only\n");
            continue;
        }
        have512 |= level == 0;
        static const char *want[] = {"avx512f", "avx2", "scalar"};
        CHECK(!strcmp(cpu_gemm_packed_kernel(), want[level]), "forced level %d runs the %s kernel", level,
              cpu_gemm_packed_kernel());
        static const int thr[] = {1, 3, 2};   /* the sanitized build: 1 and 3 threads */
        for (int t = 0; t < (TEST_SANITIZED ? 2 : 3); t++) {
            omp_set_num_threads(thr[t]);
            /* 64 KB: k blocks of 64, B blocks of NR rows, panels of up to 240 rows, 68-row chunks of a
             * non-f32 y at 1 thread (240 rows of panel) */
            cpu_set_tile_budget(65536);
            packed_edges(151, 530, 200);
            /* 4 KB: k blocks of 4 */
            cpu_set_tile_budget(4096);
            packed_edges(47, 290, 23);
        }
        cpu_set_tile_budget(0);
        omp_set_num_threads(2);
        /* default blocking: K over one k block of 512 with a tail, N over two panels per thread */
        gemm_case(33, 6200, 1100, DT_BF16, DT_BF16, DT_BF16, 1);
        gemm_case(20, 700, 530, DT_F32, DT_BF16, DT_F32, 0);
    }
    const char *off = getenv("TPGEN_NO_AVX512");
    int want512 = __builtin_cpu_supports("avx512f") && !(off && !strcmp(off, "2"));
    CHECK(have512 == want512, "the AVX-512F kernel is %s, the CPU %s it (TPGEN_NO_AVX512=%s)", have512 ? "on" : "off",
          __builtin_cpu_supports("avx512f") ? "has" : "lacks", off ? off : "");
    cpu_gemm_packed_force(0);
    cpu_kernel_route(CPU_ROUTE_AUTO);
    omp_set_num_threads(saved);
}

/* bf16 x with an fp8 weight (random finite codes, a scale per output channel
 * or one for the tensor, or none) against the double reference
 * sum x·(decode(code)·scale) + bias, rounded to y's dtype */
static void gemm_fp8_case(int64_t M, int64_t N, int64_t K, dtype_t wd, int scales, dtype_t yd, int with_bias) {
    char what[160];
    snprintf(what, sizeof what, "gemm %lldx%lldx%lld x=bf16 w=%s scales=%d y=%s bias=%d", (long long)M, (long long)N,
             (long long)K, dtype_name(wd), scales, dtype_name(yd), with_bias);
    tbuf x = tb_new(DT_BF16, M, K, 3), b = tb_new(DT_F32, 1, N, 0), y = tb_out(yd, M, N);
    tensor *w = tensor_new(cpu(), wd, N, K);
    float *hx = tb_rand(&x, -1, 1), *hb = tb_rand(&b, -1, 1), *sc = malloc((size_t)N * sizeof(float));
    uint8_t *q = w->data;
    for (int64_t i = 0; i < N * K; i++) {
        q[i] = (uint8_t)(urand() * 256);
        if (!isfinite(fp8_to_f32(wd, q[i])) || fabsf(fp8_to_f32(wd, q[i])) > 64) q[i] = 0x31;
    }
    for (int64_t i = 0; i < N; i++) sc[i] = frand(0.01f, 0.1f);
    w->scale = scales ? sc : NULL, w->scale_per_row = scales == 2;
    op_gemm(cpu(), &y.t, &x.t, w, with_bias ? &b.t : NULL);
    float *got = tb_get(&y), *ref = malloc((size_t)(M * N) * sizeof(float));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = with_bias ? hb[j] : 0, f = scales ? sc[scales == 2 ? j : 0] : 1;
            for (int64_t k = 0; k < K; k++) s += (double)hx[i * K + k] * ((double)fp8_to_f32(wd, q[j * K + k]) * f);
            ref[i * N + j] = rnd_to(yd, s);
        }
    check_close(what, yd, got, ref, (size_t)(M * N), F32_TOL);
    CHECK(pads_untouched(&y), "%s: wrote outside the output view", what);
    w->scale = NULL;
    tensor_free(w);
    free(hx); free(hb); free(sc); free(got); free(ref);
    tb_free(&x); tb_free(&b); tb_free(&y);
}

TEST(ops_gemm_amx) {
    /* The AMX route (cpu_gemm_amx.c): 16-row A tiles, 32-row/32-column
     * blocks of 2x2 C tiles, k steps of 32 in blocks of 1024, items of 256
     * columns, x packed in chunks of rows. M, N, K are off every one of
     * these multiples, below a tile (N 5, K 7 and odd K, whose last pair is
     * half zero), across two k blocks with a tail (K 2100, 2101), across two
     * column items (N 300), the x chunking (budget 64 KB: chunks of 32 rows),
     * and the row split of few-column shapes, at 1, 2 and 3 threads; bf16
     * and fp8 weights, f32 and bf16 y, with and without bias, fp8 without,
     * with one and with per-channel scales. Each call must take the route
     * (the route counter), and M < 16 and f32 x must not. On a CPU without
     * AMX (or with TPGEN_NO_AMX=1) the same cases run on the other routes
     * and the counter must not move. */
    int saved = omp_get_max_threads(), amx = cpu_amx_enabled();
    if (!amx) printf("# ops_gemm_amx: AMX is off on this CPU/run: the cases run on the other routes\n");
    static const int thr[] = {1, 2, 3};
    static const int64_t shp[][3] = {{16, 16, 32}, {17, 5, 7}, {33, 47, 45}, {70, 300, 1000}, {40, 33, 2101},
                                     {20, 64, 2100}, {100, 19, 64}};
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(thr[t]);
        for (size_t i = 0; i < sizeof shp / sizeof shp[0]; i++) {
            int64_t M = shp[i][0], N = shp[i][1], K = shp[i][2];
            long c0 = cpu_gemm_amx_calls();
            gemm_case(M, N, K, DT_BF16, DT_BF16, DT_BF16, 1);
            gemm_case(M, N, K, DT_BF16, DT_BF16, DT_F32, 0);
            gemm_case(M, N, K, DT_BF16, DT_BF16, DT_F32, 1);
            gemm_fp8_case(M, N, K, i % 2 ? DT_F8_E5M2 : DT_F8_E4M3, (int)(i % 3), DT_BF16, (int)(i % 2));
            gemm_fp8_case(M, N, K, DT_F8_E4M3, 2, DT_F32, 1);
            CHECK(cpu_gemm_amx_calls() - c0 == (amx ? 5 : 0), "%lldx%lldx%lld: %ld of 5 calls took the AMX route",
                  (long long)M, (long long)N, (long long)K, cpu_gemm_amx_calls() - c0);
        }
        cpu_set_tile_budget(65536); /* x packed in chunks of 32 rows (Kp 1024) */
        long c0 = cpu_gemm_amx_calls();
        gemm_case(70, 300, 1000, DT_BF16, DT_BF16, DT_BF16, 1);
        gemm_fp8_case(70, 300, 1000, DT_F8_E4M3, 2, DT_BF16, 1);
        cpu_set_tile_budget(0);
        CHECK(cpu_gemm_amx_calls() - c0 == (amx ? 2 : 0), "chunked x: AMX route not taken");
        /* not for AMX: one token, 15 rows, f32 activations */
        c0 = cpu_gemm_amx_calls();
        gemm_case(1, 300, 1000, DT_BF16, DT_BF16, DT_BF16, 1);
        gemm_case(15, 40, 64, DT_BF16, DT_BF16, DT_F32, 1);
        gemm_case(40, 40, 64, DT_F32, DT_BF16, DT_F32, 1);
        gemm_fp8_case(1, 70, 96, DT_F8_E4M3, 2, DT_BF16, 1);
        CHECK(cpu_gemm_amx_calls() == c0, "M < 16 or f32 x took the AMX route");
    }
    /* the route switched off in process: the AVX512-BF16 kernel / portable path, same cases */
    cpu_gemm_amx_force_off(1);
    long c0 = cpu_gemm_amx_calls();
    gemm_case(70, 300, 1000, DT_BF16, DT_BF16, DT_BF16, 1);
    gemm_fp8_case(70, 300, 1000, DT_F8_E5M2, 1, DT_F32, 0);
    CHECK(cpu_gemm_amx_calls() == c0, "cpu_gemm_amx_force_off(1): the AMX route was still taken");
    cpu_gemm_amx_force_off(0);
    omp_set_num_threads(saved);
}

/* ------------------------------------------------------------- attention */

typedef struct { int Sq, Sk, Hq, Hkv, hd, causal, q_pos0, masked_keys; dtype_t dt; } attn_case;

static void attention_ref(const attn_case *c, const float *q, const float *k, const float *v, const int32_t *valid,
                          float *o) {
    int Cq = c->Hq * c->hd, Ck = c->Hkv * c->hd;
    double *s = malloc((size_t)c->Sk * sizeof(double));
    for (int h = 0; h < c->Hq; h++) {
        int kh = h / (c->Hq / c->Hkv);
        for (int i = 0; i < c->Sq; i++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < c->Sk; j++) {
                int vis = (!c->causal || j <= i + c->q_pos0) && (!valid || valid[j]);
                double d = 0;
                for (int e = 0; e < c->hd; e++) d += (double)q[i * Cq + h * c->hd + e] * k[j * Ck + kh * c->hd + e];
                s[j] = vis ? d / sqrt((double)c->hd) : -INFINITY;
                if (s[j] > mx) mx = s[j];
            }
            for (int j = 0; j < c->Sk; j++) { s[j] = mx == -INFINITY ? 0 : exp(s[j] - mx); sum += s[j]; }
            for (int e = 0; e < c->hd; e++) {
                double a = 0;
                for (int j = 0; j < c->Sk; j++) a += s[j] * v[j * Ck + kh * c->hd + e];
                o[i * Cq + h * c->hd + e] = rnd_to(c->dt, sum > 0 ? a / sum : 0.0);
            }
        }
    }
    free(s);
}

static void attention_case(const attn_case *c) {
    char what[160];
    snprintf(what, sizeof what, "attention Sq=%d Sk=%d H=%d/%d hd=%d causal=%d pos0=%d masked=%d %s", c->Sq, c->Sk,
             c->Hq, c->Hkv, c->hd, c->causal, c->q_pos0, c->masked_keys, dtype_name(c->dt));
    int Cq = c->Hq * c->hd, Ck = c->Hkv * c->hd;
    /* q and k are column views of fused buffers, as in the single block */
    tbuf q = tb_new(c->dt, c->Sq, Cq, 5), k = tb_new(c->dt, c->Sk, Ck, 7), v = tb_new(c->dt, c->Sk, Ck, 0);
    tbuf o = tb_out(c->dt, c->Sq, Cq);
    float *hq = tb_rand(&q, -2, 2), *hk = tb_rand(&k, -2, 2), *hv = tb_rand(&v, -1, 1);
    int32_t *valid = NULL;
    tensor *kv = NULL;
    if (c->masked_keys) { /* left padding: the first masked_keys keys are invalid, plus a few random ones */
        valid = malloc((size_t)c->Sk * sizeof(int32_t));
        for (int j = 0; j < c->Sk; j++) valid[j] = j >= c->masked_keys && urand() > 0.1;
        kv = tensor_new(cpu(), DT_I32, 1, c->Sk);
        tensor_upload_raw(kv, valid);
    }
    attn_params p = {.n_q_heads = c->Hq, .n_kv_heads = c->Hkv, .head_dim = c->hd, .scale = 1.0f / sqrtf((float)c->hd),
                     .causal = c->causal, .q_pos0 = c->q_pos0, .key_valid = kv};
    op_attention(cpu(), &o.t, &q.t, &k.t, &v.t, &p);
    float *got = tb_get(&o), *ref = malloc((size_t)c->Sq * Cq * sizeof(float));
    attention_ref(c, hq, hk, hv, valid, ref);
    check_close(what, c->dt, got, ref, (size_t)c->Sq * Cq, F32_TOL);
    CHECK(pads_untouched(&o), "%s: wrote outside the output view", what);
    if (c->masked_keys && c->causal && c->q_pos0 == 0) /* rows before the padding end see no key: exactly 0 */
        for (int i = 0; i < c->masked_keys && i < c->Sq; i++)
            for (int e = 0; e < Cq; e++) CHECK(got[i * Cq + e] == 0.0f, "%s: fully masked row %d is not 0", what, i);
    free(hq); free(hk); free(hv); free(got); free(ref); free(valid);
    tensor_free(kv);
    tb_free(&q); tb_free(&k); tb_free(&v); tb_free(&o);
}

TEST(ops_attention_plain_gqa) {
    const dtype_t dts[] = {DT_F32, DT_BF16};
    for (int d = 0; d < 2; d++) {
        attention_case(&(attn_case){.Sq = 70, .Sk = 150, .Hq = 2, .Hkv = 2, .hd = 32, .dt = dts[d]});
        attention_case(&(attn_case){.Sq = 33, .Sk = 129, .Hq = 4, .Hkv = 2, .hd = 16, .dt = dts[d]});   /* GQA */
        attention_case(&(attn_case){.Sq = 5, .Sk = 3, .Hq = 6, .Hkv = 1, .hd = 8, .dt = dts[d]});
        attention_case(&(attn_case){.Sq = 130, .Sk = 130, .Hq = 1, .Hkv = 1, .hd = 512, .dt = dts[d]}); /* VAE-like */
    }
}

TEST(ops_attention_masks) {
    const dtype_t dts[] = {DT_F32, DT_BF16};
    for (int d = 0; d < 2; d++) {
        attention_case(&(attn_case){.Sq = 140, .Sk = 140, .Hq = 4, .Hkv = 2, .hd = 16, .causal = 1, .dt = dts[d]});
        attention_case(&(attn_case){.Sq = 20, .Sk = 150, .Hq = 2, .Hkv = 1, .hd = 16, .causal = 1, .q_pos0 = 130, .dt = dts[d]});
        attention_case(&(attn_case){.Sq = 70, .Sk = 200, .Hq = 2, .Hkv = 2, .hd = 24, .masked_keys = 3, .dt = dts[d]});
        /* left padding + causal: the first 9 query rows see no key at all */
        attention_case(&(attn_case){.Sq = 100, .Sk = 100, .Hq = 4, .Hkv = 2, .hd = 8, .causal = 1, .masked_keys = 9, .dt = dts[d]});
    }
}

TEST(ops_attention_many_key_tiles) { /* Sk over several key tiles of the online softmax */
    const dtype_t dts[] = {DT_F32, DT_BF16};
    for (int d = 0; d < 2; d++) {
        attention_case(&(attn_case){.Sq = 70, .Sk = 1100, .Hq = 2, .Hkv = 1, .hd = 16, .dt = dts[d]});
        attention_case(&(attn_case){.Sq = 70, .Sk = 1100, .Hq = 2, .Hkv = 2, .hd = 16, .causal = 1, .q_pos0 = 1030, .dt = dts[d]});
        /* the first key tile is entirely masked: the running max starts at -inf */
        attention_case(&(attn_case){.Sq = 40, .Sk = 1300, .Hq = 2, .Hkv = 2, .hd = 8, .masked_keys = 700, .dt = dts[d]});
        attention_case(&(attn_case){.Sq = 40, .Sk = 1300, .Hq = 2, .Hkv = 2, .hd = 8, .causal = 1, .q_pos0 = 1260,
                                    .masked_keys = 600, .dt = dts[d]});
    }
}

TEST(ops_attention_bf16_portable) { /* bf16 scores through widening + sgemm (the path of CPUs without AVX512-BF16) */
    cpu_kernel_route(CPU_ROUTE_PORTABLE);
    attention_case(&(attn_case){.Sq = 70, .Sk = 600, .Hq = 4, .Hkv = 2, .hd = 16, .causal = 1, .q_pos0 = 530, .dt = DT_BF16});
    attention_case(&(attn_case){.Sq = 33, .Sk = 40, .Hq = 2, .Hkv = 2, .hd = 24, .masked_keys = 5, .dt = DT_BF16});
    cpu_kernel_route(CPU_ROUTE_AUTO);
}

TEST(ops_attention_all_masked) { /* every key invalid: every output row is 0 */
    tbuf q = tb_new(DT_F32, 10, 16, 0), k = tb_new(DT_F32, 20, 16, 0), v = tb_new(DT_F32, 20, 16, 0), o = tb_out(DT_F32, 10, 16);
    free(tb_rand(&q, -1, 1)); free(tb_rand(&k, -1, 1)); free(tb_rand(&v, -1, 1));
    tensor *kv = tensor_new(cpu(), DT_I32, 1, 20);
    memset(kv->data, 0, 20 * sizeof(int32_t));
    attn_params p = {.n_q_heads = 2, .n_kv_heads = 2, .head_dim = 8, .scale = 0.3f, .key_valid = kv};
    op_attention(cpu(), &o.t, &q.t, &k.t, &v.t, &p);
    float *got = tb_get(&o);
    for (int i = 0; i < 160; i++) CHECK(got[i] == 0.0f, "element %d is %g, expected 0", i, got[i]);
    free(got);
    tensor_free(kv);
    tb_free(&q); tb_free(&k); tb_free(&v); tb_free(&o);
}

/* ------------------------------------------------------------ norms */

static void layernorm_case(int64_t R, int64_t C, dtype_t dt, int with_shift, int with_scale) {
    char what[128];
    snprintf(what, sizeof what, "layernorm_mod %lldx%lld %s shift=%d scale=%d", (long long)R, (long long)C,
             dtype_name(dt), with_shift, with_scale);
    tbuf x = tb_new(dt, R, C, 2), sh = tb_new(dt, 1, C, 0), sc = tb_new(dt, 1, C, 0), y = tb_out(dt, R, C);
    float *hx = tb_rand(&x, -3, 5), *hs = tb_rand(&sh, -1, 1), *hc = tb_rand(&sc, -1, 1);
    op_layernorm_mod(cpu(), &y.t, &x.t, with_shift ? &sh.t : NULL, with_scale ? &sc.t : NULL, 1e-6f);
    float *got = tb_get(&y), *ref = malloc((size_t)(R * C) * sizeof(float));
    for (int64_t r = 0; r < R; r++) {
        double mu = 0, var = 0;
        for (int64_t c = 0; c < C; c++) mu += hx[r * C + c];
        mu /= C;
        for (int64_t c = 0; c < C; c++) var += (hx[r * C + c] - mu) * (hx[r * C + c] - mu);
        var /= C;
        for (int64_t c = 0; c < C; c++) {
            double n = rnd_to(dt, (hx[r * C + c] - mu) / sqrt(var + 1e-6));
            if (with_scale) n = rnd_to(dt, rnd_to(dt, 1.0 + hc[c]) * n);
            if (with_shift) n = n + hs[c];
            ref[r * C + c] = rnd_to(dt, n);
        }
    }
    if (with_shift || with_scale) check_close2(what, dt, got, ref, (size_t)(R * C), F32_TOL);  /* chained roundings */
    else check_close(what, dt, got, ref, (size_t)(R * C), F32_TOL);
    CHECK(pads_untouched(&y), "%s: wrote outside the output view", what);
    free(hx); free(hs); free(hc); free(got); free(ref);
    tb_free(&x); tb_free(&sh); tb_free(&sc); tb_free(&y);
}

TEST(ops_layernorm_mod) {
    for (int d = 0; d < 2; d++) {
        dtype_t dt = d ? DT_BF16 : DT_F32;
        layernorm_case(7, 300, dt, 1, 1);
        layernorm_case(3, 64, dt, 0, 0);
        layernorm_case(2, 33, dt, 1, 0);
        layernorm_case(2, 33, dt, 0, 1);
    }
}

static void rmsnorm_case(int64_t R, int64_t C, int group, dtype_t dt, dtype_t wdt, int in_place) {
    char what[128];
    snprintf(what, sizeof what, "rmsnorm %lldx%lld group %d %s w=%s in_place=%d", (long long)R, (long long)C, group,
             dtype_name(dt), dtype_name(wdt), in_place);
    tbuf x = tb_new(dt, R, C, 1), w = tb_new(wdt, 1, group, 0), y = tb_out(dt, R, C);
    float *hx = tb_rand(&x, -2, 2), *hw = tb_rand(&w, 0.5f, 1.5f);
    tbuf *out = in_place ? &x : &y;
    op_rmsnorm(cpu(), &out->t, &x.t, &w.t, group, 1e-6f);
    float *got = tb_get(out), *ref = malloc((size_t)(R * C) * sizeof(float));
    for (int64_t r = 0; r < R; r++)
        for (int64_t g = 0; g < C; g += group) {
            double ss = 0;
            for (int i = 0; i < group; i++) ss += (double)hx[r * C + g + i] * hx[r * C + g + i];
            double rs = 1.0 / sqrt(ss / group + 1e-6);
            for (int i = 0; i < group; i++) ref[r * C + g + i] = rnd_to(dt, rnd_to(dt, hx[r * C + g + i] * rs) * hw[i]);
        }
    check_close(what, dt, got, ref, (size_t)(R * C), F32_TOL);
    if (!in_place) CHECK(pads_untouched(&y), "%s: wrote outside the output view", what);
    free(hx); free(hw); free(got); free(ref);
    tb_free(&x); tb_free(&w); tb_free(&y);
}

TEST(ops_rmsnorm) {
    for (int d = 0; d < 2; d++) {
        dtype_t dt = d ? DT_BF16 : DT_F32;
        rmsnorm_case(9, 96, 96, dt, DT_BF16, 0);  /* whole row (LLM) */
        rmsnorm_case(9, 96, 24, dt, DT_F32, 0);   /* per head (QK norm) */
        rmsnorm_case(4, 72, 24, dt, DT_BF16, 1);  /* in place */
        rmsnorm_case(1, 5, 5, dt, DT_F32, 1);
    }
}

static void group_norm_case(int64_t C, int64_t HW, int groups, dtype_t dt, int silu, int in_place, float offset) {
    char what[128];
    snprintf(what, sizeof what, "group_norm C=%lld HW=%lld groups=%d %s silu=%d in_place=%d", (long long)C,
             (long long)HW, groups, dtype_name(dt), silu, in_place);
    tbuf x = tb_new(dt, C, HW, in_place ? 0 : 2), g = tb_new(DT_BF16, 1, C, 0), b = tb_new(DT_F32, 1, C, 0),
         y = tb_out(dt, C, HW);
    float *hx = tb_rand(&x, offset - 2, offset + 3), *hg = tb_rand(&g, 0.5f, 2), *hb = tb_rand(&b, -1, 1);
    tbuf *out = in_place ? &x : &y;
    op_group_norm(cpu(), &out->t, &x.t, &g.t, &b.t, groups, 1e-6f, silu);
    float *got = tb_get(out), *ref = malloc((size_t)(C * HW) * sizeof(float));
    int64_t cpg = C / groups;
    for (int gi = 0; gi < groups; gi++) {
        double mu = 0, var = 0, n = (double)cpg * HW;
        for (int64_t i = gi * cpg * HW; i < (gi + 1) * cpg * HW; i++) mu += hx[i];
        mu /= n;
        for (int64_t i = gi * cpg * HW; i < (gi + 1) * cpg * HW; i++) var += (hx[i] - mu) * (hx[i] - mu);
        var /= n;
        for (int64_t c = gi * cpg; c < (gi + 1) * cpg; c++)
            for (int64_t i = 0; i < HW; i++) {
                double t = (hx[c * HW + i] - mu) / sqrt(var + 1e-6) * hg[c] + hb[c];
                if (silu) { t = rnd_to(dt, t); t = t / (1 + exp(-t)); }
                ref[c * HW + i] = rnd_to(dt, t);
            }
    }
    if (silu) check_close2(what, dt, got, ref, (size_t)(C * HW), F32_TOL);
    else check_close(what, dt, got, ref, (size_t)(C * HW), F32_TOL);
    if (!in_place) CHECK(pads_untouched(&y), "%s: wrote outside the output view", what);
    free(hx); free(hg); free(hb); free(got); free(ref);
    tb_free(&x); tb_free(&g); tb_free(&b); tb_free(&y);
}

TEST(ops_group_norm) {
    for (int d = 0; d < 2; d++) {
        dtype_t dt = d ? DT_BF16 : DT_F32;
        group_norm_case(12, 37, 4, dt, 0, 0, 0);
        group_norm_case(12, 37, 4, dt, 1, 0, 0);
        group_norm_case(64, 100, 32, dt, 1, 1, 0);
        group_norm_case(8, 1000, 1, dt, 0, 0, 20); /* large mean: the variance must not cancel */
    }
}

/* ------------------------------------------------------- element-wise */

static void rope_case(int64_t S, int nh, int hd, rope_mode mode, dtype_t dt) {
    char what[128];
    snprintf(what, sizeof what, "rope S=%lld heads=%d hd=%d %s %s", (long long)S, nh, hd,
             mode == ROPE_HALF ? "half" : "interleaved", dtype_name(dt));
    int64_t C = (int64_t)nh * hd;
    tbuf x = tb_new(dt, S, C, 3), co = tb_new(DT_F32, S, hd, 0), si = tb_new(DT_F32, S, hd, 0);
    float *hx = tb_rand(&x, -2, 2), *hc = tb_rand(&co, -1, 1), *hs = tb_rand(&si, -1, 1);
    op_rope(cpu(), &x.t, &co.t, &si.t, hd, mode);
    float *got = tb_get(&x), *ref = malloc((size_t)(S * C) * sizeof(float));
    for (int64_t s = 0; s < S; s++)
        for (int h = 0; h < nh; h++) {
            const float *a = hx + s * C + h * hd, *c = hc + s * hd, *sn = hs + s * hd;
            float *o = ref + s * C + h * hd;
            for (int j = 0; j < hd; j++) {
                int pair, sign;
                if (mode == ROPE_INTERLEAVED) { pair = j ^ 1; sign = (j & 1) ? 1 : -1; }
                else { pair = j < hd / 2 ? j + hd / 2 : j - hd / 2; sign = j < hd / 2 ? -1 : 1; }
                o[j] = rnd_to(dt, (double)a[j] * c[j] + sign * (double)a[pair] * sn[j]);
            }
        }
    check_close(what, dt, got, ref, (size_t)(S * C), F32_TOL);
    CHECK(pads_untouched(&x), "%s: wrote outside the view", what);
    free(hx); free(hc); free(hs); free(got); free(ref);
    tb_free(&x); tb_free(&co); tb_free(&si);
}

TEST(ops_rope) {
    for (int d = 0; d < 2; d++)
        for (int m = 0; m < 2; m++) {
            rope_case(13, 3, 16, (rope_mode)m, d ? DT_BF16 : DT_F32);
            rope_case(2, 1, 128, (rope_mode)m, d ? DT_BF16 : DT_F32);
        }
}

typedef enum { EW_SWIGLU, EW_SILU, EW_ADD, EW_ADD_BCAST, EW_GATED, EW_GATED_NULL } ew_kind;

static void eltwise_case(ew_kind kind, int64_t R, int64_t C, dtype_t dt, int in_place) {
    static const char *names[] = {"swiglu", "silu", "add", "add broadcast", "gated_add", "gated_add no gate"};
    char what[128];
    snprintf(what, sizeof what, "%s %lldx%lld %s in_place=%d", names[kind], (long long)R, (long long)C, dtype_name(dt), in_place);
    int b_rows = kind == EW_ADD_BCAST ? 1 : (int)R;
    tbuf a = tb_new(dt, R, C, 1), b = tb_new(dt, b_rows, C, 2), g = tb_new(dt, 1, C, 0), y = tb_out(dt, R, C);
    float *ha = tb_rand(&a, -4, 4), *hb = tb_rand(&b, -2, 2), *hg = tb_rand(&g, -1, 1);
    int inplace = in_place || kind == EW_GATED || kind == EW_GATED_NULL;
    tbuf *out = inplace ? &a : &y;
    switch (kind) {
    case EW_SWIGLU: op_swiglu(cpu(), &out->t, &a.t, &b.t); break;
    case EW_SILU: op_silu(cpu(), &out->t, &a.t); break;
    case EW_ADD: case EW_ADD_BCAST: op_add(cpu(), &out->t, &a.t, &b.t); break;
    case EW_GATED: op_gated_add(cpu(), &a.t, &g.t, &b.t); break;
    case EW_GATED_NULL: op_gated_add(cpu(), &a.t, NULL, &b.t); break;
    }
    float *got = tb_get(out), *ref = malloc((size_t)(R * C) * sizeof(float));
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            double x = ha[r * C + c], v = hb[(b_rows == 1 ? 0 : r) * C + c], s;
            switch (kind) {
            case EW_SWIGLU: s = rnd_to(dt, x / (1 + exp(-x))) * v; break;
            case EW_SILU: s = x / (1 + exp(-x)); break;
            case EW_GATED: s = x + rnd_to(dt, hg[c] * v); break;
            default: s = x + v; break;
            }
            ref[r * C + c] = rnd_to(dt, s);
        }
    check_close(what, dt, got, ref, (size_t)(R * C), F32_TOL);
    CHECK(pads_untouched(out), "%s: wrote outside the output view", what);
    free(ha); free(hb); free(hg); free(got); free(ref);
    tb_free(&a); tb_free(&b); tb_free(&g); tb_free(&y);
}

TEST(ops_eltwise) {
    for (int d = 0; d < 2; d++)
        for (int k = EW_SWIGLU; k <= EW_GATED_NULL; k++) {
            eltwise_case((ew_kind)k, 17, 45, d ? DT_BF16 : DT_F32, 0);
            eltwise_case((ew_kind)k, 300, 130, d ? DT_BF16 : DT_F32, 0); /* over the OpenMP threshold */
        }
    eltwise_case(EW_SILU, 5, 7, DT_BF16, 1);
    eltwise_case(EW_ADD, 5, 7, DT_F32, 1);
    eltwise_case(EW_ADD_BCAST, 5, 7, DT_BF16, 1);
}

TEST(ops_copy) {
    const dtype_t dts[] = {DT_F32, DT_BF16};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            tbuf x = tb_new(dts[i], 23, 41, 3), y = tb_out(dts[j], 23, 41);
            float *hx = tb_rand(&x, -100, 100);
            op_copy(cpu(), &y.t, &x.t);
            float *got = tb_get(&y), *ref = malloc(23 * 41 * sizeof(float));
            for (int k = 0; k < 23 * 41; k++) ref[k] = rnd_to(dts[j], hx[k]);
            for (int k = 0; k < 23 * 41; k++)
                if (got[k] != ref[k]) { CHECK(0, "copy %s->%s: element %d is %g, expected %g", dtype_name(dts[i]), dtype_name(dts[j]), k, got[k], ref[k]); break; }
            CHECK(pads_untouched(&y), "copy: wrote outside the output view");
            free(hx); free(got); free(ref);
            tb_free(&x); tb_free(&y);
        }
}

/* ------------------------------------------------------------- layout */

TEST(ops_gather_rows) {
    for (int d = 0; d < 2; d++) {
        dtype_t td = d ? DT_BF16 : DT_F32, yd = d ? DT_F32 : DT_BF16;
        tbuf t = tb_new(td, 50, 19, 0), y = tb_out(yd, 12, 19);
        float *ht = tb_rand(&t, -1, 1);
        int32_t ids[10];
        int64_t row0 = 100; /* this shard holds rows [100, 150) */
        for (int i = 0; i < 10; i++) ids[i] = (int32_t)(urand() * 200);
        ids[0] = 100; ids[1] = 149; ids[2] = 150; ids[3] = 99;
        op_gather_rows(cpu(), &y.t, &t.t, ids, 10, row0);
        float *got = tb_get(&y);
        for (int i = 0; i < 10; i++)
            for (int c = 0; c < 19; c++) {
                int64_t r = ids[i] - row0;
                float want = r >= 0 && r < 50 ? rnd_to(yd, ht[r * 19 + c]) : 0.0f;
                if (got[i * 19 + c] != want) { CHECK(0, "gather id %d col %d: %g, expected %g", ids[i], c, got[i * 19 + c], want); break; }
            }
        for (int i = 10; i < 12; i++) CHECK(isnan(got[i * 19]), "gather wrote row %d beyond n", i);
        free(ht); free(got);
        tb_free(&t); tb_free(&y);
    }
}

TEST(ops_upsample_transpose) {
    for (int d = 0; d < 2; d++) {
        dtype_t dt = d ? DT_BF16 : DT_F32;
        int64_t C = 4, h = 3, wd = 5;
        tbuf x = tb_new(dt, C, h * wd, 2), y = tb_out(dt, C, 4 * h * wd);
        float *hx = tb_rand(&x, -1, 1);
        op_upsample2x(cpu(), &y.t, &x.t, h, wd);
        float *got = tb_get(&y);
        int bad = 0;
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < 2 * h; i++)
                for (int64_t j = 0; j < 2 * wd; j++)
                    bad += got[c * 4 * h * wd + i * 2 * wd + j] != hx[c * h * wd + (i / 2) * wd + j / 2];
        CHECK(bad == 0, "upsample2x %s: %d wrong elements", dtype_name(dt), bad);
        CHECK(pads_untouched(&y), "upsample2x wrote outside the view");
        free(hx); free(got);
        tb_free(&x); tb_free(&y);

        tbuf a = tb_new(dt, 37, 70, 3), at = tb_out(d ? DT_F32 : DT_BF16, 70, 37);
        float *ha = tb_rand(&a, -1, 1);
        op_transpose(cpu(), &at.t, &a.t);
        float *gt = tb_get(&at);
        bad = 0;
        for (int i = 0; i < 37; i++)
            for (int j = 0; j < 70; j++) bad += gt[j * 37 + i] != rnd_to(at.t.dtype, ha[i * 70 + j]);
        CHECK(bad == 0, "transpose %s: %d wrong elements", dtype_name(dt), bad);
        CHECK(pads_untouched(&at), "transpose wrote outside the view");
        free(ha); free(gt);
        tb_free(&a); tb_free(&at);
    }
}

/* --------------------------------------------------------------- conv */

static void conv_case(int64_t Cin, int64_t Cout, int64_t h, int64_t wd, int k, dtype_t xd, dtype_t wdt, int with_bias) {
    char what[128];
    snprintf(what, sizeof what, "conv%d %lld->%lld %lldx%lld x=%s w=%s bias=%d", k, (long long)Cin, (long long)Cout,
             (long long)h, (long long)wd, dtype_name(xd), dtype_name(wdt), with_bias);
    int64_t KK = Cin * k * k, P = h * wd;
    tbuf x = tb_new(xd, Cin, P, 2), w = tb_new(wdt, Cout, KK, 0), b = tb_new(wdt, 1, Cout, 0), y = tb_out(xd, Cout, P);
    float *hx = tb_rand(&x, -1, 1), *hw = tb_rand(&w, -1, 1), *hb = tb_rand(&b, -1, 1);
    op_conv2d(cpu(), &y.t, &x.t, &w.t, with_bias ? &b.t : NULL, h, wd, k);
    float *got = tb_get(&y), *ref = malloc((size_t)(Cout * P) * sizeof(float));
    for (int64_t co = 0; co < Cout; co++)
        for (int64_t i = 0; i < h; i++)
            for (int64_t j = 0; j < wd; j++) {
                double s = with_bias ? hb[co] : 0;
                for (int64_t ci = 0; ci < Cin; ci++)
                    for (int ky = 0; ky < k; ky++)
                        for (int kx = 0; kx < k; kx++) {
                            int64_t iy = i + ky - k / 2, ix = j + kx - k / 2;
                            if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                            s += (double)hw[co * KK + (ci * k + ky) * k + kx] * hx[ci * P + iy * wd + ix];
                        }
                ref[co * P + i * wd + j] = rnd_to(xd, s);
            }
    check_close(what, xd, got, ref, (size_t)(Cout * P), F32_TOL);
    CHECK(pads_untouched(&y), "%s: wrote outside the output view", what);
    free(hx); free(hw); free(hb); free(got); free(ref);
    tb_free(&x); tb_free(&w); tb_free(&b); tb_free(&y);
}

TEST(ops_conv2d) {
    for (int d = 0; d < 2; d++) {
        dtype_t xd = d ? DT_BF16 : DT_F32;
        conv_case(5, 70, 7, 9, 3, xd, DT_BF16, 1);
        conv_case(5, 70, 7, 9, 3, xd, DT_F32, 0);
        conv_case(6, 3, 4, 1, 3, xd, DT_BF16, 1);  /* one pixel wide */
        conv_case(9, 13, 5, 6, 1, xd, DT_BF16, 1);
        conv_case(9, 13, 5, 6, 1, xd, DT_F32, 0);
    }
    /* even Cin·k·k with bf16 x and w: the vdpbf16ps route (when the CPU has it) and the forced sgemm route */
    for (int portable = 0; portable < 2; portable++) {
        cpu_kernel_route(portable ? CPU_ROUTE_PORTABLE : CPU_ROUTE_VECTOR);
        conv_case(4, 70, 7, 9, 3, DT_BF16, DT_BF16, 1);
        conv_case(10, 19, 5, 40, 1, DT_BF16, DT_BF16, 1);
        conv_case(2, 5, 3, 2, 3, DT_BF16, DT_BF16, 0);   /* narrower than the 3x3 window */
        conv_case(8, 9, 1, 33, 3, DT_BF16, DT_BF16, 1);  /* one row */
    }
    cpu_kernel_route(CPU_ROUTE_AUTO);
    cpu_set_tile_budget(4 * 9 * 9 * 2 * 2); /* bf16 route: bands of two output rows */
    conv_case(4, 70, 7, 9, 3, DT_BF16, DT_BF16, 1);
    cpu_set_tile_budget(5 * 9 * 9 * 4 * 2); /* bands of two output rows */
    conv_case(5, 70, 7, 9, 3, DT_BF16, DT_BF16, 1);
    conv_case(5, 70, 7, 9, 3, DT_F32, DT_F32, 1);
    cpu_set_tile_budget(1); /* one row per band */
    conv_case(4, 8, 5, 3, 3, DT_F32, DT_BF16, 0);
    cpu_set_tile_budget(0);
}

/* op_conv2d_down against a naive stride-2 convolution with diffusers'
 * padding (0 top/left, 1 bottom/right) */
static void conv_down_case(int64_t Cin, int64_t Cout, int64_t h, int64_t wd, dtype_t xd, dtype_t wdt, int with_bias) {
    char what[128];
    snprintf(what, sizeof what, "conv_down %lld->%lld %lldx%lld x=%s w=%s bias=%d", (long long)Cin, (long long)Cout,
             (long long)h, (long long)wd, dtype_name(xd), dtype_name(wdt), with_bias);
    int64_t KK = Cin * 9, P = h * wd, ho = h / 2, wo = wd / 2, Q = ho * wo;
    tbuf x = tb_new(xd, Cin, P, 2), w = tb_new(wdt, Cout, KK, 0), b = tb_new(wdt, 1, Cout, 0), y = tb_out(xd, Cout, Q);
    float *hx = tb_rand(&x, -1, 1), *hw = tb_rand(&w, -1, 1), *hb = tb_rand(&b, -1, 1);
    op_conv2d_down(cpu(), &y.t, &x.t, &w.t, with_bias ? &b.t : NULL, h, wd);
    float *got = tb_get(&y), *ref = malloc((size_t)(Cout * Q) * sizeof(float));
    for (int64_t co = 0; co < Cout; co++)
        for (int64_t i = 0; i < ho; i++)
            for (int64_t j = 0; j < wo; j++) {
                double s = with_bias ? hb[co] : 0;
                for (int64_t ci = 0; ci < Cin; ci++)
                    for (int ky = 0; ky < 3; ky++)
                        for (int kx = 0; kx < 3; kx++) {
                            int64_t iy = 2 * i + ky, ix = 2 * j + kx;
                            if (iy >= h || ix >= wd) continue;
                            s += (double)hw[co * KK + (ci * 3 + ky) * 3 + kx] * hx[ci * P + iy * wd + ix];
                        }
                ref[co * Q + i * wo + j] = rnd_to(xd, s);
            }
    check_close(what, xd, got, ref, (size_t)(Cout * Q), F32_TOL);
    CHECK(pads_untouched(&y), "%s: wrote outside the output view", what);
    free(hx); free(hw); free(hb); free(got); free(ref);
    tb_free(&x); tb_free(&w); tb_free(&b); tb_free(&y);
}

TEST(ops_conv2d_down) {
    for (int d = 0; d < 2; d++) {
        dtype_t xd = d ? DT_BF16 : DT_F32;
        conv_down_case(5, 70, 8, 10, xd, DT_BF16, 1);
        conv_down_case(5, 70, 8, 10, xd, DT_F32, 0);
        conv_down_case(3, 4, 2, 2, xd, DT_F32, 1);   /* one output pixel: only the padding row/column around it */
        conv_down_case(6, 9, 12, 2, xd, DT_BF16, 1); /* one output column */
    }
    cpu_set_tile_budget(5 * 9 * 5 * 4 * 2); /* bands of two output rows */
    conv_down_case(5, 70, 14, 10, DT_F32, DT_F32, 1);
    cpu_set_tile_budget(1); /* one row per band */
    conv_down_case(4, 8, 6, 6, DT_BF16, DT_BF16, 0);
    cpu_set_tile_budget(0);
}

TEST(ops_copy_bf16_rounding_special) { /* the vectorised f32->bf16 rounding on ties, NaN, inf, overflow, denormals */
    const float special[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 1.0f + 0x1p-8f + 0x1p-20f, NAN, -NAN,
                             INFINITY, -INFINITY, 3.4028235e38f, -3.4028235e38f, 1e-40f, -1e-40f, 0.0f, -0.0f,
                             0x1.fffffep-127f, 65504.0f, 1.00390625f, 2.00781250f};
    const int ns = (int)(sizeof special / sizeof special[0]);
    const uint16_t want[] = {0x3f80, 0x3f82, 0xbf80, 0x3f81, 0, 0, 0x7f80, 0xff80, 0x7f80, 0xff80, 0, 0, 0x0000, 0x8000,
                             0, 0x4780, 0x3f80, 0x4000};
    int64_t n = 3 * ns + 5; /* several AVX2 blocks and a scalar tail */
    float *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = special[i % ns];
    tensor *x = tensor_new(cpu(), DT_F32, 1, n), *y = tensor_new(cpu(), DT_BF16, 1, n);
    tensor_upload_f32(x, v);
    op_copy(cpu(), y, x);
    const uint16_t *got = y->data;
    for (int64_t i = 0; i < n; i++) {
        int k = (int)(i % ns);
        uint16_t ref = f32_to_bf16(v[i]);
        if (isnan(v[i])) CHECK((got[i] & 0x7f80) == 0x7f80 && (got[i] & 0x7f), "element %lld: NaN became 0x%04x", (long long)i, got[i]);
        else if (want[k] || v[i] == 0.0f) CHECK(got[i] == want[k], "element %lld (%a): 0x%04x, expected 0x%04x", (long long)i, v[i], got[i], want[k]);
        else CHECK(got[i] == ref, "element %lld (%a): 0x%04x, expected 0x%04x", (long long)i, v[i], got[i], ref);
    }
    free(v);
    tensor_free(x);
    tensor_free(y);
}

TEST(ops_empty_shapes) { /* zero rows or zero keys: no crash, no write outside, keyless rows are 0 */
    tbuf x = tb_new(DT_BF16, 0, 16, 0), w = tb_new(DT_BF16, 8, 16, 0), y = tb_new(DT_BF16, 0, 8, 0);
    op_gemm(cpu(), &y.t, &x.t, &w.t, NULL);
    op_layernorm_mod(cpu(), &x.t, &x.t, NULL, NULL, 1e-6f);
    op_silu(cpu(), &x.t, &x.t);
    tb_free(&x); tb_free(&w); tb_free(&y);
    tbuf q = tb_new(DT_F32, 5, 16, 0), k = tb_new(DT_F32, 0, 16, 0), v = tb_new(DT_F32, 0, 16, 0), o = tb_out(DT_F32, 5, 16);
    free(tb_rand(&q, -1, 1));
    attn_params p = {.n_q_heads = 2, .n_kv_heads = 2, .head_dim = 8, .scale = 0.35f};
    op_attention(cpu(), &o.t, &q.t, &k.t, &v.t, &p);
    float *got = tb_get(&o);
    for (int i = 0; i < 80; i++) CHECK(got[i] == 0.0f, "no keys: element %d is %g, expected 0", i, got[i]);
    CHECK(pads_untouched(&o), "attention wrote outside the view");
    free(got);
    tb_free(&q); tb_free(&k); tb_free(&v); tb_free(&o);
}
