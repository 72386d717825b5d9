/* Elementwise CUDA ops: copy/convert, SiLU, SwiGLU, add, gated residual add,
 * RoPE, and the fill/convert helpers the GEMM path uses. Every kernel walks
 * a [rows, cols] view (row pitch ld) with a grid-stride loop, computes in
 * fp32 and rounds at the points kernels/ops.h names for bf16 outputs. */
#include "cuda_dtype.cuh"

/* one [rows, cols] view: pointer, dtype, row pitch */
struct view {
    void *p;
    int dt;
    int64_t ld;
};
static view view_of(const tensor *t) { return view{t->data, (int)t->dtype, t->ld}; }

#define FOR_EACH_2D(n, cols, ...)                                                        \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);             \
         i += (int64_t)gridDim.x * blockDim.x) {                                          \
        int64_t r = i / (cols), c = i - r * (cols);                                       \
        __VA_ARGS__                                                                       \
    }

__global__ void k_convert(view y, view x, int64_t rows, int64_t cols) {
    FOR_EACH_2D(rows * cols, cols, st_el(y.p, y.dt, r * y.ld + c, ld_el(x.p, x.dt, r * x.ld + c));)
}

__global__ void k_silu(view y, view x, int64_t rows, int64_t cols) {
    FOR_EACH_2D(rows * cols, cols, st_el(y.p, y.dt, r * y.ld + c, silu_f(ld_el(x.p, x.dt, r * x.ld + c)));)
}

__global__ void k_swiglu(view y, view g, view u, int64_t rows, int64_t cols) {
    FOR_EACH_2D(rows * cols, cols, {
        float s = rnd_el(silu_f(ld_el(g.p, g.dt, r * g.ld + c)), y.dt);
        st_el(y.p, y.dt, r * y.ld + c, s * ld_el(u.p, u.dt, r * u.ld + c));
    })
}

/* b_bcast: b is one row broadcast over all rows */
__global__ void k_add(view y, view a, view b, int b_bcast, int64_t rows, int64_t cols) {
    FOR_EACH_2D(rows * cols, cols, {
        float bv = ld_el(b.p, b.dt, (b_bcast ? 0 : r * b.ld) + c);
        st_el(y.p, y.dt, r * y.ld + c, ld_el(a.p, a.dt, r * a.ld + c) + bv);
    })
}

/* x += gate * y; has_gate == 0 means gate 1 */
__global__ void k_gated_add(view x, view g, int has_gate, view y, int64_t rows, int64_t cols) {
    FOR_EACH_2D(rows * cols, cols, {
        float yv = ld_el(y.p, y.dt, r * y.ld + c);
        if (has_gate) yv = rnd_el(ld_el(g.p, g.dt, c) * yv, x.dt);
        int64_t xi = r * x.ld + c;
        st_el(x.p, x.dt, xi, ld_el(x.p, x.dt, xi) + yv);
    })
}

/* One thread per rotated pair. Products and the sum are each rounded to
 * fp32 (no fused multiply-add), as the spec's fl32(x·cos) + fl32(x_rot·sin). */
__global__ void k_rope(view x, const float *cs, const float *sn, int64_t tld, int64_t rows, int nh, int hd,
                       int half_mode) {
    int64_t pairs_per_row = (int64_t)nh * (hd / 2);
    FOR_EACH_2D(rows * pairs_per_row, pairs_per_row, {
        int h = (int)(c / (hd / 2)), j = (int)(c % (hd / 2));
        int d0 = half_mode ? j : 2 * j, d1 = half_mode ? j + hd / 2 : 2 * j + 1;
        int64_t base = r * x.ld + (int64_t)h * hd;
        float x0 = ld_el(x.p, x.dt, base + d0), x1 = ld_el(x.p, x.dt, base + d1);
        const float *cr = cs + r * tld, *sr = sn + r * tld;
        float y0 = __fsub_rn(__fmul_rn(x0, cr[d0]), __fmul_rn(x1, sr[d0]));
        float y1 = __fadd_rn(__fmul_rn(x1, cr[d1]), __fmul_rn(x0, sr[d1]));
        st_el(x.p, x.dt, base + d0, y0);
        st_el(x.p, x.dt, base + d1, y1);
    })
}

