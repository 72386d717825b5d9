/* The CUDA backend: device selection, handles, memory with exact
 * bytes_in_use/peak accounting, and the vtable. Compiled by gcc with
 * -DTPGEN_CUDA (the kernels are in the .cu files of this folder).
 *
 * Memory comes from cudaMallocAsync on the backend's stream out of the
 * device's default pool (plain device memory, never managed memory). The
 * stream-ordered allocator is used instead of cudaMalloc/cudaFree because
 * cudaFree synchronises the whole device, which would stall the forward
 * every time a block frees its temporaries. The pool keeps freed memory for
 * reuse; when an allocation fails the pool is trimmed and the allocation
 * retried once before reporting out-of-memory. Where the device has no
 * memory pools (or TPGEN_CUDA_ALLOC=plain) plain cudaMalloc/cudaFree are
 * used instead. */
#include "cuda_internal.h"
#include "kernels/err.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void cuda_check_(cudaError_t e, const char *what, const char *file, int line) {
    if (e != cudaSuccess) tp_fatal("CUDA error at %s:%d (%s): %s", file, line, what, cudaGetErrorString(e));
}

void cublas_check_(cublasStatus_t s, const char *what, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS)
        tp_fatal("cuBLAS error at %s:%d (%s): %s", file, line, what, cublasGetStatusString(s));
}

static int env_on(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}
int cuda_debug_sync(void) {
    static int v = -1;
    if (v < 0) v = env_on("TPGEN_CUDA_SYNC");
    return v;
}
int cuda_debug_poison(void) {
    static int v = -1;
    if (v < 0) v = env_on("TPGEN_CUDA_POISON");
    return v;
}

void cuda_launched_(const char *what, const char *file, int line) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) tp_fatal("CUDA launch of %s failed at %s:%d: %s", what, file, line, cudaGetErrorString(e));
    if (!cuda_debug_sync()) return;
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
        tp_fatal("CUDA fault in %s (launched at %s:%d, found by TPGEN_CUDA_SYNC): %s", what, file, line,
                 cudaGetErrorString(e));
}

/* ---- device pointer -> size (open addressing, power-of-two capacity) ---- */
struct alloc_table {
    uintptr_t *keys;
    size_t *sizes;
    size_t cap, n;
};

static size_t slot_of(const alloc_table *t, uintptr_t k) {
    return (size_t)((k >> 8) * 0x9E3779B97F4A7C15ull) & (t->cap - 1);
}

static void table_put(alloc_table *t, uintptr_t k, size_t bytes);

static void table_grow(alloc_table *t) {
    alloc_table old = *t;
    t->cap = old.cap ? old.cap * 2 : 1024;
    t->keys = xcalloc(t->cap, sizeof *t->keys);
    t->sizes = xcalloc(t->cap, sizeof *t->sizes);
    t->n = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.keys[i]) table_put(t, old.keys[i], old.sizes[i]);
    free(old.keys);
    free(old.sizes);
}

static void table_put(alloc_table *t, uintptr_t k, size_t bytes) {
    if (2 * (t->n + 1) > t->cap) table_grow(t);
    size_t i = slot_of(t, k);
    while (t->keys[i]) i = (i + 1) & (t->cap - 1);
    t->keys[i] = k;
    t->sizes[i] = bytes;
    t->n++;
}

/* remove k and return its size; (size_t)-1 when unknown */
static size_t table_take(alloc_table *t, uintptr_t k) {
    if (!t->cap) return (size_t)-1;
    size_t i = slot_of(t, k);
    while (t->keys[i] && t->keys[i] != k) i = (i + 1) & (t->cap - 1);
    if (!t->keys[i]) return (size_t)-1;
    size_t bytes = t->sizes[i];
    t->keys[i] = 0;
    t->n--;
    /* re-insert the rest of the cluster so lookups never stop early */
    for (size_t j = (i + 1) & (t->cap - 1); t->keys[j]; j = (j + 1) & (t->cap - 1)) {
        uintptr_t kk = t->keys[j];
        size_t ss = t->sizes[j];
        t->keys[j] = 0;
        t->n--;
        table_put(t, kk, ss);
    }
    return bytes;
}

/* ---- allocation ---- */

static int oom_error(backend *be, size_t bytes) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    return tp_error("out of GPU memory on device %d: could not allocate %.2f GiB (tpgen holds %.2f GiB; "
                    "%.2f GiB free of %.2f GiB); use a larger --tp to spread the model over more GPUs, "
                    "or a smaller image size", be->device, bytes / 1073741824.0, be->bytes_in_use / 1073741824.0,
                    free_b / 1073741824.0, total_b / 1073741824.0);
}

