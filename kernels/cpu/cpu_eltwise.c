/* Element-wise CPU ops: copy, RoPE, SwiGLU, SiLU, add, gated add.
 * fp32 math; when the output is bf16 the result is rounded at the points
 * where eager bf16 PyTorch rounds (after each elementwise op, ops.h). Rows
 * are spread over OpenMP threads; each thread widens bf16 rows into its own
 * scratch. */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include <math.h>
#include <stdlib.h>

static void check_same_shape(const char *op, const tensor *a, const tensor *b) {
    CPU_REQUIRE(a->rows == b->rows && a->cols == b->cols, "%s: shape [%lld,%lld] vs [%lld,%lld]", op,
                (long long)a->rows, (long long)a->cols, (long long)b->rows, (long long)b->cols);
}

static inline float silu_f(float v) { return v / (1.0f + expf(-v)); }

void cpu_copy(backend *be, tensor *y, const tensor *x) {
    check_same_shape("op_copy", y, x);
    int64_t R = y->rows, C = y->cols;
    if (y->dtype == x->dtype) { /* raw row copies, any dtype */
        size_t w = (size_t)C * dtype_size(x->dtype);
#pragma omp parallel for if (R * C > CPU_PAR_MIN)
        for (int64_t r = 0; r < R; r++) memmove(row_ptr(y, r), row_ptr(x, r), w);
        return;
    }
    /* an fp8 source is dequantised (decode x scale): the dequant op */
    CPU_REQUIRE(is_weight_dt(x->dtype) && is_float_dt(y->dtype), "op_copy: %s -> %s unsupported",
                dtype_name(x->dtype), dtype_name(y->dtype));
#pragma omp parallel if (R * C > CPU_PAR_MIN)
    {
        float *buf = xmalloc((size_t)C * sizeof(float));
#pragma omp for
        for (int64_t r = 0; r < R; r++) row_store(y, r, 0, C, row_f32(x, r, 0, C, buf));
        free(buf);
    }
}

void cpu_rope(backend *be, tensor *x, const tensor *cos, const tensor *sin, int head_dim, rope_mode mode) {
    CPU_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && x->cols % head_dim == 0,
                "op_rope: head_dim %d does not divide %lld columns", head_dim, (long long)x->cols);
    CPU_REQUIRE(cos->dtype == DT_F32 && sin->dtype == DT_F32, "op_rope: cos/sin must be F32");
    CPU_REQUIRE(cos->rows == x->rows && sin->rows == x->rows && cos->cols == head_dim && sin->cols == head_dim,
                "op_rope: tables must be [%lld, %d]", (long long)x->rows, head_dim);
    int64_t S = x->rows, C = x->cols, nh = C / head_dim, half = head_dim / 2;
#pragma omp parallel if (S * C > CPU_PAR_MIN)
    {
        float *buf = xmalloc((size_t)C * sizeof(float)), *out = xmalloc((size_t)C * sizeof(float));
#pragma omp for
        for (int64_t s = 0; s < S; s++) {
            const float *v = row_f32(x, s, 0, C, buf);
            const float *c = row_ptr(cos, s), *sn = row_ptr(sin, s);
            for (int64_t h = 0; h < nh; h++) {
                const float *a = v + h * head_dim;
                float *o = out + h * head_dim;
                if (mode == ROPE_INTERLEAVED) {
                    for (int64_t j = 0; j < head_dim; j += 2) {
                        /* products in fp32, then one add (docs/spec/flux2-transformer.md §3.6: bf16(fl32(x·cos) + fl32(x_rot·sin))) */
                        float p0 = a[j] * c[j], q0 = a[j + 1] * sn[j];
                        float p1 = a[j + 1] * c[j + 1], q1 = a[j] * sn[j + 1];
                        o[j] = p0 - q0;
                        o[j + 1] = p1 + q1;
                    }
                } else {
                    for (int64_t j = 0; j < half; j++) {
                        float p0 = a[j] * c[j], q0 = a[j + half] * sn[j];
                        float p1 = a[j + half] * c[j + half], q1 = a[j] * sn[j + half];
                        o[j] = p0 - q0;
                        o[j + half] = p1 + q1;
                    }
                }
            }
            row_store(x, s, 0, C, out);
        }
        free(buf);
        free(out);
    }
}

