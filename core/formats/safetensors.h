/* safetensors files: a fully validated header reader, raw and converting
 * tensor reads, and an atomic writer.
 *
 * Validation on open (each failure is a clear error naming the file and,
 * where it applies, the tensor): file shorter than 8 bytes; header length
 * beyond the file; malformed JSON or a non-object entry; unknown dtype;
 * shape x element size != data_offsets span; offsets outside the data area
 * or reversed. Tensor order in the file is never assumed. */
#ifndef TPGEN_SAFETENSORS_H
#define TPGEN_SAFETENSORS_H
#include "kernels/tensor.h"
#include <stdint.h>

#define ST_MAX_DIMS 8

typedef struct st_tensor_info {
    char *name;
    dtype_t dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;      /* absolute byte offsets in the file: [begin, end) */
    int qtype;                /* DT_GGML (a GGUF block type): its ggml type id (kernels/quant.h) */
} st_tensor_info;

typedef struct st_file {
    char *path;
    int fd;
    uint64_t file_size, data0; /* data area starts at data0 = 8 + header length */
    int n;                     /* number of tensors */
    st_tensor_info *tensors;   /* sorted by name */
    int n_meta;
    char **meta_keys, **meta_values; /* "__metadata__" string entries */
} st_file;

int st_open(const char *path, st_file **out);  /* 0 ok; -1 with tp_error */
void st_close(st_file *f);
const st_tensor_info *st_find(const st_file *f, const char *name);  /* NULL if absent */
const char *st_meta(const st_file *f, const char *key);             /* NULL if absent */
int64_t st_numel(const st_tensor_info *t);

/* Read a tensor's bytes as stored into dst (end - begin bytes). */
int st_read_raw(const st_file *f, const st_tensor_info *t, void *dst);
/* Read n bytes at absolute file offset off (a shard's byte range). */
int st_read_range(const st_file *f, uint64_t off, void *dst, size_t n);
/* Read a float tensor (F32/BF16/F16/F64) converted to a malloc'ed f32 array. */
int st_read_f32(const st_file *f, const char *name, float **out, const st_tensor_info **info);
/* Read an integer tensor (I64/I32/I16/I8/U8/BOOL) converted to malloc'ed int64. */
int st_read_i64(const st_file *f, const char *name, int64_t **out, const st_tensor_info **info);

typedef struct st_write_tensor {
    const char *name;
    dtype_t dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;          /* host memory, dtype layout, row-major */
} st_write_tensor;

/* Write n tensors and optional metadata (meta_kv = {key, value, ..., NULL})
 * to path atomically: a temporary file in the same directory, then rename. */
int st_write(const char *path, const st_write_tensor *t, int n, const char *const *meta_kv);

/* Streaming variant for checkpoints too large for memory: a tensor whose
 * data is NULL gets its bytes from fill(ctx, index, buf, offset, n) in
 * chunks, or is left as a hole (a sparse file of zeros: header-only
 * checkpoints with real shapes for tests) when fill is NULL or answers 1 to
 * fill(ctx, index, NULL, 0, 0), the question asked first of each tensor
 * (answer 0 to be filled). */
typedef int (*st_fill_fn)(void *ctx, int index, void *buf, size_t offset, size_t n);
int st_write_stream(const char *path, const st_write_tensor *t, int n, const char *const *meta_kv,
                    st_fill_fn fill, void *ctx);

#endif
