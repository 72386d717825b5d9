/* Host <-> GPU copies. Uploads go through a ring of pinned staging buffers:
 * the CPU copies chunk i into one buffer while the DMA engine moves chunk
 * i-1 from another, and a buffer is refilled only after its event says its
 * DMA is done. When an upload returns, the caller's buffer is free again
 * (the data sits in pinned memory or on the GPU), as the vtable promises.
 * Host memory stays at CUDA_STAGING_BUFFERS x CUDA_STAGING_BYTES whatever
 * the model size.
 *
 * cuda_upload_file() is the vtable's upload_file, the loader's path for
 * tensors kept in their stored dtype: pread() straight into the pinned
 * ring, then cudaMemcpy2DAsync (rowwise shards pick their columns on the
 * GPU side of the copy), so no other host copy exists. */
#include "cuda_internal.h"
#include "kernels/err.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int copy_error(backend *be, const char *what, cudaError_t e) {
    cudaGetLastError();
    return tp_error("CUDA device %d: %s failed: %s", be->device, what, cudaGetErrorString(e));
}

/* the next staging buffer, once its previous DMA has finished */
static void *staging_take(backend *be, int *idx) {
    cuda_impl *c = cuda_of(be);
    int i = c->staging_next;
    c->staging_next = (i + 1) % CUDA_STAGING_BUFFERS;
    cudaError_t e = cudaEventSynchronize(c->staging_done[i]);
    if (e != cudaSuccess) { copy_error(be, "waiting for a staging copy", e); return NULL; }
    *idx = i;
    return c->staging[i];
}

static int staging_sent(backend *be, int idx) {
    cudaError_t e = cudaEventRecord(cuda_of(be)->staging_done[idx], cuda_stream(be));
    return e == cudaSuccess ? 0 : copy_error(be, "recording a staging event", e);
}

/* height rows of width bytes, already packed in pinned `stage` with pitch spitch */
static int send_rows(backend *be, void *dst, size_t dpitch, const void *stage, size_t spitch, size_t width,
                     size_t height) {
    cudaError_t e = cudaMemcpy2DAsync(dst, dpitch, stage, spitch, width, height, cudaMemcpyHostToDevice,
                                      cuda_stream(be));
    return e == cudaSuccess ? 0 : copy_error(be, "host-to-device copy", e);
}

int cuda_upload2d(backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                  size_t height) {
    if (width == 0 || height == 0) return 0;
    if (!cuda_of(be)->staging[0])  /* no pinned memory: the driver stages pageable copies itself */
        return send_rows(be, dst, dpitch, src, spitch, width, height);
    if (width > CUDA_STAGING_BYTES) {  /* rows wider than a staging buffer: row by row, in pieces */
        for (size_t r = 0; r < height; r++)
            for (size_t off = 0; off < width; off += CUDA_STAGING_BYTES) {
                size_t n = width - off < CUDA_STAGING_BYTES ? width - off : CUDA_STAGING_BYTES;
                int idx;
                void *st = staging_take(be, &idx);
                if (!st) return -1;
                memcpy(st, (const char *)src + r * spitch + off, n);
                if (send_rows(be, (char *)dst + r * dpitch + off, n, st, n, n, 1) || staging_sent(be, idx)) return -1;
            }
        return 0;
    }
    size_t rows_per = CUDA_STAGING_BYTES / width;
    for (size_t r0 = 0; r0 < height; r0 += rows_per) {
        size_t nr = height - r0 < rows_per ? height - r0 : rows_per;
        int idx;
        void *st = staging_take(be, &idx);
        if (!st) return -1;
        if (spitch == width) memcpy(st, (const char *)src + r0 * spitch, nr * width);
        else
            for (size_t r = 0; r < nr; r++) memcpy((char *)st + r * width, (const char *)src + (r0 + r) * spitch, width);
        if (send_rows(be, (char *)dst + r0 * dpitch, dpitch, st, width, width, nr) || staging_sent(be, idx)) return -1;
    }
    return 0;
}

int cuda_upload(backend *be, void *dst, const void *src, size_t bytes) {
    /* a contiguous upload is a 2-D upload of staging-sized rows plus a tail */
    size_t full = bytes / CUDA_STAGING_BYTES * CUDA_STAGING_BYTES;
    if (full && cuda_upload2d(be, dst, CUDA_STAGING_BYTES, src, CUDA_STAGING_BYTES, CUDA_STAGING_BYTES,
                              full / CUDA_STAGING_BYTES))
        return -1;
    if (bytes > full)
        return cuda_upload2d(be, (char *)dst + full, bytes - full, (const char *)src + full, bytes - full,
                             bytes - full, 1);
    return 0;
}

