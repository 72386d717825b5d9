/* The CPU convolutions (kernels/cpu/cpu_conv.c, cpu_conv_amx.c) on the
 * shapes their blocking creates, on every route this machine has: AMX
 * (bf16, AMX-BF16 CPUs), vdpbf16ps (bf16, AVX512-BF16; AMX forced off) and
 * sgemm (f32, and bf16 with the bf16 kernels forced off), and the
 * Winograd F(4x4, 3x3) route that replaces sgemm for 3x3 stride-1
 * convolutions of at least 8 input channels (cpu_conv_wino.c). Each case is
 * checked element by element against a direct convolution written here,
 * accumulated in double from the values as stored (bf16-rounded inputs),
 * with a bound from the sum of |w·x| (fp32 sums) plus half a bf16 ulp of
 * the result for bf16 outputs. Inputs and outputs are column views
 * (ld > cols) and the output's pad columns must stay untouched. */
#include "test.h"
#include "kernels/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/tensor.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static backend *be_cpu(void) {
    static backend *be;
    if (!be) be = backend_cpu_create(0);
    return be;
}

static uint64_t g_state = 0x9e3779b97f4a7c15ull;
static float urand(float lo, float hi) {
    g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((g_state >> 40) * (1.0 / 16777216.0));
}

typedef struct { tensor *base; tensor t; } view;

/* rows x cols as a view with one pad column left and two right, filled with
 * `fill` there; values (rounded to dt) in host when given */
static view view_new(dtype_t dt, int64_t rows, int64_t cols, float *host, float lo, float hi) {
    view v;
    v.base = tensor_new(be_cpu(), dt, rows, cols + 3);
    v.t = tensor_cols(v.base, 1, cols);
    v.t.owner = 0;
    size_t n = (size_t)(rows * (cols + 3));
    float *all = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) all[i] = NAN;
    tensor_upload_f32(v.base, all);
    free(all);
    if (host) {
        for (int64_t i = 0; i < rows * cols; i++) {
            float x = urand(lo, hi);
            host[i] = dt == DT_BF16 ? bf16r(x) : x;
        }
        tensor_upload_f32(&v.t, host);
    }
    return v;
}

/* conv with stride st: output (ho, wo), input row st*yo + ky - pad */
typedef struct { int64_t cin, cout, h, wd; int k, down; } conv_shape;

static const char *route_name(dtype_t xd, int route) {
    if (xd == DT_F32 || route == 2) return "sgemm/winograd";
    return route == 0 ? "amx" : route == 1 ? "vdpbf16ps" : "sgemm";
}

