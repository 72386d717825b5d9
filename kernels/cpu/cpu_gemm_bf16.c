/* bf16 x bf16 GEMM on AVX512-BF16 (vdpbf16ps): y = x · wᵀ with fp32
 * accumulation, for the bf16 mode where both operands are already bf16.
 *
 * vdpbf16ps multiplies pairs of bf16 values and adds both products to an
 * fp32 lane, 32 products per zmm instruction, twice the work of an fp32 FMA.
 * The weight is repacked per panel of NR = 32 output columns so that one
 * 64-byte load holds, for one pair of k, the two values of 16 columns:
 *   panel[p][c] = (w[n0+c][2p], w[n0+c][2p+1])  as one 32-bit word,
 * and a row of x contributes the matching pair (x[m][2p], x[m][2p+1]) as a
 * 32-bit broadcast, no repacking of x needed. The micro-kernel keeps an
 * MR x 32 block of y in 2·MR zmm accumulators over a block of K (the
 * panel block stays in L2). Threads share out (panel, row range) items.
 *
 * Compiled with a target attribute, so the rest of tpgen keeps its
 * baseline ISA; cpu_has_avx512bf16() checks the CPU (cpuid) and that the OS
 * saves zmm state (xgetbv) before the kernel is ever called. */
#include "cpu_gemm_bf16.h"
#include "cpu_ops.h"
#include "cpu_rows.h"
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 10 || defined(__clang__))
#define HAVE_BF16_KERNEL 1
#include <cpuid.h>
#include <immintrin.h>
#endif

enum { NR = 32, MR = 8 };

#ifdef HAVE_BF16_KERNEL

/* Found once (pthread_once): every thread sees the same, whole answer. */
static int g_bf16, g_vdp;
static pthread_once_t g_bf16_once = PTHREAD_ONCE_INIT, g_vdp_once = PTHREAD_ONCE_INIT;

static int detect_avx512bf16(void) {
    unsigned a, b, c, d;
    const int cached = 0;
    /* TPGEN_NO_AVX512=1: as on a CPU without AVX512-BF16 (the portable
     * paths everywhere, e.g. to measure them on an AVX512 machine) */
    const char *off = getenv("TPGEN_NO_AVX512");
    if (off && *off && strcmp(off, "0")) return cached;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return cached; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6) != 0xe6) return cached; /* XMM, YMM, opmask, ZMM state enabled by the OS */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 16)) || !(b & (1u << 30))) return cached; /* F, BW */
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return cached; /* AVX512_BF16 */
    return 1;
}
static void set_bf16(void) { g_bf16 = detect_avx512bf16(); }
int cpu_has_avx512bf16(void) {
    pthread_once(&g_bf16_once, set_bf16);
    return g_bf16;
}

/* vdpbf16ps against f32 FMA, multiply-adds per cycle, measured with 12
 * independent chains of each (docs/cpu-backend.md): AMD Zen 4 (512-bit ops
 * on two 256-bit pipes) 64 vs 32, so the kernels of this file are twice the
 * FMA path's peak; Intel Emerald Rapids (Golden Cove / Raptor Cove cores,
 * as Sapphire Rapids) one vdpbf16ps per two cycles, 16 vs 32 per port
 * pair: there the f32 FMA paths are the faster (bench gemm: 141 vs 74
 * GFLOP/s per thread). The choice is by vendor, not by a timing, so that a
 * machine always computes the same bits; TPGEN_BF16_DOT=1 or 0 overrides. */
static int detect_vdpbf16(void) {
    const char *env = getenv("TPGEN_BF16_DOT");
    if (env && (!strcmp(env, "0") || !strcmp(env, "1"))) return env[0] == '1';
    unsigned a, b, c, d;
    char vendor[13] = {0};
    if (__get_cpuid(0, &a, &b, &c, &d)) memcpy(vendor, &b, 4), memcpy(vendor + 4, &d, 4), memcpy(vendor + 8, &c, 4);
    return !strcmp(vendor, "AuthenticAMD");
}
static void set_vdp(void) { g_vdp = detect_vdpbf16(); }
int cpu_vdpbf16_preferred(void) {
    pthread_once(&g_vdp_once, set_vdp);
    return g_vdp;
}

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* pack nn (<= 32) rows of a bf16 matrix (row r at base + r*ld, K = 2*kp
 * columns) into panel[kp][32] words; columns past nn are 0. Each output
 * line of 16 words is one masked gather of the same pair from 16 rows
 * (a scalar transpose cost as much as the arithmetic for M below ~256). */
