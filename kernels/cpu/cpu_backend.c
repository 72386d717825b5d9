/* The CPU backend: host memory, OpenBLAS + OpenMP compute. Memory blocks
 * carry a small header with their size so that bytes_in_use and peak_bytes
 * stay exact. The compute ops live in the other files of this folder
 * (cpu_gemm.c, cpu_attention.c, cpu_norm.c, cpu_eltwise.c, cpu_layout.c,
 * cpu_conv.c). */
#include "cpu_ops.h"
#include "../../core/err.h"
#include <stdlib.h>
#include <string.h>

#define CPU_ALIGN 64

static void *cpu_alloc(backend *be, size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, CPU_ALIGN, bytes + CPU_ALIGN)) {
        tp_error("out of host memory: could not allocate %.1f MB (in use %.1f MB); use a larger --tp or a smaller size",
                 bytes / 1e6, be->bytes_in_use / 1e6);
        return NULL;
    }
    *(size_t *)p = bytes;
    be->bytes_in_use += bytes;
    if (be->bytes_in_use > be->peak_bytes) be->peak_bytes = be->bytes_in_use;
    return (char *)p + CPU_ALIGN;
}

static void cpu_free(backend *be, void *p) {
    if (!p) return;
    char *base = (char *)p - CPU_ALIGN;
    be->bytes_in_use -= *(size_t *)base;
    free(base);
}

static int cpu_upload(backend *be, void *dst, const void *src, size_t n) { memcpy(dst, src, n); return 0; }
static int cpu_download(backend *be, void *dst, const void *src, size_t n) { memcpy(dst, src, n); return 0; }
static int cpu_upload2d(backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height) {
    for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return 0;
}
static int cpu_memset0(backend *be, void *dst, size_t n) { memset(dst, 0, n); return 0; }
static int cpu_sync(backend *be) { return 0; }
static void cpu_destroy(backend *be) { free(be); }

static const backend_vtable k_cpu_vt = {
    .name = "cpu",
    .alloc = cpu_alloc, .free = cpu_free, .upload = cpu_upload, .download = cpu_download,
    .upload2d = cpu_upload2d, .memset0 = cpu_memset0, .sync = cpu_sync, .destroy = cpu_destroy,
    .gemm = cpu_gemm,
    .copy = cpu_copy,
    .layernorm_mod = cpu_layernorm_mod,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .silu = cpu_silu,
    .add = cpu_add,
    .gated_add = cpu_gated_add,
    .gather_rows = cpu_gather_rows,
    .conv2d = cpu_conv2d,
    .group_norm = cpu_group_norm,
    .upsample2x = cpu_upsample2x,
    .transpose = cpu_transpose,
};

backend *backend_cpu_create(int threads) {
    backend *be = xcalloc(1, sizeof *be);
    be->kind = BACKEND_CPU;
    be->vt = &k_cpu_vt;
    be->device = -1;
    be->threads = threads;
    cpu_set_threads(threads);
    return be;
}