static void conv_check(conv_shape s, dtype_t xd, dtype_t wd_t, int with_bias, int route, const char *note) {
    int k = s.down ? 3 : s.k, st = s.down ? 2 : 1, pad = s.down ? 0 : k / 2;
    int64_t ho = s.down ? s.h / 2 : s.h, wo = s.down ? s.wd / 2 : s.wd, KK = s.cin * k * k;
    int64_t P = s.h * s.wd, Q = ho * wo;
    char what[200];
    snprintf(what, sizeof what, "%s conv%d%s %lld->%lld %lldx%lld x=%s w=%s bias=%d (%s)", route_name(xd, route), k,
             s.down ? " stride 2" : "", (long long)s.cin, (long long)s.cout, (long long)s.h, (long long)s.wd,
             dtype_name(xd), dtype_name(wd_t), with_bias, note);
    float *hx = malloc((size_t)(s.cin * P) * sizeof(float)), *hw = malloc((size_t)(s.cout * KK) * sizeof(float));
    float *hb = malloc((size_t)s.cout * sizeof(float));
    view x = view_new(xd, s.cin, P, hx, -1, 1), w = view_new(wd_t, s.cout, KK, hw, -0.5f, 0.5f);
    view b = view_new(wd_t, 1, s.cout, hb, -1, 1), y = view_new(xd, s.cout, Q, NULL, 0, 0);
    if (s.down) op_conv2d_down(be_cpu(), &y.t, &x.t, &w.t, with_bias ? &b.t : NULL, s.h, s.wd);
    else op_conv2d(be_cpu(), &y.t, &x.t, &w.t, with_bias ? &b.t : NULL, s.h, s.wd, k);
    int64_t ldy = Q + 3;
    float *all = malloc((size_t)(s.cout * ldy) * sizeof(float));
    tensor_download_f32(y.base, all);
    int64_t bad = 0, pads = 0, first = -1;
    double worst = 0;
    for (int64_t co = 0; co < s.cout; co++) {
        const float *row = all + co * ldy;
        pads += !isnan(row[0]) + !isnan(row[Q + 1]) + !isnan(row[Q + 2]);
        for (int64_t yo = 0; yo < ho; yo++)
            for (int64_t xo = 0; xo < wo; xo++) {
                double sum = with_bias ? hb[co] : 0, mag = with_bias ? fabs(hb[co]) : 0;
                for (int64_t ci = 0; ci < s.cin; ci++)
                    for (int ky = 0; ky < k; ky++)
                        for (int kx = 0; kx < k; kx++) {
                            int64_t iy = st * yo + ky - pad, ix = st * xo + kx - pad;
                            if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.wd) continue; /* zero padding */
                            double t = (double)hw[co * KK + (ci * k + ky) * k + kx] * hx[ci * P + iy * s.wd + ix];
                            sum += t;
                            mag += fabs(t);
                        }
                double got = row[1 + yo * wo + xo];
                double tol = 4e-6 * mag + 1e-30 + (xd == DT_BF16 ? fabs(sum) * 0x1p-8 : 0);
                double err = fabs(got - sum);
                if (!(err <= tol)) { /* also catches NaN */
                    if (first < 0) first = co * Q + yo * wo + xo;
                    bad++;
                }
                if (mag > 0 && err / mag > worst) worst = err / mag;
            }
    }
    CHECK(bad == 0, "%s: %lld of %lld values off (first at channel %lld pixel %lld), worst |err|/sum|w·x| %.2e", what,
          (long long)bad, (long long)(s.cout * Q), (long long)(first < 0 ? 0 : first / Q),
          (long long)(first < 0 ? 0 : first % Q), worst);
    CHECK(pads == 0, "%s: wrote %lld pad values outside the output view", what, (long long)pads);
    free(all), free(hx), free(hw), free(hb);
    tensor_free(x.base), tensor_free(w.base), tensor_free(b.base), tensor_free(y.base);
}

/* the shapes: channels off the 16/32 blocks, K off the 32-value tile
 * depth (odd K included), pixels off the 32-pixel blocks, 1x1, images
 * smaller than the window, one row, one column, stride 2 with its
 * bottom/right-only padding */
static const conv_shape g_shapes[] = {
    {5, 70, 7, 9, 3, 0},   /* K = 45: one tile step and a partial one; 3 channel blocks, last one 6 wide */
    {33, 17, 6, 11, 3, 0}, /* K = 297; 66 pixels: two blocks and 2 */
    {3, 40, 12, 8, 3, 0},  /* the encoder's conv_in: K = 27, odd */
    {64, 33, 5, 7, 1, 0},  /* 1x1, K = 64 */
    {7, 5, 3, 3, 1, 0},    /* 1x1, K = 7 */
    {4, 3, 1, 1, 3, 0},    /* one pixel: only the centre tap */
    {6, 9, 2, 2, 3, 0},    /* smaller than the window */
    {8, 12, 1, 37, 3, 0},  /* one row */
    {8, 12, 37, 1, 3, 0},  /* one column */
    {32, 96, 4, 32, 3, 0}, /* whole blocks everywhere: K = 288, 128 pixels, 96 channels */
    {5, 70, 8, 10, 3, 1},  /* stride 2 */
    {3, 20, 6, 14, 3, 1},  /* stride 2, K = 27 */
    {6, 9, 12, 2, 3, 1},   /* stride 2, one output column */
    {3, 4, 2, 2, 3, 1},    /* stride 2, one output pixel: the padding row and column around it */
    {33, 40, 10, 66, 3, 1} /* stride 2, 165 output pixels */
};

static void all_shapes(dtype_t xd, dtype_t wd_t, int route, const char *note) {
    for (size_t i = 0; i < sizeof g_shapes / sizeof g_shapes[0]; i++) conv_check(g_shapes[i], xd, wd_t, i % 2 == 0, route, note);
}

/* bf16 on route 0 (AMX where the CPU has it), 1 (AMX off: vdpbf16ps where
 * the CPU has AVX512-BF16, whether or not it is the CPU's default) or 2
 * (bf16 kernels off: sgemm) */
static void set_route(int route) {
    cpu_conv_amx_force_off(route >= 1);
    cpu_kernel_route(route == 2 ? CPU_ROUTE_PORTABLE : CPU_ROUTE_VECTOR);
}

