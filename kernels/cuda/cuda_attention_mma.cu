/* Flash attention on mma.sync (FlashAttention-2 layout), bf16, head_dim 128.
 *
 * A block owns 64 query rows of one head (4 warps x 16 rows) and streams
 * keys in tiles of 64 through shared memory. Each warp keeps everything of
 * its rows in registers: Q as A fragments, the scores S = Q·Kᵀ, the running
 * max/sum, and the fp32 output accumulator O (16 x 128). The score
 * accumulators of two adjacent 8-key tiles are exactly the A fragment of
 * the next product, so P goes to P·V without touching shared memory. V is
 * stored transposed in shared memory so that its B fragments are single
 * 32-bit loads.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16, g = lane/4, t = lane%4):
 *   A (16x16, row): regs {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}
 *   B (16x8, col):  regs {(k 2t..2t+1, n g), (k 2t+8.., n g)}
 *   C (16x8 f32):   {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}
 * Scores are kept in log2 units (scale·log2 e folded in) so exp2f is used. */
#include "cuda_attention.cuh"

#define FA_HD 128
#define FA_BQ 64
#define FA_BK 64
#define FA_LDK (FA_HD + 8)  /* Q and K tile pitch (bf16): conflict-free fragment loads */
#define FA_LDV (FA_BK + 8)  /* Vᵀ tile pitch (bf16) */

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t ld32(const bf16 *p) { return *(const uint32_t *)p; }

/* two floats as bf16x2, the first in the low half (the lower column) */
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

