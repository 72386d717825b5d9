/* The backend-neutral op interface. Model code (core/models/) calls these
 * functions and never a backend directly; kernels/cpu and kernels/cuda each
 * fill one backend_vtable.
 *
 * Conventions for every compute op
 * - All tensors live on the backend passed in (t->be == be).
 * - Activations are DT_F32 or DT_BF16; weights are DT_F32, DT_BF16 or, for
 *   op_gemm, op_copy and op_gather_rows, fp8 with scales (tensor.scale).
 *   Arithmetic is fp32; the result is rounded to the output tensor's dtype.
 *   When the output is bf16, ops round at the points where eager PyTorch in
 *   bf16 rounds (docs/spec/flux2-transformer.md §3), noted per op below.
 * - Inputs and outputs may be views (ld > cols). Unless an op says it works
 *   in place, outputs must not overlap inputs.
 * - Ops may be asynchronous (CUDA: queued on the backend's stream); be_sync()
 *   waits. Host<->backend copies through be_upload/be_download are ordered
 *   with the ops.
 * - Bad shapes are programming errors: the op calls tp_fatal().
 */
#ifndef TPGEN_OPS_H
#define TPGEN_OPS_H
#include "tensor.h"
#include "fault.h"
#include <stdint.h>
#include <stddef.h>

typedef enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 } backend_kind;

typedef enum { ROPE_INTERLEAVED = 0, ROPE_HALF = 1 } rope_mode;

typedef struct attn_params {
    int n_q_heads, n_kv_heads;  /* GQA: query head h uses kv head h / (n_q_heads / n_kv_heads) */
    int head_dim;
    float scale;                /* usually 1/sqrt(head_dim) */
    int causal;                 /* key j visible to query i only if j <= i + q_pos0 */
    int64_t q_pos0;             /* absolute position of query row 0 (for causal) */
    const tensor *key_valid;    /* NULL, or DT_I32 [1, Sk] on the backend: 0 = masked key */
} attn_params;

typedef struct backend backend;

typedef struct backend_vtable {
    const char *name;
    /* memory */
    void *(*alloc)(backend *, size_t bytes);          /* NULL + tp_error on failure */
    void (*free)(backend *, void *);
    int (*upload)(backend *, void *dst, const void *host_src, size_t bytes);
    int (*download)(backend *, void *host_dst, const void *src, size_t bytes);
    /* 2-D copy host -> backend: height rows of width bytes, pitches in bytes */
    int (*upload2d)(backend *, void *dst, size_t dpitch, const void *host_src, size_t spitch,
                    size_t width, size_t height);
    int (*memset0)(backend *, void *dst, size_t bytes);
    int (*sync)(backend *);
    void (*destroy)(backend *);
    /* compute */
    void (*gemm)(backend *, tensor *y, const tensor *x, const tensor *w, const tensor *bias);
    void (*copy)(backend *, tensor *y, const tensor *x);
    void (*layernorm_mod)(backend *, tensor *y, const tensor *x, const tensor *shift,
                          const tensor *scale, float eps);
    void (*rmsnorm)(backend *, tensor *y, const tensor *x, const tensor *w, int group, float eps);
    void (*rope)(backend *, tensor *x, const tensor *cos, const tensor *sin, int head_dim, rope_mode mode);
    void (*attention)(backend *, tensor *o, const tensor *q, const tensor *k, const tensor *v,
                      const attn_params *p);
    void (*swiglu)(backend *, tensor *y, const tensor *gate, const tensor *up);
    void (*silu)(backend *, tensor *y, const tensor *x);
    void (*add)(backend *, tensor *y, const tensor *a, const tensor *b);
    void (*gated_add)(backend *, tensor *x, const tensor *gate, const tensor *y);
    void (*gather_rows)(backend *, tensor *y, const tensor *table, const int32_t *ids, int64_t n,
                        int64_t row0);
    void (*conv2d)(backend *, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
                   int64_t h, int64_t wd, int k);
    void (*group_norm)(backend *, tensor *y, const tensor *x, const tensor *gamma,
                       const tensor *beta, int groups, float eps, int apply_silu);
    void (*upsample2x)(backend *, tensor *y, const tensor *x, int64_t h, int64_t wd);
    void (*transpose)(backend *, tensor *y, const tensor *x);
    void (*conv2d_down)(backend *, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
                        int64_t h, int64_t wd);
    /* file -> backend, no host copy of the caller's (the loader's direct
     * path): height rows of width bytes, row r read from file offset
     * off + r*spitch of fd, to dst + r*dpitch. Thread-safe on the CPU
     * backend (pread); NULL: the loader stages through upload2d instead.
     * Returns -1 + tp_error on a short or failed read (the caller adds the
     * file name). */
    int (*upload_file)(backend *, void *dst, size_t dpitch, int fd, uint64_t off, size_t spitch,
                       size_t width, size_t height);
    /* the two halves of group_norm (op_channel_sums, op_channel_affine);
     * NULL: ops.c runs them on the host through download/upload */
    void (*channel_sums)(backend *, const tensor *x, const double *center, int p, double *out);
    void (*channel_affine)(backend *, tensor *y, const tensor *x, const float *a, const float *b, int apply_silu);
    /* op_rows_invariant; NULL: 0 */
    int (*rows_invariant)(backend *, dtype_t dt);
    /* op_channel_row_sums; NULL: ops.c calls channel_sums on each row */
    void (*channel_row_sums)(backend *, const tensor *x, int64_t W, const double *center, int p, double *out);
} backend_vtable;

