/* Flash-style attention: each block owns a tile of query rows of one head
 * and streams the keys through shared memory in tiles, keeping a running
 * max and sum per row (online softmax), so no Sq x Sk matrix ever exists in
 * global memory. Two kernels:
 * - k_attn_wmma: bf16 q/k/v/o with head_dim 128 (the FLUX.2 and LLM hot
 *   path): Q·Kᵀ and P·V on tensor cores (WMMA 16x16x16, fp32 accumulate),
 *   softmax in fp32 on CUDA cores, P rounded to bf16 for the second product
 *   (as FlashAttention does).
 * - k_attn_hd512: head_dim 512 (the VAE's mid-block attention), f32 or
 *   bf16: 32 query rows a block, the accumulator in registers.
 * - k_attn_generic: any other head dim (small test heads) and f32 inputs;
 *   plain fp32 FMA from shared memory (TPGEN_CUDA_ATTENTION=generic forces
 *   it for head_dim 512 too).
 * Masks (both): causal with q_pos0, key_valid, GQA; rows that see no key
 * get 0 (PyTorch SDPA behaviour). */
#include "cuda_attention.cuh"
#include <mma.h>
#include <stdlib.h>
#include <string.h>

/* Online-softmax update of one row held by a warp: s[0..n) are raw scores
 * (already scaled; -inf when masked). Writes p = exp(s - m_new) through
 * put(j, p), returns the factor that rescales the old accumulator. */
template <typename Put>
__device__ __forceinline__ float softmax_row(const float *s, int n, float *m, float *l, Put put) {
    int lane = threadIdx.x % 32;
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, s[j]);
    mx = warp_max(mx);
    float m_new = fmaxf(*m, mx);
    float alpha = 1.0f, sum = 0.0f;
    if (m_new == -INFINITY) {  /* nothing visible yet in this row */
        for (int j = lane; j < n; j += 32) put(j, 0.0f);
    } else {
        alpha = expf(*m - m_new);  /* exp(-inf) = 0 on the first visible tile */
        for (int j = lane; j < n; j += 32) {
            float p = expf(s[j] - m_new);
            sum += p;
            put(j, p);
        }
    }
    sum = warp_sum(sum);
    __syncwarp();
    if (lane == 0) {
        *l = *l * alpha + sum;
        *m = m_new;
    }
    __syncwarp();
    return alpha;
}

/* ---------------- generic kernel ---------------- */

/* tile rows (queries and keys) for a head dim: keeps shared memory ~70 KB */
static int generic_tile(int hd) {
    int t = 64;
    while (t > 4 && (int64_t)t * hd > 4096) t /= 2;
    return t;
}
static size_t generic_smem(int t, int hd) {
    return sizeof(float) * ((size_t)2 * t * (hd + 1) + (size_t)2 * t * hd + (size_t)t * (t + 1) + 3 * (size_t)t);
}

