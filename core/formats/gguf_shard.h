/* GGUF files as checkpoints, and the shards of quantised tensors
 * (docs/gguf.md "GGUF checkpoints" and "Quantised weights in memory").
 *
 * A .gguf file opens as an st_file whose entries are its tensors in
 * row-major shapes: F32/F16/BF16 (and the integer types) as the plain dtypes
 * (quant_dtype), every block type as DT_GGML with st_tensor_info.qtype the
 * ggml type id. The plan engine, BFL detection and the config-from-shapes
 * path see names and shapes only, so they work unchanged.
 *
 * A rank's shard of a DT_GGML tensor is held as stored blocks: for whole
 * rows (replicated, column-parallel) the rows' bytes; for a split of the
 * columns (row-parallel, packed row-parallel) each local row holds, for
 * each shard piece, the blocks that cover that piece's columns, so a shard
 * edge inside a block costs one extra block per row and edge. */
#ifndef TPGEN_GGUF_SHARD_H
#define TPGEN_GGUF_SHARD_H
#include "safetensors.h"
#include "plans/plan.h"
#include "kernels/tensor.h"

/* Open a .gguf file as an st_file (0, or -1 + tp_error naming the file; a
 * tensor of a type tpgen cannot decode is refused naming it and its type). */
int gguf_st_open(const char *path, st_file **out);

/* One 2-D byte copy from the file into the local tensor: `height` runs of
 * `len` bytes, run i from file offset src + i * src_pitch to byte
 * dst + i * dst_pitch of the tensor's memory. */
typedef struct qshard_run {
    uint64_t src, src_pitch;
    size_t len, dst, dst_pitch;
    int64_t height;
} qshard_run;

typedef struct qshard {
    int64_t pitch;                     /* bytes of a local row */
    int n_seg;
    tensor_qseg seg[TENSOR_MAX_QSEGS];
    int n_run;
    qshard_run run[PLAN_MAX_PIECES];
    uint64_t bytes;                    /* bytes read (= the sum of the runs) */
} qshard;

/* The layout and reads of rank `rank`'s shard si of the DT_GGML tensor ti
 * (tp as passed to plan_shard_pieces). -1 + tp_error when the tensor cannot
 * be held quantised (more than 2 dimensions, or a split of its rows that is
 * not whole rows). */
int qshard_plan(const st_tensor_info *ti, const shard_info *si, int tp, int rank, qshard *out);

/* Decode a DT_GGML tensor of f (an st_file from gguf_st_open) in bounded
 * chunks of whole rows and count its NaN/Inf values (*first: the first's
 * element index, -1 when none). 0, or -1 + tp_error on a read error. */
int gguf_scan_finite(const st_file *f, const st_tensor_info *t, int64_t *first, int64_t *count);

#endif