struct backend {
    backend_kind kind;
    const backend_vtable *vt;
    void *impl;          /* backend private state */
    int device;          /* GPU ordinal (CUDA) or -1 */
    int threads;         /* CPU threads this rank may use */
    size_t bytes_in_use, peak_bytes;  /* maintained by the backend's alloc/free */
};

/* ---- creating backends ---- */
/* CPU backend using `threads` OpenMP/OpenBLAS threads (<= 0: the default). */
backend *backend_cpu_create(int threads);
/* CUDA backend on GPU `device`; NULL + tp_error when unavailable or built
 * without CUDA (tpgen_has_cuda() == 0). */
backend *backend_cuda_create(int device);
int tpgen_has_cuda(void);         /* 1 when the binary was built with the CUDA backend */
int backend_cuda_device_count(void); /* 0 when none is usable (or no CUDA build) */
void backend_destroy(backend *be);

/* ---- memory (thin wrappers over the vtable; inline, so that the tensor
 * type, which allocates through them, needs nothing of ops.c) ----
 * Backends keep be->bytes_in_use and be->peak_bytes up to date in their
 * alloc and free (they know each block's size). */
/* be_alloc also runs the fault injection and, inside a lockstep section,
 * ends the job on a failure instead of returning NULL (kernels/fault.h). */
static inline void *be_alloc(backend *be, size_t bytes) {
    void *p = tp_fault_alloc_fails(bytes) ? NULL : be->vt->alloc(be, bytes);
    if (!p) tp_alloc_failed();
    return p;
}
static inline void be_free(backend *be, void *p) {
    if (p) be->vt->free(be, p);
}
static inline int be_upload(backend *be, void *dst, const void *host_src, size_t bytes) {
    return be->vt->upload(be, dst, host_src, bytes);
}
static inline int be_download(backend *be, void *host_dst, const void *src, size_t bytes) {
    return be->vt->download(be, host_dst, src, bytes);
}
static inline int be_sync(backend *be) { return be->vt->sync(be); }
/* vt->upload_file, or a tp_error when the backend has none */
int be_upload_file(backend *be, void *dst, size_t dpitch, int fd, uint64_t off, size_t spitch, size_t width,
                   size_t height);

/* Host <-> tensor helpers that convert dtypes: upload n = numel f32 values
 * into t (any float dtype, view allowed) and download t as f32. */
int tensor_upload_f32(tensor *t, const float *host);
int tensor_download_f32(const tensor *t, float *host);
/* Raw copy of host bytes in t's own dtype (contiguous or view). */
int tensor_upload_raw(tensor *t, const void *host);
int tensor_download_raw(const tensor *t, void *host);

/* ---- compute ops ---- */