int cuda_download(backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return 0;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream(be));
    if (e == cudaSuccess) e = cudaStreamSynchronize(cuda_stream(be));
    return e == cudaSuccess ? 0 : copy_error(be, "device-to-host copy", e);
}

static int read_full(int fd, void *buf, size_t n, uint64_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return tp_error("reading %zu bytes at offset %llu failed: %s", n, (unsigned long long)off,
                                   strerror(errno));
        if (r == 0)
            return tp_error("unexpected end of file: the file ends before byte %llu (wanted %zu more bytes; the file "
                            "is truncated, download it again)", (unsigned long long)(off + done), n - done);
        done += (size_t)r;
    }
    return 0;
}

/* Without pinned memory: the same reads into one pageable buffer, each
 * copy waited for before the buffer is refilled (slow, but bounded). */
static int upload_file_pageable(backend *be, void *dst, size_t dpitch, int fd, uint64_t off, size_t spitch,
                                size_t width, size_t height) {
    char *buf = xmalloc(CUDA_STAGING_BYTES);
    int rc = 0;
    for (size_t r = 0; r < height && !rc; r++)
        for (size_t o = 0; o < width && !rc; o += CUDA_STAGING_BYTES) {
            size_t n = width - o < CUDA_STAGING_BYTES ? width - o : CUDA_STAGING_BYTES;
            rc = read_full(fd, buf, n, off + r * spitch + o) ||
                 send_rows(be, (char *)dst + r * dpitch + o, n, buf, n, n, 1);
            cudaError_t e = rc ? cudaSuccess : cudaStreamSynchronize(cuda_stream(be));
            if (e != cudaSuccess) rc = copy_error(be, "host-to-device copy", e);
        }
    free(buf);
    return rc ? -1 : 0;
}

/* one row (or a piece of one) per staging buffer: rows too long to batch */
static int upload_file_rows(backend *be, char *dst, size_t dpitch, int fd, uint64_t off, size_t spitch,
                            size_t width, size_t height) {
    for (size_t r = 0; r < height; r++)
        for (size_t o = 0; o < width; o += CUDA_STAGING_BYTES) {
            size_t n = width - o < CUDA_STAGING_BYTES ? width - o : CUDA_STAGING_BYTES;
            int idx;
            void *st = staging_take(be, &idx);
            if (!st || read_full(fd, st, n, off + r * spitch + o)) return -1;
            if (send_rows(be, dst + r * dpitch + o, n, st, n, n, 1) || staging_sent(be, idx)) return -1;
        }
    return 0;
}

/* The vtable's `upload_file` (see docs/cuda.md): copy `height` rows of
 * `width` bytes, row r starting at file offset off + r*spitch, to
 * dst + r*dpitch. Rows are batched so that each batch fills a pinned
 * staging buffer, and the pread of batch i overlaps the DMA of batch i-1.
 * A batch is read either as one span (the other ranks' columns included,
 * skipped by the 2-D copy: few large reads) when the gaps are at most as
 * wide as the rows, or else row by row, packed, so a rank never reads more
 * than twice its shard (rowwise at tp 4 and 8 would otherwise read tp x). */
int cuda_upload_file(backend *be, void *dst, size_t dpitch, int fd, uint64_t off, size_t spitch, size_t width,
                     size_t height) {
    if (width == 0 || height == 0) return 0;
    if (!cuda_of(be)->staging[0]) return upload_file_pageable(be, dst, dpitch, fd, off, spitch, width, height);
    int packed = height > 1 && (spitch > 2 * width || spitch < width);
    size_t step = packed || height == 1 ? width : spitch;   /* bytes per row in the staging buffer */
    if (step > CUDA_STAGING_BYTES) return upload_file_rows(be, dst, dpitch, fd, off, spitch, width, height);
    size_t rows_per = CUDA_STAGING_BYTES / step;
    for (size_t r0 = 0; r0 < height; r0 += rows_per) {
        size_t nr = height - r0 < rows_per ? height - r0 : rows_per;
        int idx;
        char *st = staging_take(be, &idx);
        if (!st) return -1;
        for (size_t r = 0; packed && r < nr; r++)
            if (read_full(fd, st + r * width, width, off + (r0 + r) * spitch)) return -1;
        /* a span ends with the last row's width: no bytes past the tensor are read */
        if (!packed && read_full(fd, st, (nr - 1) * step + width, off + r0 * spitch)) return -1;
        if (send_rows(be, (char *)dst + r0 * dpitch, dpitch, st, step, width, nr) || staging_sent(be, idx)) return -1;
    }
    return 0;
}