/* device memory from the pool, stream ordered; NULL + tp_error on failure */
static void *device_alloc(backend *be, size_t bytes) {
    cuda_impl *c = cuda_of(be);
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = c->use_pool ? cudaMallocAsync(&p, bytes, c->stream) : cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation && c->use_pool) {  /* give cached pool memory back and retry once */
        cudaGetLastError();
        cudaMemPool_t pool;
        if (cudaStreamSynchronize(c->stream) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, be->device) == cudaSuccess)
            cudaMemPoolTrimTo(pool, 0);
        e = cudaMallocAsync(&p, bytes, c->stream);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        cudaGetLastError();
        /* some drivers answer "invalid argument" to sizes beyond the device */
        if (e == cudaErrorMemoryAllocation || bytes > free_b) oom_error(be, bytes);
        else tp_error("CUDA allocation of %zu bytes on device %d failed: %s", bytes, be->device, cudaGetErrorString(e));
        return NULL;
    }
    /* debug pools: pool memory is handed out again without zeroing, unlike the
     * CPU's fresh pages; NaN everywhere makes an uninitialised read show */
    if (c->poison) {
        e = cudaMemsetAsync(p, 0xff, bytes, c->stream);   /* ordered before every later use: all on this stream */
        if (e != cudaSuccess) tp_fatal("cuda alloc: poisoning %zu bytes failed: %s", bytes, cudaGetErrorString(e));
    }
    table_put(c->allocs, (uintptr_t)p, bytes);
    be->bytes_in_use += bytes;
    if (be->bytes_in_use > be->peak_bytes) be->peak_bytes = be->bytes_in_use;
    return p;
}

static void device_free(backend *be, void *p) {
    if (!p) return;
    size_t bytes = table_take(cuda_of(be)->allocs, (uintptr_t)p);
    if (bytes == (size_t)-1) tp_fatal("cuda free: %p was not allocated by this backend", p);
    be->bytes_in_use -= bytes;
    if (cuda_of(be)->use_pool) CUDA_CHECK(cudaFreeAsync(p, cuda_of(be)->stream));
    else CUDA_CHECK(cudaFree(p));  /* waits for the device: queued work may still use p */
}

void *cuda_scratch(backend *be, int slot, size_t bytes) {
    cuda_impl *c = cuda_of(be);
    if (slot < 0 || slot >= CUDA_SCRATCH_SLOTS) tp_fatal("cuda scratch: bad slot %d", slot);
    if (bytes <= c->scratch_bytes[slot]) return c->scratch[slot];
    size_t want = bytes + bytes / 4;  /* some headroom against regrowing by a few bytes */
    device_free(be, c->scratch[slot]);
    c->scratch[slot] = NULL;
    c->scratch_bytes[slot] = 0;
    void *p = device_alloc(be, want);
    if (!p) {
        tp_alloc_failed();   /* inside a lockstep section: the rank, the phase and MPI_Abort (kernels/fault.h) */
        tp_fatal("%s (while allocating an op's temporary buffer)", tp_error_msg());
    }
    c->scratch[slot] = p;
    c->scratch_bytes[slot] = want;
    return p;
}

/* ---- misc vtable entries ---- */

static int cuda_memset0(backend *be, void *dst, size_t bytes) {
    cudaError_t e = cudaMemsetAsync(dst, 0, bytes, cuda_stream(be));
    return e == cudaSuccess ? 0 : tp_error("cudaMemsetAsync of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
}

static int cuda_sync(backend *be) {
    cudaError_t e = cudaStreamSynchronize(cuda_stream(be));
    if (e != cudaSuccess)
        return tp_error("CUDA device %d reported an error while running queued work: %s", be->device,
                        cudaGetErrorString(e));
    return 0;
}

static void cuda_destroy(backend *be) {
    cuda_impl *c = cuda_of(be);
    cudaStreamSynchronize(c->stream);
    cuda_fp8_release(be);
    for (int i = 0; i < CUDA_SCRATCH_SLOTS; i++) device_free(be, c->scratch[i]);
    for (int i = 0; i < CUDA_STAGING_BUFFERS; i++) {
        if (c->staging[i]) cudaFreeHost(c->staging[i]);
        if (c->staging_done[i]) cudaEventDestroy(c->staging_done[i]);
    }
    if (c->blas) cublasDestroy(c->blas);
    if (c->blas_workspace) cudaFree(c->blas_workspace);
    cudaStreamSynchronize(c->stream);
    cudaStreamDestroy(c->stream);
    free(c->allocs->keys);
    free(c->allocs->sizes);
    free(c->allocs);
    free(c);
    free(be);
}

/* in cuda_transfer.c */
int cuda_upload(backend *, void *dst, const void *src, size_t bytes);
int cuda_download(backend *, void *dst, const void *src, size_t bytes);
int cuda_upload2d(backend *, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height);

static const backend_vtable k_cuda_vt = {
    .name = "cuda",
    .alloc = device_alloc, .free = device_free, .upload = cuda_upload, .download = cuda_download,
    .upload2d = cuda_upload2d, .memset0 = cuda_memset0, .sync = cuda_sync, .destroy = cuda_destroy,
    .gemm = cuda_gemm, .copy = cuda_copy, .layernorm_mod = cuda_layernorm_mod, .rmsnorm = cuda_rmsnorm,
    .rope = cuda_rope, .attention = cuda_attention, .swiglu = cuda_swiglu, .silu = cuda_silu, .add = cuda_add,
    .gated_add = cuda_gated_add, .gather_rows = cuda_gather_rows, .conv2d = cuda_conv2d, .conv2d_down = cuda_conv2d_down,
    .group_norm = cuda_group_norm, .upsample2x = cuda_upsample2x, .transpose = cuda_transpose,
    .upload_file = cuda_upload_file, .channel_sums = cuda_channel_sums, .channel_affine = cuda_channel_affine,
};

/* ---- creation ---- */

int cudaplug_has_cuda(void) { return 1; }

/* 0 when there is no driver, no device, or the driver is too old: the
 * runtime reports those as errors, which are cleared here so that later
 * calls start clean. */
int cudaplug_device_count(void) {
    static int cached = -1;
    if (cached >= 0) return cached;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        n = 0;
    }
    cached = n;
    return n;
}

