/* Normalisation kernels: LayerNorm + modulation (one block per row),
 * grouped RMSNorm (one warp per group), GroupNorm (statistics in a first
 * pass, normalise + affine + optional SiLU in a second). Statistics are
 * accumulated in double whatever the dtype, like the CPU twin; the
 * normalisation itself is fp32. */
#include "cuda_dtype.cuh"

static const int k_ln_threads = 256;

/* block-wide double sum; every thread gets the total. Statistics are
 * accumulated in double like the CPU twin (rows reach 12288 values). */
__device__ double block_sum(double v, double *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads();  /* red may still be read by a previous call */
    if (l == 0) red[w] = v;
    __syncthreads();
    double t = l < nw ? red[l] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

/* y = LN(x) * (1 + scale) + shift, bf16 rounding points as in ops.h */
__global__ void k_layernorm_mod(void *y, int ydt, int64_t yld, const void *x, int xdt, int64_t xld, int64_t cols,
                                const void *shift, int shdt, const void *scale, int scdt, float eps) {
    __shared__ double red[32];
    const int64_t r = blockIdx.x;
    const int64_t xo = r * xld, yo = r * yld;
    double s = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += ld_el(x, xdt, xo + c);
    float mean = (float)(block_sum(s, red) / (double)cols);
    double v = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        double d = (double)ld_el(x, xdt, xo + c) - mean;
        v += d * d;
    }
    float rstd = (float)(1.0 / sqrt(block_sum(v, red) / (double)cols + (double)eps));
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float n = rnd_el(__fmul_rn(ld_el(x, xdt, xo + c) - mean, rstd), ydt);
        if (scale) n = rnd_el(__fmul_rn(rnd_el(1.0f + ld_el(scale, scdt, c), ydt), n), ydt);
        if (shift) n = n + ld_el(shift, shdt, c);
        st_el(y, ydt, yo + c, n);
    }
}

/* One warp per (row, group). Reads the whole group before writing, so
 * y == x (in place) is safe. */
__global__ void k_rmsnorm(void *y, int ydt, int64_t yld, const void *x, int xdt, int64_t xld, int64_t rows,
                          int64_t groups_per_row, int group, const void *w, int wdt, float eps) {
    int64_t gi = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (gi >= rows * groups_per_row) return;
    int64_t r = gi / groups_per_row, g = gi % groups_per_row;
    int64_t xo = r * xld + g * group, yo = r * yld + g * group;
    double ss = 0;
    for (int c = lane; c < group; c += 32) {
        double v = ld_el(x, xdt, xo + c);
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float rs = (float)(1.0 / sqrt(ss / group + (double)eps));
    for (int c = lane; c < group; c += 32) {
        float n = rnd_el(__fmul_rn(ld_el(x, xdt, xo + c), rs), ydt);
        if (w) n = __fmul_rn(n, ld_el(w, wdt, c));
        st_el(y, ydt, yo + c, n);
    }
}

/* GroupNorm pass 1: partial sums of x and x^2 per group, accumulated in
 * double with atomics. grid = (groups, chunks). */
__global__ void k_group_stats(const void *x, int xdt, int64_t xld, int64_t hw, int ch_per_group, double *stats) {
    int g = blockIdx.x;
    int64_t n = (int64_t)ch_per_group * hw;
    double s = 0, s2 = 0;
    for (int64_t i = blockIdx.y * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.y * blockDim.x) {
        int64_t c = g * (int64_t)ch_per_group + i / hw, p = i % hw;
        double v = ld_el(x, xdt, c * xld + p);
        s += v;
        s2 += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
    if (threadIdx.x % 32 == 0) {
        atomicAdd(&stats[2 * g], s);
        atomicAdd(&stats[2 * g + 1], s2);
    }
}

/* GroupNorm pass 2: the affine folded as PyTorch's kernel does,
 * y = x*a + b with a = rstd*gamma, b = beta - mean*a (fp32, no fused
 * multiply-add, like the CPU twin), rounded once; SiLU on the rounded value,
 * rounded again (PyTorch runs SiLU as a separate op). */
__global__ void k_group_apply(void *y, int ydt, int64_t yld, const void *x, int xdt, int64_t xld, int64_t C,
                              int64_t hw, int ch_per_group, const double *stats, const void *gamma, int gdt,
                              const void *beta, int bdt, float eps, int apply_silu) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < C * hw; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = i / hw, p = i % hw;
        int g = (int)(c / ch_per_group);
        double n = (double)ch_per_group * hw;
        double mean = stats[2 * g] / n, var = stats[2 * g + 1] / n - mean * mean;
        float rstd = (float)(1.0 / sqrt((var > 0 ? var : 0) + (double)eps));
        float a = gamma ? __fmul_rn(rstd, ld_el(gamma, gdt, c)) : rstd;
        float b = __fsub_rn(beta ? ld_el(beta, bdt, c) : 0.0f, __fmul_rn((float)mean, a));
        float v = __fadd_rn(__fmul_rn(ld_el(x, xdt, c * xld + p), a), b);
        if (apply_silu) v = silu_f(rnd_el(v, ydt));
        st_el(y, ydt, c * yld + p, v);
    }
}

