/* The CPU backend: host memory, OpenBLAS + OpenMP compute. Memory blocks
 * carry a small header with their size so that bytes_in_use and peak_bytes
 * stay exact. The compute ops live in the other files of this folder
 * (cpu_gemm.c, cpu_attention.c, cpu_norm.c, cpu_eltwise.c, cpu_layout.c,
 * cpu_conv.c). */
#include "cpu_ops.h"
#include "kernels/err.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CPU_ALIGN 64

static void *cpu_alloc(backend *be, size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, CPU_ALIGN, bytes + CPU_ALIGN)) {
        tp_error("out of host memory: could not allocate %.1f MB (in use %.1f MB); use a larger --tp or a smaller size",
                 bytes / 1e6, be->bytes_in_use / 1e6);
        return NULL;
    }
    *(size_t *)p = bytes;
    /* atomic: the loader's reader threads and OpenMP regions may allocate concurrently */
    size_t now = __atomic_add_fetch(&be->bytes_in_use, bytes, __ATOMIC_RELAXED);
    size_t peak = __atomic_load_n(&be->peak_bytes, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&be->peak_bytes, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return (char *)p + CPU_ALIGN;
}

static void cpu_free(backend *be, void *p) {
    if (!p) return;
    char *base = (char *)p - CPU_ALIGN;
    __atomic_sub_fetch(&be->bytes_in_use, *(size_t *)base, __ATOMIC_RELAXED);
    free(base);
}

static int cpu_upload(backend *be, void *dst, const void *src, size_t n) { memcpy(dst, src, n); return 0; }
static int cpu_download(backend *be, void *dst, const void *src, size_t n) { memcpy(dst, src, n); return 0; }
static int cpu_upload2d(backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height) {
    for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return 0;
}
/* pread until n bytes are in (pread may return less, e.g. past 2 GiB) */
static int cpu_pread_full(int fd, char *dst, size_t n, uint64_t off) {
    while (n > 0) {
        ssize_t r = pread(fd, dst, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return tp_error("read failed at byte %llu: %s", (unsigned long long)off, strerror(errno));
        if (r == 0)
            return tp_error("unexpected end of file at byte %llu (the file is truncated; download it again)",
                            (unsigned long long)off);
        dst += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

/* Host memory is the destination: each row is read straight into place
 * (one pread for the whole block when rows are contiguous on both sides),
 * so the loader's direct path has no staging at all on the CPU. */
static int cpu_upload_file(backend *be, void *dst, size_t dpitch, int fd, uint64_t off, size_t spitch, size_t width,
                           size_t height) {
    (void)be;
    if (width == 0 || height == 0) return 0;
    if (height == 1 || (spitch == width && dpitch == width)) return cpu_pread_full(fd, dst, width * height, off);
    for (size_t r = 0; r < height; r++)
        if (cpu_pread_full(fd, (char *)dst + r * dpitch, width, off + r * spitch)) return -1;
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
    .conv2d_down = cpu_conv2d_down,
    .group_norm = cpu_group_norm,
    .upsample2x = cpu_upsample2x,
    .transpose = cpu_transpose,
    .upload_file = cpu_upload_file,
    .channel_sums = cpu_channel_sums,
    .channel_affine = cpu_channel_affine,
    .rows_invariant = cpu_rows_invariant,
    .channel_row_sums = cpu_channel_row_sums,
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
