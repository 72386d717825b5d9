/* Tensors: dtypes, bf16 rounding, and the 2-D matrix view every op works on.
 *
 * Batch is always 1 inside a forward pass, so activations are matrices
 * [rows = tokens, cols = features]; a per-head layout [S, H*hd] is the same
 * matrix with head h owning columns [h*hd, (h+1)*hd). Convolution activations
 * are [channels, height*width] with the spatial size passed to the op.
 * 1-D vectors are [1, n]. A view shares data with its parent (ld keeps the
 * parent's row pitch), so the joint [text; image] sequence is one buffer with
 * two row-range views, and the fused single-block projection is one buffer
 * with column-range views for Q, K, V, gate and up. */
#ifndef TPGEN_TENSOR_H
#define TPGEN_TENSOR_H
#include <stdint.h>
#include <stddef.h>
#include <string.h>

typedef enum {
    DT_F32 = 0,
    DT_BF16,
    DT_F16,
    DT_F64,
    DT_I64,
    DT_I32,
    DT_I16,
    DT_I8,
    DT_U8,
    DT_BOOL,
    DT_F8_E4M3,   /* fp8 storage dtypes (weights only): 1 sign, 4 exponent, 3 mantissa bits, no inf */
    DT_F8_E5M2,   /* 1 sign, 5 exponent, 2 mantissa bits (IEEE-like, with inf) */
    DT_GGML,      /* ggml blocks (GGUF weights only): tensor.qtype, .qpitch, .qseg; no per-element size */
    DT_COUNT
} dtype_t;

size_t dtype_size(dtype_t dt);
const char *dtype_name(dtype_t dt);            /* safetensors spelling: "F32", "BF16", ... */
int dtype_from_name(const char *s, dtype_t *out); /* 0 ok, -1 unknown */

/* ---- scalar conversions (round-to-nearest-even, NaN kept quiet) ---- */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* round an f32 value to the nearest bf16 and back: bf16(x) of the spec */
static inline float bf16r(float f) { return bf16_to_f32(f32_to_bf16(f)); }
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/* fp8 codes (OCP FP8: E4M3 "fn", bias 7, max 448, NaN = S.1111.111, no inf;
 * E5M2 bias 15, max 57344, inf and NaN as in IEEE). Decoding is exact in
 * f32 (and in bf16); fp8_table(dt) gives all 256 values of a format. */
static inline int dtype_is_fp8(int dt) { return dt == DT_F8_E4M3 || dt == DT_F8_E5M2; }
const float *fp8_table(dtype_t dt);   /* 256 entries; NULL for a non-fp8 dtype */
static inline float fp8_to_f32(dtype_t dt, uint8_t code) { return fp8_table(dt)[code]; }
/* round to nearest even; values beyond the format's largest finite value
 * saturate to it (callers clamp first, as the quantisers do), NaN -> NaN */
uint8_t f32_to_fp8(dtype_t dt, float f);
float fp8_max(dtype_t dt);            /* 448 or 57344 */

/* Convert n elements of a float dtype (F32, BF16, F16, F64) to/from f32. */
int convert_to_f32(float *dst, const void *src, dtype_t dt, size_t n);
/* Index of the first NaN or Inf among n floats, -1 when all are finite.
 * Used to turn a silently black image into an error (latents after each
 * denoising step, prompt embeddings, the decoded image, weights). */
int64_t first_nonfinite_f32(const float *x, size_t n);
void convert_from_f32(void *dst, dtype_t dt, const float *src, size_t n);

/* ---- the matrix view ---- */
struct backend;

/* One segment of a DT_GGML tensor's local row (see tensor.qseg). */
#define TENSOR_MAX_QSEGS 8   /* = PLAN_MAX_PIECES: a packed row-parallel shard has one piece per block */
typedef struct tensor_qseg {
    int64_t col0, ncols;  /* local columns */
    int64_t off;          /* byte offset of its covering blocks in the stored local row */
    int64_t skip;         /* column col0 is element skip of those blocks */
} tensor_qseg;

