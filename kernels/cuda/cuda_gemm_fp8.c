/* The fp8 tensor-core GEMM (sm_89 / sm_90 and newer): cuBLASLt with E4M3
 * weights x E4M3 activations, fp32 accumulation.
 *
 * y = x · (decode(w)·sw)ᵀ ≈ sx·sw · (qx · qwᵀ): the activations are
 * quantised per call with one dynamic scale sx = amax(x)/448
 * (cuda_quantize_act_e4m3); a per-tensor weight scale goes to cuBLASLt as
 * the A scale and the result is written in bf16 directly; a per-channel
 * weight scale (one per output column of y) and a bias are applied by a
 * fused epilogue kernel on an f32 result. Same mapping as cuda_gemm.c:
 * column-major yᵀ[N, M] = Wᵀ · x, which is cuBLASLt's required "TN" layout
 * for fp8 (A transposed, B not).
 *
 * Used only when it applies: bf16 activations, an E4M3 weight without the
 * full_precision_matrix_mult hint, a device of compute capability >= 8.9,
 * dimensions and leading dimensions multiples of 16, a heuristic algorithm
 * found (the search's result is cached per shape), and TPGEN_FP8_GEMM not set to 0; otherwise cuda_gemm dequantises
 * (cuda_fp8.cu). UNVERIFIED on hardware (no GPU has been lent to this
 * project): TEST_GPU gpu_fp8_tensor_core_gemm compares it with the CPU. */
#include "cuda_internal.h"
#include "kernels/err.h"
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cuda_quantize_act_e4m3(backend *be, const tensor *x, void *q, float *s_dev, unsigned *amax_dev);
void cuda_fp8_epilogue(backend *be, tensor *y, const float *acc, const float *sw, int per_col, const tensor *bias);

typedef struct fp8_state {
    backend *be;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    float *scal;              /* device: [0] activation scale, [1] amax bits */
    int cc;                   /* compute capability * 10 */
} fp8_state;

/* cuBLASLt's algorithm search is not free: its result is kept per shape
 * and layout (the pointers do not enter it: the preference says A may be only
 * 16-byte aligned), including "no algorithm" */
#define FP8_ALGO_CACHE 64
typedef struct {
    int64_t M, N, K, wld, cld;
    int direct, ascale, found, used;
    cublasLtMatmulAlgo_t algo;
} fp8_algo;
static fp8_algo g_algos[FP8_ALGO_CACHE];
static int g_algo_next;
/* one backend at a time uses the fp8 path (the process's GPU backend) */
static fp8_state g_fp8;

void cuda_fp8_release(backend *be) {
    if (g_fp8.be != be) return;
    if (g_fp8.lt) cublasLtDestroy(g_fp8.lt);
    if (g_fp8.workspace) cudaFree(g_fp8.workspace);
    if (g_fp8.scal) cudaFree(g_fp8.scal);
    memset(&g_fp8, 0, sizeof g_fp8);
    memset(g_algos, 0, sizeof g_algos);
    g_algo_next = 0;
}

static fp8_state *state(backend *be) {
    if (g_fp8.be == be) return g_fp8.cc ? &g_fp8 : NULL;
    if (g_fp8.be) return NULL;
    g_fp8.be = be;
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, be->device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, be->device);
    if (major * 10 + minor < 89) return NULL;   /* g_fp8.cc stays 0: the dequantising path */
    g_fp8.workspace_bytes = (size_t)32 << 20;
    if (cublasLtCreate(&g_fp8.lt) != CUBLAS_STATUS_SUCCESS || cudaMalloc(&g_fp8.workspace, g_fp8.workspace_bytes) ||
        cudaMalloc((void **)&g_fp8.scal, 2 * sizeof(float)))
        return NULL;
    g_fp8.cc = major * 10 + minor;
    return &g_fp8;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

int cuda_gemm_fp8_applies(backend *be, const tensor *y, const tensor *x, const tensor *w) {
    const char *env = getenv("TPGEN_FP8_GEMM");   /* read per call: cuda_bench times both paths */
    if (env && !strcmp(env, "0")) return 0;
    if (w->dtype != DT_F8_E4M3 || x->dtype != DT_BF16 || (w->quant_flags & TQ_FULL_PRECISION_MM)) return 0;
    if (w->rows % 16 || w->cols % 16 || w->ld % 16 || !aligned16(w->data) || x->rows < 1) return 0;
    return state(be) != NULL;
}

