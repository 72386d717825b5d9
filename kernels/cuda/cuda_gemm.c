/* GEMM and convolution on cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F: fp32
 * accumulation for bf16 and a true-fp32 path for f32 reference runs; TF32
 * is never enabled).
 *
 * Row-major y = x·Wᵀ maps onto column-major cuBLAS as in spec
 * docs/spec/flux2-transformer.md §7.5: yᵀ[N,M] = op_T(W as [K,N], ld w.ld) · (x as [K,M],
 * ld x.ld), ldc = y.ld, so views with ld > cols go straight through.
 *
 * Mixed dtypes (f32 x with bf16 W, ...) upcast the bf16 operand to f32 in
 * scratch (exact). Outputs cuBLAS cannot write directly (bf16 from f32
 * inputs, or an f32 bias into a bf16 output) are computed in an f32 scratch
 * and converted, so y is always rounded once, after the bias.
 *
 * Quantised GGUF weights (DT_GGML) are decoded tile by tile over their rows
 * into scratch in x's dtype (cuda_ggml.cu) and multiplied by the same
 * cuBLAS path (gemm_ggml). */
#include "cuda_internal.h"
#include "kernels/err.h"
#include <stdlib.h>

static cudaDataType_t cuda_type(dtype_t dt) { return dt == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

static void need_int(int64_t v, const char *what) {
    if (v < 0 || v > 0x7fffffff) tp_fatal("cuda gemm: %s = %lld does not fit cuBLAS's int", what, (long long)v);
}

/* C = op(A)·op(B) + beta·C, column-major; A and B share a dtype. */
static void gemm_raw(backend *be, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                     const void *A, int64_t lda, const void *B, int64_t ldb, dtype_t in_dt, void *C, int64_t ldc,
                     dtype_t c_dt, float beta) {
    need_int(m, "m"); need_int(n, "n"); need_int(k, "k");
    need_int(lda, "lda"); need_int(ldb, "ldb"); need_int(ldc, "ldc");
    float alpha = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(cuda_of(be)->blas, ta, tb, (int)m, (int)n, (int)k, &alpha, A, cuda_type(in_dt), (int)lda,
                              B, cuda_type(in_dt), (int)ldb, &beta, C, cuda_type(c_dt), (int)ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    cuda_launched_("cublasGemmEx", __FILE__, __LINE__);
}

/* Tiles and chunks start at multiples of CUDA_ALIGN_ELEMS elements, so that
 * every GEMM after the first still gets 256-byte-aligned pointers (the
 * fastest cuBLAS kernels want them): 128 elements are 256 bytes of bf16. */
#define CUDA_ALIGN_ELEMS 128
static int64_t round_tile(int64_t t) { return t >= CUDA_ALIGN_ELEMS ? t / CUDA_ALIGN_ELEMS * CUDA_ALIGN_ELEMS : t; }

/* Can cuBLAS write an output of dtype out_dt (with this bias) directly? */
static int direct_output(dtype_t in_dt, dtype_t out_dt, const tensor *bias) {
    if (in_dt == DT_F32 && out_dt != DT_F32) return 0;
    return !bias || bias->dtype == out_dt || out_dt == DT_F32;
}

static void need_float(const tensor *t, const char *op) {
    if (t->dtype != DT_F32 && t->dtype != DT_BF16)
        tp_fatal("cuda %s: dtype %s is not supported (f32 or bf16)", op, dtype_name(t->dtype));
}

/* a contiguous f32 copy of a bf16 operand in scratch `slot` */
static const void *as_f32(backend *be, const tensor *t, int slot, int64_t *ld) {
    if (t->dtype == DT_F32) { *ld = t->ld; return t->data; }
    void *d = cuda_scratch(be, slot, sizeof(float) * tensor_numel(t));
    cuda_convert_2d(be, d, DT_F32, t->cols, t->data, t->dtype, t->ld, t->rows, t->cols);
    *ld = t->cols;
    return d;
}

static void check_shapes(const tensor *y, const tensor *x, const tensor *w, const tensor *bias) {
    if (x->cols != w->cols || y->rows != x->rows || y->cols != w->rows || (bias && bias->cols != w->rows))
        tp_fatal("cuda gemm: bad shapes y [%lld,%lld] = x [%lld,%lld] · w [%lld,%lld]ᵀ", (long long)y->rows,
                 (long long)y->cols, (long long)x->rows, (long long)x->cols, (long long)w->rows, (long long)w->cols);
}

/* y = x·wᵀ (+ bias) with f32/bf16 operands: cuBLAS */
static void gemm_dense(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias) {
    need_float(y, "gemm"); need_float(x, "gemm"); need_float(w, "gemm");
    check_shapes(y, x, w, bias);
    if (bias) need_float(bias, "gemm bias");
    int64_t M = x->rows, N = w->rows, K = x->cols;
    if (M == 0 || N == 0) return;
    if (K == 0) {  /* an empty sum: y = bias, or 0 */
        if (bias) cuda_fill_rows(be, y->data, y->dtype, y->ld, M, N, bias->data, bias->dtype);
        else CUDA_CHECK(cudaMemset2DAsync(y->data, (size_t)y->ld * dtype_size(y->dtype), 0,
                                          (size_t)N * dtype_size(y->dtype), (size_t)M, cuda_stream(be)));
        return;
    }
    const void *X = x->data, *W = w->data;
    int64_t xld = x->ld, wld = w->ld;
    dtype_t in_dt = x->dtype;
    if (x->dtype != w->dtype) {  /* upcast whichever operand is bf16 */
        X = as_f32(be, x, 1, &xld);
        W = as_f32(be, w, 1, &wld);
        in_dt = DT_F32;
    }
    int direct = direct_output(in_dt, y->dtype, bias);
    void *C = y->data;
    int64_t ldc = y->ld;
    dtype_t c_dt = y->dtype;
    if (!direct) {
        C = cuda_scratch(be, 0, sizeof(float) * (size_t)M * (size_t)N);
        ldc = N;
        c_dt = DT_F32;
    }
    if (bias) cuda_fill_rows(be, C, c_dt, ldc, M, N, bias->data, bias->dtype);
    gemm_raw(be, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, W, wld, X, xld, in_dt, C, ldc, c_dt, bias ? 1.0f : 0.0f);
    if (!direct) cuda_convert_2d(be, y->data, y->dtype, y->ld, C, DT_F32, N, M, N);
}

/* the rows of a DT_GGML weight decoded per tile: TPGEN_CUDA_GGML_TILE_BYTES or CUDA_GGML_TILE_BYTES */
static size_t ggml_tile_bytes(void) {
    const char *e = getenv("TPGEN_CUDA_GGML_TILE_BYTES");
    long long v = e ? atoll(e) : 0;
    return v > 0 ? (size_t)v : CUDA_GGML_TILE_BYTES;
}

/* A GGUF block weight: tiles of its rows decoded into scratch in x's dtype
 * (f32 x: the exact f32 values, the CPU's bit for bit; bf16 x: those values
 * rounded to bf16 once), each multiplied by cuBLAS into its columns of y;
 * at most one tile (ggml_tile_bytes) is ever decoded, never the whole
 * weight. */
static void gemm_ggml(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias) {
    need_float(y, "gemm"); need_float(x, "gemm");
    check_shapes(y, x, w, bias);
    if (bias) need_float(bias, "gemm bias");
    int64_t N = w->rows, K = w->cols;
    if (x->rows == 0 || N == 0) return;
    size_t es = dtype_size(x->dtype), row = (size_t)K * es;
    int64_t tile = row ? (int64_t)(ggml_tile_bytes() / row) : N;
    if (tile < 1) tile = 1;
    tile = round_tile(tile);
    if (tile > N) tile = N;
    for (int64_t r0 = 0; r0 < N; r0 += tile) {
        int64_t nr = N - r0 < tile ? N - r0 : tile;
        tensor wd = tensor_wrap(be, x->dtype, nr, K, cuda_scratch(be, 2, row * (size_t)nr));
        cuda_ggml_dequant(be, wd.data, wd.dtype, wd.ld, w, r0, nr);
        tensor yv = tensor_cols(y, r0, nr), bv = yv;
        if (bias) bv = tensor_cols(bias, r0, nr);
        gemm_dense(be, &yv, x, &wd, bias ? &bv : NULL);
    }
}

void cuda_gemm(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias) {
    tensor wd;
    if (w->dtype == DT_GGML) {
        gemm_ggml(be, y, x, w, bias);
        return;
    }
    /* E4M3 weights on sm_89+: the fp8 tensor cores (cuda_gemm_fp8.c) */
    if (dtype_is_fp8(w->dtype) && x->cols == w->cols && y->rows == x->rows && y->cols == w->rows &&
        cuda_gemm_fp8_applies(be, y, x, w) && cuda_gemm_fp8(be, y, x, w, bias) == 0)
        return;
    if (dtype_is_fp8(w->dtype)) {
        /* fp8 weight: dequantised into scratch in x's dtype (bf16 x: the
         * decoded codes times the scale rounded to bf16 once), then the
         * ordinary GEMM; one weight's local shard at a time */
        need_float(x, "gemm");
        wd = tensor_wrap(be, x->dtype, w->rows, w->cols,
                         cuda_scratch(be, 2, dtype_size(x->dtype) * (size_t)w->rows * (size_t)w->cols));
        cuda_dequant(be, wd.data, wd.dtype, wd.ld, w);
        w = &wd;
    }
    gemm_dense(be, y, x, w, bias);
}

/* Convolution = im2col over a chunk of output pixels + one GEMM per chunk:
 * y[:, p0:p0+np] (row-major [Cout, np], ld y.ld) = W[Cout, CinKK] · col[CinKK, np],
 * i.e. column-major yᵀ = colᵀ · Wᵀ with both operands untransposed.
 * Chunks keep the im2col buffer near 128 MB whatever the image size. */
/* down != 0: op_conv2d_down (3x3, stride 2, output (h/2) x (wd/2) pixels) */
static void conv_impl(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias, int64_t h,
                      int64_t wd, int k, int down) {
    need_float(y, "conv2d"); need_float(x, "conv2d"); need_float(w, "conv2d");
    int64_t hw = h * wd, cin = x->rows, cout = w->rows, ckk = cin * k * k;
    int64_t ohw = down ? (h / 2) * (wd / 2) : hw;
    if ((k != 1 && k != 3) || x->cols != hw || y->cols != ohw || y->rows != cout || w->cols != ckk ||
        (bias && bias->cols != cout) || (down && (k != 3 || h % 2 || wd % 2)))
        tp_fatal("cuda conv2d: bad shapes (x [%lld,%lld], w [%lld,%lld], y [%lld,%lld], %lldx%lld, k %d%s)",
                 (long long)x->rows, (long long)x->cols, (long long)w->rows, (long long)w->cols, (long long)y->rows,
                 (long long)y->cols, (long long)h, (long long)wd, k, down ? ", stride 2" : "");
    if (bias) need_float(bias, "conv2d bias");
    if (ohw == 0 || cout == 0) return;
    dtype_t ct = (x->dtype == DT_F32 || w->dtype == DT_F32) ? DT_F32 : DT_BF16;
    const void *W = w->data;
    int64_t wld = w->ld;
    if (w->dtype != ct) W = as_f32(be, w, 1, &wld);
    size_t es = dtype_size(ct);
    int64_t chunk = (int64_t)(((size_t)128 << 20) / ((size_t)ckk * es));
    if (chunk < 256) chunk = 256;
    chunk = round_tile(chunk);
    if (chunk > ohw) chunk = ohw;
    int direct = direct_output(ct, y->dtype, bias);
    for (int64_t p0 = 0; p0 < ohw; p0 += chunk) {
        int64_t np = ohw - p0 < chunk ? ohw - p0 : chunk;
        const void *col;
        int64_t cld;
        if (k == 1 && x->dtype == ct) {  /* a 1x1 convolution reads x in place */
            col = (const char *)x->data + (size_t)p0 * es;
            cld = x->ld;
        } else {
            void *c = cuda_scratch(be, 0, (size_t)ckk * (size_t)np * es);
            if (down) cuda_im2col_down(be, c, ct, x->data, x->dtype, x->ld, cin, h, wd, p0, np);
            else cuda_im2col(be, c, ct, x->data, x->dtype, x->ld, cin, h, wd, k, p0, np);
            col = c;
            cld = np;
        }
        void *C = (char *)y->data + (size_t)p0 * dtype_size(y->dtype);
        int64_t ldc = y->ld;
        dtype_t c_dt = y->dtype;
        if (!direct) {
            C = cuda_scratch(be, 2, sizeof(float) * (size_t)cout * (size_t)np);
            ldc = np;
            c_dt = DT_F32;
        }
        if (bias) cuda_fill_cols(be, C, c_dt, ldc, cout, np, bias->data, bias->dtype);
        gemm_raw(be, CUBLAS_OP_N, CUBLAS_OP_N, np, cout, ckk, col, cld, W, wld, ct, C, ldc, c_dt, bias ? 1.0f : 0.0f);
        if (!direct)
            cuda_convert_2d(be, (char *)y->data + (size_t)p0 * dtype_size(y->dtype), y->dtype, y->ld, C, DT_F32, np,
                            cout, np);
    }
}

void cuda_conv2d(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias, int64_t h, int64_t wd,
                 int k) {
    conv_impl(be, y, x, w, bias, h, wd, k, 0);
}

void cuda_conv2d_down(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias, int64_t h,
                      int64_t wd) {
    conv_impl(be, y, x, w, bias, h, wd, 3, 1);
}
