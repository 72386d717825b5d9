/* `tpgen bench gemm`: GEMM throughput of the CPU backend's op_gemm on the
 * FLUX.2 klein-4B linear shapes, against plain cblas_sgemm on the same
 * shapes. Columns: OpenBLAS sgemm (f32 x, f32 W), op_gemm with f32 weights,
 * op_gemm with bf16 weights and f32 activations (the f32 reference mode),
 * and bf16 x bf16 (the bf16 mode) through the portable path (the packed GEMM
 * of cpu_gemm_packed.c, its micro-kernel named in the header line with
 * OpenBLAS's core type, so that TPGEN_NO_AVX512=2 OPENBLAS_CORETYPE=Haswell
 * compares the AVX2 kernels of both), through the AVX512-BF16 kernel when this CPU has it (AMX off) and
 * through the AMX kernel when it has AMX, fp8 weights with f32 x (widened)
 * and with bf16 x (AMX where present, else vdpbf16ps), and the
 * portable and AMX paths as shares of sgemm. Each
 * figure is the best of --reps rounds after one warm-up round; a round runs
 * every column once, one after the other (side by side). With --ops it
 * also times op_attention and op_conv2d (the other sgemm / vdpbf16ps users)
 * on transformer and VAE shapes. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_amx.h"
#include "kernels/cpu/cpu_gemm_amx.h"
#include "kernels/cpu/cpu_gemm_packed.h"
#include "kernels/err.h"
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_cpu_time; /* --cpu-time: process CPU time instead of wall time */

static double now(void) {
    struct timespec ts;
    clock_gettime(g_cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One column of the table: plain sgemm, or op_gemm on (y, x, w) with the
 * AVX512-BF16 routes (and AMX) on or forced off, or only AMX off. */
typedef struct { int sgemm, no_amx; cpu_route route; tensor *y; const tensor *x, *w; double best; } variant;

static void run_variant(backend *be, variant *v) {
    if (v->sgemm)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)v->x->rows, (int)v->w->rows, (int)v->x->cols, 1.0f,
                    v->x->data, (int)v->x->ld, v->w->data, (int)v->w->ld, 0.0f, v->y->data, (int)v->y->ld);
    else {
        cpu_kernel_route(v->route);
        cpu_gemm_amx_force_off(v->no_amx);
        op_gemm(be, v->y, v->x, v->w, NULL);
        cpu_kernel_route(CPU_ROUTE_AUTO);
        cpu_gemm_amx_force_off(0);
    }
}

/* Best seconds of every variant, measured side by side: each round runs
 * each variant once, in order, so load from other processes on a shared
 * machine falls on all columns alike and their ratios stay comparable.
 * Round 0 is the warm-up. */
static void time_variants(backend *be, variant *v, int nv, int reps) {
    for (int i = 0; i < nv; i++) v[i].best = 1e30;
    for (int r = -1; r < reps; r++)
        for (int i = 0; i < nv; i++) {
            double t0 = now();
            run_variant(be, &v[i]);
            double t = now() - t0;
            if (r >= 0 && t < v[i].best) v[i].best = t;
        }
}

static tensor *random_tensor(backend *be, dtype_t dt, int64_t rows, int64_t cols) {
    tensor *t = tensor_new(be, dt, rows, cols);
    if (!t) return NULL;
    size_t n = tensor_numel(t);
    float *v = xmalloc(n * sizeof(float));
    uint32_t s = 12345u + (uint32_t)rows;
    for (size_t i = 0; i < n; i++) { s = s * 1664525u + 1013904223u; v[i] = (float)(s >> 8) / 16777216.0f - 0.5f; }
    tensor_upload_f32(t, v);
    free(v);
    return t;
}

/* an E4M3 weight with per-row scales (the layout of mixed fp8 checkpoints):
 * the codes of a random [-0.5, 0.5) matrix quantised by row absmax */
static tensor *random_fp8(backend *be, int64_t rows, int64_t cols) {
    tensor *f = random_tensor(be, DT_F32, rows, cols), *t = f ? tensor_new(be, DT_F8_E4M3, rows, cols) : NULL;
    if (!t) { tensor_free(f); return NULL; }
    float *s = be_alloc(be, (size_t)rows * sizeof(float));
    const float *v = f->data;
    uint8_t *q = t->data;
    for (int64_t r = 0; r < rows; r++) {
        float a = 0;
        for (int64_t c = 0; c < cols; c++) a = fmaxf(a, fabsf(v[r * cols + c]));
        s[r] = a > 0 ? a / 448.0f : 1.0f;
        for (int64_t c = 0; c < cols; c++) q[r * cols + c] = f32_to_fp8(DT_F8_E4M3, v[r * cols + c] / s[r]);
    }
    t->scale = s, t->scale_per_row = 1;
    tensor_free(f);
    return t;
}

/* ---- --ops: attention and convolution ---- */

typedef struct {
    const char *name;
    int conv;                  /* 0 attention, 1 conv2d */
    int64_t a, b, c, d;        /* attention: S, heads, head_dim; conv: Cin, Cout, side, k */
} op_case;