__global__ void k_attn_generic(attn_args a, int T) {
    extern __shared__ float sm[];
    const int hd = a.hd, qs_ld = hd + 1;
    float *Qs = sm, *Ks = Qs + T * qs_ld, *Vs = Ks + T * qs_ld, *Os = Vs + T * hd, *Ss = Os + T * hd;
    float *mrow = Ss + T * (T + 1), *lrow = mrow + T, *arow = lrow + T;
    const int tid = threadIdx.x, nt = blockDim.x, warp = tid / 32, nwarps = nt / 32;
    const int64_t q0 = (int64_t)blockIdx.x * T;
    const int h = blockIdx.y, kvh = h / (a.hq / a.hkv);

    for (int i = tid; i < T * hd; i += nt) {
        int r = i / hd, d = i % hd;
        Qs[r * qs_ld + d] = q0 + r < a.sq ? ld_el(a.q, a.qdt, (q0 + r) * a.qld + (int64_t)h * hd + d) : 0.0f;
        Os[i] = 0.0f;
    }
    for (int r = tid; r < T; r += nt) { mrow[r] = -INFINITY; lrow[r] = 0.0f; }
    const int64_t kend = key_end(a, q0, T);
    for (int64_t k0 = 0; k0 < kend; k0 += T) {
        __syncthreads();
        for (int i = tid; i < T * hd; i += nt) {
            int r = i / hd, d = i % hd;
            bool in = k0 + r < a.sk;
            Ks[r * qs_ld + d] = in ? ld_el(a.k, a.kdt, (k0 + r) * a.kld + (int64_t)kvh * hd + d) : 0.0f;
            Vs[i] = in ? ld_el(a.v, a.vdt, (k0 + r) * a.vld + (int64_t)kvh * hd + d) : 0.0f;
        }
        __syncthreads();
        for (int i = tid; i < T * T; i += nt) {
            int r = i / T, j = i % T;
            const float *qr = Qs + r * qs_ld, *kr = Ks + j * qs_ld;
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += qr[d] * kr[d];
            Ss[r * (T + 1) + j] = key_visible(a, q0 + r, k0 + j) ? dot * a.scale : -INFINITY;
        }
        __syncthreads();
        for (int r = warp; r < T; r += nwarps) {
            float *srow = Ss + r * (T + 1);
            float al = softmax_row(srow, T, &mrow[r], &lrow[r], [&](int j, float p) { srow[j] = p; });
            if (tid % 32 == 0) arow[r] = al;
        }
        __syncthreads();
        for (int i = tid; i < T * hd; i += nt) {
            int r = i / hd, d = i % hd;
            const float *pr = Ss + r * (T + 1);
            float acc = Os[i] * arow[r];
            for (int j = 0; j < T; j++) acc += pr[j] * Vs[j * hd + d];
            Os[i] = acc;
        }
    }
    __syncthreads();
    for (int i = tid; i < T * hd; i += nt) {
        int r = i / hd, d = i % hd;
        if (q0 + r >= a.sq) continue;
        float l = lrow[r];
        st_el(a.o, a.odt, (q0 + r) * a.old + (int64_t)h * hd + d, l > 0.0f ? Os[i] / l : 0.0f);
    }
}

/* ---------------- tiled kernel for head_dim 512 (the VAE's mid-block attention) ----------------
 * The generic kernel fits only 8 query rows of a 512-wide head in a block,
 * so every 8 rows stream all of K and V again (at 1024x1024, 16384 tokens:
 * ~128 GiB through L2 in f32). Here a block owns H5_BQ = 32 query rows: Q in
 * shared memory, the output accumulator in registers (8 threads a row, 64
 * dimensions each), K and V streamed in tiles of H5_BK = 16 keys through one
 * shared buffer: 4x fewer K/V passes. Scores: one warp per (row, key) pair,
 * lanes split the 512 dimensions (conflict-free), then a warp sum. f32 math,
 * f32 or bf16 storage; ~99 KB of shared memory (fits sm_86/89 too). */
#define H5_HD 512
#define H5_BQ 32
#define H5_BK 16
#define H5_THREADS 256
static size_t hd512_smem() {
    return sizeof(float) * ((size_t)H5_BQ * H5_HD + (size_t)H5_BK * H5_HD + (size_t)H5_BQ * (H5_BK + 1) + 3 * H5_BQ);
}

