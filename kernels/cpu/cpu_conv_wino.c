/* The f32 3x3 stride-1 convolution as Winograd F(4x4, 3x3) (Lavin & Gray,
 * "Fast Algorithms for Convolutional Neural Networks", 2016).
 *
 * Each 4x4 block of output pixels ("tile") is computed from the 6x6 input
 * pixels around it: V = Bᵀ d B per input channel, U = G g Gᵀ per (output,
 * input) channel pair, and then for each of the 36 points ξ of the 6x6
 * transformed tile one matrix product over the channels,
 *     M[ξ][co][tile] = Σ_ci U[ξ][co][ci] · V[ξ][ci][tile],
 * and the output tile Y = Aᵀ M A. The products cost 36 multiply-adds per
 * 16 output pixels and channel pair instead of 9 per pixel (4x fewer), and
 * are 36 ordinary sgemm calls (OpenBLAS), so the f32 convolution runs at
 * sgemm speed on a quarter of the work; the transforms are additions with
 * small constants, vectorised along the tiles of a row.
 *
 * Numerics: the same products in a different order, with the transforms'
 * constants (up to 8 and 1/24) in between; the error stays a small
 * multiple of fp32 rounding of sum|w·x| (tests/test_conv.c holds every
 * route to 4e-6 of it: Winograd's worst is about 8e-7, im2col's 1.5e-7;
 * the VAE golden tests pass unchanged).
 *
 * Work: the output is cut into bands of tile rows (band_rows). A band is
 * transformed in, multiplied (36 products) and transformed out either by
 * one thread (when there are enough bands) or by all of them, step by step
 * (cpu_conv_wino). */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

enum { T = 6, TT = 36, BAND_BYTES = 64 << 20 };

static _Atomic int g_force = -1; /* < 0: as TPGEN_NO_WINOGRAD says */
static int g_env_off;              /* read once, under pthread_once */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
void cpu_conv_wino_force_off(int on) { g_force = on; }
static void read_env(void) {
    const char *e = getenv("TPGEN_NO_WINOGRAD");
    g_env_off = e && *e && strcmp(e, "0") != 0;
}

/* TPGEN_NO_WINOGRAD=1: the f32 3x3 convolution on im2col + sgemm (bench vae compares them) */
int cpu_conv_wino_usable(int64_t cin, int k, int stride) {
    pthread_once(&g_once, read_env);
    int off = g_force >= 0 ? g_force : g_env_off;
    /* few input channels (the encoder's conv_in, 3): the transforms would outweigh the products */
    return !off && k == 3 && stride == 1 && cin >= 8;
}

/* The three transforms, each on one value per lane (the loops around them
 * run along tiles or channels and are vectorised with omp simd).
 * Bᵀ = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1] */
#define BT_ROWS(d0, d1, d2, d3, d4, d5, o0, o1, o2, o3, o4, o5)                                                        \
    do {                                                                                                               \
        float p_ = (d4) - 4 * (d2), q_ = (d3) - 4 * (d1), r_ = (d4) - (d2), s_ = 2 * ((d3) - (d1));                    \
        o0 = 4 * (d0) - 5 * (d2) + (d4);                                                                               \
        o1 = p_ + q_;                                                                                                  \
        o2 = p_ - q_;                                                                                                  \
        o3 = r_ + s_;                                                                                                  \
        o4 = r_ - s_;                                                                                                  \
        o5 = 4 * (d1) - 5 * (d3) + (d5);                                                                               \
    } while (0)

/* G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1] */
#define G_ROWS(g0, g1, g2, o0, o1, o2, o3, o4, o5)                                                                     \
    do {                                                                                                               \
        float s_ = (g0) + (g2), e_ = (g0) * (1.0f / 24) + (g2) * (1.0f / 6), f_ = (g1) * (1.0f / 12);                  \
        o0 = (g0) * 0.25f;                                                                                             \
        o1 = -(s_ + (g1)) * (1.0f / 6);                                                                                \
        o2 = -(s_ - (g1)) * (1.0f / 6);                                                                                \
        o3 = e_ + f_;                                                                                                  \
        o4 = e_ - f_;                                                                                                  \
        o5 = (g2);                                                                                                     \
    } while (0)

/* Aᵀ = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1] */
#define AT_ROWS(m0, m1, m2, m3, m4, m5, o0, o1, o2, o3)                                                                \
    do {                                                                                                               \
        float a1_ = (m1) + (m2), a2_ = (m1) - (m2), b1_ = (m3) + (m4), b2_ = (m3) - (m4);                              \
        o0 = (m0) + a1_ + b1_;                                                                                         \
        o1 = a2_ + 2 * b2_;                                                                                            \
        o2 = a1_ + 4 * b1_;                                                                                            \
        o3 = a2_ + 8 * b2_ + (m5);                                                                                     \
    } while (0)

