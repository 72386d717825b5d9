/* The portable GEMM: y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias) with f32 FMAs, for
 * every dtype combination except f32 x f32 -> f32 (OpenBLAS's sgemm) and the
 * bf16 routes of CPUs with AMX or AVX512-BF16. It is the bf16 GEMM of CPUs
 * without AVX512-BF16, so it has to run at sgemm speed from bf16 operands.
 *
 * GotoBLAS/BLIS structure, with the packing doing the widening: in the
 * product C = A · B, A = x and B = wᵀ. For each k block of kc:
 *   - B: the thread's weight rows [n0, n0+nn) are packed into micro-panels
 *     of NR rows, [kc][NR] floats each, read straight from bf16 (or f32; f16
 *     and fp8 through row_f32, which applies the fp8 scale exactly as the
 *     dequantised checkpoint), widened and transposed 8 x 8 in registers.
 *   - A: all rows of x (of the current row chunk) into micro-panels of MR
 *     rows, [kc][MR] floats, again straight from bf16 or f32.
 *   - the micro-kernel (cpu_gemm_ukernel.h) keeps an MR x NR tile of C in
 *     registers over the k block, then writes it once: into y when y is f32
 *     (accumulating over the k blocks, bias added at the last), else into a
 *     per-thread f32 accumulator; after the last k block the tile gets its
 *     bias and is rounded once into y (bf16/f16).
 * Loop order per k block: pack A, then per B block of nc weight rows (1 MB,
 * stays in L2) pack it and run the tiles with the A micro-panels outer and
 * the B micro-panels inner: one A micro-panel (MR x kc) stays in L1 while
 * the B block streams from L2 (prefetched in the kernel), and consecutive
 * tiles share their rows of C. (B in L1 and A in L2, the classic order,
 * sends each tile to 8 fresh rows of C; it measured 85-89 % of sgemm
 * against 88-92 % for this order, both before the prefetches.)
 *
 * So every operand element is read from its bf16 source once per use of
 * its block and written once as f32 into a cache-sized packed buffer: there
 * is no widened f32 copy of w, x or y in memory, which the earlier path
 * (widen into panels, then OpenBLAS sgemm, whose own packing cannot read
 * bf16) could not avoid.
 *
 * Threads: N is cut into panels of at most NB_MAX weight rows, a multiple
 * of `threads` of them; each thread owns whole panels (dynamic schedule),
 * so no packed piece of w is shared between cores or packed twice; each
 * thread packs x for its own panels (x is re-read once per panel, 1/(2·nb)
 * of the work). One parallel region per call, no barrier inside; the packed
 * buffers belong to their thread and are kept between calls.
 *
 * Kernels: AVX-512F (8 x 48 tile, 24 zmm accumulators) when the CPU has it,
 * else AVX2+FMA (6 x 16, 12 ymm), else a scalar one (CPUs without AVX2 or
 * FMA, which only a build for older CPUs runs on). One source,
 * included per ISA. TPGEN_NO_AVX512=2 (or cpu_gemm_packed_force) keeps
 * the AVX-512F kernel off, as on an AVX2-only CPU. */
#include "cpu_gemm_packed.h"
#include "cpu_ops.h"
#include "cpu_rows.h"
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_X86_KERNELS 1
#include <immintrin.h>
#endif

/* Blocking: KC k per block, B_BYTES the packed B block, NB_MAX weight rows
 * per thread panel, C_BYTES the packed A chunk and a thread's f32
 * accumulator (non-f32 y). W_BYTES is the default of cpu_tile_budget, from
 * which choose() derives them, so that tests can shrink every block. */
enum { NB_MAX = 3072, KC = 512 };
#define B_BYTES ((size_t)1 << 20)
#define W_BYTES ((size_t)12 << 20)
#define C_BYTES ((size_t)16 << 20)

typedef void (*ukern_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int acc,
                         const float *bias);
typedef struct { const char *name; int mr, nr, avx2_pack; ukern_fn fn; } ukernel;

/* ---- the micro-kernels: one source, one instance per ISA ---- */

#ifdef HAVE_X86_KERNELS
#define UK_NAME uk_avx512
#define UK_TARGET __attribute__((target("avx512f")))
#define UK_MR 8
#define UK_NV 3
#define UK_PF 16
#define VEC __m512
#define VW 16
#define V_LOAD _mm512_loadu_ps
#define V_STORE _mm512_storeu_ps
#define V_FMA _mm512_fmadd_ps
#define V_ADD _mm512_add_ps
#define V_BCAST(p) _mm512_set1_ps(*(p))
#define V_ZERO _mm512_setzero_ps
#include "cpu_gemm_ukernel.h"