__global__ void __launch_bounds__(H5_THREADS) k_attn_hd512(attn_args a) {
    extern __shared__ float sm[];
    float *Qs = sm, *KVs = Qs + H5_BQ * H5_HD, *Ss = KVs + H5_BK * H5_HD;
    float *mrow = Ss + H5_BQ * (H5_BK + 1), *lrow = mrow + H5_BQ, *arow = lrow + H5_BQ;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int64_t q0 = (int64_t)blockIdx.x * H5_BQ;
    const int h = blockIdx.y, kvh = h / (a.hq / a.hkv);
    const int r_own = tid / 8, c_own = tid % 8;   /* this thread's output row and first dimension */
    float acc[H5_HD / 8];
#pragma unroll
    for (int i = 0; i < H5_HD / 8; i++) acc[i] = 0.0f;

    for (int i = tid; i < H5_BQ * H5_HD; i += H5_THREADS) {
        int r = i / H5_HD, d = i % H5_HD;
        Qs[i] = q0 + r < a.sq ? ld_el(a.q, a.qdt, (q0 + r) * a.qld + (int64_t)h * H5_HD + d) : 0.0f;
    }
    for (int r = tid; r < H5_BQ; r += H5_THREADS) { mrow[r] = -INFINITY; lrow[r] = 0.0f; }
    const int64_t kend = key_end(a, q0, H5_BQ);
    for (int64_t k0 = 0; k0 < kend; k0 += H5_BK) {
        __syncthreads();   /* the previous tile's V is no longer read */
        for (int i = tid; i < H5_BK * H5_HD; i += H5_THREADS) {
            int r = i / H5_HD, d = i % H5_HD;
            KVs[i] = k0 + r < a.sk ? ld_el(a.k, a.kdt, (k0 + r) * a.kld + (int64_t)kvh * H5_HD + d) : 0.0f;
        }
        __syncthreads();
        for (int pr = warp; pr < H5_BQ * H5_BK; pr += H5_THREADS / 32) {
            int r = pr / H5_BK, j = pr % H5_BK;
            const float *qr = Qs + r * H5_HD, *kr = KVs + j * H5_HD;
            float dot = 0.0f;
#pragma unroll 4
            for (int d = lane; d < H5_HD; d += 32) dot += qr[d] * kr[d];
            dot = warp_sum(dot);
            if (lane == 0) Ss[r * (H5_BK + 1) + j] = key_visible(a, q0 + r, k0 + j) ? dot * a.scale : -INFINITY;
        }
        __syncthreads();   /* scores done: K is no longer read */
        for (int i = tid; i < H5_BK * H5_HD; i += H5_THREADS) {
            int r = i / H5_HD, d = i % H5_HD;
            KVs[i] = k0 + r < a.sk ? ld_el(a.v, a.vdt, (k0 + r) * a.vld + (int64_t)kvh * H5_HD + d) : 0.0f;
        }
        for (int r = warp; r < H5_BQ; r += H5_THREADS / 32) {
            float *srow = Ss + r * (H5_BK + 1);
            float al = softmax_row(srow, H5_BK, &mrow[r], &lrow[r], [&](int j, float p) { srow[j] = p; });
            if (lane == 0) arow[r] = al;
        }
        __syncthreads();
        const float al = arow[r_own], *prow = Ss + r_own * (H5_BK + 1);
#pragma unroll
        for (int i = 0; i < H5_HD / 8; i++) acc[i] *= al;
        for (int j = 0; j < H5_BK; j++) {
            const float p = prow[j], *vr = KVs + j * H5_HD + c_own;
#pragma unroll
            for (int i = 0; i < H5_HD / 8; i++) acc[i] += p * vr[8 * i];
        }
    }
    __syncthreads();
    if (q0 + r_own >= a.sq) return;
    const float l = lrow[r_own];
#pragma unroll
    for (int i = 0; i < H5_HD / 8; i++)
        st_el(a.o, a.odt, (q0 + r_own) * a.old + (int64_t)h * H5_HD + c_own + 8 * i, l > 0.0f ? acc[i] / l : 0.0f);
}

/* ---------------- tensor-core kernel (bf16, head_dim 128) ---------------- */

namespace wm = nvcuda::wmma;
#define WM_HD 128
#define WM_BQ 64            /* 4 warps x 16 query rows */
#define WM_BK 64
#define WM_LDH (WM_HD + 8)  /* bf16 row pitch of Q/K/V tiles (padding against bank conflicts) */
#define WM_LDS (WM_BK + 4)  /* f32 scores */
#define WM_LDP (WM_BK + 8)  /* bf16 probabilities */
#define WM_LDO (WM_HD + 4)  /* f32 output accumulator */

