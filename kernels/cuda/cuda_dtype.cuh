/* Device helpers shared by the CUDA kernels: loads and stores of f32/bf16
 * elements chosen by a run-time dtype (uniform across a launch, so the
 * branch costs nothing measurable in memory-bound kernels), the bf16
 * rounding the op contracts ask for, and launch bookkeeping. */
#ifndef TPGEN_CUDA_DTYPE_CUH
#define TPGEN_CUDA_DTYPE_CUH
#include <cuda_bf16.h>
#include "cuda_internal.h"
extern "C" {
#include "kernels/err.h"
}

__device__ __forceinline__ float ld_el(const void *p, int dt, int64_t i) {
    return dt == DT_BF16 ? __bfloat162float(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}
__device__ __forceinline__ void st_el(void *p, int dt, int64_t i, float v) {
    if (dt == DT_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else ((float *)p)[i] = v;
}
/* bf16(v) when the result dtype is bf16 (an eager-PyTorch rounding point), else v */
__device__ __forceinline__ float rnd_el(float v, int dt) {
    return dt == DT_BF16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Host side: the op contracts allow f32 and bf16 tensors only. */
static inline void cuda_need_float(const tensor *t, const char *op) {
    if (t->dtype != DT_F32 && t->dtype != DT_BF16)
        tp_fatal("cuda %s: dtype %s is not supported (f32 or bf16)", op, dtype_name(t->dtype));
    if (!t->be || t->be->kind != BACKEND_CUDA) tp_fatal("cuda %s: tensor is not on the CUDA backend", op);
}
static inline unsigned cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);  /* grid-stride loops cover the rest */
}
#define CUDA_LAUNCHED(what) cuda_launched_((what), __FILE__, __LINE__)
#endif
