/* Loading a component's weights: each rank reads only the byte ranges of
 * its own shard of each planned tensor (docs/spec/flux2-transformer.md §8),
 * straight into backend memory; replicated tensors are read whole. No rank
 * ever holds a full-size copy of a sharded tensor.
 *
 * Every tensor is held as a 2-D matrix: rows = shape[0], cols = the product
 * of the other dims (a 1-D [n] tensor is [1, n]; a conv weight
 * [Cout, Cin, k, k] is [Cout, Cin*k*k]). */
#ifndef TPGEN_WEIGHTS_H
#define TPGEN_WEIGHTS_H
#include "checkpoint.h"
#include "kernels/tensor.h"
#include "plans/plan.h"

struct backend;
typedef struct weights weights;

typedef struct load_opts {
    int tp, rank;               /* shard of rank `rank` out of tp (1, 0: everything whole) */
    struct backend *be;         /* where tensors go */
    dtype_t dtype;              /* DT_F32: float tensors upcast; DT_BF16: float tensors as bf16 */
    /* optional filter: load only tensors for which want(name, ctx) != 0 */
    int (*want)(const char *name, void *ctx);
    void *want_ctx;
    int use_mmap;               /* 0: pread (default); 1: copy from an mmap of each file */
    size_t staging_cap;         /* host staging bound in bytes (0: WEIGHTS_STAGING_CAP) */
    int io_threads;             /* threads reading CPU-backend tensors in place (0: WEIGHTS_IO_THREADS) */
    /* optional load-time transformation of each tensor's shard once it is
     * read (a LoRA merge: core/formats/lora.h): called on the calling thread, in
     * file order, with the plan's shard (rule, style, blocks) and the
     * rank; t holds the rank's local tensor in the target dtype. */
    int (*transform)(void *ctx, const st_tensor_info *ti, const shard_info *si, int tp, int rank, tensor *t);
    void *transform_ctx;
    int quantize_fp8;           /* --quantize fp8: sharded linear weights become E4M3 + per-row scales (core/formats/fp8.h) */
} load_opts;

/* Host staging never exceeds this per rank (CUDA copies go through it, as
 * do dtype conversions); the CPU backend reads same-dtype tensors straight
 * into their memory and needs none. */
#define WEIGHTS_STAGING_CAP ((size_t)64 << 20)
/* Several reads in flight keep a disk busy: a cold klein-4B load took
 * ~2.5x less time with 4 reader threads than with 1 (docs/loader.md). */
#define WEIGHTS_IO_THREADS 4

typedef struct load_stats {
    uint64_t bytes_read;        /* bytes read from files by this rank */
    uint64_t bytes_replicated;  /* of which: replicated tensors */
    uint64_t bytes_sharded;     /* of which: this rank's shards */
    uint64_t bytes_held;        /* bytes of backend memory the weights occupy (fp8 scales included) */
    uint64_t max_staging;       /* largest host staging buffer used */
    double seconds;
    int n_tensors;
} load_stats;

/* Validate (plan_validate) then load. p may be NULL (all replicated). */
int weights_load(const checkpoint *c, const plan *p, const load_opts *o, weights **out,
                 load_stats *st);
/* What rank `rank` of tp would hold, without reading any weight byte:
 * bytes in the checkpoint's dtype, and the largest local tensor (the
 * staging a device backend needs is min(that, WEIGHTS_STAGING_CAP)).
 * Validates the plan first. */
typedef struct load_estimate {
    uint64_t bytes_replicated, bytes_sharded;
    uint64_t max_local_tensor;
    uint64_t max_staging;
    int n_tensors, n_sharded;
} load_estimate;
int weights_estimate(const checkpoint *c, const plan *p, int tp, int rank, load_estimate *out);
/* The same counting only the tensors for which want(name, ctx) != 0 (the
 * ones a component actually loads); want NULL counts all. */
int weights_estimate_want(const checkpoint *c, const plan *p, int tp, int rank,
                          int (*want)(const char *name, void *ctx), void *want_ctx, load_estimate *out);

/* Number of loaded tensors and the i-th name (sorted), for iteration. */
int weights_count(const weights *w);
const char *weights_name(const weights *w, int i);

/* The loaded tensor, or NULL when the checkpoint has no such tensor. */
const tensor *weights_get(const weights *w, const char *name);
/* Like weights_get with a printf-style name, but a missing tensor is an
 * error: NULL + tp_error("... tensor X missing from <dir>"). */
const tensor *weights_req(const weights *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Global (unsharded) shape of a loaded tensor as in the file. */
const st_tensor_info *weights_info(const weights *w, const char *name);
void weights_free(weights *w);

#endif