static TARGET void pack_gather(const uint16_t *base, int64_t ld, int64_t nn, int64_t kp, uint32_t *panel) {
    __m512i off[2];
    __mmask16 valid[2];
    for (int h = 0; h < 2; h++) {
        int32_t o[16];
        for (int i = 0; i < 16; i++) o[i] = (int32_t)((h * 16 + i) * ld * 2); /* byte offsets of the rows */
        off[h] = _mm512_loadu_si512(o);
        int64_t left = nn - h * 16;
        valid[h] = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
    }
    const char *b = (const char *)base;
    for (int64_t p = 0; p < kp; p++, b += 4) {
        __m512i lo = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid[0], off[0], b, 1);
        __m512i hi = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid[1], off[1], b, 1);
        _mm512_storeu_si512(panel + p * NR, lo);
        _mm512_storeu_si512(panel + p * NR + 16, hi);
    }
}

void bf16_pack_panel(const uint16_t *base, int64_t ld, int64_t nn, int64_t kp, uint32_t *panel) {
    if ((int64_t)NR * ld * 2 < INT32_MAX) { pack_gather(base, ld, nn, kp, panel); return; }
    for (int64_t c = 0; c < NR; c++) { /* rows too far apart for 32-bit gather offsets */
        if (c >= nn) { for (int64_t p = 0; p < kp; p++) panel[p * NR + c] = 0; continue; }
        const uint16_t *src = base + c * ld;
        for (int64_t p = 0; p < kp; p++) memcpy(panel + p * NR + c, src + 2 * p, 4);
    }
}

/* out[i][0..32) = sum_p x_i[2p..2p+1] · panel[p] for the mr rows x_0.. (stride ldx elements);
 * the 32 words of pair p are at panel + p*ldp */
static inline __attribute__((always_inline)) TARGET void micro(const uint16_t *x, int64_t ldx, const uint32_t *panel,
                                                                 int64_t ldp, int64_t kp, int mr, int accumulate,
                                                                 float *out) {
    __m512 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        acc[i][0] = accumulate ? _mm512_loadu_ps(out + i * NR) : _mm512_setzero_ps();
        acc[i][1] = accumulate ? _mm512_loadu_ps(out + i * NR + 16) : _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < kp; p++) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + p * ldp);
        __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + p * ldp + 16);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            int pair;
            memcpy(&pair, x + i * ldx + 2 * p, 4);
            __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], w0, xb);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], w1, xb);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        _mm512_storeu_ps(out + i * NR, acc[i][0]);
        _mm512_storeu_ps(out + i * NR + 16, acc[i][1]);
    }
}

/* one constant mr per call site, so each copy is fully unrolled */
static TARGET void micro_any(const uint16_t *x, int64_t ldx, const uint32_t *panel, int64_t ldp, int64_t kp, int mr,
                             int accumulate, float *out) {
    switch (mr) {
    case 8: micro(x, ldx, panel, ldp, kp, 8, accumulate, out); break;
    case 7: micro(x, ldx, panel, ldp, kp, 7, accumulate, out); break;
    case 6: micro(x, ldx, panel, ldp, kp, 6, accumulate, out); break;
    case 5: micro(x, ldx, panel, ldp, kp, 5, accumulate, out); break;
    case 4: micro(x, ldx, panel, ldp, kp, 4, accumulate, out); break;
    case 3: micro(x, ldx, panel, ldp, kp, 3, accumulate, out); break;
    case 2: micro(x, ldx, panel, ldp, kp, 2, accumulate, out); break;
    default: micro(x, ldx, panel, ldp, kp, 1, accumulate, out); break;
    }
}