#define UK_NAME uk_avx2
#define UK_TARGET __attribute__((target("avx2,fma")))
#define UK_MR 6
#define UK_NV 2
#define UK_PF 16
#define VEC __m256
#define VW 8
#define V_LOAD _mm256_loadu_ps
#define V_STORE _mm256_storeu_ps
#define V_FMA _mm256_fmadd_ps
#define V_ADD _mm256_add_ps
#define V_BCAST(p) _mm256_set1_ps(*(p))
#define V_ZERO _mm256_setzero_ps
#include "cpu_gemm_ukernel.h"
#endif

#define UK_NAME uk_scalar
#define UK_TARGET
#define UK_MR 4
#define UK_NV 8
#define UK_PF 16
#define VEC float
#define VW 1
#define V_LOAD(p) (*(p))
#define V_STORE(p, v) (*(p) = (v))
#define V_FMA(a, b, c) ((a) * (b) + (c))
#define V_ADD(a, b) ((a) + (b))
#define V_BCAST(p) (*(p))
#define V_ZERO() 0.0f
#include "cpu_gemm_ukernel.h"

static const ukernel K_SCALAR = {"scalar", 4, 8, 0, uk_scalar};
#ifdef HAVE_X86_KERNELS
static const ukernel K_AVX512 = {"avx512f", 8, 48, 1, uk_avx512}, K_AVX2 = {"avx2", 6, 16, 1, uk_avx2};
#endif

static int g_force; /* 1: not AVX-512F, 2: scalar */
void cpu_gemm_packed_force(int level) { g_force = level; }

#ifdef HAVE_X86_KERNELS
static int has512, has2; /* written once, by detect() under pthread_once */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void detect(void) {
    __builtin_cpu_init();
    /* TPGEN_NO_AVX512=2: as on an AVX2-only CPU (=1 turns off only the bf16 kernels and AMX) */
    const char *off = getenv("TPGEN_NO_AVX512");
    has512 = __builtin_cpu_supports("avx512f") && !(off && !strcmp(off, "2"));
    has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

static const ukernel *kernel(void) {
#ifdef HAVE_X86_KERNELS
    pthread_once(&g_once, detect);
    if (has512 && g_force < 1) return &K_AVX512;
    if (has2 && g_force < 2) return &K_AVX2;
#endif
    return &K_SCALAR;
}

const char *cpu_gemm_packed_kernel(void) { return kernel()->name; }

/* ---- packing ----
 * pack(t, r0, n, k0, kb, P, dst): rows [r0, r0+n) x k [k0, k0+kb) of t into
 * ceil(n / P) micro-panels of P rows, dst[(i/P)·kb·P + k·P + i%P] =
 * t[r0+i][k0+k] as f32, rows past n zero. Rows go in groups of G = 8 (P a
 * multiple of 8) or G = P (P < 8), each group inside one panel; with AVX2,
 * blocks of G rows x 8 k are loaded (bf16 widened by a shift), transposed
 * 8 x 8 in registers and stored as 8 k-lines of G values. */

static const float g_zero[KC]; /* a missing row, as f32 or bf16 zeros */

static inline float load1(const void *row, int64_t k, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)row)[k]) : ((const float *)row)[k];
}

#ifdef HAVE_X86_KERNELS
#define T2 __attribute__((target("avx2,fma")))

static inline T2 __m256 load8(const void *row, int64_t k, int bf16) {
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)row + k);
}

