/* Normalisations: LayerNorm with AdaLN modulation, grouped RMSNorm and
 * GroupNorm. Statistics are accumulated in double (rows reach 12288 values,
 * VAE groups 8 million), the normalisation itself is fp32 as in PyTorch. */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include "cpu_vecmath.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* y = LN(x) * (1 + scale) + shift; bf16 output rounds LN, (1+scale),
 * the product and the sum separately (docs/spec/flux2-transformer.md §3.4). */
void cpu_layernorm_mod(backend *be, tensor *y, const tensor *x, const tensor *shift,
                       const tensor *scale, float eps) {
    CPU_REQUIRE(y->rows == x->rows && y->cols == x->cols, "op_layernorm_mod: y and x shapes differ");
    int64_t R = x->rows, C = x->cols;
    CPU_REQUIRE(!shift || (shift->rows == 1 && shift->cols == C), "op_layernorm_mod: shift must be [1,%lld]", (long long)C);
    CPU_REQUIRE(!scale || (scale->rows == 1 && scale->cols == C), "op_layernorm_mod: scale must be [1,%lld]", (long long)C);
    dtype_t dt = y->dtype;
    float *a = xmalloc((size_t)C * sizeof(float)), *sh = xmalloc((size_t)C * sizeof(float));
    if (scale) { /* bf16(1 + scale) once for all rows */
        const float *s = row_f32(scale, 0, 0, C, a);
        for (int64_t i = 0; i < C; i++) a[i] = round_to(dt, 1.0f + s[i]);
    }
    if (shift) { const float *s = row_f32(shift, 0, 0, C, sh); if (s != sh) memcpy(sh, s, (size_t)C * 4); }
#pragma omp parallel if (R * C > CPU_PAR_MIN)
    {
        float *bx = xmalloc((size_t)C * sizeof(float)), *out = xmalloc((size_t)C * sizeof(float));
#pragma omp for
        for (int64_t r = 0; r < R; r++) {
            const float *v = row_f32(x, r, 0, C, bx);
            double sum = 0, ss = 0;
            for (int64_t i = 0; i < C; i++) sum += v[i];
            float mu = (float)(sum / (double)C);
            for (int64_t i = 0; i < C; i++) { double d = (double)v[i] - mu; ss += d * d; }
            float rstd = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
            for (int64_t i = 0; i < C; i++) {
                float n = round_to(dt, (v[i] - mu) * rstd);
                if (scale) n = round_to(dt, a[i] * n);
                if (shift) n = n + sh[i];
                out[i] = n;
            }
            row_store(y, r, 0, C, out);
        }
        free(bx);
        free(out);
    }
    free(a);
    free(sh);
}

/* RMSNorm over consecutive groups of `group` columns; bf16 rounds x*r and
 * then (.)*w (the two-rounding form, docs/spec/flux2-transformer.md §3.3). y may be x. */
void cpu_rmsnorm(backend *be, tensor *y, const tensor *x, const tensor *w, int group, float eps) {
    CPU_REQUIRE(y->rows == x->rows && y->cols == x->cols, "op_rmsnorm: y and x shapes differ");
    CPU_REQUIRE(group > 0 && x->cols % group == 0, "op_rmsnorm: group %d does not divide %lld columns", group,
                (long long)x->cols);
    CPU_REQUIRE(w && w->rows == 1 && w->cols == group, "op_rmsnorm: w must be [1, %d]", group);
    int64_t R = x->rows, C = x->cols;
    dtype_t dt = y->dtype;
    float *wb = xmalloc((size_t)group * sizeof(float));
    const float *wv = row_f32(w, 0, 0, group, wb);
#pragma omp parallel if (R * C > CPU_PAR_MIN)
    {
        float *bx = xmalloc((size_t)C * sizeof(float)), *out = xmalloc((size_t)C * sizeof(float));
#pragma omp for
        for (int64_t r = 0; r < R; r++) {
            const float *v = row_f32(x, r, 0, C, bx);
            for (int64_t g0 = 0; g0 < C; g0 += group) {
                double ss = 0;
                for (int64_t i = 0; i < group; i++) ss += (double)v[g0 + i] * v[g0 + i];
                float rs = (float)(1.0 / sqrt(ss / group + (double)eps));
                for (int64_t i = 0; i < group; i++) out[g0 + i] = round_to(dt, v[g0 + i] * rs) * wv[i];
            }
            row_store(y, r, 0, C, out);
        }
        free(bx);
        free(out);
    }
    free(wb);
}

