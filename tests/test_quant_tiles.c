/* The CUDA backend's GGUF tile kernel, run on the host: qb_tile_body
 * (kernels/quant_blocks.h, the body the __global__ kernel of
 * kernels/cuda/cuda_ggml.cu calls) over its whole grid, for every block type,
 * whole rows and row-parallel segments whose edges fall inside blocks and
 * inside 16/32-element units (half a K-quant block, 1.5 blocks, one element),
 * row tiles (r0 > 0) and an output pitch wider than the row, f32 and bf16
 * outputs; against the CPU's decoding (quant_dequant_span per segment, as
 * cpu_rows.h row_f32_weight reads a DT_GGML row, and the whole rows decoded
 * by quant_dequant_row, picked: tests/quant_random.c) bit for bit, every
 * output element written (poisoned first). Also: the shared f16 decoder
 * equals f16_to_f32 on all 65536 codes and the bf16 rounding equals
 * f32_to_bf16 on special values. */
#include "test.h"
#include "quant_random.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"
#include "kernels/ops.h"
#include "kernels/err.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int k_types[] = {QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1, QUANT_Q8_0, QUANT_IQ4_NL,
                              QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_IQ4_XS};

/* run the tile body over every (block, thread) of a grid of nthr threads */
static void run_grid(const qb_tile_args *a, int nthr) {
    int64_t n = qb_tile_items(a), blocks = (n + nthr - 1) / nthr;
    for (int64_t b = 0; b < blocks; b++)
        for (int t = 0; t < nthr; t++) qb_tile_body(a, b, nthr, t);
}

/* rows [r0, r0 + nr) of w decoded by the tile body (ld = cols + pad) vs the CPU */
static void tile_case(const tensor *w, const double *wd, int64_t r0, int64_t nr, int64_t pad, int bf16, const char *what) {
    int64_t K = w->cols, ld = K + pad;
    size_t es = bf16 ? 2 : 4, n = (size_t)(nr * ld);
    uint8_t *out = xmalloc(n ? n * es : 1);
    memset(out, 0xff, n * es);   /* NaN / 0xffff: every element must be written */
    qb_tile_args a;
    REQUIRE(qb_tile_init(&a, w->qtype, (const uint8_t *)w->data + r0 * w->qpitch, w->qpitch, w->qseg, w->n_qseg, nr,
                         out, ld, bf16) == 0, "%s: qb_tile_init refused", what);
    run_grid(&a, 128);
    float *ref = xmalloc((size_t)K * sizeof(float));
    int64_t bad = 0, bad_pad = 0, bad_wd = 0;
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (r0 + r) * w->qpitch;
        for (int i = 0; i < w->n_qseg; i++) {   /* the CPU backend's read of a DT_GGML row */
            const tensor_qseg *s = &w->qseg[i];
            quant_dequant_span(w->qtype, row + s->off, s->skip, s->ncols, ref + s->col0);
        }
        for (int64_t c = 0; c < K; c++) {
            uint32_t want, got;
            float f = ref[c];
            bad_wd += (double)f != wd[(r0 + r) * K + c] && !(isnan(f) && isnan(wd[(r0 + r) * K + c]));
            if (bf16) {
                uint16_t g;
                memcpy(&g, out + ((size_t)(r * ld + c)) * 2, 2);
                want = f32_to_bf16(f), got = g;
            } else {
                memcpy(&want, &f, 4);
                memcpy(&got, out + ((size_t)(r * ld + c)) * 4, 4);
            }
            bad += want != got;
        }
        for (int64_t c = K; c < ld; c++) {   /* the pitch's padding is not written */
            uint8_t ff[4] = {0xff, 0xff, 0xff, 0xff};
            bad_pad += memcmp(out + (size_t)(r * ld + c) * es, ff, es) != 0;
        }
    }
    CHECK(bad == 0, "%s (%s, %s out, rows %lld+%lld, %d segment(s)): %lld of %lld values differ from the CPU's", what,
          quant_type_name(w->qtype), bf16 ? "bf16" : "f32", (long long)r0, (long long)nr, w->n_qseg, (long long)bad,
          (long long)(nr * K));
    CHECK(bad_pad == 0, "%s: %lld padding elements written", what, (long long)bad_pad);
    CHECK(bad_wd == 0, "%s: quant_dequant_span differs from the whole rows decoded in %lld values", what,
          (long long)bad_wd);
    free(ref), free(out);
}

