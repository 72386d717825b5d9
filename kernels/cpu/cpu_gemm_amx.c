/* bf16 GEMM on AMX (Sapphire Rapids and later): y[M,N] = x[M,K] · w[N,K]ᵀ
 * for bf16 x and bf16 (or fp8) w, bf16 products and fp32 sums.
 *
 * Why: on Sapphire Rapids vdpbf16ps issues once per cycle while two f32
 * FMAs do, so the AVX512-BF16 kernel (cpu_gemm_bf16.c) runs below sgemm.
 * TDPBF16PS multiplies a 16x32 bf16 tile A by a 32x16 bf16 tile B into a
 * 16x16 fp32 tile C: 16384 flops per instruction.
 *
 * Operands (tile shapes: cpu_amx.h, all 16 rows of 64 bytes):
 * - A = x, packed once per call (per chunk of rows when x is large) into
 *   1 KB tiles xp[m/16][k/32] of 16 rows x 32 k, rows past M and k past K
 *   zero. Packing avoids the cache-set conflicts of loading 16 rows that
 *   are K·2 bytes apart (6 KB at K = 3072) straight from x, and makes the
 *   M and K edges plain zeros.
 * - B = w in the "VNNI" pair layout: row q of a tile holds, for 16 output
 *   columns, the 32-bit word (w[n][2q], w[n][2q+1]). That is exactly the
 *   32-column panel of the AVX512-BF16 kernel (bf16_pack_panel, masked
 *   gathers): panel[p][32] words, so the two B tiles of a 32-column panel
 *   are at +0 and +16 words with a stride of 128 bytes. The weights are
 *   constant but stored row-major, so each call packs them, each weight
 *   element once, block by block into a per-thread buffer kept between
 *   calls; fp8 weights are decoded exactly to bf16 first (fp8_decode_bf16)
 *   and their scale is applied to the fp32 sums, as cpu_gemm_fp8.c does.
 * - C: 2x2 tiles = a 32x32 block of y, contiguous (rows 128 bytes apart)
 *   in a per-thread f32 buffer, so that partial sums carry over k blocks.
 *
 * Blocking. An item is (NC = 256 output columns, a range of rows). Per k
 * block of KC = 1024 the item packs its 256 x 1024 weight block (512 KB,
 * stays in L2), then, for each 32-row block of x (64 KB of A tiles, L1/L2),
 * sweeps the 8 column panels. Per k step of a 32x32 block: 4 tile loads
 * (4 KB) for 4 TDPBF16PS. x is re-read from L3/memory once per item and k
 * block, i.e. N/256 times per call (about 250 flops per byte).
 *
 * Threads: one parallel region per call. The threads pack x together,
 * then share the items (dynamic schedule); rows are split into several
 * items only when there are fewer than two column items per thread. Each
 * thread configures its tiles at the start of the region and releases them
 * at the end. */
#include "cpu_gemm_amx.h"
#include "cpu_amx.h"
#include "cpu_gemm_bf16.h"
#include "cpu_gemm_fp8.h"
#include "cpu_ops.h"
#include "cpu_rows.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__)) && defined(__linux__)
#define HAVE_AMX_GEMM 1
#include <immintrin.h>
#endif

/* MIN_M: below 16 rows most of every A tile would be zero padding; the
 * AVX512-BF16 kernel or the portable path takes those (GEMVs, modulation) */
enum { NC = 256, KC = 1024, MIN_M = 16 };
#define X_BYTES ((size_t)32 << 20) /* packed x per chunk of rows */

static int g_off;
static long g_calls;
void cpu_gemm_amx_force_off(int on) { g_off = on; }
long cpu_gemm_amx_calls(void) { return __atomic_load_n(&g_calls, __ATOMIC_RELAXED); }

