/* Loading a component's weights: each rank reads only the byte ranges of
 * its own shard of each planned tensor (spec flux2-transformer.md §8),
 * straight into backend memory; replicated tensors are read whole. No rank
 * ever holds a full-size copy of a sharded tensor.
 *
 * Every tensor is held as a 2-D matrix: rows = shape[0], cols = the product
 * of the other dims (a 1-D [n] tensor is [1, n]; a conv weight
 * [Cout, Cin, k, k] is [Cout, Cin*k*k]). */
#ifndef TPGEN_WEIGHTS_H
#define TPGEN_WEIGHTS_H
#include "checkpoint.h"
#include "tensor.h"
#include "../plans/plan.h"

struct backend;
typedef struct weights weights;

typedef struct load_opts {
    int tp, rank;               /* shard of rank `rank` out of tp (1, 0: everything whole) */
    struct backend *be;         /* where tensors go */
    dtype_t dtype;              /* DT_F32: float tensors upcast; DT_BF16: float tensors as bf16 */
    /* optional filter: load only tensors for which want(name, ctx) != 0 */
    int (*want)(const char *name, void *ctx);
    void *want_ctx;
} load_opts;

typedef struct load_stats {
    uint64_t bytes_read;        /* bytes read from files by this rank */
    uint64_t bytes_replicated;  /* of which: replicated tensors */
    uint64_t bytes_sharded;     /* of which: this rank's shards */
    uint64_t bytes_held;        /* bytes of backend memory the weights occupy */
    uint64_t max_staging;       /* largest host staging buffer used */
    double seconds;
    int n_tensors;
} load_stats;

/* Validate (plan_validate) then load. p may be NULL (all replicated). */
int weights_load(const checkpoint *c, const plan *p, const load_opts *o, weights **out,
                 load_stats *st);
/* The loaded tensor, or NULL when the checkpoint has no such tensor. */
const tensor *weights_get(const weights *w, const char *name);
/* Like weights_get with a printf-style name, but a missing tensor is an
 * error: NULL + tp_error("... tensor X missing from <dir>"). */
const tensor *weights_req(const weights *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Global (unsharded) shape of a loaded tensor as in the file. */
const st_tensor_info *weights_info(const weights *w, const char *name);
void weights_free(weights *w);

#endif