TEST(quant_tiles_match_cpu) {
    backend *be = backend_cpu_create(1);
    uint32_t s = test_seed() | 1;
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        int type = k_types[t];
        const quant_type *qt = quant_type_get(type);
        REQUIRE(qt && qt->dequant && qb_block(type) == qt->block && qb_bytes(type) == qt->bytes,
                "type %d: the shared decoders' sizes differ from quant.c's table", type);
        int64_t bs = qt->block, Kg = 4 * bs, N = 7;
        /* whole rows; a row-parallel local row of three segments out of global
         * order: 1.5 blocks starting half-way into one, an element range
         * inside one block that starts and ends inside units, and half a
         * block; one segment of a single element */
        span whole[] = {{0, Kg}};
        span split[] = {{bs / 2, 2 * bs}, {3 * bs + 5, 3 * bs + bs - 3}, {0, bs / 2}};
        span one[] = {{2 * bs + 17, 2 * bs + 18}};
        struct { const span *sp; int n; const char *what; } cases[] = {
            {whole, 1, "whole rows"}, {split, 3, "in-block segments"}, {one, 1, "one element"}};
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int64_t K;
            double *wd;
            tensor *w = segmented_weight(be, type, N, Kg, cases[c].sp, cases[c].n, &s, &K, &wd);
            REQUIRE(w, "%s", tp_error_msg());
            for (int bf = 0; bf < 2; bf++) {
                tile_case(w, wd, 0, N, 0, bf, cases[c].what);
                tile_case(w, wd, 2, 4, 9, bf, cases[c].what);   /* a tile of rows, ld > cols */
            }
            tensor_free(w);
            free(wd);
        }
    }
    backend_destroy(be);
}

/* the inputs qb_tile_init must refuse: no decoders for the type, a segment
 * beyond its row, a skip outside the block */
TEST(quant_tiles_init_refuses) {
    qb_tile_args a;
    tensor_qseg ok = {0, 64, 0, 0}, beyond = {0, 64, 20, 0}, skip = {0, 8, 0, 40};
    float out[64] = {0};
    CHECK(qb_tile_init(&a, QUANT_Q8_0, out, 68, &ok, 1, 1, out, 64, 0) == 0 && a.units == 2, "Q8_0 64 columns");
    CHECK(qb_tile_init(&a, QUANT_F16, out, 128, &ok, 1, 1, out, 64, 0) == -1, "F16 is no block type");
    CHECK(qb_tile_init(&a, QUANT_Q8_K, out, 292, &ok, 1, 1, out, 64, 0) == -1, "Q8_K has no decoder");
    CHECK(qb_tile_init(&a, QUANT_Q8_0, out, 68, &beyond, 1, 1, out, 64, 0) == -1, "segment past the row");
    CHECK(qb_tile_init(&a, QUANT_Q8_0, out, 68, &skip, 1, 1, out, 64, 0) == -1, "skip past the block");
    CHECK(qb_tile_init(&a, QUANT_Q8_0, out, 68, &ok, 0, 1, out, 64, 0) == -1, "no segments");
}

TEST(quant_blocks_f16_bf16_exact) {
    int64_t bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = qb_f16((uint16_t)h), b = f16_to_f32((uint16_t)h);
        bad += memcmp(&a, &b, 4) != 0;
    }
    CHECK(bad == 0, "qb_f16 differs from f16_to_f32 on %lld of 65536 codes", (long long)bad);
    const float v[] = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.01171875f, -3.3e38f, 3.4e38f, INFINITY, -INFINITY, NAN,
                       1e-40f, -1e-45f, 0.1f, 65504.0f};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        CHECK(qb_bf16(v[i]) == f32_to_bf16(v[i]), "qb_bf16(%g) = %04x, f32_to_bf16 %04x", (double)v[i], qb_bf16(v[i]),
              f32_to_bf16(v[i]));
    uint32_t s = 12345;
    for (int i = 0; i < 100000; i++) {
        uint32_t u = rng_next(&s);
        float f;
        memcpy(&f, &u, 4);
        if (qb_bf16(f) != f32_to_bf16(f)) { CHECK(0, "qb_bf16 of bits %08x", u); break; }
    }
}
