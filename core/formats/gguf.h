/* GGUF files (v2 and v3, little-endian): a fully validated reader of the
 * metadata and tensor infos, and byte-range reads of tensor blocks, in the
 * manner of safetensors.h. docs/gguf.md describes the format and limits.
 *
 * Validation on open (each failure is a clear error naming the file and,
 * where it applies, the key or tensor): magic, version, tensor and key
 * counts against the file size, string and array lengths inside the file,
 * array nesting depth, general.alignment (a power of two), tensor names
 * unique, 1..4 dimensions each > 0 with products that cannot overflow, a
 * type ggml defines, ne[0] a multiple of the type's block, offsets aligned,
 * data inside the file, no two tensors sharing bytes. A tensor of a type
 * that tpgen cannot decode is listed (inspect shows it); gguf_check_type
 * refuses it when it is to be used.
 *
 * GGUF lists dimensions fastest first: ne[0] is the row length. shape[] is
 * the row-major order a safetensors file would list: shape[i] =
 * ne[ndim-1-i]. Rows (the product of ne[1..]) are stored one after the
 * other, each ne[0] / block whole blocks. */
#ifndef TPGEN_GGUF_H
#define TPGEN_GGUF_H
#include "kernels/quant.h"
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAX_DIMS 4

/* metadata value types, as stored */
typedef enum {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6,
    GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12,
    GGUF_NTYPES
} gguf_vtype;
const char *gguf_vtype_name(int t);   /* "u32", "string", "array", ... */

typedef struct gguf_str {
    uint64_t len;   /* bytes, not counting the terminating NUL that s always has */
    char *s;        /* may hold NUL bytes of its own; len is exact */
} gguf_str;

typedef struct gguf_value {
    gguf_vtype type;
    union {
        uint64_t u;    /* U8 U16 U32 U64 BOOL */
        int64_t i;     /* I8 I16 I32 I64 */
        double f;      /* F32 F64 */
    } num;
    gguf_str str;      /* STRING */
    /* ARRAY: n elements of elem; numbers are held as stored (n * size,
     * little-endian) in data, strings as gguf_str[n] in data, arrays as
     * gguf_value[n] in data */
    gguf_vtype elem;
    uint64_t n;
    void *data;
} gguf_value;

typedef struct gguf_kv {
    char *key;
    gguf_value v;
} gguf_kv;

typedef struct gguf_tensor {
    char *name;
    int type;                       /* ggml type id */
    const quant_type *qt;           /* its sizes (never NULL after open) */
    int ndim;
    int64_t ne[GGUF_MAX_DIMS];      /* fastest first; unused entries 1 */
    int64_t shape[GGUF_MAX_DIMS];   /* row-major: shape[i] = ne[ndim-1-i] */
    int64_t rows, row_len;          /* rows = ne[1] * ne[2] * ne[3], row_len = ne[0] */
    uint64_t row_bytes;             /* ne[0] / block * bytes */
    uint64_t begin, end;            /* absolute byte offsets in the file: [begin, end) */
} gguf_tensor;

typedef struct gguf_file {
    char *path;
    int fd;                   /* -1 for gguf_open_mem */
    const uint8_t *mem;       /* gguf_open_mem's bytes (not owned) */
    uint64_t file_size;
    uint32_t version;
    uint32_t alignment;       /* general.alignment, default 32 */
    uint64_t data0;           /* the data section's start (aligned); tensor offsets count from here */
    int n_kv;
    gguf_kv *kv;              /* in file order */
    int n;                    /* tensors */
    gguf_tensor *tensors;     /* in file order */
    int *by_name;             /* indices into tensors, sorted by name */
} gguf_file;

/* 0 ok; -1 with tp_error naming the file. */
int gguf_open(const char *path, gguf_file **out);
/* Parse n bytes of memory as a GGUF file named `name` (for tests and the
 * fuzzer); the bytes must outlive the handle. */
int gguf_open_mem(const void *data, size_t n, const char *name, gguf_file **out);
void gguf_close(gguf_file *f);
int gguf_is_gguf(const char *path);   /* 1 when the file starts with the GGUF magic */