/* U[ξ][co][ci] = (G g Gᵀ)[ξ] for every (co, ci), g the 3x3 kernel. Per
 * output channel the row is put tap-major (gt[tap][ci]), so that the
 * transform runs along ci, which is also U's contiguous index. */
static void weight_transform(const tensor *w, int64_t Cout, int64_t Cin, float *U) {
    size_t plane = (size_t)Cout * (size_t)Cin;
#pragma omp parallel
    {
        float *row = xmalloc(sizeof(float) * (size_t)Cin * 9), *gt = xmalloc(sizeof(float) * (size_t)Cin * 9);
        float *t = xmalloc(sizeof(float) * (size_t)Cin * T * 3);
#pragma omp for
        for (int64_t co = 0; co < Cout; co++) {
            const float *g = row_f32(w, co, 0, Cin * 9, row);
            for (int64_t ci = 0; ci < Cin; ci++)
                for (int k = 0; k < 9; k++) gt[k * Cin + ci] = g[ci * 9 + k];
            for (int c = 0; c < 3; c++) { /* t[i][c] = (G g)[i][c]: the kernel's rows combined, column c */
                const float *g0 = gt + c * Cin, *g1 = gt + (3 + c) * Cin, *g2 = gt + (6 + c) * Cin;
                float *o[T];
                for (int i = 0; i < T; i++) o[i] = t + (i * 3 + c) * Cin;
#pragma omp simd
                for (int64_t ci = 0; ci < Cin; ci++)
                    G_ROWS(g0[ci], g1[ci], g2[ci], o[0][ci], o[1][ci], o[2][ci], o[3][ci], o[4][ci], o[5][ci]);
            }
            for (int i = 0; i < T; i++) { /* U[i·6 + j] = (t Gᵀ)[i][j] */
                const float *a0 = t + i * 3 * Cin, *a1 = a0 + Cin, *a2 = a1 + Cin;
                float *u[T];
                for (int j = 0; j < T; j++) u[j] = U + (size_t)(i * T + j) * plane + (size_t)co * (size_t)Cin;
#pragma omp simd
                for (int64_t ci = 0; ci < Cin; ci++)
                    G_ROWS(a0[ci], a1[ci], a2[ci], u[0][ci], u[1][ci], u[2][ci], u[3][ci], u[4][ci], u[5][ci]);
            }
        }
        free(row), free(gt), free(t);
    }
}

/* d[t] = src[4t + p - 1] for the four phases p (rows q[p·n1 + t]): one input
 * row split by column phase, zero outside [0, wd) */
static void split_phases(const float *src, int64_t wd, int64_t n1, float *q) {
    int64_t t = 0;
    for (; t < n1 && t < 1; t++)
        for (int p = 0; p < 4; p++) q[p * n1 + t] = p ? (4 * t + p - 1 < wd ? src[4 * t + p - 1] : 0.0f) : 0.0f;
#if defined(__AVX2__)
    /* 8 tiles at a time: 32 consecutive values, a 4 x 8 transpose */
    for (; t + 8 <= n1 && 4 * t + 31 <= wd; t += 8) {
        const float *b = src + 4 * t - 1;
        __m256 v0 = _mm256_loadu_ps(b), v1 = _mm256_loadu_ps(b + 8), v2 = _mm256_loadu_ps(b + 16), v3 = _mm256_loadu_ps(b + 24);
        __m256 x0 = _mm256_permute2f128_ps(v0, v2, 0x20), x1 = _mm256_permute2f128_ps(v0, v2, 0x31);
        __m256 x2 = _mm256_permute2f128_ps(v1, v3, 0x20), x3 = _mm256_permute2f128_ps(v1, v3, 0x31);
        __m256 ta = _mm256_unpacklo_ps(x0, x1), tb = _mm256_unpackhi_ps(x0, x1);
        __m256 tc = _mm256_unpacklo_ps(x2, x3), td = _mm256_unpackhi_ps(x2, x3);
        _mm256_storeu_ps(q + t, _mm256_shuffle_ps(ta, tc, 0x44));
        _mm256_storeu_ps(q + n1 + t, _mm256_shuffle_ps(ta, tc, 0xEE));
        _mm256_storeu_ps(q + 2 * n1 + t, _mm256_shuffle_ps(tb, td, 0x44));
        _mm256_storeu_ps(q + 3 * n1 + t, _mm256_shuffle_ps(tb, td, 0xEE));
    }
#endif
    for (; t < n1; t++)
        for (int p = 0; p < 4; p++) {
            int64_t ix = 4 * t + p - 1;
            q[p * n1 + t] = ix >= 0 && ix < wd ? src[ix] : 0.0f;
        }
}

