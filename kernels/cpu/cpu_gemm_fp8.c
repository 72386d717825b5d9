/* bf16 activations x fp8 weights on AVX512-BF16: y = x · (decode(w)·s)ᵀ.
 *
 * Every E4M3/E5M2 value is exactly a bf16 (3 or 2 mantissa bits, exponents
 * inside bf16's range), so the weight panel is packed straight from the
 * fp8 codes (32 rows at a time, widened with F16C, then the bf16 kernel's
 * pair-interleaved packing), with no full-size bf16 or f32 copy; the dot
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

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#endif

/* n codes -> bf16 bits, exactly. An E5M2 code is the top byte of an IEEE
 * half; an E4M3 magnitude code c, read as the half with bits c << 7, is the
 * value times 2^-8 (normal and subnormal alike). F16C widens 8 at a time;
 * the f32 result is a bf16 value, so its top 16 bits are the bf16. The NaN
 * codes are restored afterwards (E4M3 S.1111.111 would read as 480). */
void fp8_decode_bf16(const uint8_t *q, int64_t n, int e5m2, uint16_t *out) {
    int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
    const __m256 k256 = _mm256_set1_ps(256.0f);
    for (; i + 8 <= n; i += 8) {
        __m128i c = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(q + i)));
        __m256 f;
        if (e5m2) {
            f = _mm256_cvtph_ps(_mm_slli_epi16(c, 8));
        } else {
            __m128i mag = _mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x7f)), 7);
            __m128i sign = _mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x80)), 8);
            f = _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(mag, sign)), k256);
        }
        __m256i b = _mm256_srli_epi32(_mm256_castps_si256(f), 16);
        __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        _mm_storeu_si128((__m128i *)(out + i), packed);
    }
    if (!e5m2)
        for (int64_t j = 0; j < i; j++)
            if ((q[j] & 0x7f) == 0x7f) out[j] = f32_to_bf16(fp8_to_f32(DT_F8_E4M3, q[j]));
#endif
    for (; i < n; i++) out[i] = f32_to_bf16(fp8_to_f32(e5m2 ? DT_F8_E5M2 : DT_F8_E4M3, q[i]));
}

/* decode nn rows into rows[32][K] bf16, then the bf16 kernel's packing */
static void pack_fp8(const tensor *w, int64_t n0, int64_t nn, int64_t K, uint16_t *rows, uint32_t *panel) {
    int e5m2 = w->dtype == DT_F8_E5M2;
    for (int64_t c = 0; c < nn; c++) fp8_decode_bf16((const uint8_t *)row_ptr(w, n0 + c), K, e5m2, rows + c * K);
    bf16_pack_panel(rows, K, nn, K / 2, panel);
}

int cpu_gemm_fp8_usable(const tensor *x, const tensor *w) {
    return cpu_bf16_kernels_enabled() && x->dtype == DT_BF16 && dtype_is_fp8(w->dtype) && x->cols % 2 == 0;
}

void cpu_gemm_fp8(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    int64_t M = x->rows, N = w->rows, K = x->cols, kp = K / 2, npanel = (N + NR - 1) / NR;
    const float *sc = w->scale;
    int per_row = sc && w->scale_per_row;
    int threads = omp_get_max_threads();
    /* an item is (panel, block of rows); the panel is decoded and packed
     * once per item, so rows are split only when panels are too few */
    int64_t mchunks = npanel >= 2 * threads ? 1 : (2 * threads + npanel - 1) / npanel;
    int64_t mc = (M + mchunks - 1) / mchunks;
    mchunks = (M + mc - 1) / mc;
#pragma omp parallel if (npanel * mchunks > 1)
    {
        uint32_t *panel = xmalloc((size_t)(kp ? kp : 1) * NR * sizeof(uint32_t));
        uint16_t *rows = xmalloc((size_t)(K ? K : 1) * NR * sizeof(uint16_t));
        float *acc = xmalloc((size_t)MR * NR * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t pi = 0; pi < npanel; pi++)
            for (int64_t mi = 0; mi < mchunks; mi++) {
                int64_t n0 = pi * NR, nn = N - n0 < NR ? N - n0 : NR, m0 = mi * mc, m1 = m0 + mc < M ? m0 + mc : M;
                if (m0 >= m1) continue;
                pack_fp8(w, n0, nn, K, rows, panel);
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
        free(panel), free(rows), free(acc);
    }
}