void bf16_panel_gemm(const uint16_t *x, int64_t ldx, int64_t m, const uint32_t *panel, int64_t ldp, int64_t kp,
                     float *c, int64_t ldc, int64_t ncols) {
    float out[MR * NR];
    for (int64_t i0 = 0; i0 < m; i0 += MR) {
        int mr = m - i0 < MR ? (int)(m - i0) : MR;
        micro_any(x + i0 * ldx, ldx, panel, ldp, kp, mr, 0, out);
        for (int i = 0; i < mr; i++) memcpy(c + (i0 + i) * ldc, out + i * NR, (size_t)ncols * sizeof(float));
    }
}

/* K is cut into blocks of KPB pairs so that a packed panel (KPB·128 bytes)
 * and the MR rows of x it meets stay in L2 (1-2 MB): at K = 12288 a whole
 * panel alone is 786 KB. Partial sums of the item's rows wait in acc. */
enum { KPB = 2048 };

static void gemm_item(tensor *y, const tensor *x, const tensor *w, const float *bias, int64_t n0, int64_t m0,
                      int64_t m1, uint32_t *panel, float *acc) {
    int64_t N = w->rows, kp = x->cols / 2, nn = N - n0 < NR ? N - n0 : NR;
    const uint16_t *wrow = row_ptr(w, n0);
    for (int64_t k0 = 0; k0 < kp; k0 += KPB) {
        int64_t kn = kp - k0 < KPB ? kp - k0 : KPB;
        bf16_pack_panel(wrow + 2 * k0, w->ld, nn, kn, panel);
        for (int64_t m = m0; m < m1; m += MR) {
            int mr = m1 - m < MR ? (int)(m1 - m) : MR;
            micro_any((const uint16_t *)row_ptr(x, m) + 2 * k0, x->ld, panel, NR, kn, mr, k0 > 0, acc + (m - m0) * NR);
        }
    }
    for (int64_t m = m0; m < m1; m++) {
        float *o = acc + (m - m0) * NR;
        if (bias) for (int64_t j = 0; j < nn; j++) o[j] += bias[n0 + j];
        row_store(y, m, n0, nn, o);
    }
}

int cpu_gemm_bf16_usable(int64_t M, int64_t N, int64_t K) {
    /* k is consumed in pairs */
    return cpu_has_avx512bf16() && K % 2 == 0 && M >= 1;
}

void cpu_gemm_bf16(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols, npanel = (N + NR - 1) / NR;
    int threads = omp_get_max_threads();
    /* split rows too when there are fewer than two panels per thread */
    int64_t mchunks = npanel >= 2 * threads ? 1 : (2 * threads + npanel - 1) / npanel;
    int64_t mc = (M + mchunks - 1) / mchunks;
    mc = (mc + MR - 1) / MR * MR;
    mchunks = (M + mc - 1) / mc;
#pragma omp parallel if (npanel * mchunks > 1)
    {
        int64_t kpb = K / 2 < KPB ? K / 2 : KPB;
        uint32_t *panel = xmalloc((size_t)kpb * NR * sizeof(uint32_t));
        float *acc = xmalloc((size_t)mc * NR * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t pi = 0; pi < npanel; pi++)
            for (int64_t mi = 0; mi < mchunks; mi++) {
                int64_t m0 = mi * mc, m1 = m0 + mc < M ? m0 + mc : M;
                if (m0 < m1) gemm_item(y, x, w, bias, pi * NR, m0, m1, panel, acc);
            }
        free(panel);
        free(acc);
    }
}

#else /* no compiler support: the portable path is used */

int cpu_has_avx512bf16(void) { return 0; }
int cpu_vdpbf16_preferred(void) { return 0; }
void bf16_pack_panel(const uint16_t *base, int64_t ld, int64_t nn, int64_t kp, uint32_t *panel) {
    tp_fatal("bf16_pack_panel: this build has no AVX512-BF16 kernel");
}
void bf16_panel_gemm(const uint16_t *x, int64_t ldx, int64_t m, const uint32_t *panel, int64_t ldp, int64_t kp,
                     float *c, int64_t ldc, int64_t ncols) {
    tp_fatal("bf16_panel_gemm: this build has no AVX512-BF16 kernel");
}
int cpu_gemm_bf16_usable(int64_t M, int64_t N, int64_t K) { return 0; }
void cpu_gemm_bf16(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    tp_fatal("cpu_gemm_bf16: this build has no AVX512-BF16 kernel");
}

#endif