static const void *data_or_null(const tensor *t) { return t ? t->data : nullptr; }
static int dt_or_f32(const tensor *t) { return t ? (int)t->dtype : (int)DT_F32; }

void cuda_layernorm_mod(backend *be, tensor *y, const tensor *x, const tensor *shift, const tensor *scale,
                        float eps) {
    cuda_need_float(y, "layernorm_mod");
    cuda_need_float(x, "layernorm_mod");
    if (y->rows != x->rows || y->cols != x->cols) tp_fatal("cuda layernorm_mod: y and x differ in shape");
    if ((shift && shift->cols != x->cols) || (scale && scale->cols != x->cols))
        tp_fatal("cuda layernorm_mod: shift/scale must be [1, %lld]", (long long)x->cols);
    if (x->rows == 0) return;
    k_layernorm_mod<<<(unsigned)x->rows, k_ln_threads, 0, cuda_stream(be)>>>(
        y->data, y->dtype, y->ld, x->data, x->dtype, x->ld, x->cols, data_or_null(shift), dt_or_f32(shift),
        data_or_null(scale), dt_or_f32(scale), eps);
    CUDA_LAUNCHED("layernorm_mod");
}

void cuda_rmsnorm(backend *be, tensor *y, const tensor *x, const tensor *w, int group, float eps) {
    cuda_need_float(y, "rmsnorm");
    cuda_need_float(x, "rmsnorm");
    if (group <= 0 || x->cols % group || y->rows != x->rows || y->cols != x->cols || (w && w->cols != group))
        tp_fatal("cuda rmsnorm: bad shapes (x [%lld,%lld], group %d)", (long long)x->rows, (long long)x->cols, group);
    int64_t gpr = x->cols / group, warps = x->rows * gpr;
    if (warps == 0) return;
    const int threads = 256;
    unsigned blocks = (unsigned)((warps * 32 + threads - 1) / threads);
    k_rmsnorm<<<blocks, threads, 0, cuda_stream(be)>>>(y->data, y->dtype, y->ld, x->data, x->dtype, x->ld, x->rows,
                                                       gpr, group, data_or_null(w), dt_or_f32(w), eps);
    CUDA_LAUNCHED("rmsnorm");
}

void cuda_group_norm(backend *be, tensor *y, const tensor *x, const tensor *gamma, const tensor *beta, int groups,
                     float eps, int apply_silu) {
    cuda_need_float(y, "group_norm");
    cuda_need_float(x, "group_norm");
    if (groups <= 0 || x->rows % groups || y->rows != x->rows || y->cols != x->cols)
        tp_fatal("cuda group_norm: bad shapes (x [%lld,%lld], %d groups)", (long long)x->rows, (long long)x->cols,
                 groups);
    if (x->rows == 0 || x->cols == 0) return;
    double *stats = (double *)cuda_scratch(be, 0, sizeof(double) * 2 * (size_t)groups);
    CUDA_CHECK(cudaMemsetAsync(stats, 0, sizeof(double) * 2 * (size_t)groups, cuda_stream(be)));
    int cpg = (int)(x->rows / groups);
    int64_t per_group = (int64_t)cpg * x->cols;
    unsigned chunks = (unsigned)((per_group + 256 * 64 - 1) / (256 * 64));  /* ~64 elements per thread */
    if (chunks > 1024) chunks = 1024;
    k_group_stats<<<dim3((unsigned)groups, chunks), 256, 0, cuda_stream(be)>>>(x->data, x->dtype, x->ld, x->cols, cpg,
                                                                              stats);
    CUDA_LAUNCHED("group_norm stats");
    int64_t n = x->rows * x->cols;
    k_group_apply<<<cuda_blocks(n, 256), 256, 0, cuda_stream(be)>>>(
        y->data, y->dtype, y->ld, x->data, x->dtype, x->ld, x->rows, x->cols, cpg, stats, data_or_null(gamma),
        dt_or_f32(gamma), data_or_null(beta), dt_or_f32(beta), eps, apply_silu);
    CUDA_LAUNCHED("group_norm apply");
}