typedef struct tensor {
    dtype_t dtype;
    int64_t rows, cols;   /* 1-D vectors: rows = 1 */
    int64_t ld;           /* elements between the starts of consecutive rows, >= cols */
    void *data;           /* backend memory: host for the CPU backend, device for CUDA */
    struct backend *be;   /* where data lives */
    int owner;            /* 1: tensor_free releases data (and scale) through be */
    /* fp8 weights (dtype_is_fp8): value = decode(code) * scale. scale is f32
     * on be: NULL means 1, else one value for the tensor (scale_per_row 0)
     * or one per row of this view (tensor_rows moves it with the rows). */
    void *scale;
    int scale_per_row;
    int quant_flags;      /* TQ_* hints from the checkpoint */
    /* DT_GGML weights (docs/gguf.md "Quantised weights in memory"): each
     * row is qpitch bytes of ggml blocks of type qtype (a ggml type id, see
     * kernels/quant.h); ld is unused. A local row is n_qseg segments, one
     * per shard piece of a row-parallel split: columns [col0, col0 + ncols)
     * of the local row are elements skip.. of the covering blocks stored at
     * byte off of the row. A whole row is one segment {0, cols, 0, 0}. */
    int qtype;
    int64_t qpitch;
    int n_qseg;
    tensor_qseg qseg[TENSOR_MAX_QSEGS];
    /* Low-rank terms added to every product with this weight (an unmerged
     * LoRA on fp8 or GGUF weights, docs/lora.md): op_gemm adds
     * x[:, col0:col0+ncols] · aᵀ · bᵀ to y[:, row0:row0+nrows] for each
     * term. Rows are the owner's local rows; lowrank_row0 is where a row view
     * starts in them (tensor_rows moves it). Owned by the owning tensor. */
    struct tensor_lowrank *lowrank;
    int64_t lowrank_row0;
} tensor;

/* One low-rank term: a [r, ncols] and b [nrows, r] (the coefficient folded
 * into b), both plain f32 tensors on the weight's backend. */
typedef struct tensor_lowrank_term {
    int64_t row0, nrows, col0, ncols;
    tensor *a, *b;
} tensor_lowrank_term;

typedef struct tensor_lowrank {
    int n;
    tensor_lowrank_term *t;
} tensor_lowrank;

/* Add a term to w (the owning tensor); a and b become w's. */
void tensor_lowrank_add(tensor *w, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, tensor *a, tensor *b);
/* Backend bytes of w's low-rank terms. */
size_t tensor_lowrank_bytes(const tensor *w);

/* the layer must not run an fp8 GEMM (ComfyUI full_precision_matrix_mult):
 * a backend dequantises it and multiplies in bf16/f32 */
#define TQ_FULL_PRECISION_MM 1

static inline int tensor_contiguous(const tensor *t) { return t->ld == t->cols || t->rows == 1; }
static inline size_t tensor_nbytes(const tensor *t) {
    if (t->dtype == DT_GGML) return (size_t)t->rows * (size_t)t->qpitch;
    return (size_t)t->rows * (size_t)t->cols * dtype_size(t->dtype);
}
static inline size_t tensor_numel(const tensor *t) { return (size_t)t->rows * (size_t)t->cols; }

/* Allocate a contiguous rows x cols tensor on backend be (data uninitialised).
 * Returns NULL after tp_error() on out-of-memory. */
tensor *tensor_new(struct backend *be, dtype_t dt, int64_t rows, int64_t cols);
void tensor_free(tensor *t);   /* NULL ok; frees data only when owner */
/* A DT_GGML weight: rows x cols of ggml type qtype, each row `pitch` bytes
 * made of the n segments seg (copied); data uninitialised. NULL after
 * tp_error() on out-of-memory. tensor_new refuses DT_GGML. */
tensor *tensor_new_ggml(struct backend *be, int qtype, int64_t rows, int64_t cols, int64_t pitch,
                        const tensor_qseg *seg, int n);

/* Views (no allocation, value types): rows [r0, r0+n) or columns [c0, c0+n).
 * A DT_GGML tensor takes row views only (its rows are qpitch bytes apart). */
tensor tensor_rows(const tensor *t, int64_t r0, int64_t n);
tensor tensor_cols(const tensor *t, int64_t c0, int64_t n);
/* Reinterpret a contiguous tensor as rows x cols (same element count). */
tensor tensor_reshape(const tensor *t, int64_t rows, int64_t cols);
/* Wrap memory that lives on be (not owned). */
tensor tensor_wrap(struct backend *be, dtype_t dt, int64_t rows, int64_t cols, void *data);

#endif