/* d[4t + c] = o[c·ntx + t] + bias for x = 4t + c < wd: the column phases interleaved back into a row */
static void join_phases(const float *o, int64_t ntx, int64_t wd, float bias, float *d) {
    int64_t t = 0;
#if defined(__AVX2__)
    const __m256 vb = _mm256_set1_ps(bias);
    for (; 4 * (t + 8) <= wd; t += 8) {
        __m256 a = _mm256_loadu_ps(o + t), b = _mm256_loadu_ps(o + ntx + t);
        __m256 c = _mm256_loadu_ps(o + 2 * ntx + t), e = _mm256_loadu_ps(o + 3 * ntx + t);
        __m256 abl = _mm256_unpacklo_ps(a, b), abh = _mm256_unpackhi_ps(a, b);
        __m256 cel = _mm256_unpacklo_ps(c, e), ceh = _mm256_unpackhi_ps(c, e);
        __m256 x0 = _mm256_shuffle_ps(abl, cel, 0x44), x1 = _mm256_shuffle_ps(abl, cel, 0xEE);
        __m256 x2 = _mm256_shuffle_ps(abh, ceh, 0x44), x3 = _mm256_shuffle_ps(abh, ceh, 0xEE);
        float *dt = d + 4 * t;
        _mm256_storeu_ps(dt, _mm256_add_ps(_mm256_permute2f128_ps(x0, x1, 0x20), vb));
        _mm256_storeu_ps(dt + 8, _mm256_add_ps(_mm256_permute2f128_ps(x2, x3, 0x20), vb));
        _mm256_storeu_ps(dt + 16, _mm256_add_ps(_mm256_permute2f128_ps(x0, x1, 0x31), vb));
        _mm256_storeu_ps(dt + 24, _mm256_add_ps(_mm256_permute2f128_ps(x2, x3, 0x31), vb));
    }
#endif
    for (int64_t xo = 4 * t; xo < wd; xo++) d[xo] = o[(xo & 3) * ntx + (xo >> 2)] + bias;
}

typedef struct {
    int64_t h, wd, ntx, ty0, nty, ldv; /* image, tiles per row, the band's tile rows, tiles (padded) per product row */
} band;

/* V[ξ][ci][t] for one input channel over the band. q: the band's input rows
 * (from 4·ty0 - 1, 4·nty + 2 of them) split by column phase, q[(r·4 + p)·n1 + t]
 * = input column 4t + p - 1 (zero outside the image), n1 = ntx + 1; s: the
 * 6 x 4 phase rows of one tile row after the vertical transform. */
static void input_transform(const tensor *x, int64_t ci, const band *b, float *V, size_t vplane, float *q, float *s,
                            float *rowbuf) {
    int64_t n1 = b->ntx + 1, nrows = 4 * b->nty + 2, y0 = 4 * b->ty0 - 1, wd = b->wd;
    for (int64_t r = 0; r < nrows; r++) {
        int64_t iy = y0 + r;
        float *qr = q + r * 4 * n1;
        if (iy < 0 || iy >= b->h) { memset(qr, 0, sizeof(float) * 4 * (size_t)n1); continue; }
        split_phases(row_f32(x, ci, iy * wd, wd, rowbuf), wd, n1, qr);
    }
    float *Vc = V + (size_t)ci * (size_t)b->ldv;
    for (int64_t tyl = 0; tyl < b->nty; tyl++) {
        /* vertical: s[i][p][t] = Bᵀ over the tile's 6 input rows */
        for (int p = 0; p < 4; p++) {
            const float *d[T];
            float *v[T];
            for (int k = 0; k < T; k++) d[k] = q + ((4 * tyl + k) * 4 + p) * n1, v[k] = s + (k * 4 + p) * n1;
#pragma omp simd
            for (int64_t t = 0; t < n1; t++)
                BT_ROWS(d[0][t], d[1][t], d[2][t], d[3][t], d[4][t], d[5][t], v[0][t], v[1][t], v[2][t], v[3][t],
                        v[4][t], v[5][t]);
        }
        /* horizontal: tile column j reads phase j % 4 at tile t + j / 4 */
        for (int i = 0; i < T; i++) {
            const float *s0 = s + i * 4 * n1, *s1 = s0 + n1, *s2 = s1 + n1, *s3 = s2 + n1;
            float *o[T];
            for (int j = 0; j < T; j++) o[j] = Vc + (size_t)(i * T + j) * vplane + tyl * b->ntx;
#pragma omp simd
            for (int64_t t = 0; t < b->ntx; t++)
                BT_ROWS(s0[t], s1[t], s2[t], s3[t], s0[t + 1], s1[t + 1], o[0][t], o[1][t], o[2][t], o[3][t], o[4][t],
                        o[5][t]);
        }
    }
}