/* ---- the two halves of GroupNorm for the band-parallel VAE decode
 * (op_channel_sums, op_channel_affine): on the device, one upload of the
 * centers and one download of the partial sums per call, instead of the
 * host fallback's two copies per channel. Partial sums per (channel, chunk)
 * in f64, added on the host in chunk order: deterministic. */
static const int k_cs_threads = 256;

__global__ void k_channel_sums(const void *x, int xdt, int64_t xld, int64_t hw, const double *center, int p,
                               int64_t per_chunk, double *partial) {
    int64_t c = blockIdx.x;
    int64_t i0 = (int64_t)blockIdx.y * per_chunk, i1 = i0 + per_chunk < hw ? i0 + per_chunk : hw;
    double m = center ? center[c] : 0.0, s = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        double v = (double)ld_el(x, xdt, c * xld + i);
        s += p == 1 ? v : (v - m) * (v - m);
    }
    __shared__ double red[k_cs_threads];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[c * gridDim.y + blockIdx.y] = red[0];
}

void cuda_channel_sums(backend *be, const tensor *x, const double *center, int p, double *out) {
    cuda_need_float(x, "channel_sums");
    if (p != 1 && p != 2) tp_fatal("cuda channel_sums: power %d is not 1 or 2", p);
    int64_t C = x->rows, hw = x->cols;
    if (C == 0) return;
    int64_t chunks = (hw + k_cs_threads * 16 - 1) / (k_cs_threads * 16);  /* ~16 elements a thread */
    if (chunks < 1) chunks = 1;
    if (chunks > 64) chunks = 64;
    int64_t per_chunk = (hw + chunks - 1) / chunks;
    double *d = (double *)cuda_scratch(be, 0, sizeof(double) * (size_t)C * (size_t)(chunks + 1));
    double *dcenter = d + C * chunks;
    cudaStream_t s = cuda_stream(be);
    if (center) CUDA_CHECK(cudaMemcpyAsync(dcenter, center, sizeof(double) * (size_t)C, cudaMemcpyHostToDevice, s));
    k_channel_sums<<<dim3((unsigned)C, (unsigned)chunks), k_cs_threads, 0, s>>>(x->data, x->dtype, x->ld, hw,
                                                                              center ? dcenter : nullptr, p, per_chunk, d);
    CUDA_LAUNCHED("channel_sums");
    double *h = (double *)xmalloc(sizeof(double) * (size_t)C * (size_t)chunks);
    CUDA_CHECK(cudaMemcpyAsync(h, d, sizeof(double) * (size_t)C * (size_t)chunks, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (int64_t c = 0; c < C; c++) {
        double t = 0;
        for (int64_t j = 0; j < chunks; j++) t += h[c * chunks + j];
        out[c] = t;
    }
    free(h);
}

/* y = x*a[c] + b[c] (rounded after each step, as the CPU), then SiLU on the
 * value rounded to y's dtype */
__global__ void k_channel_affine(void *y, int ydt, int64_t yld, const void *x, int xdt, int64_t xld, int64_t C,
                                 int64_t hw, const float *ab, int apply_silu) {
    int64_t n = C * hw;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = k / hw, i = k - c * hw;
        float v = __fadd_rn(__fmul_rn(ld_el(x, xdt, c * xld + i), ab[c]), ab[C + c]);
        if (apply_silu) v = silu_f(rnd_el(v, ydt));
        st_el(y, ydt, c * yld + i, v);
    }
}

void cuda_channel_affine(backend *be, tensor *y, const tensor *x, const float *a, const float *b, int apply_silu) {
    cuda_need_float(y, "channel_affine");
    cuda_need_float(x, "channel_affine");
    if (y->rows != x->rows || y->cols != x->cols) tp_fatal("cuda channel_affine: y and x differ in shape");
    int64_t C = x->rows, hw = x->cols;
    if (C == 0 || hw == 0) return;
    float *d = (float *)cuda_scratch(be, 1, sizeof(float) * 2 * (size_t)C);
    cudaStream_t s = cuda_stream(be);
    /* pageable sources: the copies finish reading a and b before they return */
    CUDA_CHECK(cudaMemcpyAsync(d, a, sizeof(float) * (size_t)C, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(d + C, b, sizeof(float) * (size_t)C, cudaMemcpyHostToDevice, s));
    k_channel_affine<<<cuda_blocks(C * hw, 256), 256, 0, s>>>(y->data, y->dtype, y->ld, x->data, x->dtype, x->ld, C, hw,
                                                             d, apply_silu);
    CUDA_LAUNCHED("channel_affine");
}
