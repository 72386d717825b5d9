/* Shared by the attention kernels: the launch arguments and the masks. */
#ifndef TPGEN_CUDA_ATTENTION_CUH
#define TPGEN_CUDA_ATTENTION_CUH
#include "cuda_dtype.cuh"

struct attn_args {
    const void *q, *k, *v;
    void *o;
    int64_t qld, kld, vld, old;
    int qdt, kdt, vdt, odt;
    int64_t sq, sk;
    int hq, hkv, hd;
    float scale;
    int causal;
    int64_t q_pos0;
    const int32_t *key_valid;
};

__device__ __forceinline__ bool key_visible(const attn_args &a, int64_t qi, int64_t kj) {
    if (kj >= a.sk) return false;
    if (a.causal && kj > a.q_pos0 + qi) return false;
    return !a.key_valid || a.key_valid[kj] != 0;
}

/* one past the last key any query row of [q0, q0+rows) may see */
__device__ __forceinline__ int64_t key_end(const attn_args &a, int64_t q0, int rows) {
    int64_t last = q0 + rows - 1 < a.sq - 1 ? q0 + rows - 1 : a.sq - 1;
    int64_t e = a.causal ? a.q_pos0 + last + 1 : a.sk;
    return e < a.sk ? (e > 0 ? e : 0) : a.sk;
}

/* the tensor-core kernel on mma.sync (cuda_attention_mma.cu): bf16, head_dim 128 */
void launch_attention_mma(const attn_args &a, cudaStream_t stream);

#endif
