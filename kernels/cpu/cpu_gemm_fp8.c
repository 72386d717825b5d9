/* bf16 activations x fp8 weights on AVX512-BF16: y = x · (decode(w)·s)ᵀ.
 *
 * Every E4M3/E5M2 value is exactly a bf16 (3 or 2 mantissa bits, exponents
 * inside bf16's range), so the weight panel is packed straight from the
 * fp8 codes into the pair-interleaved bf16 layout of cpu_gemm_bf16.c
 * through a 256-entry table, with no full-size bf16 or f32 copy; the dot
 * products run on vdpbf16ps and the scale (per tensor, or per output
 * channel = per column of y) is applied to the fp32 sums in the epilogue:
 * y = s · Σ x·decode(w), which differs from Σ x·(decode(w)·s) only by the
 * f32 rounding of the sums. Without AVX512-BF16, or for f32 activations,
 * cpu_gemm.c's tiled path widens fp8 panels to f32 (row_f32) instead. */
#include "cpu_gemm_fp8.h"
#include "cpu_gemm_bf16.h"
#include "cpu_ops.h"
#include "cpu_rows.h"
#include <omp.h>
#include <stdlib.h>

enum { NR = BF16_PANEL_ROWS, MR = 64 };

/* the bf16 bits of each code's value */
static uint16_t g_bits[2][256];
__attribute__((constructor)) static void fp8_bf16_tables(void) {
    for (int c = 0; c < 256; c++) {
        g_bits[0][c] = f32_to_bf16(fp8_to_f32(DT_F8_E4M3, (uint8_t)c));
        g_bits[1][c] = f32_to_bf16(fp8_to_f32(DT_F8_E5M2, (uint8_t)c));
    }
}

/* panel[p][c] = (bf16 w[c][2p], bf16 w[c][2p+1]) for c < nn, 0 beyond */
static void pack_fp8(const uint8_t *base, int64_t ld, int64_t nn, int64_t kp, const uint16_t *bits, uint32_t *panel) {
    for (int64_t c = 0; c < NR; c++) {
        if (c >= nn) { for (int64_t p = 0; p < kp; p++) panel[p * NR + c] = 0; continue; }
        const uint8_t *r = base + c * ld;
        for (int64_t p = 0; p < kp; p++) panel[p * NR + c] = bits[r[2 * p]] | (uint32_t)bits[r[2 * p + 1]] << 16;
    }
}

int cpu_gemm_fp8_usable(const tensor *x, const tensor *w) {
    return cpu_bf16_kernels_enabled() && x->dtype == DT_BF16 && dtype_is_fp8(w->dtype) && x->cols % 2 == 0;
}

void cpu_gemm_fp8(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols, kp = K / 2, npanel = (N + NR - 1) / NR;
    const uint16_t *bits = g_bits[w->dtype == DT_F8_E5M2];
    const float *sc = w->scale;
    int per_row = sc && w->scale_per_row;
    int threads = omp_get_max_threads();
    /* items are (panel, block of rows): each packs its panel once for up to
     * MR rows of x; more row blocks only when panels are too few */
    int64_t mchunks = npanel >= 2 * threads ? (M + 255) / 256 : (2 * threads + npanel - 1) / npanel;
    if (mchunks < 1) mchunks = 1;
    int64_t mc = (M + mchunks - 1) / mchunks;
    mchunks = (M + mc - 1) / mc;
#pragma omp parallel if (npanel * mchunks > 1)
    {
        uint32_t *panel = xmalloc((size_t)(kp ? kp : 1) * NR * sizeof(uint32_t));
        float *acc = xmalloc((size_t)MR * NR * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t pi = 0; pi < npanel; pi++)
            for (int64_t mi = 0; mi < mchunks; mi++) {
                int64_t n0 = pi * NR, nn = N - n0 < NR ? N - n0 : NR, m0 = mi * mc, m1 = m0 + mc < M ? m0 + mc : M;
                if (m0 >= m1) continue;
                pack_fp8(row_ptr(w, n0), w->ld, nn, kp, bits, panel);
                for (int64_t m = m0; m < m1; m += MR) {
                    int64_t mr = m1 - m < MR ? m1 - m : MR;
                    bf16_panel_gemm(row_ptr(x, m), x->ld, mr, panel, NR, kp, acc, NR, nn);
                    for (int64_t i = 0; i < mr; i++) {
                        float *o = acc + i * NR;
                        for (int64_t j = 0; j < nn; j++) {
                            float s = sc ? sc[per_row ? n0 + j : 0] : 1.0f;
                            o[j] = o[j] * s + (bias ? bias[n0 + j] : 0.0f);
                        }
                        row_store(y, m + i, n0, nn, o);
                    }
                }
            }
        free(panel);
        free(acc);
    }
}