/* y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias[1,N] when not NULL). fp32 accumulation;
 * y rounded once to its dtype. w is a weight (f32 or bf16, contiguous rows,
 * ld >= K) or fp8 (F8_E4M3/F8_E5M2 with its scales, kernels/tensor.h: the
 * product is x · (decode(w) * scale)ᵀ; the CPU widens fp8 panels inside
 * the GEMM, CUDA runs an fp8 tensor-core GEMM or dequantises to bf16).
 * Shapes: x.cols == w.cols, y.rows == x.rows, y.cols == w.rows. */
void op_gemm(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias);
/* Swap rows [0, d) and [d, 2d) of a DT_GGML tensor's stored bytes in place
 * (whole rows are whole blocks), through host memory so that it works on
 * any backend; -1 + tp_error on a failed copy. */
int op_swap_ggml_row_halves(tensor *w, int64_t d);

/* y = x with dtype conversion; same shape; views allowed. An fp8 x (a
 * weight, kernels/tensor.h) is dequantised: y = decode(code) * scale, one
 * f32 multiply rounded to y's dtype (f32: the exact dequantised value). */
void op_copy(backend *be, tensor *y, const tensor *x);

/* y = LN(x) * (1 + scale) + shift, LN over each row without affine,
 * biased variance, eps. shift/scale are [1, cols] (NULL: plain LN).
 * bf16 output: LN rounded, then bf16(1+scale), bf16(a*n), bf16(b+shift). */
void op_layernorm_mod(backend *be, tensor *y, const tensor *x, const tensor *shift,
                      const tensor *scale, float eps);

/* RMSNorm over consecutive groups of `group` columns of each row (group ==
 * cols: a whole-row norm as in LLMs; group == head_dim: per-head QK norm).
 * y = (x / sqrt(mean(x²) + eps)) * w, w is [1, group]. bf16 output rounds
 * twice: bf16(x*r) then bf16(.*w). In place (y == x) allowed. */
void op_rmsnorm(backend *be, tensor *y, const tensor *x, const tensor *w, int group, float eps);

/* In place RoPE on x [S, nh*head_dim]; cos/sin are f32 [S, head_dim]
 * (the full per-token table, each frequency present twice).
 * ROPE_INTERLEAVED (FLUX.2): pairs (2j, 2j+1):
 *   y[2j] = x[2j]c[2j] - x[2j+1]s[2j];  y[2j+1] = x[2j+1]c[2j+1] + x[2j]s[2j+1]
 * ROPE_HALF (Qwen3, Mistral): pairs (j, j+hd/2):
 *   y[j] = x[j]c[j] - x[j+h]s[j];  y[j+h] = x[j+h]c[j+h] + x[j]s[j+h]
 * fp32 math, one rounding to x's dtype. */
void op_rope(backend *be, tensor *x, const tensor *cos, const tensor *sin, int head_dim, rope_mode mode);

/* o[Sq, Hq*hd] = softmax(q kᵀ * scale + mask) v per head; q [Sq, Hq*hd],
 * k and v [Sk, Hkv*hd] (views allowed). fp32 softmax and accumulation.
 * Must not materialise Sq x Sk scores for all heads (tile it). A query row
 * with no visible key gets 0 (PyTorch SDPA behaviour). */
void op_attention(backend *be, tensor *o, const tensor *q, const tensor *k, const tensor *v,
                  const attn_params *p);

/* y = silu(gate) * up (same shapes; views allowed). bf16: bf16(silu) then bf16(*). */
void op_swiglu(backend *be, tensor *y, const tensor *gate, const tensor *up);
/* y = x * sigmoid(x). In place allowed. */
void op_silu(backend *be, tensor *y, const tensor *x);
/* y = a + b; b may be [1, cols] (broadcast over rows). In place (y == a) allowed. */
void op_add(backend *be, tensor *y, const tensor *a, const tensor *b);
/* x += gate * y (gate [1, cols] broadcast; NULL gate means 1). In place on x.
 * bf16: bf16(x + bf16(gate*y)). */
void op_gated_add(backend *be, tensor *x, const tensor *gate, const tensor *y);

/* y[i] = table[ids[i] - row0] for i < n; rows whose id falls outside
 * [row0, row0 + table.rows) are set to 0 (vocab-sharded embeddings).
 * ids is a HOST array. On the CPU backend the table may be DT_GGML (a
 * quantised GGUF token_embd: each row's blocks are decoded). */