/* r[j] = row j (8 values) -> r[k] = the 8 rows at k */
static inline T2 void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20), r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20), r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31), r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31), r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* one group of G rows (src[G..8) are zero rows) from k = 0 in steps of 8 to
 * d (the group's first value in its panel, k-lines P apart); returns the k
 * where the scalar tail starts. pf: rows to prefetch meanwhile (the next
 * group), one line per row every 64 bytes of source. */
static T2 int64_t pack_group_avx2(const void *const src[8], const char *const pf[8], int bf16, int G, int64_t kb,
                                  int P, float *d) {
    int64_t k = 0, pfk = bf16 ? 32 : 16; /* elements per cache line */
    for (; k + 8 <= kb; k += 8) {
        __m256 r[8];
        for (int j = 0; j < 8; j++) r[j] = load8(src[j], k, bf16);
        if (k % pfk == 0)
            for (int j = 0; j < G; j++) _mm_prefetch(pf[j] + k * (4 >> bf16), _MM_HINT_T0);
        transpose8(r);
        float *o = d + k * P;
        if (G == 8) {
            for (int q = 0; q < 8; q++) _mm256_storeu_ps(o + q * P, r[q]);
        } else if (G == 4) {
            for (int q = 0; q < 8; q++) _mm_storeu_ps(o + q * P, _mm256_castps256_ps128(r[q]));
        } else { /* G == 6 */
            for (int q = 0; q < 8; q++) {
                _mm_storeu_ps(o + q * P, _mm256_castps256_ps128(r[q]));
                _mm_storel_pi((__m64 *)(o + q * P + 4), _mm256_extractf128_ps(r[q], 1));
            }
        }
    }
    return k;
}
#endif

static void pack(const tensor *t, int64_t r0, int64_t n, int64_t k0, int64_t kb, int P, int avx2, float *dst,
                 float *tmp) {
    int64_t rows = (n + P - 1) / P * P;
    int G = P < 8 ? P : 8;
    int direct = t->dtype == DT_BF16 || t->dtype == DT_F32;
    int sbf = t->dtype == DT_BF16; /* rows read through row_f32 are f32 */
    size_t es = dtype_size(t->dtype);
    for (int64_t g = 0; g < rows; g += G) {
        const void *src[8];
        const char *pf[8];
        for (int j = 0; j < 8; j++) {
            int64_t i = g + j;
            if (j >= G || i >= n) src[j] = g_zero;
            else if (direct) src[j] = (const char *)row_ptr(t, r0 + i) + (size_t)k0 * es;
            else src[j] = row_f32_weight(t, r0 + i, k0, kb, tmp + j * kb); /* f16, fp8 (with its scale), GGML blocks */
            pf[j] = direct && i + G < n ? (const char *)row_ptr(t, r0 + i + G) + (size_t)k0 * es : (const char *)g_zero;
        }
        if (!direct) sbf = 0;
        float *d = dst + (g / P) * kb * P + g % P;
        int64_t k = 0;
#ifdef HAVE_X86_KERNELS
        if (avx2) k = pack_group_avx2(src, pf, sbf, G, kb, P, d);
#endif
        for (; k < kb; k++)
            for (int j = 0; j < G; j++) d[k * P + j] = load1(src[j], k, sbf);
    }
}

/* ---- blocking ---- */

typedef struct { int64_t kc, nc, nb, npanel, mch; } blocking;

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

static blocking choose(const ukernel *u, int64_t M, int64_t N, int64_t K, int threads, int ybuf) {
    blocking b;
    size_t bytes = cpu_tile_budget(W_BYTES);
    int64_t kmax = (int64_t)(bytes / 1024);
    if (kmax > KC) kmax = KC;
    b.kc = clamp64(kmax, 1, K);
    /* B block: nc weight rows of kc (stays in L2), a multiple of NR */
    int64_t ncmax = (int64_t)((bytes < B_BYTES * 16 ? bytes / 16 : B_BYTES) / (4 * (size_t)b.kc));
    ncmax = ncmax / u->nr * u->nr;
    b.nc = ncmax < u->nr ? u->nr : ncmax;
    /* thread panels: a multiple of `threads` panels of at most nbmax rows, rounded up to NR */
    int64_t nbmax = clamp64((int64_t)(bytes / (4 * (size_t)b.kc)) / u->nr * u->nr, u->nr, NB_MAX / u->nr * u->nr);
    int64_t per = (N + threads - 1) / threads, q = (per + nbmax - 1) / nbmax, nb = (per + q - 1) / q;
    b.nb = (nb + u->nr - 1) / u->nr * u->nr;
    if (b.nc > b.nb) b.nc = b.nb;
    b.npanel = (N + b.nb - 1) / b.nb;
    /* rows per chunk: the packed A (all rows of the chunk x kc) and, when y
     * is not f32, the f32 accumulator (rows x nb) within their budgets */
    size_t cbytes = cpu_tile_budget(C_BYTES);
    b.mch = clamp64((int64_t)(cbytes / (4 * (size_t)b.kc)), u->mr, M);
    if (ybuf) b.mch = clamp64((int64_t)(cbytes / (4 * (size_t)b.nb)), 1, b.mch);
    return b;
}

void cpu_gemm_packed_blocking(int64_t M, int64_t N, int64_t K, dtype_t ydt, int64_t out[6]) {
    const ukernel *u = kernel();
    blocking b = choose(u, M, N, K, omp_get_max_threads(), ydt != DT_F32);
    int64_t v[6] = {u->mr, u->nr, b.kc, b.nc, b.nb, b.mch};
    memcpy(out, v, sizeof v);
}

/* ---- the driver ---- */

/* kept for the next call; 64-byte aligned, so that micro-panel lines are cache lines */
static _Thread_local cpu_scratch t_a, t_b, t_c, t_tmp;

typedef struct {
    tensor *y;
    const tensor *x, *w;
    const float *bias;
    const ukernel *u;
    blocking b;
} job;

/* One MR x NR tile at rows i.., columns j.. of y (mr x nr of it valid).
 * c: where the f32 partial sums live (y itself or the thread's
 * accumulator), row stride ldc. Full tiles with nothing to round go
 * straight through the kernel; edges and the rounding step go through a
 * tile on the stack. */
static void tile(const job *g, const float *a, const float *b, int64_t kb, int first, int last, int64_t i,
                 int64_t j, int mr, int nr, float *c, int64_t ldc) {
    const ukernel *u = g->u;
    const float *bias = last && g->bias ? g->bias + j : NULL;
    int yf32 = g->y->dtype == DT_F32;
    if (mr == u->mr && nr == u->nr && (yf32 || !last)) {
        u->fn(kb, a, b, c, ldc, !first, bias);
        return;
    }
    float t[8 * 48]; /* the largest tile: the AVX-512F kernel's */
    int ldt = u->nr;
    if (!first)
        for (int r = 0; r < mr; r++) memcpy(t + r * ldt, c + r * ldc, (size_t)nr * sizeof(float));
    u->fn(kb, a, b, t, ldt, !first, NULL);
    for (int r = 0; r < mr; r++) {
        float *tr = t + r * ldt;
        if (bias) for (int q = 0; q < nr; q++) tr[q] += bias[q];
        if (last && !yf32) row_store(g->y, i + r, j, nr, tr);
        else memcpy(c + r * ldc, tr, (size_t)nr * sizeof(float));
    }
}

/* y[:, n0 .. n0+nn) for all rows, by one thread */
static void panel(const job *g, int64_t n0, int64_t nn) {
    const ukernel *u = g->u;
    const blocking *bl = &g->b;
    int64_t M = g->x->rows, K = g->x->cols, MR = u->mr, NR = u->nr;
    int yf32 = g->y->dtype == DT_F32;
    float *bp = cpu_scratch_get(&t_b, sizeof(float) * ((size_t)bl->nc * (size_t)bl->kc));
    float *ap = cpu_scratch_get(&t_a, sizeof(float) * ((size_t)((bl->mch + MR - 1) / MR * MR) * (size_t)bl->kc));
    float *tmp = cpu_scratch_get(&t_tmp, sizeof(float) * (8 * (size_t)bl->kc));
    float *cb = yf32 ? NULL : cpu_scratch_get(&t_c, sizeof(float) * ((size_t)bl->mch * (size_t)bl->nb));
    for (int64_t m0 = 0; m0 < M; m0 += bl->mch) {
        int64_t mb = M - m0 < bl->mch ? M - m0 : bl->mch;
        for (int64_t k0 = 0; k0 < K; k0 += bl->kc) {
            int64_t kb = K - k0 < bl->kc ? K - k0 : bl->kc;
            int first = k0 == 0, last = k0 + kb == K;
            pack(g->x, m0, mb, k0, kb, (int)MR, u->avx2_pack, ap, tmp);
            for (int64_t j0 = 0; j0 < nn; j0 += bl->nc) {
                int64_t jb = nn - j0 < bl->nc ? nn - j0 : bl->nc;
                pack(g->w, n0 + j0, jb, k0, kb, (int)NR, u->avx2_pack, bp, tmp);
                for (int64_t ir = 0; ir < mb; ir += MR) {
                    const float *a = ap + (ir / MR) * kb * MR;
                    int mr = (int)(mb - ir < MR ? mb - ir : MR);
                    int64_t i = m0 + ir;
                    for (int64_t jr = 0; jr < jb; jr += NR) {
                        int nr = (int)(jb - jr < NR ? jb - jr : NR);
                        int64_t j = n0 + j0 + jr;
                        float *c;
                        int64_t ldc;
                        if (yf32) c = (float *)row_ptr(g->y, i) + j, ldc = g->y->ld;
                        else c = cb + ir * bl->nb + (j - n0), ldc = bl->nb;
                        tile(g, a, bp + (jr / NR) * kb * NR, kb, first, last, i, j, mr, nr, c, ldc);
                    }
                }
            }
        }
    }
}

void cpu_gemm_packed(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols;
    job g = {.y = y, .x = x, .w = w, .bias = bias, .u = kernel()};
    g.b = choose(g.u, M, N, K, omp_get_max_threads(), y->dtype != DT_F32);
#pragma omp parallel if (g.b.npanel > 1 || M * K > CPU_PAR_MIN)
    {
#pragma omp for schedule(dynamic)
        for (int64_t p = 0; p < g.b.npanel; p++) {
            int64_t n0 = p * g.b.nb, nn = N - n0 < g.b.nb ? N - n0 : g.b.nb;
            panel(&g, n0, nn);
        }
    }
}