static size_t wmma_smem(void) {
    return 3 * (size_t)WM_BQ * WM_LDH * 2 + (size_t)WM_BQ * WM_LDS * 4 + (size_t)WM_BQ * WM_LDP * 2 +
           (size_t)WM_BQ * WM_LDO * 4 + 3 * (size_t)WM_BQ * 4;
}

/* rows [r0, r0+64) x 128 bf16 of a head into a shared tile, zero past `rows` (16-byte loads) */
__device__ __forceinline__ void load_tile(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int64_t ld, int64_t r0,
                                          int64_t rows) {
    for (int i = threadIdx.x; i < WM_BQ * (WM_HD / 8); i += blockDim.x) {
        int r = i / (WM_HD / 8), c = (i % (WM_HD / 8)) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < rows) v = *(const uint4 *)(src + (r0 + r) * ld + c);
        *(uint4 *)(dst + r * WM_LDH + c) = v;
    }
}

__global__ void __launch_bounds__(128) k_attn_wmma(attn_args a) {
    extern __shared__ __align__(128) unsigned char smraw[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)smraw, *Ks = Qs + WM_BQ * WM_LDH, *Vs = Ks + WM_BK * WM_LDH;
    float *Ss = (float *)(Vs + WM_BK * WM_LDH);
    __nv_bfloat16 *Ps = (__nv_bfloat16 *)(Ss + WM_BQ * WM_LDS);
    float *Os = (float *)(Ps + WM_BQ * WM_LDP);
    float *mrow = Os + WM_BQ * WM_LDO, *lrow = mrow + WM_BQ;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t q0 = (int64_t)blockIdx.x * WM_BQ;
    const int h = blockIdx.y, kvh = h / (a.hq / a.hkv);
    const __nv_bfloat16 *qh = (const __nv_bfloat16 *)a.q + (int64_t)h * WM_HD;
    const __nv_bfloat16 *kh = (const __nv_bfloat16 *)a.k + (int64_t)kvh * WM_HD;
    const __nv_bfloat16 *vh = (const __nv_bfloat16 *)a.v + (int64_t)kvh * WM_HD;

    load_tile(Qs, qh, a.qld, q0, a.sq);
    for (int i = threadIdx.x; i < WM_BQ * WM_LDO; i += blockDim.x) Os[i] = 0.0f;
    for (int r = threadIdx.x; r < WM_BQ; r += blockDim.x) { mrow[r] = -INFINITY; lrow[r] = 0.0f; }
    __syncthreads();
    /* this warp's 16 query rows stay in registers for the whole key loop */
    wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> qf[WM_HD / 16];
    for (int kk = 0; kk < WM_HD / 16; kk++) wm::load_matrix_sync(qf[kk], Qs + warp * 16 * WM_LDH + kk * 16, WM_LDH);
    float *Sw = Ss + warp * 16 * WM_LDS;
    __nv_bfloat16 *Pw = Ps + warp * 16 * WM_LDP;
    float *Ow = Os + warp * 16 * WM_LDO;

    const int64_t kend = key_end(a, q0, WM_BQ);
    for (int64_t k0 = 0; k0 < kend; k0 += WM_BK) {
        __syncthreads();  /* every warp is done with the previous K/V tile */
        load_tile(Ks, kh, a.kld, k0, a.sk);
        load_tile(Vs, vh, a.vld, k0, a.sk);
        __syncthreads();
        for (int jn = 0; jn < WM_BK / 16; jn++) {  /* S = Q Kᵀ, 16 keys at a time */
            wm::fragment<wm::accumulator, 16, 16, 16, float> sf;
            wm::fill_fragment(sf, 0.0f);
            for (int kk = 0; kk < WM_HD / 16; kk++) {
                wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> kf;
                wm::load_matrix_sync(kf, Ks + jn * 16 * WM_LDH + kk * 16, WM_LDH);
                wm::mma_sync(sf, qf[kk], kf, sf);
            }
            wm::store_matrix_sync(Sw + jn * 16, sf, WM_LDS, wm::mem_row_major);
        }
        __syncwarp();
        for (int r = 0; r < 16; r++) {  /* mask, scale, online softmax, rescale O */
            int64_t qi = q0 + warp * 16 + r;
            float *srow = Sw + r * WM_LDS;
            for (int j = lane; j < WM_BK; j += 32)
                srow[j] = key_visible(a, qi, k0 + j) ? srow[j] * a.scale : -INFINITY;
            __syncwarp();
            __nv_bfloat16 *prow = Pw + r * WM_LDP;
            float al = softmax_row(srow, WM_BK, &mrow[warp * 16 + r], &lrow[warp * 16 + r],
                                   [&](int j, float p) { prow[j] = __float2bfloat16_rn(p); });
            for (int d = lane; d < WM_HD; d += 32) Ow[r * WM_LDO + d] *= al;
        }
        __syncwarp();
        for (int dn = 0; dn < WM_HD / 16; dn++) {  /* O += P V, 16 output dims at a time */
            wm::fragment<wm::accumulator, 16, 16, 16, float> of;
            wm::load_matrix_sync(of, Ow + dn * 16, WM_LDO, wm::mem_row_major);
            for (int kk = 0; kk < WM_BK / 16; kk++) {
                wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> pf;
                wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::row_major> vf;
                wm::load_matrix_sync(pf, Pw + kk * 16, WM_LDP);
                wm::load_matrix_sync(vf, Vs + kk * 16 * WM_LDH + dn * 16, WM_LDH);
                wm::mma_sync(of, pf, vf, of);
            }
            wm::store_matrix_sync(Ow + dn * 16, of, WM_LDO, wm::mem_row_major);
        }
        __syncwarp();
    }
    __syncwarp();
    __nv_bfloat16 *oh = (__nv_bfloat16 *)a.o + (int64_t)h * WM_HD;
    for (int r = 0; r < 16; r++) {
        int64_t qi = q0 + warp * 16 + r;
        if (qi >= a.sq) break;
        float l = lrow[warp * 16 + r];
        for (int d = lane; d < WM_HD; d += 32)
            oh[qi * a.old + d] = __float2bfloat16_rn(l > 0.0f ? Ow[r * WM_LDO + d] / l : 0.0f);
    }
}