void cpu_swiglu(backend *be, tensor *y, const tensor *gate, const tensor *up) {
    check_same_shape("op_swiglu", y, gate);
    check_same_shape("op_swiglu", y, up);
    int64_t R = y->rows, C = y->cols;
    dtype_t dt = y->dtype;
#pragma omp parallel if (R * C > CPU_PAR_MIN)
    {
        float *bg = xmalloc((size_t)C * sizeof(float)), *bu = xmalloc((size_t)C * sizeof(float)),
              *out = xmalloc((size_t)C * sizeof(float));
#pragma omp for
        for (int64_t r = 0; r < R; r++) {
            const float *g = row_f32(gate, r, 0, C, bg), *u = row_f32(up, r, 0, C, bu);
            for (int64_t i = 0; i < C; i++) out[i] = round_to(dt, silu_f(g[i])) * u[i];
            row_store(y, r, 0, C, out);
        }
        free(bg);
        free(bu);
        free(out);
    }
}

void cpu_silu(backend *be, tensor *y, const tensor *x) {
    check_same_shape("op_silu", y, x);
    int64_t R = y->rows, C = y->cols;
#pragma omp parallel if (R * C > CPU_PAR_MIN)
    {
        float *bx = xmalloc((size_t)C * sizeof(float)), *out = xmalloc((size_t)C * sizeof(float));
#pragma omp for
        for (int64_t r = 0; r < R; r++) {
            const float *v = row_f32(x, r, 0, C, bx);
            for (int64_t i = 0; i < C; i++) out[i] = silu_f(v[i]);
            row_store(y, r, 0, C, out);
        }
        free(bx);
        free(out);
    }
}

void cpu_add(backend *be, tensor *y, const tensor *a, const tensor *b) {
    check_same_shape("op_add", y, a);
    CPU_REQUIRE(b->cols == a->cols && (b->rows == a->rows || b->rows == 1),
                "op_add: b [%lld,%lld] must match a [%lld,%lld] or be [1,%lld]", (long long)b->rows,
                (long long)b->cols, (long long)a->rows, (long long)a->cols, (long long)a->cols);
    int64_t R = y->rows, C = y->cols;
#pragma omp parallel if (R * C > CPU_PAR_MIN)
    {
        float *ba = xmalloc((size_t)C * sizeof(float)), *bb = xmalloc((size_t)C * sizeof(float)),
              *out = xmalloc((size_t)C * sizeof(float));
        const float *bcast = b->rows == 1 ? row_f32(b, 0, 0, C, bb) : NULL;
#pragma omp for
        for (int64_t r = 0; r < R; r++) {
            const float *va = row_f32(a, r, 0, C, ba), *vb = bcast ? bcast : row_f32(b, r, 0, C, bb);
            for (int64_t i = 0; i < C; i++) out[i] = va[i] + vb[i];
            row_store(y, r, 0, C, out);
        }
        free(ba);
        free(bb);
        free(out);
    }
}

void cpu_gated_add(backend *be, tensor *x, const tensor *gate, const tensor *y) {
    check_same_shape("op_gated_add", x, y);
    CPU_REQUIRE(!gate || (gate->rows == 1 && gate->cols == x->cols), "op_gated_add: gate must be [1, %lld]",
                (long long)x->cols);
    int64_t R = x->rows, C = x->cols;
    dtype_t dt = x->dtype;
#pragma omp parallel if (R * C > CPU_PAR_MIN)
    {
        float *bx = xmalloc((size_t)C * sizeof(float)), *by = xmalloc((size_t)C * sizeof(float)),
              *bg = xmalloc((size_t)C * sizeof(float)), *out = xmalloc((size_t)C * sizeof(float));
        const float *g = gate ? row_f32(gate, 0, 0, C, bg) : NULL;
#pragma omp for
        for (int64_t r = 0; r < R; r++) {
            const float *vx = row_f32(x, r, 0, C, bx), *vy = row_f32(y, r, 0, C, by);
            if (g) for (int64_t i = 0; i < C; i++) out[i] = vx[i] + round_to(dt, g[i] * vy[i]);
            else for (int64_t i = 0; i < C; i++) out[i] = vx[i] + vy[i];
            row_store(x, r, 0, C, out);
        }
        free(bx);
        free(by);
        free(bg);
        free(out);
    }
}
