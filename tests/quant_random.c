/* Random test data for the quantised GEMMs (quant_random.h). */
#include "quant_random.h"
#include "kernels/tensor.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

uint32_t rng_next(uint32_t *s) {
    *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
    return *s;
}

/* Random bytes with valid f16 scales (magnitude 0.002-0.05) at each type's
 * scale fields: random bytes there could be Inf/NaN. */
void random_blocks(int type, uint8_t *b, int64_t nblocks, uint32_t *s) {
    static const struct { int type, off[2]; } k_scales[] = {
        {QUANT_Q4_0, {0, -1}}, {QUANT_Q4_1, {0, 2}}, {QUANT_Q5_0, {0, -1}}, {QUANT_Q5_1, {0, 2}},
        {QUANT_Q8_0, {0, -1}}, {QUANT_IQ4_NL, {0, -1}}, {QUANT_Q2_K, {80, 82}}, {QUANT_Q3_K, {108, -1}},
        {QUANT_Q4_K, {0, 2}}, {QUANT_Q5_K, {0, 2}}, {QUANT_Q6_K, {208, -1}}, {QUANT_IQ4_XS, {0, -1}},
    };
    const quant_type *qt = quant_type_get(type);
    for (int64_t i = 0; i < nblocks * qt->bytes; i++) b[i] = (uint8_t)rng_next(s);
    for (size_t k = 0; k < sizeof k_scales / sizeof k_scales[0]; k++) {
        if (k_scales[k].type != type) continue;
        for (int64_t j = 0; j < nblocks; j++)
            for (int f = 0; f < 2 && k_scales[k].off[f] >= 0; f++) {
                float v = (0.002f + 0.048f * (float)(rng_next(s) % 1000) / 1000.0f) * (rng_next(s) & 1 ? -1 : 1);
                uint16_t h = f32_to_f16(v);
                memcpy(b + j * qt->bytes + k_scales[k].off[f], &h, 2);
            }
    }
}

tensor *segmented_weight(struct backend *be, int type, int64_t N, int64_t Kg, const span *sp, int nsp, uint32_t *s,
                         int64_t *Kout, double **wd_out) {
    const quant_type *qt = quant_type_get(type);
    int64_t rb = quant_row_bytes(qt, Kg), K = 0, pitch = 0;
    uint8_t *g = xmalloc((size_t)(N * rb));
    random_blocks(type, g, N * rb / qt->bytes, s);
    tensor_qseg seg[TENSOR_MAX_QSEGS];
    int64_t off[TENSOR_MAX_QSEGS], len[TENSOR_MAX_QSEGS];
    for (int i = 0; i < nsp; i++) {
        int64_t skip;
        quant_col_span(qt, sp[i].c0, sp[i].c1, &off[i], &len[i], &skip);
        seg[i] = (tensor_qseg){K, sp[i].c1 - sp[i].c0, pitch, skip};
        K += sp[i].c1 - sp[i].c0, pitch += len[i];
    }
    tensor *w = tensor_new_ggml(be, type, N, K, pitch, seg, nsp);
    if (!w) return free(g), NULL;
    for (int64_t r = 0; r < N; r++)
        for (int i = 0; i < nsp; i++)
            memcpy((uint8_t *)w->data + r * pitch + seg[i].off, g + r * rb + off[i], (size_t)len[i]);
    /* reference weights: whole rows decoded, the segments' columns picked */
    float *row = xmalloc((size_t)Kg * sizeof(float));
    double *wd = xmalloc((size_t)(N * K) * sizeof(double));
    for (int64_t r = 0; r < N; r++) {
        quant_dequant_row(type, g + r * rb, row, Kg);
        for (int i = 0, k = 0; i < nsp; i++)
            for (int64_t c = sp[i].c0; c < sp[i].c1; c++) wd[r * K + k++] = row[c];
    }
    free(row), free(g);
    *Kout = K, *wd_out = wd;
    return w;
}