/* ---------------- host side ---------------- */

static int aligned16(const void *p, int64_t ld) { return ((uintptr_t)p % 16) == 0 && ld % 8 == 0; }

/* Which kernel: the tensor-core ones need bf16 q/k/v/o, head_dim 128 and
 * 16-byte aligned rows. TPGEN_CUDA_ATTENTION=generic|wmma|mma overrides the
 * default (wmma) where the inputs allow it: benchmarks, and the switch to the
 * faster mma kernel once a GPU run has validated it (docs/cuda.md). */
enum attn_kernel { ATTN_GENERIC, ATTN_WMMA, ATTN_MMA };

static attn_kernel pick_kernel(const attn_args &a) {
    if (a.hd != WM_HD || a.qdt != DT_BF16 || a.kdt != DT_BF16 || a.vdt != DT_BF16 || a.odt != DT_BF16)
        return ATTN_GENERIC;
    if (!aligned16(a.q, a.qld) || !aligned16(a.k, a.kld) || !aligned16(a.v, a.vld) || !aligned16(a.o, a.old))
        return ATTN_GENERIC;
    const char *e = getenv("TPGEN_CUDA_ATTENTION");
    if (e && !strcmp(e, "generic")) return ATTN_GENERIC;
    if (e && !strcmp(e, "mma")) return ATTN_MMA;
    return ATTN_WMMA;
}