/* y[co] over the band's pixel rows from M[ξ][co][t]: Y = Aᵀ M A + bias.
 * s: 6 x 4 rows of ntx after the horizontal transform, o: 4 x 4 after the
 * vertical one (output row r, column phase c), rows: 4 image rows when y
 * is not f32. */
static void output_transform(tensor *y, int64_t co, const band *b, const float *M, size_t mplane, float bias,
                             float *s, float *o, float *rows) {
    int64_t ntx = b->ntx, wd = b->wd;
    const float *Mc = M + (size_t)co * (size_t)b->ldv;
    int direct = y->dtype == DT_F32;
    for (int64_t tyl = 0; tyl < b->nty; tyl++) {
        const float *m = Mc + tyl * ntx;
        for (int i = 0; i < T; i++) {
            const float *mj[T];
            for (int j = 0; j < T; j++) mj[j] = m + (size_t)(i * T + j) * mplane;
            float *si = s + i * 4 * ntx;
#pragma omp simd
            for (int64_t t = 0; t < ntx; t++)
                AT_ROWS(mj[0][t], mj[1][t], mj[2][t], mj[3][t], mj[4][t], mj[5][t], si[t], si[ntx + t], si[2 * ntx + t],
                        si[3 * ntx + t]);
        }
        for (int c = 0; c < 4; c++) {
            const float *si[T];
            for (int i = 0; i < T; i++) si[i] = s + (i * 4 + c) * ntx;
            float *o0 = o + c * ntx, *o1 = o0 + 4 * ntx, *o2 = o1 + 4 * ntx, *o3 = o2 + 4 * ntx;
#pragma omp simd
            for (int64_t t = 0; t < ntx; t++)
                AT_ROWS(si[0][t], si[1][t], si[2][t], si[3][t], si[4][t], si[5][t], o0[t], o1[t], o2[t], o3[t]);
        }
        /* the tile row's output rows, the column phases interleaved (x = 4t + c) */
        int64_t yo0 = 4 * (b->ty0 + tyl), nr = b->h - yo0 < 4 ? b->h - yo0 : 4;
        float *yr = direct ? (float *)row_ptr(y, co) + yo0 * wd : rows;
        for (int64_t r = 0; r < nr; r++) {
            const float *orow = o + r * 4 * ntx;
            float *d = yr + r * wd;
            join_phases(orow, ntx, wd, bias, d);
            if (!direct) row_store(y, co, (yo0 + r) * wd, wd, d);
        }
    }
}

/* U, V and M are kept for the calling thread between calls (fresh pages
 * for 50-100 MB per convolution cost a tenth of its time in page faults):
 * at most the U of the largest convolution plus BAND_BYTES stay allocated. */
static _Thread_local cpu_scratch t_u, t_vm;

/* 36 products of one band: M[ξ] = U[ξ] · V[ξ], on the calling thread */
static void band_products(const float *U, int64_t Cout, int64_t Cin, const float *V, size_t vplane, float *M,
                          size_t mplane, int64_t nt, int64_t ldv, int xi) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Cout, (int)nt, (int)Cin, 1.0f,
                U + (size_t)xi * (size_t)Cout * (size_t)Cin, (int)Cin, V + xi * vplane, (int)ldv, 0.0f, M + xi * mplane,
                (int)ldv);
}

/* tile rows per band: each band repacks all of U (36·Cout·Cin values) in
 * its products, so wide convolutions want long bands (Cout·Cin / 256
 * tiles: 1024 at 512 channels), narrow ones short bands whose V and M stay
 * in cache (at least 256 tiles); whole tile rows, at least one, V and M
 * within `budget` bytes */
