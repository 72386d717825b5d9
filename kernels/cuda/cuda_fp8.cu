/* fp8 weights on CUDA: the dequantise kernel (decode(code) x scale, per
 * tensor or per row, to bf16 or f32). op_copy from an fp8 tensor is this
 * kernel; op_gemm with an fp8 weight dequantises the weight into scratch
 * and runs the bf16/f32 cuBLAS GEMM (the sm_80 path of issue 12, used on
 * every GPU for now: a cuBLASLt FP8 tensor-core GEMM for sm_89/sm_90 is not
 * written yet, docs/fp8.md). The decode is arithmetic from the format
 * definitions, the same values as kernels/tensor.c's table. UNVERIFIED on
 * hardware: compiled here, op-tested against the CPU backend by
 * scripts/gpu-check.sh (TEST_GPU gpu_fp8_*). */
#include "cuda_dtype.cuh"

__device__ __forceinline__ float fp8_decode_dev(unsigned c, int e5m2) {
    int s = c >> 7;
    float v;
    if (!e5m2) {   /* E4M3 fn: bias 7, S.1111.111 NaN, no inf */
        int e = (c >> 3) & 15, m = c & 7;
        if (e == 15 && m == 7) return __int_as_float(0x7fc00000);
        v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    } else {       /* E5M2: bias 15, exponent 31 inf/NaN */
        int e = (c >> 2) & 31, m = c & 3;
        if (e == 31) v = m ? __int_as_float(0x7fc00000) : __int_as_float(0x7f800000);
        else v = e ? ldexpf((float)(4 + m), e - 17) : ldexpf((float)m, -16);
    }
    return s ? -v : v;
}

__global__ void k_dequant(void *dst, int ddt, int64_t dld, const uint8_t *src, int64_t sld, int e5m2,
                          const float *scale, int per_row, int64_t rows, int64_t cols) {
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        float s = scale ? scale[per_row ? r : 0] : 1.0f;
        st_el(dst, ddt, r * dld + c, fp8_decode_dev(src[r * sld + c], e5m2) * s);
    }
}

extern "C" void cuda_dequant(backend *be, void *dst, dtype_t ddt, int64_t dld, const tensor *w) {
    if (!dtype_is_fp8(w->dtype)) tp_fatal("cuda dequant: %s is not an fp8 dtype", dtype_name(w->dtype));
    if (ddt != DT_F32 && ddt != DT_BF16) tp_fatal("cuda dequant: output %s (f32 or bf16)", dtype_name(ddt));
    int64_t n = w->rows * w->cols;
    if (n == 0) return;
    k_dequant<<<cuda_blocks(n, 256), 256, 0, cuda_stream(be)>>>(dst, (int)ddt, dld, (const uint8_t *)w->data, w->ld,
                                                                w->dtype == DT_F8_E5M2, (const float *)w->scale,
                                                                w->scale_per_row, w->rows, w->cols);
    CUDA_LAUNCHED("dequant");
}

/* ---- the fp8 tensor-core path (cuda_gemm_fp8.c): dynamic per-tensor
 * activation quantisation and the per-channel epilogue ---- */
#include <cuda_fp8.h>

/* amax over a [rows, cols] view of x (bf16/f32), as float bits (|x| >= 0
 * orders like its bits) */
__global__ void k_absmax(const void *x, int dt, int64_t ld, int64_t rows, int64_t cols, unsigned *amax) {
    float m = 0;
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        float v = fabsf(ld_el(x, dt, r * ld + c));
        m = v > m ? v : (v != v ? INFINITY : m);   /* a NaN activation poisons the scale (visible, not hidden) */
    }
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) atomicMax(amax, __float_as_uint(m));
}

