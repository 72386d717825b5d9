/* fp8 weights on CUDA: the dequantise kernel (decode(code) x scale, per
 * tensor or per row, to bf16 or f32). op_copy from an fp8 tensor is this
 * kernel; op_gemm with an fp8 weight dequantises the weight into scratch
 * and runs the bf16/f32 cuBLAS GEMM (the sm_80 path of issue 12, used on
 * every GPU for now: a cuBLASLt FP8 tensor-core GEMM for sm_89/sm_90 is not
 * written yet, docs/fp8.md). The decode is arithmetic from the format
 * definitions, the same values as core/tensor.c's table. UNVERIFIED on
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