void op_gather_rows(backend *be, tensor *y, const tensor *table, const int32_t *ids, int64_t n,
                    int64_t row0);

/* 2-D convolution, stride 1, zero padding k/2, k in {1, 3}.
 * x [Cin, h*wd], w [Cout, Cin*k*k] (PyTorch [Cout,Cin,k,k] flattened),
 * bias [1, Cout] or NULL, y [Cout, h*wd]. */
void op_conv2d(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
               int64_t h, int64_t wd, int k);
/* 3x3 convolution with stride 2, as diffusers' Downsample2D(padding=0)
 * computes it: F.pad(x, (0, 1, 0, 1)) (one zero row at the bottom and one
 * zero column on the right, none on the top/left), then a stride-2 conv.
 * y[co, i*(wd/2) + j] = bias[co] + sum w[co, ci, dy, dx] x[ci, 2i+dy, 2j+dx]
 * (x read as 0 past the last row/column). x [Cin, h*wd] with h and wd even,
 * w [Cout, Cin*9], bias [1, Cout] or NULL, y [Cout, (h/2)*(wd/2)]. */
void op_conv2d_down(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
                    int64_t h, int64_t wd);
/* GroupNorm on x [C, HW]: `groups` groups of C/groups channels, statistics
 * over (C/groups)*HW values (biased variance, fp32), then *gamma[c] + beta[c];
 * optionally SiLU after. In place allowed. */
void op_group_norm(backend *be, tensor *y, const tensor *x, const tensor *gamma, const tensor *beta,
                   int groups, float eps, int apply_silu);
/* GroupNorm in two halves, for an activation split by columns across ranks
 * (the VAE's row bands), where the statistics must be summed over the
 * group before they are applied. op_channel_sums: out[c] = sum over the
 * columns of (x[c, i] - center[c])^p in f64, p 1 or 2, center a HOST array
 * [C] or NULL (0); out is a HOST array [C]. op_channel_affine: y[c, i] =
 * x[c, i]*a[c] + b[c] (a, b HOST arrays [C]), then SiLU when asked, with
 * op_group_norm's arithmetic and rounding: op_group_norm equals these two
 * with a = rstd*gamma, b = beta - mean*a. In place allowed. */
void op_channel_sums(backend *be, const tensor *x, const double *center, int p, double *out);
void op_channel_affine(backend *be, tensor *y, const tensor *x, const float *a, const float *b, int apply_silu);
/* out[c*rows + r] = op_channel_sums of row r alone (columns [r*W, (r+1)*W)
 * of x, rows = x->cols / W) for channel c: the same bits as that call, in
 * one pass (the VAE's GroupNorm folds them in image row order). */
void op_channel_row_sums(backend *be, const tensor *x, int64_t W, const double *center, int p, double *out);
/* 1 when, with activations of dtype dt, this backend's op_conv2d,
 * op_conv2d_down, op_gemm, op_attention (per query row) and the per-element
 * ops give every output pixel or row the same bits whatever else the call
 * holds: a computation split into row bands then gives the whole one's
 * bits (the VAE's band count changes nothing, core/models/vae/vae_band.c).
 * CPU: yes, except the f32 3x3 convolutions on the Winograd route, whose
 * 4x4 tiles follow the call's first row (TPGEN_NO_WINOGRAD=1 turns it off;
 * bf16 on AMX or vdpbf16ps does not take it). CUDA: not established (0). */
int op_rows_invariant(backend *be, dtype_t dt);
/* Nearest-neighbour x2: x [C, h*wd] -> y [C, 2h*2wd]. */
void op_upsample2x(backend *be, tensor *y, const tensor *x, int64_t h, int64_t wd);
/* y [cols, rows] = x [rows, cols]ᵀ. */
void op_transpose(backend *be, tensor *y, const tensor *x);

/* Pick the backend for --backend NAME (NULL or "auto": cuda when a GPU is
 * visible, else cpu). local_rank/local_size place GPUs and split the CPU
 * cores between the ranks of one node. */
int backend_select(const char *name, int local_rank, int local_size, backend **out);
/* The CPU backend's thread count for backend_select, from the rank's CPU
 * binding (core/dist/affinity.c, at dist_init); OMP_NUM_THREADS still wins. */
void backend_set_cpu_threads(int threads);

#endif
