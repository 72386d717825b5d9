/* The bf16 convolution's matrix product on AMX (Sapphire Rapids and later):
 * y[co, p] = sum_k W[co][k] · col[k][p] with fp32 sums, for the bf16 mode
 * where the weights and the im2col columns are bf16.
 *
 * TDPBF16PS multiplies a 16x32 bf16 tile A by a 32x16 tile B held as 16
 * rows of 16 (k, k+1) pairs (the "VNNI" layout) into a 16x16 fp32 tile:
 * 16384 flops per instruction, several times vdpbf16ps. The operands:
 * - A: the weights, packed once per call into 1 KB tiles [co/16][k/32]
 *   (16 rows of 32 k), Cout padded to 32 and K to 32 with zeros;
 * - B: the pair-interleaved im2col band of cpu_conv.c, read in place: pair
 *   row q holds (col[2q][p], col[2q+1][p]) as 32-bit words, rows ldp words
 *   apart (ldp/16 odd, so the 16 rows of a tile fall in distinct cache
 *   sets), pixel columns padded to 32 and pair rows to kp (= K/2 padded)
 *   with zeros;
 * - C: 2x2 accumulator tiles, 32 output channels x 32 pixels.
 * A thread's item (cpu_conv.c) is a few output rows: its B columns stay in
 * L2 while the weight tiles of every channel block stream past them.
 *
 * Detection, the OS's permission for the tile registers and the per-thread
 * tile configuration are kernels/cpu/cpu_amx.c's, shared with the GEMM.
 * Compiled with a target attribute so the rest of tpgen keeps its baseline
 * ISA. */
#include "cpu_conv_amx.h"
#include "cpu_amx.h"
#include "cpu_ops.h"
#include "cpu_rows.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__)) && defined(__linux__)
#define HAVE_AMX_KERNEL 1
#include <immintrin.h>
#endif

static int g_amx_off;
void cpu_conv_amx_force_off(int on) { g_amx_off = on; }

#ifdef HAVE_AMX_KERNEL

int cpu_conv_amx_enabled(void) { return !g_amx_off && cpu_amx_enabled(); }

#define TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))

/* tiles 0-3: C (32 channels x 32 pixels as 2x2), 4-5: A, 6-7: B, in the
 * one configuration of cpu_amx.h */


/* rows [co0, co0+nc) x pixels [c0, c0+nn) of y = out (32 x 32) + bias, rounded
 * to y's dtype; f32 and bf16 (round to nearest even, NaN kept quiet, as
 * f32_to_bf16) 16 at a time */
static TARGET void store_block(tensor *y, const float *out, int64_t ldo, const float *bias, int64_t co0, int64_t nc,
                               int64_t c0, int64_t nn) {
    if (y->dtype != DT_F32 && y->dtype != DT_BF16) {
        float tmp[32];
        for (int64_t r = 0; r < nc; r++) {
            for (int64_t j = 0; j < nn; j++) tmp[j] = out[r * ldo + j] + (bias ? bias[co0 + r] : 0.0f);
            row_store(y, co0 + r, c0, nn, tmp);
        }
        return;
    }
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i one = _mm512_set1_epi32(1), rbias = _mm512_set1_epi32(0x7fff), qnan = _mm512_set1_epi32(0x400000);
    for (int64_t r = 0; r < nc; r++) {
        __m512 b = _mm512_set1_ps(bias ? bias[co0 + r] : 0.0f);
        char *row = (char *)row_ptr(y, co0 + r);
        for (int64_t j = 0; j < nn; j += 16) {
            int64_t left = nn - j;
            __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            __m512 v = _mm512_add_ps(_mm512_loadu_ps(out + r * ldo + j), b);
            if (y->dtype == DT_F32) { _mm512_mask_storeu_ps((float *)row + c0 + j, m, v); continue; }
            __m512i u = _mm512_castps_si512(v);
            __mmask16 isnan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absmask), inf);
            __m512i rn = _mm512_add_epi32(u, _mm512_add_epi32(rbias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
            rn = _mm512_mask_or_epi32(rn, isnan, u, qnan);
            __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(rn, 16));
            _mm256_mask_storeu_epi16((uint16_t *)row + c0 + j, m, h);
        }
    }
}

uint16_t *amx_pack_weights(const tensor *w, int64_t *kp_out) {
    int64_t Cout = w->rows, K = w->cols, Kp = (K + 31) / 32 * 32, Cp = (Cout + 31) / 32 * 32, nks = Kp / 32;
    uint16_t *p = xcalloc((size_t)(Cp * Kp), sizeof(uint16_t));
#pragma omp parallel for if (Cout * K > (1 << 18))
    for (int64_t co = 0; co < Cout; co++) {
        const uint16_t *src = row_ptr(w, co);
        uint16_t *dst = p + (co / 16) * nks * 512 + (co % 16) * 32; /* row co%16 of tile (co/16, ks) */
        for (int64_t ks = 0; ks < nks; ks++) {
            int64_t n = K - ks * 32 < 32 ? K - ks * 32 : 32;
            memcpy(dst + ks * 512, src + ks * 32, (size_t)n * sizeof(uint16_t));
        }
    }
    *kp_out = Kp / 2;
    return p;
}

/* The weight tiles of 32 channels (64 KB for a chunk of 1024 k) meet the
 * item's pixel blocks one after the other from L1/L2; the chunk's pixel
 * columns (at most CHUNK bytes) stay in L2. */
void amx_conv_block(tensor *y, const uint16_t *wp, int64_t kp, int64_t ks0, int64_t nk, const float *bias,
                    const uint32_t *colp, int64_t ldp, int64_t np, int64_t b0, float *acc, int first, int last) {
    int64_t Cout = y->rows, nblk = (np + 31) / 32, nks = kp / 16, ncb = (Cout + 31) / 32;
    float out[32 * 32];
    for (int64_t cb = 0; cb < ncb; cb++)
        for (int64_t blk = 0; blk < nblk; blk++) {
            int64_t p0 = blk * 32, nn = np - p0 < 32 ? np - p0 : 32;
            int64_t co0 = cb * 32, nc = Cout - co0 < 32 ? Cout - co0 : 32;
            int whole = first && last; /* one chunk: no partial sums to keep */
            float *a = whole ? out : acc + co0 * ldp + p0;
            int64_t lda = whole ? 32 : ldp;
            const uint16_t *wa = wp + (2 * cb * nks + ks0) * 512;   /* channels 0-15; 16-31 nks tiles further */
            cpu_amx_block(wa, wa + nks * 512, colp + p0, 16 * ldp, ldp, nk, a, lda, !first);
            if (last) store_block(y, a, lda, bias, co0, nc, b0 + p0, nn);
        }
}

#else /* no AMX in this build */

int cpu_conv_amx_enabled(void) { return 0; }
uint16_t *amx_pack_weights(const tensor *w, int64_t *kp_out) {
    tp_fatal("amx_pack_weights: this build has no AMX kernel");
}
void amx_conv_block(tensor *y, const uint16_t *wp, int64_t kp, int64_t ks0, int64_t nk, const float *bias,
                    const uint32_t *colp, int64_t ldp, int64_t np, int64_t b0, float *acc, int first, int last) {
    tp_fatal("amx_conv_block: this build has no AMX kernel");
}

#endif