/* Sum over each channel (row) of x of (x - center[group])^p, p = 1 or 2. */
/* sum of v[i] (p = 1) or of (v[i] - m)^2 (p = 2) in double; 8 floats at a
 * time into independent double lanes with AVX2 (a scalar double chain is
 * 4 cycles per value, the biggest part of a VAE GroupNorm) */
static double sum_pow(const float *v, int64_t n, double m, int p) {
    int64_t i = 0;
    double s = 0;
#ifdef CPU_VEC_AVX2
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd(), vm = _mm256_set1_pd(m);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        if (p == 1) { a0 = _mm256_add_pd(a0, lo); a1 = _mm256_add_pd(a1, hi); continue; }
        lo = _mm256_sub_pd(lo, vm);
        hi = _mm256_sub_pd(hi, vm);
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(lo, lo));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(hi, hi));
    }
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(a0, a1));
    s = (t[0] + t[1]) + (t[2] + t[3]);
#endif
    if (p == 1) for (; i < n; i++) s += v[i];
    else for (; i < n; i++) { double d = v[i] - m; s += d * d; }
    return s;
}

/* out[c] = sum_i (x[c,i] - center[c])^p (center NULL: 0) */
static void channel_sums(const tensor *x, const double *center, int p, double *out) {
    int64_t C = x->rows, HW = x->cols;
#pragma omp parallel if (C * HW > CPU_PAR_MIN)
    {
        float *bx = xmalloc((size_t)HW * sizeof(float));
#pragma omp for schedule(dynamic)
        for (int64_t c = 0; c < C; c++)
            out[c] = sum_pow(row_f32(x, c, 0, HW, bx), HW, center ? center[c] : 0, p);
        free(bx);
    }
}

void cpu_channel_row_sums(backend *be, const tensor *x, int64_t W, const double *center, int p, double *out) {
    (void)be;
    CPU_REQUIRE((p == 1 || p == 2) && W > 0 && x->cols % W == 0, "op_channel_row_sums: power %d, row width %lld of %lld",
                p, (long long)W, (long long)x->cols);
    int64_t C = x->rows, HW = x->cols, rows = HW / W;
#pragma omp parallel if (C * HW > CPU_PAR_MIN)
    {
        float *bx = xmalloc((size_t)HW * sizeof(float));
#pragma omp for schedule(dynamic)
        for (int64_t c = 0; c < C; c++) {
            const float *v = row_f32(x, c, 0, HW, bx);
            for (int64_t r = 0; r < rows; r++) /* each row from its own start: channel_sums of that row alone */
                out[c * rows + r] = sum_pow(v + r * W, W, center ? center[c] : 0, p);
        }
        free(bx);
    }
}

void cpu_channel_sums(backend *be, const tensor *x, const double *center, int p, double *out) {
    (void)be;
    CPU_REQUIRE(p == 1 || p == 2, "op_channel_sums: power %d is not 1 or 2", p);
    channel_sums(x, center, p, out);
}

/* out[i] = v[i]*a + b, then with silu: rounded to dt, t / (1 + exp(-t)) */
static void affine_silu(const float *v, float *out, int64_t n, float a, float b, int silu, dtype_t dt) {
    int64_t i = 0;
#ifdef CPU_VEC_AVX2
    __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), va), vb);
        if (silu) {
            if (dt == DT_BF16) t = bf16_round8(t);
            t = _mm256_div_ps(t, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), t))));
        }
        _mm256_storeu_ps(out + i, t);
    }
    if (i < n) {   /* the tail through the same vector arithmetic: a pixel's value does not depend on where the
                    * row ends (a VAE band's rows end elsewhere than the whole image's) */
        float tv[8] = {0}, to[8];
        memcpy(tv, v + i, (size_t)(n - i) * sizeof *tv);
        affine_silu(tv, to, 8, a, b, silu, dt);
        memcpy(out + i, to, (size_t)(n - i) * sizeof *to);
    }
    return;