/* Deterministic reductions as the CPU reference has: no TF32, and no
 * reduced-precision (bf16) split-K reductions, which the default mode allows */
cublasMath_t cuda_blas_math_mode(void) {
    return (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
}

static int setup(backend *be, cuda_impl *c) {
    cudaError_t e;
#define TRY(call, what)                                                                                      \
    if ((e = (call)) != cudaSuccess) {                                                                       \
        cudaGetLastError();                                                                                  \
        return tp_error("CUDA device %d: %s failed: %s", be->device, what, cudaGetErrorString(e));          \
    }
    TRY(cudaSetDevice(be->device), "selecting the device");
    TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "creating a stream");
    c->poison = cuda_debug_poison();
    int pools = 0;
    const char *alloc = getenv("TPGEN_CUDA_ALLOC");
    cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, be->device);
    cudaGetLastError();
    c->use_pool = pools && !(alloc && !strcmp(alloc, "plain"));
    if (c->use_pool) {
        cudaMemPool_t pool;
        TRY(cudaDeviceGetDefaultMemPool(&pool, be->device), "getting the memory pool");
        uint64_t keep = UINT64_MAX;  /* keep freed blocks cached between syncs */
        TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "configuring the memory pool");
    }
    c->blas_workspace_bytes = (size_t)32 << 20;  /* what cuBLAS recommends for Hopper */
    TRY(cudaMalloc(&c->blas_workspace, c->blas_workspace_bytes), "allocating the cuBLAS workspace");
    for (int i = 0; i < CUDA_STAGING_BUFFERS; i++) {
        TRY(cudaEventCreateWithFlags(&c->staging_done[i], cudaEventDisableTiming), "creating an event");
        if (cudaHostAlloc(&c->staging[i], CUDA_STAGING_BYTES, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            c->staging[i] = NULL;
        }
    }
    /* all or none: without pinned memory uploads still work, from pageable memory (slower) */
    for (int i = 0; i < CUDA_STAGING_BUFFERS; i++)
        if (!c->staging[i]) {
            for (int j = 0; j < CUDA_STAGING_BUFFERS; j++) {
                if (c->staging[j]) cudaFreeHost(c->staging[j]);
                c->staging[j] = NULL;
            }
            break;
        }
#undef TRY
    cublasStatus_t s = cublasCreate(&c->blas);
    if (s != CUBLAS_STATUS_SUCCESS) return tp_error("cuBLAS initialisation on device %d failed: %s", be->device, cublasGetStatusString(s));
    if ((s = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetWorkspace(c->blas, c->blas_workspace, c->blas_workspace_bytes)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetMathMode(c->blas, cuda_blas_math_mode())) != CUBLAS_STATUS_SUCCESS)
        return tp_error("cuBLAS setup on device %d failed: %s", be->device, cublasGetStatusString(s));
    size_t free_b;
    cudaMemGetInfo(&free_b, &c->total_mem);
    return 0;
}

backend *cudaplug_backend_create(int device) {
    int n = cudaplug_device_count();
    if (n <= 0) {
        tp_error("no usable CUDA GPU is visible (no device, or no/too old NVIDIA driver); use --backend cpu");
        return NULL;
    }
    if (device < 0 || device >= n) {
        tp_error("CUDA device %d does not exist (this node has %d); check CUDA_VISIBLE_DEVICES", device, n);
        return NULL;
    }
    backend *be = xcalloc(1, sizeof *be);
    cuda_impl *c = xcalloc(1, sizeof *c);
    c->allocs = xcalloc(1, sizeof *c->allocs);
    be->kind = BACKEND_CUDA;
    be->vt = &k_cuda_vt;
    be->impl = c;
    be->device = device;
    be->threads = 1;
    if (setup(be, c)) {
        if (c->stream) cuda_destroy(be);
        else { free(c->allocs); free(c); free(be); }
        return NULL;
    }
    return be;
}