const gguf_tensor *gguf_find(const gguf_file *f, const char *name);   /* NULL if absent */
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);    /* NULL if absent */
/* 0 when tpgen can decode t's type, else -1 with an error naming the file,
 * the tensor and the type (and listing the supported ones). */
int gguf_check_type(const gguf_file *f, const gguf_tensor *t);

/* Typed metadata access. Each returns 0 with the value, 1 when the key is
 * absent (nothing recorded), -1 with an error naming the file and key when
 * the value has another type or does not fit. Integers convert between
 * widths and signedness when the value fits; floats from F32 or F64. */
int gguf_get_str(const gguf_file *f, const char *key, const char **out);
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out);
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
/* an array of strings: items point into the handle */
int gguf_get_arr_str(const gguf_file *f, const char *key, const gguf_str **items, uint64_t *n);
/* an array of any integer type as malloc'ed int64 (u64 values above
 * INT64_MAX are refused) */
int gguf_get_arr_i64(const gguf_file *f, const char *key, int64_t **out, uint64_t *n);
/* an array of F32/F64 as malloc'ed float */
int gguf_get_arr_f32(const gguf_file *f, const char *key, float **out, uint64_t *n);

/* ---- tensor bytes ---- */
/* The bytes of rows [r0, r1) of t: whole rows are whole blocks, so they are
 * one contiguous range [*begin, *end) of the file. */
void gguf_rows_range(const gguf_tensor *t, int64_t r0, int64_t r1, uint64_t *begin, uint64_t *end);
/* Read n bytes at absolute offset off (pread; thread-safe). */
int gguf_read_range(const gguf_file *f, uint64_t off, void *dst, size_t n);
/* Read a tensor's bytes as stored into dst (end - begin bytes). */
int gguf_read_raw(const gguf_file *f, const gguf_tensor *t, void *dst);
/* The blocks of rows [r0, r1) that cover columns [c0, c1), as stored (a
 * quantised shard): (r1 - r0) rows of *pitch bytes each into dst (which
 * holds (r1 - r0) * pitch bytes; quant_col_span gives pitch in advance);
 * column c0 is element *skip of each row's first block. Whole rows are one
 * read. *bytes_read (may be NULL) gets the bytes read. */
int gguf_read_blocks(const gguf_file *f, const gguf_tensor *t, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                     void *dst, int64_t *pitch, int64_t *skip, uint64_t *bytes_read);
/* Dequantise rows [r0, r1) x columns [c0, c1) of t into dst (row-major,
 * (r1 - r0) x (c1 - c0) floats), reading only the blocks that cover the
 * columns of each row. *bytes_read (may be NULL) gets the bytes read. */
int gguf_read_f32_block(const gguf_file *f, const gguf_tensor *t, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                        float *dst, uint64_t *bytes_read);
/* The whole tensor dequantised into a malloc'ed f32 array (rows x row_len). */
int gguf_read_f32(const gguf_file *f, const char *name, float **out, const gguf_tensor **info);

/* ---- writing ---- */
typedef struct gguf_write_tensor {
    const char *name;
    int type;                   /* a ggml type id that quant_type_get knows */
    int ndim;                   /* 1..4 */
    int64_t ne[GGUF_MAX_DIMS];  /* fastest first, each > 0; ne[0] whole blocks */
    const void *data;           /* the bytes as stored; NULL: from fill, or a hole when fill is NULL too */
} gguf_write_tensor;
/* fill n bytes of tensor `index` from byte `offset` of its data */
typedef int (*gguf_fill_fn)(void *ctx, int index, void *buf, uint64_t offset, size_t n);

/* Write a GGUF v3 file atomically (a temporary file in the same folder,
 * then rename) in gguf-py GGUFWriter's layout: header, the n_kv pairs in
 * order (a general.alignment among them sets the alignment, default 32),
 * the tensor infos, zero padding to the alignment, then each tensor's data
 * followed by zero padding to the alignment. Tensors whose data and fill
 * are NULL are holes (a sparse file: real shapes for tests and benchmarks). */
int gguf_write(const char *path, const gguf_kv *kv, int n_kv, const gguf_write_tensor *t, int n, gguf_fill_fn fill,
               void *ctx);

#endif