/* q = e4m3(x / s), s = amax / 448 (1 when amax is 0), saturating; s stored */
__global__ void k_quant_e4m3(const void *x, int dt, int64_t ld, int64_t rows, int64_t cols, const unsigned *amax,
                             __nv_fp8_storage_t *q, float *s_out) {
    float a = __uint_as_float(*amax), s = a > 0 ? a / 448.0f : 1.0f, inv = 1.0f / s;
    int64_t n = rows * cols;
    if (blockIdx.x == 0 && threadIdx.x == 0) *s_out = s;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        q[i] = __nv_cvt_float_to_fp8(ld_el(x, dt, r * ld + c) * inv, __NV_SATFINITE, __NV_E4M3);
    }
}

/* y[r, c] = acc[r, c] * sw[c or 0] (+ bias[c]), rounded once to y's dtype */
__global__ void k_fp8_epilogue(void *y, int ydt, int64_t yld, const float *acc, int64_t rows, int64_t cols,
                               const float *sw, int per_col, const void *bias, int bdt) {
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        float v = acc[i] * (sw ? sw[per_col ? c : 0] : 1.0f);
        if (bias) v += ld_el(bias, bdt, c);
        st_el(y, ydt, r * yld + c, v);
    }
}

/* x (activations, [rows, cols] view) -> q (contiguous E4M3) and *s_dev */
extern "C" void cuda_quantize_act_e4m3(backend *be, const tensor *x, void *q, float *s_dev, unsigned *amax_dev) {
    int64_t n = x->rows * x->cols;
    CUDA_CHECK(cudaMemsetAsync(amax_dev, 0, sizeof(unsigned), cuda_stream(be)));
    if (n == 0) return;
    unsigned blocks = cuda_blocks(n, 256);
    if (blocks > 1024) blocks = 1024;   /* grid-stride: few atomics */
    k_absmax<<<blocks, 256, 0, cuda_stream(be)>>>(x->data, (int)x->dtype, x->ld, x->rows, x->cols, amax_dev);
    CUDA_LAUNCHED("fp8 absmax");
    k_quant_e4m3<<<cuda_blocks(n, 256), 256, 0, cuda_stream(be)>>>(x->data, (int)x->dtype, x->ld, x->rows, x->cols,
                                                                   amax_dev, (__nv_fp8_storage_t *)q, s_dev);
    CUDA_LAUNCHED("fp8 quantise");
}

extern "C" void cuda_fp8_epilogue(backend *be, tensor *y, const float *acc, const float *sw, int per_col,
                                  const tensor *bias) {
    int64_t n = y->rows * y->cols;
    if (n == 0) return;
    k_fp8_epilogue<<<cuda_blocks(n, 256), 256, 0, cuda_stream(be)>>>(y->data, (int)y->dtype, y->ld, acc, y->rows, y->cols,
                                                                     sw, per_col, bias ? bias->data : NULL,
                                                                     bias ? (int)bias->dtype : 0);
    CUDA_LAUNCHED("fp8 epilogue");
}

/* embedding rows from an fp8 table (an fp8 text encoder's embed_tokens):
 * y[i] = decode(table[ids[i] - row0]) * scale, 0 for another shard's row */
__global__ void k_gather_fp8(void *y, int ydt, int64_t yld, const uint8_t *t, int e5m2, int64_t tld, int64_t trows,
                             int64_t cols, const float *scale, int per_row, const int32_t *ids, int64_t n, int64_t row0) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * cols; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i % cols, src = (int64_t)ids[r] - row0;
        float v = 0.0f;
        if (src >= 0 && src < trows) v = fp8_decode_dev(t[src * tld + c], e5m2) * (scale ? scale[per_row ? src : 0] : 1.0f);
        st_el(y, ydt, r * yld + c, v);
    }
}

extern "C" void cuda_gather_rows_fp8(backend *be, tensor *y, const tensor *table, const int32_t *d_ids, int64_t n,
                                     int64_t row0) {
    k_gather_fp8<<<cuda_blocks(n * y->cols, 256), 256, 0, cuda_stream(be)>>>(
        y->data, (int)y->dtype, y->ld, (const uint8_t *)table->data, table->dtype == DT_F8_E5M2, table->ld, table->rows,
        y->cols, (const float *)table->scale, table->scale_per_row, d_ids, n, row0);
    CUDA_LAUNCHED("gather_rows fp8");
}