void cuda_attention(backend *be, tensor *o, const tensor *q, const tensor *k, const tensor *v,
                    const attn_params *p) {
    cuda_need_float(o, "attention");
    cuda_need_float(q, "attention");
    cuda_need_float(k, "attention");
    cuda_need_float(v, "attention");
    int hd = p->head_dim, hq = p->n_q_heads, hkv = p->n_kv_heads;
    if (hd <= 0 || hq <= 0 || hkv <= 0 || hq % hkv || q->cols != (int64_t)hq * hd || o->cols != q->cols ||
        o->rows != q->rows || k->cols < (int64_t)hkv * hd || v->cols < (int64_t)hkv * hd || k->rows != v->rows)
        tp_fatal("cuda attention: bad shapes (q [%lld,%lld], k [%lld,%lld], v [%lld,%lld], o [%lld,%lld], "
                 "heads %d/%d, head_dim %d)", (long long)q->rows, (long long)q->cols, (long long)k->rows,
                 (long long)k->cols, (long long)v->rows, (long long)v->cols, (long long)o->rows, (long long)o->cols,
                 hq, hkv, hd);
    if (p->key_valid && (p->key_valid->dtype != DT_I32 || p->key_valid->cols != k->rows))
        tp_fatal("cuda attention: key_valid must be i32 [1, %lld]", (long long)k->rows);
    if (hd > 2048) tp_fatal("cuda attention: head_dim %d is above the supported 2048", hd);
    if (q->rows == 0) return;
    attn_args a = {q->data, k->data, v->data, o->data, q->ld, k->ld, v->ld, o->ld,
                   (int)q->dtype, (int)k->dtype, (int)v->dtype, (int)o->dtype, q->rows, k->rows,
                   hq, hkv, hd, p->scale, p->causal, p->q_pos0,
                   p->key_valid ? (const int32_t *)p->key_valid->data : nullptr};
    if (hq > 65535) tp_fatal("cuda attention: too many heads (%d)", hq);
    attn_kernel kind = pick_kernel(a);
    if (kind == ATTN_MMA) {
        launch_attention_mma(a, cuda_stream(be));
        return;
    }
    if (kind == ATTN_WMMA) {
        static int configured;
        size_t smem = wmma_smem();
        if (!configured) {
            CUDA_CHECK(cudaFuncSetAttribute(k_attn_wmma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            configured = 1;
        }
        dim3 grid((unsigned)((q->rows + WM_BQ - 1) / WM_BQ), (unsigned)hq);
        k_attn_wmma<<<grid, 128, smem, cuda_stream(be)>>>(a);
        CUDA_LAUNCHED("attention (wmma)");
        return;
    }
    const char *env = getenv("TPGEN_CUDA_ATTENTION");
    if (hd == H5_HD && !(env && !strcmp(env, "generic"))) {
        static int configured512;
        size_t smem = hd512_smem();
        if (!configured512) {
            CUDA_CHECK(cudaFuncSetAttribute(k_attn_hd512, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            configured512 = 1;
        }
        dim3 grid((unsigned)((q->rows + H5_BQ - 1) / H5_BQ), (unsigned)hq);
        k_attn_hd512<<<grid, H5_THREADS, smem, cuda_stream(be)>>>(a);
        CUDA_LAUNCHED("attention (tiled, head_dim 512)");
        return;
    }
    int T = generic_tile(hd);
    size_t smem = generic_smem(T, hd);
    static size_t configured;
    if (smem > configured) {
        CUDA_CHECK(cudaFuncSetAttribute(k_attn_generic, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = smem;
    }
    dim3 grid((unsigned)((q->rows + T - 1) / T), (unsigned)hq);
    k_attn_generic<<<grid, 128, smem, cuda_stream(be)>>>(a, T);
    CUDA_LAUNCHED("attention (generic)");
}