#endif
    for (; i < n; i++) {
        float t = v[i] * a + b;
        if (silu) { t = round_to(dt, t); t = t / (1.0f + exp_scalar(-t)); }
        out[i] = t;
    }
}
/* y[c,:] = x[c,:]*a[c] + b[c] (+ SiLU): the apply half of group_norm */
static void channel_affine(tensor *y, const tensor *x, const float *a, const float *b, int apply_silu) {
    int64_t C = x->rows, HW = x->cols;
    dtype_t dt = y->dtype;
#pragma omp parallel if (C * HW > CPU_PAR_MIN)
    {
        float *bx = xmalloc((size_t)HW * sizeof(float)), *out = xmalloc((size_t)HW * sizeof(float));
#pragma omp for schedule(dynamic)
        for (int64_t c = 0; c < C; c++) {
            const float *v = row_f32(x, c, 0, HW, bx);
            float *o = dt == DT_F32 ? row_ptr(y, c) : out; /* in place is fine: element i is read before it is written */
            affine_silu(v, o, HW, a[c], b[c], apply_silu, dt);
            if (o == out) row_store(y, c, 0, HW, out);
        }
        free(bx);
        free(out);
    }
}

void cpu_channel_affine(backend *be, tensor *y, const tensor *x, const float *a, const float *b, int apply_silu) {
    (void)be;
    CPU_REQUIRE(y->rows == x->rows && y->cols == x->cols, "op_channel_affine: y and x shapes differ");
    channel_affine(y, x, a, b, apply_silu);
}

void cpu_group_norm(backend *be, tensor *y, const tensor *x, const tensor *gamma,
                    const tensor *beta, int groups, float eps, int apply_silu) {
    (void)be;
    int64_t C = x->rows, HW = x->cols;
    CPU_REQUIRE(y->rows == C && y->cols == HW, "op_group_norm: y and x shapes differ");
    CPU_REQUIRE(groups > 0 && C % groups == 0, "op_group_norm: %d groups do not divide %lld channels", groups,
                (long long)C);
    CPU_REQUIRE(!gamma || (gamma->rows * gamma->cols == C), "op_group_norm: gamma must have %lld values", (long long)C);
    CPU_REQUIRE(!beta || (beta->rows * beta->cols == C), "op_group_norm: beta must have %lld values", (long long)C);
    int cpg = (int)(C / groups);
    double n = (double)cpg * (double)HW;
    double *cs = xmalloc((size_t)C * sizeof(double)), *mean = xcalloc((size_t)groups, sizeof(double)),
           *var = xcalloc((size_t)groups, sizeof(double)), *center = xmalloc((size_t)C * sizeof(double));
    channel_sums(x, NULL, 1, cs);
    for (int64_t c = 0; c < C; c++) mean[c / cpg] += cs[c];
    for (int g = 0; g < groups; g++) mean[g] /= n;
    for (int64_t c = 0; c < C; c++) center[c] = mean[c / cpg];
    channel_sums(x, center, 2, cs); /* two-pass variance: no cancellation */
    for (int64_t c = 0; c < C; c++) var[c / cpg] += cs[c];
    float *ga = xmalloc((size_t)C * sizeof(float)), *be_ = xmalloc((size_t)C * sizeof(float));
    for (int64_t c = 0; c < C; c++) { ga[c] = 1.0f; be_[c] = 0.0f; }
    if (gamma) convert_to_f32(ga, gamma->data, gamma->dtype, (size_t)C);
    if (beta) convert_to_f32(be_, beta->data, beta->dtype, (size_t)C);
    for (int64_t c = 0; c < C; c++) {
        int g = (int)(c / cpg);
        float mu = (float)mean[g], rstd = (float)(1.0 / sqrt(var[g] / n + (double)eps));
        /* PyTorch's kernel folds the affine: y = x*a + b with a = rstd*gamma, b = beta - mu*a */
        float a = rstd * ga[c];
        ga[c] = a;
        be_[c] = be_[c] - mu * a;
    }
    channel_affine(y, x, ga, be_, apply_silu);
    free(cs); free(mean); free(var); free(center); free(ga); free(be_);
}