int cpu_gemm_amx_usable(const tensor *x, const tensor *w) {
#ifdef HAVE_AMX_GEMM
    return !g_off && x->dtype == DT_BF16 && (w->dtype == DT_BF16 || dtype_is_fp8(w->dtype)) && x->rows >= MIN_M &&
           cpu_amx_enabled();
#else
    return 0;
#endif
}

#ifdef HAVE_AMX_GEMM

static _Thread_local cpu_scratch t_xp, t_wp, t_acc, t_rows;

/* packed row i of a chunk: x row m (or zeros when m < 0) into the tiles
 * xp[i/16][s] (nks tiles of 32 k per 16 rows), as row i%16 of each */
static void pack_x_row(const tensor *x, int64_t m, int64_t i, int64_t nks, uint16_t *xp) {
    uint16_t *dst = xp + (i / 16) * nks * 512 + (i % 16) * 32;
    int64_t K = x->cols;
    const uint16_t *src = m >= 0 ? row_ptr(x, m) : NULL;
    for (int64_t s = 0; s < nks; s++) {
        int64_t n = src ? (K - s * 32 < 32 ? K - s * 32 : 32) : 0;
        if (n) memcpy(dst + s * 512, src + s * 32, (size_t)n * 2);
        if (n < 32) memset(dst + s * 512 + n, 0, (size_t)(32 - n) * 2);
    }
}

/* weight rows [n, n+nn) (nn <= 32), k [k0, k0+kn) (kn a multiple of 32) as
 * kn/2 pair rows of 32 words; k past K and columns past nn are zero. rows:
 * 32 x KC bf16 scratch for decoded fp8. */
static void pack_w(const tensor *w, int64_t n, int64_t nn, int64_t k0, int64_t kn, uint16_t *rows, uint32_t *dst) {
    int64_t K = w->cols, ka = K - k0 < kn ? K - k0 : kn, kp = ka / 2, ld = w->ld;
    const uint16_t *base;
    if (dtype_is_fp8(w->dtype)) {
        for (int64_t c = 0; c < nn; c++)
            fp8_decode_bf16((const uint8_t *)row_ptr(w, n + c) + k0, ka, w->dtype == DT_F8_E5M2, rows + c * kn);
        base = rows, ld = kn;
    } else {
        base = (const uint16_t *)row_ptr(w, n) + k0;
    }
    bf16_pack_panel(base, ld, nn, kp, dst);
    if (ka & 1) { /* odd K: the last pair is (w[K-1], 0) */
        for (int64_t c = 0; c < 32; c++) dst[kp * 32 + c] = c < nn ? base[c * ld + ka - 1] : 0;
        kp++;
    }
    memset(dst + kp * 32, 0, (size_t)(kn / 2 - kp) * 32 * 4);
}

typedef struct {
    tensor *y;
    const tensor *x, *w;
    const float *bias, *scale; /* scale: fp8 weights only */
    int scale_per_row;
    int64_t nks, Kp;
} job;

/* the finished block c: vr rows from y row m, vc columns from n */
static void epilogue(const job *j, float *c, int64_t m, int64_t vr, int64_t n, int64_t vc) {
    for (int64_t r = 0; r < vr; r++) {
        float *o = c + r * 32;
        if (j->scale) /* the same expression as cpu_gemm_fp8.c */
            for (int64_t q = 0; q < vc; q++)
                o[q] = o[q] * j->scale[j->scale_per_row ? n + q : 0] + (j->bias ? j->bias[n + q] : 0.0f);
        else if (j->bias)
            for (int64_t q = 0; q < vc; q++) o[q] += j->bias[n + q];
        row_store(j->y, m + r, n, vc, o);
    }
}

/* columns [n0, n0+nn) for packed rows [r0, r1) of the chunk that starts at
 * y row m0 and has mn valid rows */