__device__ __forceinline__ float group_max(float v) {  /* over the 4 lanes that share a row */
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float group_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__global__ void __launch_bounds__(128) k_attn_mma(attn_args a) {
    extern __shared__ __align__(16) unsigned char smraw[];
    bf16 *Qs = (bf16 *)smraw, *Ks = Qs + FA_BQ * FA_LDK, *Vt = Ks + FA_BK * FA_LDK;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int64_t q0 = (int64_t)blockIdx.x * FA_BQ;
    const int h = blockIdx.y, kvh = h / (a.hq / a.hkv);
    const bf16 *qh = (const bf16 *)a.q + (int64_t)h * FA_HD;
    const bf16 *kh = (const bf16 *)a.k + (int64_t)kvh * FA_HD;
    const bf16 *vh = (const bf16 *)a.v + (int64_t)kvh * FA_HD;

    for (int i = tid; i < FA_BQ * (FA_HD / 8); i += blockDim.x) {
        int r = i / (FA_HD / 8), c = (i % (FA_HD / 8)) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (q0 + r < a.sq) v = *(const uint4 *)(qh + (q0 + r) * a.qld + c);
        *(uint4 *)(Qs + r * FA_LDK + c) = v;
    }
    __syncthreads();
    uint32_t qa[FA_HD / 16][4];
    const bf16 *qw = Qs + warp * 16 * FA_LDK;
    for (int kk = 0; kk < FA_HD / 16; kk++) {
        qa[kk][0] = ld32(qw + g * FA_LDK + kk * 16 + 2 * t);
        qa[kk][1] = ld32(qw + (g + 8) * FA_LDK + kk * 16 + 2 * t);
        qa[kk][2] = ld32(qw + g * FA_LDK + kk * 16 + 8 + 2 * t);
        qa[kk][3] = ld32(qw + (g + 8) * FA_LDK + kk * 16 + 8 + 2 * t);
    }
    float o[FA_HD / 8][4];
    for (int d = 0; d < FA_HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  /* rows g and g+8 of the warp */
    const float sl2 = a.scale * 1.4426950408889634f;
    const int64_t r0 = q0 + warp * 16 + g, r1 = r0 + 8;
    const bool masked = a.causal || a.key_valid;
    const int64_t kend = key_end(a, q0, FA_BQ);

    for (int64_t k0 = 0; k0 < kend; k0 += FA_BK) {
        __syncthreads();  /* every warp is done with the previous tile */
        for (int i = tid; i < FA_BK * (FA_HD / 8); i += blockDim.x) {
            int r = i / (FA_HD / 8), c = (i % (FA_HD / 8)) * 8;  /* K: coalesced rows */
            uint4 v = make_uint4(0, 0, 0, 0);
            if (k0 + r < a.sk) v = *(const uint4 *)(kh + (k0 + r) * a.kld + c);
            *(uint4 *)(Ks + r * FA_LDK + c) = v;
        }
        for (int i = tid; i < FA_BK * (FA_HD / 8); i += blockDim.x) {
            int r = i % FA_BK, c = (i / FA_BK) * 8;  /* V: lanes walk keys so the transposed stores don't conflict */
            uint4 v = make_uint4(0, 0, 0, 0);
            if (k0 + r < a.sk) v = *(const uint4 *)(vh + (k0 + r) * a.vld + c);
            const bf16 *e = (const bf16 *)&v;
            for (int j = 0; j < 8; j++) Vt[(c + j) * FA_LDV + r] = e[j];
        }
        __syncthreads();

        float s[FA_BK / 8][4];  /* S = Q Kᵀ: 8 tiles of 8 keys */
        for (int j = 0; j < FA_BK / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const bf16 *kr = Ks + (j * 8 + g) * FA_LDK + 2 * t;
            for (int kk = 0; kk < FA_HD / 16; kk++) mma16816(s[j], qa[kk], ld32(kr + kk * 16), ld32(kr + kk * 16 + 8));
        }
        const bool full = !masked && k0 + FA_BK <= a.sk;
        float mx0 = -INFINITY, mx1 = -INFINITY;
        for (int j = 0; j < FA_BK / 8; j++)
            for (int e = 0; e < 2; e++) {
                int64_t kj = k0 + j * 8 + 2 * t + e;
                float v0 = s[j][e] * sl2, v1 = s[j][2 + e] * sl2;
                if (!full) {
                    if (!key_visible(a, r0, kj)) v0 = -INFINITY;
                    if (!key_visible(a, r1, kj)) v1 = -INFINITY;
                }
                s[j][e] = v0;
                s[j][2 + e] = v1;
                mx0 = fmaxf(mx0, v0);
                mx1 = fmaxf(mx1, v1);
            }
        float mn0 = fmaxf(m0, group_max(mx0)), mn1 = fmaxf(m1, group_max(mx1));
        /* a row with nothing visible so far keeps p = 0 and its accumulator */
        float al0 = mn0 == -INFINITY ? 1.0f : exp2f(m0 - mn0), al1 = mn1 == -INFINITY ? 1.0f : exp2f(m1 - mn1);
        float sum0 = 0.0f, sum1 = 0.0f;
        for (int j = 0; j < FA_BK / 8; j++)
            for (int e = 0; e < 2; e++) {
                float p0 = mn0 == -INFINITY ? 0.0f : exp2f(s[j][e] - mn0);
                float p1 = mn1 == -INFINITY ? 0.0f : exp2f(s[j][2 + e] - mn1);
                s[j][e] = p0;
                s[j][2 + e] = p1;
                sum0 += p0;
                sum1 += p1;
            }
        l0 = l0 * al0 + group_sum(sum0);
        l1 = l1 * al1 + group_sum(sum1);
        m0 = mn0;
        m1 = mn1;
        for (int d = 0; d < FA_HD / 8; d++) {
            o[d][0] *= al0; o[d][1] *= al0;
            o[d][2] *= al1; o[d][3] *= al1;
        }
        for (int kk = 0; kk < FA_BK / 16; kk++) {  /* O += P V, 16 keys per step */
            uint32_t pa[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
                              pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            for (int d = 0; d < FA_HD / 8; d++) {
                const bf16 *vr = Vt + (d * 8 + g) * FA_LDV + kk * 16 + 2 * t;
                mma16816(o[d], pa, ld32(vr), ld32(vr + 8));
            }
        }
    }
    bf16 *oh = (bf16 *)a.o + (int64_t)h * FA_HD;
    float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;  /* no visible key -> 0 */
    for (int d = 0; d < FA_HD / 8; d++) {
        int col = d * 8 + 2 * t;
        if (r0 < a.sq) *(uint32_t *)(oh + r0 * a.old + col) = pack2(o[d][0] * inv0, o[d][1] * inv0);
        if (r1 < a.sq) *(uint32_t *)(oh + r1 * a.old + col) = pack2(o[d][2] * inv1, o[d][3] * inv1);
    }
}

void launch_attention_mma(const attn_args &a, cudaStream_t stream) {
    static int configured;
    const size_t smem = sizeof(bf16) * ((size_t)(FA_BQ + FA_BK) * FA_LDK + (size_t)FA_HD * FA_LDV);
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(k_attn_mma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = 1;
    }
    dim3 grid((unsigned)((a.sq + FA_BQ - 1) / FA_BQ), (unsigned)a.hq);
    k_attn_mma<<<grid, 128, smem, stream>>>(a);
    CUDA_LAUNCHED("attention (mma)");
}
