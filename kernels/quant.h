/* ggml block types: the storage formats of GGUF tensors (docs/gguf.md).
 *
 * A tensor row of n elements is n / block whole blocks of `bytes` bytes,
 * each block decoding to `block` f32 values; rows are stored one after the
 * other, so whole rows are always whole blocks. The table knows the sizes of
 * every type that ggml's GGUF files can hold (so that a file's layout can be
 * validated whatever it holds); `dequant` says whether tpgen can decode it.
 *
 * Dequantisers are written from the format descriptions and give exactly
 * the f32 values of gguf-py's reference dequantiser (every value is one or
 * two f32 roundings: scale * scale, then * quant, then - min, never fused). */
#ifndef TPGEN_QUANT_H
#define TPGEN_QUANT_H
#include "tensor.h"
#include <stdint.h>

/* ggml type ids, as stored in GGUF tensor infos */
enum {
    QUANT_F32 = 0, QUANT_F16 = 1, QUANT_Q4_0 = 2, QUANT_Q4_1 = 3, QUANT_Q5_0 = 6, QUANT_Q5_1 = 7,
    QUANT_Q8_0 = 8, QUANT_Q8_1 = 9, QUANT_Q2_K = 10, QUANT_Q3_K = 11, QUANT_Q4_K = 12, QUANT_Q5_K = 13,
    QUANT_Q6_K = 14, QUANT_Q8_K = 15, QUANT_IQ4_NL = 20, QUANT_IQ4_XS = 23, QUANT_BF16 = 30,
};

#define QUANT_MAX_BLOCK 256   /* the largest block of any type (K-quants) */

typedef struct quant_type {
    int id;              /* ggml type id */
    const char *name;    /* ggml's spelling: "Q4_K" */
    int block;           /* elements per block */
    int bytes;           /* bytes per block */
    /* decode one block into out[block]; NULL: known to ggml, not to tpgen */
    void (*dequant)(const uint8_t *blk, float *out);
} quant_type;

const quant_type *quant_type_get(int id);  /* NULL for an id ggml does not define */
const char *quant_type_name(int id);       /* "Q4_K"; "unknown" for an undefined id */
int quant_supported(int id);               /* 1 when tpgen can dequantise it */
/* the supported types, comma-separated, for error messages */
const char *quant_supported_list(void);

/* The plain element types (F32 F16 BF16 F64 I8 I16 I32 I64) are tensors of
 * a tpgen dtype, stored as safetensors stores them: 0 and *dt for those,
 * -1 for block types (and unknown ids). */
int quant_dtype(int type, dtype_t *dt);

/* Bytes of a row of n elements; -1 when n is not a multiple of the block. */
int64_t quant_row_bytes(const quant_type *qt, int64_t n);

/* The blocks that cover columns [c0, c1) of a row: bytes [*off, *off + *len)
 * from the start of the row, and *skip = c0 % block, the index of column c0
 * in the first of them. Requires 0 <= c0 < c1 <= row length. */
void quant_col_span(const quant_type *qt, int64_t c0, int64_t c1, int64_t *off, int64_t *len, int64_t *skip);

/* Dequantise n elements (a multiple of the block) from whole blocks. The
 * type must be supported (quant_supported); anything else is a programming
 * error (callers refuse such tensors, naming them, when they open a file). */
void quant_dequant_row(int type, const void *blocks, float *out, int64_t n);
/* Dequantise n elements starting at element `skip` of the blocks at
 * `blocks` (the covering blocks of quant_col_span): only the blocks that
 * hold those elements are decoded. */
void quant_dequant_span(int type, const void *blocks, int64_t skip, int64_t n, float *out);
/* Columns [c0, c0 + n) of the row that starts at `row`. */
void quant_dequant_cols(int type, const void *row, int64_t c0, int64_t n, float *out);

#endif