static int64_t band_rows(int64_t Cin, int64_t Cout, int64_t ntx, int64_t nty_all, size_t budget) {
    size_t per_row = sizeof(float) * TT * (size_t)(Cin + Cout) * (size_t)ntx;
    int64_t want = Cin * Cout / 256 > 256 ? Cin * Cout / 256 : 256, nty = (want + ntx - 1) / ntx;
    int64_t fit = (int64_t)(cpu_tile_budget(budget) / per_row);
    nty = nty > fit ? fit : nty;
    return nty < 1 ? 1 : nty > nty_all ? nty_all : nty;
}

/* Two ways to share the bands between threads. With at least two bands per
 * thread, each band belongs to one thread from its input to its output
 * (own V and M, BAND_BYTES split between the threads): no barrier at all,
 * so a thread that another process holds up delays only its own bands
 * (with a barrier per step, 128 channels at 512² ran 2.6x slower on two
 * threads than on one while another job held a core). Wide convolutions
 * have fewer, longer bands: there the threads share each band's three
 * steps, with a barrier after each. */
void cpu_conv_wino(tensor *y, const tensor *x, const tensor *w, const float *bias, int64_t h, int64_t wd) {
    int64_t Cin = x->rows, Cout = w->rows, ntx = (wd + 3) / 4, nty_all = (h + 3) / 4;
    int threads = omp_get_max_threads();
    float *U = cpu_scratch_get(&t_u, sizeof(float) * (TT * (size_t)Cout * (size_t)Cin));
    weight_transform(w, Cout, Cin, U);
    int64_t nty = band_rows(Cin, Cout, ntx, nty_all, BAND_BYTES);
    int own = threads == 1 || (nty_all + nty - 1) / nty >= 2 * threads;
    if (own && threads > 1) nty = band_rows(Cin, Cout, ntx, nty_all, BAND_BYTES / (size_t)threads);
    int64_t nbands = (nty_all + nty - 1) / nty, ldv = (nty * ntx + 15) / 16 * 16;
    size_t vplane = (size_t)Cin * (size_t)ldv, mplane = (size_t)Cout * (size_t)ldv, per = TT * (vplane + mplane);
    float *VM = cpu_scratch_get(&t_vm, sizeof(float) * (per * (own ? (size_t)threads : 1)));
#pragma omp parallel
    {
        int64_t n1 = ntx + 1;
        float *q = xmalloc(sizeof(float) * (size_t)((4 * nty + 2) * 4 * n1));
        float *s = xmalloc(sizeof(float) * (size_t)(T * 4 * n1)), *o = xmalloc(sizeof(float) * (size_t)(16 * ntx));
        float *rowbuf = x->dtype == DT_F32 ? NULL : xmalloc(sizeof(float) * (size_t)wd);
        float *rows = y->dtype == DT_F32 ? NULL : xmalloc(sizeof(float) * 4 * (size_t)wd);
        float *V = VM + (own ? (size_t)omp_get_thread_num() * per : 0), *M = V + TT * vplane;
        if (own) {
#pragma omp for schedule(dynamic)
            for (int64_t bi = 0; bi < nbands; bi++) {
                int64_t ty0 = bi * nty;
                band b = {.h = h, .wd = wd, .ntx = ntx, .ty0 = ty0, .nty = nty_all - ty0 < nty ? nty_all - ty0 : nty, .ldv = ldv};
                for (int64_t ci = 0; ci < Cin; ci++) input_transform(x, ci, &b, V, vplane, q, s, rowbuf);
                for (int xi = 0; xi < TT; xi++) band_products(U, Cout, Cin, V, vplane, M, mplane, b.nty * ntx, ldv, xi);
                for (int64_t co = 0; co < Cout; co++) output_transform(y, co, &b, M, mplane, bias ? bias[co] : 0.0f, s, o, rows);
            }
        } else {
            for (int64_t ty0 = 0; ty0 < nty_all; ty0 += nty) {
                band b = {.h = h, .wd = wd, .ntx = ntx, .ty0 = ty0, .nty = nty_all - ty0 < nty ? nty_all - ty0 : nty, .ldv = ldv};
#pragma omp for schedule(dynamic, 4)
                for (int64_t ci = 0; ci < Cin; ci++) input_transform(x, ci, &b, V, vplane, q, s, rowbuf);
#pragma omp for schedule(dynamic)
                for (int xi = 0; xi < TT; xi++) band_products(U, Cout, Cin, V, vplane, M, mplane, b.nty * ntx, ldv, xi);
#pragma omp for schedule(dynamic, 4)
                for (int64_t co = 0; co < Cout; co++) output_transform(y, co, &b, M, mplane, bias ? bias[co] : 0.0f, s, o, rows);
            }
        }
        free(q), free(s), free(o), free(rowbuf), free(rows);
    }
}