static double op_flop(const op_case *oc) {
    if (!oc->conv) return 4.0 * oc->a * oc->a * oc->b * oc->c;
    return 2.0 * oc->b * oc->a * oc->d * oc->d * oc->c * oc->c;
}

/* best seconds of one op case in dtype dt; -1 on allocation failure */
static double op_seconds(backend *be, const op_case *oc, dtype_t dt, int reps) {
    tensor *t[4] = {0};
    double best = -1;
    if (!oc->conv) {
        int64_t S = oc->a, C = oc->b * oc->c;
        for (int i = 0; i < 4; i++) t[i] = random_tensor(be, dt, S, C);
    } else {
        int64_t P = oc->c * oc->c;
        t[0] = random_tensor(be, dt, oc->a, P);
        t[1] = random_tensor(be, dt, oc->b, oc->a * oc->d * oc->d);
        t[2] = random_tensor(be, dt, 1, oc->b);
        t[3] = tensor_new(be, dt, oc->b, P);
    }
    if (t[0] && t[1] && t[2] && t[3]) {
        attn_params p = {.n_q_heads = (int)oc->b, .n_kv_heads = (int)oc->b, .head_dim = (int)oc->c,
                         .scale = 1.0f / sqrtf((float)oc->c)};
        best = 1e30;
        for (int r = -1; r < reps; r++) {
            double t0 = now();
            if (!oc->conv) op_attention(be, t[3], t[0], t[1], t[2], &p);
            else op_conv2d(be, t[3], t[0], t[1], t[2], oc->c, oc->c, (int)oc->d);
            double el = now() - t0;
            if (r >= 0 && el < best) best = el;
        }
    }
    for (int i = 0; i < 4; i++) tensor_free(t[i]);
    return best;
}

static int ops_table(backend *be, int reps, int avx) {
    static const op_case cases[] = {
        {"attn S2048 4x128", 0, 2048, 4, 128, 0},
        {"attn S4096 1x512", 0, 4096, 1, 512, 0},
        {"conv3 512 64x64", 1, 512, 512, 64, 3},
        {"conv3 128 256x256", 1, 128, 128, 256, 3},
        {"conv1 256>128 128x128", 1, 256, 128, 128, 1},
    };
    printf("\n# op_attention / op_conv2d GFLOP/s, best of %d (%s time)\n", reps, g_cpu_time ? "CPU" : "wall");
    printf("%-22s %10s %14s %14s\n", "op", "f32", "bf16 portable", "bf16 avx512");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const op_case *oc = &cases[i];
        double f = op_flop(oc), t32 = op_seconds(be, oc, DT_F32, reps);
        cpu_kernel_route(CPU_ROUTE_PORTABLE);
        double tport = op_seconds(be, oc, DT_BF16, reps);
        cpu_kernel_route(CPU_ROUTE_VECTOR);
        double tavx = avx ? op_seconds(be, oc, DT_BF16, reps) : 0;
        cpu_kernel_route(CPU_ROUTE_AUTO);
        if (t32 < 0 || tport < 0 || tavx < 0) {
            fprintf(stderr, "tpgen: error: bench gemm --ops: %s\n", tp_error_msg());
            return 1;
        }
        char avxs[32] = "-";
        if (avx) snprintf(avxs, sizeof avxs, "%.1f", f / tavx * 1e-9);
        printf("%-22s %10.1f %14.1f %14s\n", oc->name, f / t32 * 1e-9, f / tport * 1e-9, avxs);
        fflush(stdout);
    }
    return 0;
}

static int usage(int rc) {
    fprintf(rc ? stderr : stdout,
            "usage: tpgen bench gemm [--m TOKENS] [--reps N] [--threads T] [--quick] [--cpu-time] [--ops]\n"
            "  GFLOP/s of op_gemm on the klein-4B linear shapes (N x K = out x in) against cblas_sgemm.\n"
            "  --m TOKENS   rows of x (default 1152)\n"
            "  --reps N     timed runs per figure, best reported (default 3)\n"
            "  --threads T  OpenMP/OpenBLAS threads (default: all cores)\n"
            "  --quick      only the first two shapes\n"
            "  --cpu-time   time with the process CPU clock (with --threads 1: per-core throughput that\n"
            "               other processes on a shared machine do not distort)\n"
            "  --ops        also time op_attention and op_conv2d (f32, bf16 portable, bf16 AVX512-BF16)\n");
    return rc;
}

