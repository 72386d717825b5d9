/* Private declarations shared by the CUDA backend's files (C and CUDA C++).
 * The backend state lives in be->impl; every op queues its work on
 * cuda_stream(be) and returns without waiting. */
#ifndef TPGEN_CUDA_INTERNAL_H
#define TPGEN_CUDA_INTERNAL_H
#include <cuda_runtime.h>
#include <cublas_v2.h>
#ifdef __cplusplus
extern "C" {
#endif
#include "kernels/ops.h"

/* Number of pinned staging buffers for host->device uploads, and their size:
 * while one buffer's DMA runs the CPU fills the next. 3 x 32 MB of pinned
 * memory keeps the host footprint bounded whatever the model size. */
#define CUDA_STAGING_BUFFERS 3
#define CUDA_STAGING_BYTES ((size_t)32 << 20)

typedef struct alloc_table alloc_table;

typedef struct cuda_impl {
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_workspace;              /* cuBLAS workspace (set once) */
    size_t blas_workspace_bytes;
    void *scratch[3];                  /* op temporaries (im2col, dtype casts, ids); grow */
    size_t scratch_bytes[3];
    void *staging[CUDA_STAGING_BUFFERS]; /* pinned host buffers (NULL: pinning unavailable) */
    cudaEvent_t staging_done[CUDA_STAGING_BUFFERS];
    int staging_next;
    int use_pool;                      /* 1: cudaMallocAsync (stream-ordered pool); 0: cudaMalloc */
    alloc_table *allocs;               /* device pointer -> size, for bytes_in_use */
    size_t total_mem;
    int poison;                        /* TPGEN_CUDA_POISON: fill every allocation with 0xff (NaN in f32 and bf16) */
} cuda_impl;

static inline cuda_impl *cuda_of(backend *be) { return (cuda_impl *)be->impl; }
static inline cudaStream_t cuda_stream(backend *be) { return ((cuda_impl *)be->impl)->stream; }

/* Abort with the CUDA error string: used after kernel launches and API calls
 * inside ops, where a failure means a programming error or a dead device. */
void cuda_check_(cudaError_t e, const char *what, const char *file, int line);
#define CUDA_CHECK(call) cuda_check_((call), #call, __FILE__, __LINE__)
void cublas_check_(cublasStatus_t s, const char *what, const char *file, int line);
#define CUBLAS_CHECK(call) cublas_check_((call), #call, __FILE__, __LINE__)
/* After a kernel launch (or a library call that launches work): a launch
 * error aborts naming `what`; with TPGEN_CUDA_SYNC=1 (scripts/gpu-check.sh
 * sets it) the device is synchronised too, so that a fault inside the kernel
 * (a bad address, a trap) is reported here, naming the kernel, instead of at
 * the next sync. */
void cuda_launched_(const char *what, const char *file, int line);
/* TPGEN_CUDA_SYNC / TPGEN_CUDA_POISON set (non-empty, not "0"); read once */
int cuda_debug_sync(void);
int cuda_debug_poison(void);

/* the UUID ("GPU-...") or else the PCI bus id of a device, as nvidia-smi -L
 * prints it (cuda_nccl.c); -1 when neither can be read */
int cuda_gpu_identity(int device, char *out, size_t n);
/* the cuBLAS math mode of every handle (cuda_backend.c) */
cublasMath_t cuda_blas_math_mode(void);

/* Device scratch slot `slot` (< CUDA_SCRATCH_SLOTS) of at least `bytes`,
 * valid until the next call for the same slot. Stream ordered: work queued
 * earlier finishes before the memory is reused or released. */
#define CUDA_SCRATCH_SLOTS 3
void *cuda_scratch(backend *be, int slot, size_t bytes);

/* The compute ops (vtable entries), in cuda_gemm.c, cuda_elementwise.cu,
 * cuda_norm.cu, cuda_attention.cu and cuda_image.cu. */
void cuda_gemm(backend *, tensor *y, const tensor *x, const tensor *w, const tensor *bias);
void cuda_copy(backend *, tensor *y, const tensor *x);
/* fp8 tensor-core GEMM (cuda_gemm_fp8.c): applies / run (-1: no algorithm,
 * use the dequantising path) / release the backend's cuBLASLt state */
int cuda_gemm_fp8_applies(backend *be, const tensor *y, const tensor *x, const tensor *w);
int cuda_gemm_fp8(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias);
void cuda_fp8_release(backend *be);
/* op_gather_rows from an fp8 table (d_ids on the device), cuda_fp8.cu */
void cuda_gather_rows_fp8(backend *be, tensor *y, const tensor *table, const int32_t *d_ids, int64_t n, int64_t row0);
/* fp8 weight w -> dst (f32 or bf16, row pitch dld): decode x scale (cuda_fp8.cu) */
void cuda_dequant(backend *be, void *dst, dtype_t ddt, int64_t dld, const tensor *w);
/* rows [r0, r0 + nr) of a DT_GGML (GGUF block) weight w -> dst (f32 or bf16,
 * row pitch dld elements, row r0 first): the shared block decoders of
 * kernels/quant_blocks.h, the CPU's values bit for bit (cuda_ggml.cu) */
void cuda_ggml_dequant(backend *be, void *dst, dtype_t ddt, int64_t dld, const tensor *w, int64_t r0, int64_t nr);
/* op_gather_rows from a DT_GGML table (ids on the host), cuda_ggml.cu */
void cuda_gather_rows_ggml(backend *be, tensor *y, const tensor *table, const int32_t *ids, int64_t n, int64_t row0);
/* bytes of device scratch a DT_GGML GEMM decodes its weight into at most
 * (one tile of rows; TPGEN_CUDA_GGML_TILE_BYTES overrides, for tests) */
#define CUDA_GGML_TILE_BYTES ((size_t)64 << 20)
void cuda_layernorm_mod(backend *, tensor *y, const tensor *x, const tensor *shift,
                        const tensor *scale, float eps);
void cuda_rmsnorm(backend *, tensor *y, const tensor *x, const tensor *w, int group, float eps);
void cuda_rope(backend *, tensor *x, const tensor *cos, const tensor *sin, int head_dim, rope_mode mode);
void cuda_attention(backend *, tensor *o, const tensor *q, const tensor *k, const tensor *v,
                    const attn_params *p);
void cuda_swiglu(backend *, tensor *y, const tensor *gate, const tensor *up);
void cuda_silu(backend *, tensor *y, const tensor *x);
void cuda_add(backend *, tensor *y, const tensor *a, const tensor *b);
void cuda_gated_add(backend *, tensor *x, const tensor *gate, const tensor *y);
void cuda_gather_rows(backend *, tensor *y, const tensor *table, const int32_t *ids, int64_t n,
                      int64_t row0);
void cuda_conv2d(backend *, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
                 int64_t h, int64_t wd, int k);
void cuda_conv2d_down(backend *, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
                      int64_t h, int64_t wd);
void cuda_group_norm(backend *, tensor *y, const tensor *x, const tensor *gamma,
                     const tensor *beta, int groups, float eps, int apply_silu);
/* the GroupNorm halves of the band-parallel VAE (op_channel_sums / op_channel_affine), cuda_norm.cu */
void cuda_channel_sums(backend *, const tensor *x, const double *center, int p, double *out);
void cuda_channel_affine(backend *, tensor *y, const tensor *x, const float *a, const float *b, int apply_silu);
void cuda_upsample2x(backend *, tensor *y, const tensor *x, int64_t h, int64_t wd);
void cuda_transpose(backend *, tensor *y, const tensor *x);

/* Kernel launchers used by cuda_gemm.c (cuda_image.cu / cuda_elementwise.cu). */
/* dst [rows, cols] (ld dld, dtype ddt) = broadcast of the [1, cols] row vector v */
void cuda_fill_rows(backend *, void *dst, dtype_t ddt, int64_t dld, int64_t rows, int64_t cols,
                    const void *v, dtype_t vdt);
/* dst[i] = bias[i / per] for i < rows*cols of a [rows, cols] (ld dld) matrix: bias per row */
void cuda_fill_cols(backend *, void *dst, dtype_t ddt, int64_t dld, int64_t rows, int64_t cols,
                    const void *bias, dtype_t bdt);
/* generic strided 2-D convert: dst[r*dld + c] = src[r*sld + c] */
void cuda_convert_2d(backend *, void *dst, dtype_t ddt, int64_t dld, const void *src, dtype_t sdt,
                     int64_t sld, int64_t rows, int64_t cols);
/* im2col for a k x k, stride 1, pad k/2 convolution over pixels [p0, p0+np):
 * col [Cin*k*k, np] (dtype cdt) from x [Cin, h*wd] (ld xld). */
void cuda_im2col(backend *, void *col, dtype_t cdt, const void *x, dtype_t xdt, int64_t xld,
                 int64_t cin, int64_t h, int64_t wd, int k, int64_t p0, int64_t np);
/* the same for op_conv2d_down: 3x3, stride 2, no top/left padding, over
 * output pixels [p0, p0+np) of the (h/2) x (wd/2) output */
void cuda_im2col_down(backend *, void *col, dtype_t cdt, const void *x, dtype_t xdt, int64_t xld,
                      int64_t cin, int64_t h, int64_t wd, int64_t p0, int64_t np);

/* Proposed vtable extension `upload_file` (docs/cuda.md): copy `height`
 * rows of `width` bytes, row r read from file offset off + r*spitch, to
 * dst + r*dpitch, through the pinned staging ring (pread overlaps the DMA). */
int cuda_upload_file(backend *, void *dst, size_t dpitch, int fd, uint64_t off, size_t spitch, size_t width,
                     size_t height);

#ifdef __cplusplus
}
#endif
/* The plugin's entry points (libtpgen-cuda.so), reached from the main
 * program through kernels/cuda_plugin.c (dlopen). */
int cudaplug_has_cuda(void);
int cudaplug_device_count(void);
backend *cudaplug_backend_create(int device);
/* and cudaplug_comm_create_nccl (cuda_nccl.c) */

#endif