static void item(const job *j, const uint16_t *xp, int64_t m0, int64_t mn, int64_t r0, int64_t r1, int64_t n0,
                 int64_t nn, uint32_t *wp, uint16_t *rows, float *acc) {
    int64_t npn = (nn + 31) / 32;
    for (int64_t k0 = 0; k0 < j->Kp; k0 += KC) {
        int64_t kn = j->Kp - k0 < KC ? j->Kp - k0 : KC, ks0 = k0 / 32;
        int first = k0 == 0, last = k0 + kn >= j->Kp;
        for (int64_t p = 0; p < npn; p++)
            pack_w(j->w, n0 + 32 * p, nn - 32 * p < 32 ? nn - 32 * p : 32, k0, kn, rows, wp + p * (kn / 2) * 32);
        for (int64_t r = r0; r < r1; r += 32) {
            const uint16_t *a0 = xp + ((r / 16) * j->nks + ks0) * 512, *a1 = a0 + j->nks * 512;
            for (int64_t p = 0; p < npn; p++) {
                float *c = acc + (((r - r0) / 32) * npn + p) * 1024;
                cpu_amx_block(a0, a1, wp + p * (kn / 2) * 32, 512, 32, kn / 32, c, 32, !first);
                if (last)
                    epilogue(j, c, m0 + r, mn - r < 32 ? mn - r : 32, n0 + 32 * p, nn - 32 * p < 32 ? nn - 32 * p : 32);
            }
        }
    }
}

void cpu_gemm_amx(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols, Kp = (K + 31) / 32 * 32;
    __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
    job j = {.y = y, .x = x, .w = w, .bias = bias, .nks = Kp / 32, .Kp = Kp};
    if (dtype_is_fp8(w->dtype)) j.scale = w->scale, j.scale_per_row = w->scale && w->scale_per_row;
    int threads = omp_get_max_threads();
    /* rows per chunk of packed x: the budget (tests shrink it), in 32s */
    int64_t mc = (int64_t)(cpu_tile_budget(X_BYTES) / ((size_t)Kp * 2)) / 32 * 32, mall = (M + 31) / 32 * 32;
    mc = mc < 32 ? 32 : mc > mall ? mall : mc;
    int64_t nsub = (N + NC - 1) / NC;
    uint16_t *xp = cpu_scratch_get(&t_xp, (size_t)mc * (size_t)Kp * 2);
#pragma omp parallel
    {
        cpu_amx_tiles_begin();
        uint32_t *wp = cpu_scratch_get(&t_wp, (size_t)NC * KC * 2);
        uint16_t *rows = dtype_is_fp8(w->dtype) ? cpu_scratch_get(&t_rows, (size_t)32 * KC * 2) : NULL;
        for (int64_t m0 = 0; m0 < M; m0 += mc) {
            int64_t mn = M - m0 < mc ? M - m0 : mc, mp = (mn + 31) / 32 * 32, nmb = mp / 32;
#pragma omp for
            for (int64_t i = 0; i < mp; i++) pack_x_row(x, i < mn ? m0 + i : -1, i, j.nks, xp);
            /* rows split only when the column items are too few for the threads */
            int64_t parts = nsub >= 2 * threads ? 1 : (2 * threads + nsub - 1) / nsub;
            parts = parts > nmb ? nmb : parts;
            int64_t per = (nmb + parts - 1) / parts;
            parts = (nmb + per - 1) / per;
            float *acc = cpu_scratch_get(&t_acc, (size_t)per * 32 * NC * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic)
            for (int64_t s = 0; s < nsub; s++)
                for (int64_t q = 0; q < parts; q++) {
                    int64_t n0 = s * NC, nn = N - n0 < NC ? N - n0 : NC, r0 = q * per * 32;
                    int64_t r1 = r0 + per * 32 < mp ? r0 + per * 32 : mp;
                    item(&j, xp, m0, mn, r0, r1, n0, nn, wp, rows, acc);
                }
        }
        cpu_amx_tiles_end();
    }
}

#else /* no AMX in this build: cpu_gemm_amx_usable() is 0 */

void cpu_gemm_amx(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    tp_fatal("cpu_gemm_amx: this build has no AMX kernel");
}

#endif