int bench_gemm(int argc, char **argv) {
    int64_t M = 1152;
    int reps = 3, threads = 0, quick = 0, ops = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(0);
        else if (!strcmp(a, "--quick")) quick = 1;
        else if (!strcmp(a, "--cpu-time")) g_cpu_time = 1;
        else if (!strcmp(a, "--ops")) ops = 1;
        else if (i + 1 < argc && !strcmp(a, "--m")) M = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--reps")) reps = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--threads")) threads = atoi(argv[++i]);
        else { fprintf(stderr, "tpgen: error: bench gemm: unknown or incomplete option '%s'\n", a); return usage(2); }
    }
    if (M <= 0 || reps <= 0 || threads < 0) {
        fprintf(stderr, "tpgen: error: bench gemm: --m and --reps must be positive, --threads >= 0\n");
        return 2;
    }
    static const int64_t shapes[][2] = {{3072, 3072}, {18432, 3072}, {3072, 9216}, {27648, 3072}, {3072, 12288}};
    int nshape = quick ? 2 : 5, avx = cpu_has_avx512bf16(), amx = avx && cpu_amx_enabled();
    backend *be = backend_cpu_create(threads);
    printf("# op_gemm GFLOP/s, M = %lld tokens, %d threads, best of %d (%s time); portable kernel: %s; OpenBLAS: %s; "
           "AVX512-BF16 kernel: %s; AMX: %s\n",
           (long long)M, omp_get_max_threads(), reps, g_cpu_time ? "CPU" : "wall", cpu_gemm_packed_kernel(),
           openblas_get_corename(),
           !avx ? "not available on this CPU/build" : cpu_vdpbf16_preferred() ? "yes, the default"
                                                                           : "yes, not the default (slower than FMA here)",
           amx ? "yes" : "no");
    if (!strcmp(openblas_get_corename(), "Prescott") && __builtin_cpu_supports("avx2"))
        printf("# OpenBLAS fell back to its SSE3 Prescott kernels on this CPU model: OPENBLAS_CORETYPE=%s makes "
               "sgemm several times faster (docs/cpu-backend.md)\n",
               __builtin_cpu_supports("avx512bw") ? "SkylakeX" : "Haswell");
    printf("%-14s %10s %10s %12s %14s %14s %12s %12s %14s %12s %10s\n", "W [N x K]", "sgemm f32", "op f32",
           "op bf16w/f32x", "op bf16 port.", "op bf16 avx512", "op bf16 amx", "op fp8w/f32x", "op fp8w bf16x",
           "port./sgemm", "amx/sgemm");
    int rc = 0;
    for (int s = 0; s < nshape && !rc; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1];
        double flop = 2.0 * (double)M * (double)N * (double)K;
        tensor *x = random_tensor(be, DT_F32, M, K), *xb = random_tensor(be, DT_BF16, M, K);
        tensor *w = random_tensor(be, DT_F32, N, K), *wb = random_tensor(be, DT_BF16, N, K);
        tensor *y = tensor_new(be, DT_F32, M, N), *yb = tensor_new(be, DT_BF16, M, N), *w8 = random_fp8(be, N, K);
        if (!x || !xb || !w || !wb || !y || !yb || !w8) {
            fprintf(stderr, "tpgen: error: bench gemm: %s\n", tp_error_msg());
            rc = 1;
        } else {
            /* fp8 weights: widened to f32 panels (f32 x), on the hardware route (bf16 x: AMX, else vdpbf16ps) */
            variant v[] = {{.sgemm = 1, .y = y, .x = x, .w = w}, {.y = y, .x = x, .w = w}, {.y = y, .x = x, .w = wb},
                           {.route = CPU_ROUTE_PORTABLE, .y = yb, .x = xb, .w = wb}, {.y = y, .x = x, .w = w8},
                           {.route = CPU_ROUTE_VECTOR, .y = yb, .x = xb, .w = w8},
                           {.no_amx = 1, .route = CPU_ROUTE_VECTOR, .y = yb, .x = xb, .w = wb},
                           {.y = yb, .x = xb, .w = wb}};
            /* the fp8/bf16 column only with a bf16 kernel, the AVX512-BF16 column with it, AMX with AMX */
            time_variants(be, v, amx ? 8 : avx ? 7 : 5, reps);
            double g_sg = flop / v[0].best * 1e-9, g_f32 = flop / v[1].best * 1e-9, g_wb = flop / v[2].best * 1e-9;
            double g_port = flop / v[3].best * 1e-9, g_8f = flop / v[4].best * 1e-9;
            char avxs[32] = "-", avx8[32] = "-", amxs[32] = "-", amxr[32] = "-";
            if (avx) snprintf(avx8, sizeof avx8, "%.1f", flop / v[5].best * 1e-9);
            if (avx) snprintf(avxs, sizeof avxs, "%.1f", flop / v[6].best * 1e-9);
            if (amx) snprintf(amxs, sizeof amxs, "%.1f", flop / v[7].best * 1e-9);
            if (amx) snprintf(amxr, sizeof amxr, "%.2fx", v[0].best / v[7].best);
            char shape[32];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)N, (long long)K);
            printf("%-14s %10.1f %10.1f %12.1f %14.1f %14s %12s %12.1f %14s %11.1f%% %10s\n", shape, g_sg, g_f32, g_wb,
                   g_port, avxs, amxs, g_8f, avx8, 100 * g_port / g_sg, amxr);
            fflush(stdout);
        }
        tensor_free(x); tensor_free(xb); tensor_free(w); tensor_free(wb); tensor_free(y); tensor_free(yb); tensor_free(w8);
    }
    if (!rc && ops) rc = ops_table(be, reps, avx);
    backend_destroy(be);
    return rc;
}
