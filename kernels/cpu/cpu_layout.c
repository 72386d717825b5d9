/* Data-movement ops: embedding row gather, nearest 2x upsampling and
 * transpose. Values are converted when input and output dtypes differ. */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include <stdlib.h>

void cpu_gather_rows(backend *be, tensor *y, const tensor *table, const int32_t *ids, int64_t n,
                     int64_t row0) {
    CPU_REQUIRE(n >= 0 && n <= y->rows && y->cols == table->cols, "op_gather_rows: y [%lld,%lld] cannot hold %lld rows of %lld",
                (long long)y->rows, (long long)y->cols, (long long)n, (long long)table->cols);
    int64_t C = y->cols;
    size_t es = dtype_size(y->dtype);
#pragma omp parallel if (n * C > CPU_PAR_MIN)
    {
        float *buf = xmalloc((size_t)C * sizeof(float));
#pragma omp for
        for (int64_t i = 0; i < n; i++) {
            int64_t r = (int64_t)ids[i] - row0;
            if (r < 0 || r >= table->rows) memset(row_ptr(y, i), 0, (size_t)C * es); /* another shard's row */
            else if (y->dtype == table->dtype) memcpy(row_ptr(y, i), row_ptr(table, r), (size_t)C * es);
            else row_store(y, i, 0, C, row_f32_weight(table, r, 0, C, buf));   /* GGUF blocks too */
        }
        free(buf);
    }
}

/* each value twice: d[2j] = d[2j+1] = s[j] (element stores: an odd column
 * offset leaves d aligned only to its element size) */
static void dup16(uint16_t *restrict d, const uint16_t *restrict s, int64_t n) {
    for (int64_t j = 0; j < n; j++) d[2 * j] = d[2 * j + 1] = s[j];
}
static void dup32(uint32_t *restrict d, const uint32_t *restrict s, int64_t n) {
    for (int64_t j = 0; j < n; j++) d[2 * j] = d[2 * j + 1] = s[j];
}

void cpu_upsample2x(backend *be, tensor *y, const tensor *x, int64_t h, int64_t wd) {
    CPU_REQUIRE(x->cols == h * wd && y->rows == x->rows && y->cols == 4 * h * wd,
                "op_upsample2x: x [%lld,%lld] y [%lld,%lld] for %lldx%lld", (long long)x->rows, (long long)x->cols,
                (long long)y->rows, (long long)y->cols, (long long)h, (long long)wd);
    int64_t C = x->rows, W2 = 2 * wd;
    if (x->dtype == y->dtype && (x->dtype == DT_F32 || x->dtype == DT_BF16)) { /* no conversion: copy the values */
        int bf = x->dtype == DT_BF16;
#pragma omp parallel for if (C * h * wd > CPU_PAR_MIN)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < h; i++) {
                const char *src = (const char *)row_ptr(x, c) + (size_t)(i * wd) * (bf ? 2 : 4);
                char *d0 = (char *)row_ptr(y, c) + (size_t)(2 * i * W2) * (bf ? 2 : 4);
                if (bf) dup16((uint16_t *)d0, (const uint16_t *)src, wd);
                else dup32((uint32_t *)d0, (const uint32_t *)src, wd);
                memcpy(d0 + (size_t)W2 * (bf ? 2 : 4), d0, (size_t)W2 * (bf ? 2 : 4));
            }
        return;
    }
#pragma omp parallel if (C * h * wd > CPU_PAR_MIN)
    {
        float *buf = xmalloc((size_t)(h * wd) * sizeof(float)), *line = xmalloc((size_t)W2 * sizeof(float));
#pragma omp for
        for (int64_t c = 0; c < C; c++) {
            const float *v = row_f32(x, c, 0, h * wd, buf);
            for (int64_t i = 0; i < h; i++) {
                for (int64_t j = 0; j < W2; j++) line[j] = v[i * wd + j / 2];
                row_store(y, c, (2 * i) * W2, W2, line);
                row_store(y, c, (2 * i + 1) * W2, W2, line);
            }
        }
        free(buf);
        free(line);
    }
}

/* Blocked so that both the reads and the writes stay within cache lines. */
void cpu_transpose(backend *be, tensor *y, const tensor *x) {
    CPU_REQUIRE(y->rows == x->cols && y->cols == x->rows, "op_transpose: y must be [%lld,%lld]",
                (long long)x->cols, (long long)x->rows);
    enum { B = 32 };
    int64_t R = x->rows, C = x->cols;
    int64_t nbr = (R + B - 1) / B, nbc = (C + B - 1) / B;
#pragma omp parallel if (R * C > CPU_PAR_MIN)
    {
        float in[B], out[B][B];
#pragma omp for collapse(2)
        for (int64_t bi = 0; bi < nbr; bi++)
            for (int64_t bj = 0; bj < nbc; bj++) {
                int64_t r0 = bi * B, c0 = bj * B, nr = R - r0 < B ? R - r0 : B, nc = C - c0 < B ? C - c0 : B;
                for (int64_t i = 0; i < nr; i++) {
                    const float *v = row_f32(x, r0 + i, c0, nc, in);
                    for (int64_t j = 0; j < nc; j++) out[j][i] = v[j];
                }
                for (int64_t j = 0; j < nc; j++) row_store(y, c0 + j, r0, nr, out[j]);
            }
    }
}