/* dst row r = v (row broadcast), or dst[r][c] = v[r] (column broadcast) */
__global__ void k_fill(view d, const void *v, int vdt, int per_row, int64_t rows, int64_t cols) {
    FOR_EACH_2D(rows * cols, cols, st_el(d.p, d.dt, r * d.ld + c, ld_el(v, vdt, per_row ? r : c));)
}

/* ---- host side ---- */

static const int k_threads = 256;

static void same_shape(const tensor *a, const tensor *b, const char *op) {
    if (a->rows != b->rows || a->cols != b->cols)
        tp_fatal("cuda %s: shape mismatch [%lld,%lld] vs [%lld,%lld]", op, (long long)a->rows,
                 (long long)a->cols, (long long)b->rows, (long long)b->cols);
}

void cuda_copy(backend *be, tensor *y, const tensor *x) {
    if (dtype_is_fp8(x->dtype)) {  /* fp8 weight: dequantise */
        cuda_need_float(y, "copy");
        same_shape(y, x, "copy");
        cuda_dequant(be, y->data, y->dtype, y->ld, x);
        return;
    }
    cuda_need_float(y, "copy");
    cuda_need_float(x, "copy");
    same_shape(y, x, "copy");
    if (y->dtype == x->dtype) {  /* same dtype: a strided memcpy */
        size_t es = dtype_size(x->dtype);
        CUDA_CHECK(cudaMemcpy2DAsync(y->data, (size_t)y->ld * es, x->data, (size_t)x->ld * es,
                                     (size_t)x->cols * es, (size_t)x->rows, cudaMemcpyDeviceToDevice,
                                     cuda_stream(be)));
        return;
    }
    int64_t n = x->rows * x->cols;
    if (n == 0) return;
    k_convert<<<cuda_blocks(n, k_threads), k_threads, 0, cuda_stream(be)>>>(view_of(y), view_of(x), x->rows, x->cols);
    CUDA_LAUNCHED("convert");
}

void cuda_convert_2d(backend *be, void *dst, dtype_t ddt, int64_t dld, const void *src, dtype_t sdt, int64_t sld,
                     int64_t rows, int64_t cols) {
    int64_t n = rows * cols;
    if (n == 0) return;
    view d{dst, (int)ddt, dld}, s{(void *)src, (int)sdt, sld};
    k_convert<<<cuda_blocks(n, k_threads), k_threads, 0, cuda_stream(be)>>>(d, s, rows, cols);
    CUDA_LAUNCHED("convert");
}

void cuda_fill_rows(backend *be, void *dst, dtype_t ddt, int64_t dld, int64_t rows, int64_t cols, const void *v,
                    dtype_t vdt) {
    int64_t n = rows * cols;
    if (n == 0) return;
    k_fill<<<cuda_blocks(n, k_threads), k_threads, 0, cuda_stream(be)>>>(view{dst, (int)ddt, dld}, v, (int)vdt, 0,
                                                                         rows, cols);
    CUDA_LAUNCHED("fill");
}

void cuda_fill_cols(backend *be, void *dst, dtype_t ddt, int64_t dld, int64_t rows, int64_t cols, const void *bias,
                    dtype_t bdt) {
    int64_t n = rows * cols;
    if (n == 0) return;
    k_fill<<<cuda_blocks(n, k_threads), k_threads, 0, cuda_stream(be)>>>(view{dst, (int)ddt, dld}, bias, (int)bdt,
                                                                         1, rows, cols);
    CUDA_LAUNCHED("fill");
}