TEST(conv_f32_shapes) {
    all_shapes(DT_F32, DT_F32, 2, "whole image");
    all_shapes(DT_F32, DT_BF16, 2, "bf16 weights widened");
}

TEST(conv_bf16_shapes_every_route) {
    printf("# conv routes on this CPU: AMX %s, AVX512-BF16 %s\n", (set_route(0), cpu_conv_amx_enabled()) ? "yes" : "no",
           cpu_has_avx512bf16() ? "yes" : "no");
    for (int route = 0; route < 3; route++) {
        set_route(route);
        all_shapes(DT_BF16, DT_BF16, route, "whole image");
    }
    set_route(0);
    all_shapes(DT_BF16, DT_F32, 2, "f32 weights: sgemm"); /* mixed dtypes take the sgemm route */
    cpu_conv_amx_force_off(0);
    cpu_kernel_route(CPU_ROUTE_AUTO);
}

/* items of one output row and K in chunks of one 16-pair tile step (a tile
 * budget of 1 byte: partial sums carried between chunks), and two threads
 * sharing the items; K = 2700 in one chunk and in 85 */
TEST(conv_items_and_threads) {
    int before = omp_get_max_threads();
    static const conv_shape s[] = {{5, 70, 7, 9, 3, 0}, {33, 40, 10, 66, 3, 1}, {64, 33, 5, 7, 1, 0}, {300, 40, 6, 5, 3, 0}};
    for (int threads = 1; threads <= 2; threads++) {
        cpu_set_threads(threads);
        for (int budget = 0; budget < 2; budget++) {
            cpu_set_tile_budget(budget ? 1 : 0); /* 1 byte: one output row per item */
            const char *note = budget ? (threads > 1 ? "1-row items, 16-pair K chunks, 2 threads" : "1-row items, 16-pair K chunks")
                                      : (threads > 1 ? "2 threads" : "1 thread");
            for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
                conv_check(s[i], DT_F32, DT_F32, 1, 2, note);
                for (int route = 0; route < 3; route++) {
                    set_route(route);
                    conv_check(s[i], DT_BF16, DT_BF16, 1, route, note);
                }
                set_route(0);
            }
        }
    }
    cpu_set_tile_budget(0);
    cpu_set_threads(before);
}

/* Winograd F(4x4, 3x3) on its own edges: sides that are not multiples of
 * the 4-pixel tile, one tile, a pixel, widths past the 32-pixel vector
 * blocks of the phase split/join (37, 70) and under them; bands of one
 * tile row (budget of 1 byte) and of the default size; 1 and 2 threads;
 * f32, f32 x with bf16 w, and bf16 with the bf16 kernels off. The same
 * shapes with Winograd turned off take im2col + sgemm, so both are held
 * to the same direct reference. */
TEST(conv_winograd_tiles) {
    int before = omp_get_max_threads();
    static const conv_shape s[] = {{8, 8, 4, 4, 3, 0},   {9, 5, 5, 6, 3, 0},   {16, 24, 13, 70, 3, 0},
                                   {12, 7, 9, 33, 3, 0}, {8, 3, 1, 1, 3, 0},   {20, 10, 2, 37, 3, 0},
                                   {40, 9, 11, 3, 3, 0}, {8, 16, 21, 64, 3, 0}};
    for (int wino = 1; wino >= 0; wino--) {
        cpu_conv_wino_force_off(!wino);
        for (int threads = 1; threads <= 2; threads++) {
            cpu_set_threads(threads);
            for (int budget = 0; budget < 2; budget++) {
                cpu_set_tile_budget(budget ? 1 : 0); /* 1 byte: bands of one tile row */
                char note[96];
                snprintf(note, sizeof note, "%s, %d thread%s%s", wino ? "winograd" : "winograd off", threads,
                         threads > 1 ? "s" : "", budget ? ", 1-row bands" : "");
                for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
                    conv_check(s[i], DT_F32, DT_F32, i % 2 == 0, 2, note);
                    conv_check(s[i], DT_F32, DT_BF16, 1, 2, note);
                    set_route(2);
                    conv_check(s[i], DT_BF16, DT_BF16, i % 2, 2, note);
                    set_route(0);
                }
            }
        }
    }
    cpu_conv_wino_force_off(0);
    cpu_set_tile_budget(0);
    cpu_set_threads(before);
}