long cuda_fp8_algo_searches;   /* heuristic queries so far (tests read it) */

static fp8_algo *algo_lookup(int64_t M, int64_t N, int64_t K, int64_t wld, int64_t cld, int direct, int ascale) {
    for (int i = 0; i < FP8_ALGO_CACHE; i++) {
        fp8_algo *a = &g_algos[i];
        if (a->used && a->M == M && a->N == N && a->K == K && a->wld == wld && a->cld == cld && a->direct == direct &&
            a->ascale == ascale)
            return a;
    }
    return NULL;
}

/* a cuBLASLt call that must not fail silently (a failed scale-pointer set
 * would leave the result unscaled): warn once and take the dequantising path */
#define LT_TRY(call)                                                                                           \
    do {                                                                                                       \
        cublasStatus_t st_ = (call);                                                                           \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                    \
            static int warned_;                                                                                \
            if (!warned_++)                                                                                    \
                fprintf(stderr, "tpgen: warning: cuBLASLt %s failed (%s at %s:%d); fp8 GEMMs take the "         \
                        "dequantising path\n", #call, cublasGetStatusString(st_), __FILE__, __LINE__);          \
            goto out;                                                                                          \
        }                                                                                                      \
    } while (0)

/* 0 done; -1 when cuBLASLt has no algorithm for the shape or a descriptor
 * call failed (the caller falls back to the dequantising path) */
int cuda_gemm_fp8(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias) {
    fp8_state *s = state(be);
    int64_t M = x->rows, N = w->rows, K = x->cols;
    int per_col = w->scale && w->scale_per_row;
    int direct = !per_col && !bias && y->dtype == DT_BF16 && y->ld % 8 == 0 && aligned16(y->data);
    const void *ascale = w->scale && !per_col ? w->scale : NULL, *bscale = &s->scal[0];
    int64_t cld = direct ? y->ld : N;
    fp8_algo *cached = algo_lookup(M, N, K, w->ld, cld, direct, ascale != NULL);
    if (cached && !cached->found) return -1;

    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t ct = direct ? CUDA_R_16BF : CUDA_R_32F;
    int rc = -1;
    LT_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (ascale) LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ascale, sizeof ascale));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bscale, sizeof bscale));
    /* A = W as column-major [K, N] (ld w.ld), B = qx as [K, M] (ld K), D = yᵀ [N, M] */
    LT_TRY(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)N, w->ld));
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)M, K));
    LT_TRY(cublasLtMatrixLayoutCreate(&lc, ct, (uint64_t)N, (uint64_t)M, cld));
    if (!cached) {
        uint32_t align_a = 16;
        LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &s->workspace_bytes,
                                                    sizeof s->workspace_bytes));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                    sizeof align_a));
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(s->lt, op, la, lb, lc, lc, pref, 1, &heur, &found);
        cuda_fp8_algo_searches++;
        cached = &g_algos[g_algo_next];
        g_algo_next = (g_algo_next + 1) % FP8_ALGO_CACHE;
        *cached = (fp8_algo){M, N, K, w->ld, cld, direct, ascale != NULL, hs == CUBLAS_STATUS_SUCCESS && found > 0, 1,
                             heur.algo};
        if (!cached->found) goto out;
    }
    uint8_t *qx = cuda_scratch(be, 1, (size_t)M * (size_t)K);
    float *acc = direct ? NULL : cuda_scratch(be, 0, sizeof(float) * (size_t)M * (size_t)N);
    cuda_quantize_act_e4m3(be, x, qx, &s->scal[0], (unsigned *)&s->scal[1]);
    float alpha = 1.0f, beta = 0.0f;
    void *D = direct ? y->data : acc;
    CUBLAS_CHECK(cublasLtMatmul(s->lt, op, &alpha, w->data, la, qx, lb, &beta, D, lc, D, lc, &cached->algo, s->workspace,
                                s->workspace_bytes, cuda_stream(be)));
    cuda_launched_("cublasLtMatmul (fp8)", __FILE__, __LINE__);
    /* a per-tensor weight scale went in as the A scale already */
    if (!direct) cuda_fp8_epilogue(be, y, acc, per_col ? w->scale : NULL, per_col, bias);
    rc = 0;
out:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return rc;
}