void cuda_silu(backend *be, tensor *y, const tensor *x) {
    cuda_need_float(y, "silu");
    cuda_need_float(x, "silu");
    same_shape(y, x, "silu");
    int64_t n = x->rows * x->cols;
    if (n == 0) return;
    k_silu<<<cuda_blocks(n, k_threads), k_threads, 0, cuda_stream(be)>>>(view_of(y), view_of(x), x->rows, x->cols);
    CUDA_LAUNCHED("silu");
}

void cuda_swiglu(backend *be, tensor *y, const tensor *gate, const tensor *up) {
    cuda_need_float(y, "swiglu");
    cuda_need_float(gate, "swiglu");
    cuda_need_float(up, "swiglu");
    same_shape(y, gate, "swiglu");
    same_shape(y, up, "swiglu");
    int64_t n = y->rows * y->cols;
    if (n == 0) return;
    k_swiglu<<<cuda_blocks(n, k_threads), k_threads, 0, cuda_stream(be)>>>(view_of(y), view_of(gate), view_of(up),
                                                                           y->rows, y->cols);
    CUDA_LAUNCHED("swiglu");
}

void cuda_add(backend *be, tensor *y, const tensor *a, const tensor *b) {
    cuda_need_float(y, "add");
    cuda_need_float(a, "add");
    cuda_need_float(b, "add");
    same_shape(y, a, "add");
    int bcast = b->rows == 1 && a->rows != 1;
    if (b->cols != a->cols || (!bcast && b->rows != a->rows)) same_shape(a, b, "add");
    int64_t n = y->rows * y->cols;
    if (n == 0) return;
    k_add<<<cuda_blocks(n, k_threads), k_threads, 0, cuda_stream(be)>>>(view_of(y), view_of(a), view_of(b), bcast,
                                                                        y->rows, y->cols);
    CUDA_LAUNCHED("add");
}

void cuda_gated_add(backend *be, tensor *x, const tensor *gate, const tensor *y) {
    cuda_need_float(x, "gated_add");
    cuda_need_float(y, "gated_add");
    same_shape(x, y, "gated_add");
    view g{nullptr, (int)DT_F32, 0};
    if (gate) {
        cuda_need_float(gate, "gated_add");
        if (gate->rows != 1 || gate->cols != x->cols) tp_fatal("cuda gated_add: gate must be [1, %lld]", (long long)x->cols);
        g = view_of(gate);
    }
    int64_t n = x->rows * x->cols;
    if (n == 0) return;
    k_gated_add<<<cuda_blocks(n, k_threads), k_threads, 0, cuda_stream(be)>>>(view_of(x), g, gate != nullptr,
                                                                              view_of(y), x->rows, x->cols);
    CUDA_LAUNCHED("gated_add");
}

void cuda_rope(backend *be, tensor *x, const tensor *cos, const tensor *sin, int head_dim, rope_mode mode) {
    cuda_need_float(x, "rope");
    if (cos->dtype != DT_F32 || sin->dtype != DT_F32 || cos->ld != sin->ld)
        tp_fatal("cuda rope: cos/sin tables must be f32 with the same layout");
    if (head_dim <= 0 || head_dim % 2 || x->cols % head_dim || cos->rows != x->rows || cos->cols < head_dim ||
        sin->rows != x->rows || sin->cols < head_dim)
        tp_fatal("cuda rope: bad shapes (x [%lld,%lld], head_dim %d, table [%lld,%lld])", (long long)x->rows,
                 (long long)x->cols, head_dim, (long long)cos->rows, (long long)cos->cols);
    int nh = (int)(x->cols / head_dim);
    int64_t n = x->rows * nh * (head_dim / 2);
    if (n == 0) return;
    k_rope<<<cuda_blocks(n, k_threads), k_threads, 0, cuda_stream(be)>>>(
        view_of(x), (const float *)cos->data, (const float *)sin->data, cos->ld, x->rows, nh, head_dim,
        mode == ROPE_HALF);
    CUDA_LAUNCHED("rope");
}
