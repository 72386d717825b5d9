/* Quantised GGUF weights (DT_GGML) on CUDA: rows of ggml blocks decoded
 * into a row-major f32 or bf16 matrix in device memory, for the GEMM
 * (cuda_gemm.c: tile by tile over the weight's rows, then cuBLAS).
 *
 * The kernel is the shared tile body of kernels/quant_blocks.h (one thread
 * per 16- or 32-element unit of a covering block of a segment of a row),
 * the same text the CPU compiles for kernels/quant.c; the decoders round
 * every multiply and subtraction separately (__fmul_rn / __fsub_rn), so the
 * values equal the CPU's bit for bit (f32; bf16: the f32 value rounded to
 * nearest even once). tests/test_quant_tiles.c runs the body over the grid
 * on the host against quant_dequant_span. UNVERIFIED on hardware: compiled
 * here; TEST_GPU gpu_ggml_gemm (tests/test_cuda_ops.c) and the golden
 * flux2-gguf checks of scripts/gpu-check.sh run it on a GPU. */
#include "cuda_dtype.cuh"
#include "kernels/quant_blocks.h"
extern "C" {
#include "kernels/quant.h"
}

__global__ void k_ggml_tile(qb_tile_args a) { qb_tile_body(&a, blockIdx.x, blockDim.x, threadIdx.x); }

extern "C" void cuda_ggml_dequant(backend *be, void *dst, dtype_t ddt, int64_t dld, const tensor *w, int64_t r0,
                                  int64_t nr) {
    if (w->dtype != DT_GGML) tp_fatal("cuda ggml dequant: %s is not a GGUF block tensor", dtype_name(w->dtype));
    if (ddt != DT_F32 && ddt != DT_BF16) tp_fatal("cuda ggml dequant: output %s (f32 or bf16)", dtype_name(ddt));
    if (r0 < 0 || nr < 0 || r0 + nr > w->rows || dld < w->cols)
        tp_fatal("cuda ggml dequant: rows [%lld, +%lld) of %lld, ld %lld < %lld columns", (long long)r0,
                 (long long)nr, (long long)w->rows, (long long)dld, (long long)w->cols);
    qb_tile_args a;
    if (qb_tile_init(&a, w->qtype, (const uint8_t *)w->data + (size_t)r0 * (size_t)w->qpitch, w->qpitch, w->qseg,
                     w->n_qseg, nr, dst, dld, ddt == DT_BF16))
        tp_fatal("cuda ggml dequant: a [%lld, %lld] %s weight of %d segment(s) in %lld-byte rows has no CUDA decoder or "
                 "a bad layout", (long long)w->rows, (long long)w->cols, quant_type_name(w->qtype), w->n_qseg,
                 (long long)w->qpitch);
    int64_t n = qb_tile_items(&a);
    if (n == 0) return;
    const int threads = 128;
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > 0x7fffffff) tp_fatal("cuda ggml dequant: %lld work items are too many for one launch", (long long)n);
    k_ggml_tile<<<(unsigned)blocks, threads, 0, cuda_stream(be)>>>(a);
    CUDA_LAUNCHED("ggml dequant");
}

/* op_gather_rows from a DT_GGML table (a quantised GGUF token_embd, as the
 * CPU backend allows): each id's row decoded into its row of y (ids is a
 * host array), rows outside [row0, row0 + table.rows) zero. One launch per
 * token: a prompt is at most a few thousand. */
extern "C" void cuda_gather_rows_ggml(backend *be, tensor *y, const tensor *table, const int32_t *ids, int64_t n,
                                      int64_t row0) {
    size_t es = dtype_size(y->dtype);
    for (int64_t i = 0; i < n; i++) {
        int64_t src = (int64_t)ids[i] - row0;
        char *dst = (char *)y->data + (size_t)i * (size_t)y->ld * es;
        if (src >= 0 && src < table->rows) cuda_ggml_dequant(be, dst, y->dtype, y->ld, table, src, 1);
        else CUDA_CHECK(cudaMemsetAsync(dst, 0, (size_t)y->cols * es, cuda_stream(be)));
    }
}
