/* Block caching (issue 36): cache-dit 1.5.3's DBCache and TaylorSeer, as
 * docs/spec/block-cache.md specifies them, as one wrapper around the block
 * loops of every transformer.
 *
 * A model's forward runs each of its two block groups (FLUX.2: the double
 * blocks, then the single blocks; FLUX.3: the mode blocks, then the joint
 * single blocks) through block_cache_run with a callback that runs one
 * block. Without a cache (NULL, or a spec that is off) that is the plain
 * loop. With one, the wrapper runs the first Fn blocks, measures how much
 * their residual moved since the last computed step, and either runs the
 * middle blocks or adds their residual from the last computed step (or its
 * TaylorSeer forecast) instead; the last Bn blocks always run (spec §2).
 *
 * State: per group and per CFG branch (spec §4), created fresh for every
 * image (block_cache_new per job), so a batch renders each image as it
 * would alone. */
#ifndef TPGEN_BLOCK_CACHE_H
#define TPGEN_BLOCK_CACHE_H
#include "kernels/tensor.h"
#include <mpi.h>
#include <stdint.h>

enum { BC_DOUBLE = 0, BC_SINGLE = 1, BC_GROUPS = 2, BC_BRANCHES = 2 };

/* --cache SPEC, parsed. Limits use -1 for "none". */
typedef struct bc_spec {
    int on;
    int fn, bn;                  /* compute blocks at the front and the back of each group */
    int warmup;                  /* steps 0..warmup-1 always compute */
    double threshold;            /* double group (FLUX.3: mode blocks) */
    double threshold_single;     /* single group */
    int max_cached;              /* cached steps per image, group and branch (-1: no limit) */
    int max_continuous;          /* cached steps in a row (-1: no limit) */
    int taylorseer;              /* forecast order 0 (off), 1 or 2 */
    char preset[16];             /* the preset it came from ("" if none) */
} bc_spec;

/* Parse "off", a preset name ("fast", "balanced"), or comma-separated
 * key=value pairs (a preset name may come first, the pairs then override
 * it). -1 + tp_error naming the key on a bad key, value or combination. */
int bc_spec_parse(const char *text, bc_spec *out);
/* The spec as text (canonical key=value list, or "off"), malloc'ed. */
char *bc_spec_format(const bc_spec *s);
/* Whether fn/bn fit a model of n_double + n_single blocks (each group
 * separately: fn + bn at most its count); -1 + tp_error naming the key. */
int bc_spec_check_model(const bc_spec *s, int n_double, int n_single, const char *group_names[2]);
/* The threshold of group g. */
double bc_threshold(const bc_spec *s, int g);

/* What was computed and what was served from the cache in one image:
 * dec[b][g] one char per step, 'C' computed or 'K' cached; diff[b][g] the
 * residual diff per step (NaN: not evaluated; -1: threshold >= 1, not
 * computed; -2: shape changed). b = 1 only with CFG. */
typedef struct bc_log {
    int steps, branches;
    char *dec[BC_BRANCHES][BC_GROUPS];
    double *diff[BC_BRANCHES][BC_GROUPS];
    int disagreements;           /* decisions on which the ranks differed (then all computed); 0 expected */
    uint64_t peak_bytes;         /* the largest host memory the cache held */
} bc_log;
void bc_log_free(bc_log *l);
/* cached steps of group g, all branches */
int bc_log_cached(const bc_log *l, int g);

/* The pure decision of spec §3 for one group and branch: the counters of
 * the state and the step. Returns BC_COMPUTE, BC_CACHE, or BC_MEASURE (then
 * cache iff diff < threshold). *code is the diff to record without a
 * measurement (NaN, -1, -2). */
enum { BC_COMPUTE = 0, BC_CACHE = 1, BC_MEASURE = 2 };
typedef struct bc_counts {
    int n_cached;                /* cached steps so far */
    int cont;                    /* cached steps in a row, ending at step - 1 */
    int have_prev;               /* a computed step's Fn residual exists */
    int same_shape;              /* and has the shape of this step's */
} bc_counts;
int bc_decide(const bc_spec *s, double thr, const bc_counts *c, int step, double *code);
/* diff = mean|prev - r| / mean|prev| from the sums over this rank's
 * elements, added up over the sequence-parallel group sp (MPI_COMM_NULL:
 * none; TP ranks hold the whole, replicated tensor). Collective over sp. */
double bc_ratio(double sum_absdiff, double sum_absprev, int64_t count, MPI_Comm sp);

/* TaylorSeer (spec §5) on one stream of n floats, order k. */
typedef struct bc_taylor {
    int k, levels, last;         /* levels of dY held; last: step of the last update (-1: none) */
    int64_t n;
    float *dy;                   /* [k + 1][n] */
} bc_taylor;
void bc_taylor_update(bc_taylor *t, const float *y, int64_t n, int step);
void bc_taylor_approx(const bc_taylor *t, int step, float *out);

typedef struct block_cache block_cache;
/* A fresh cache for one image of `steps` steps and `branches` (1, or 2
 * with CFG). agree: the TP group, over which each decision is agreed
 * (MPI_COMM_NULL: one rank); sp: the SP group of Ulysses sequence
 * parallelism (MPI_COMM_NULL: none), over which the residual sums add up
 * and the decision is agreed too. NULL when s is off. */
block_cache *block_cache_new(const bc_spec *s, int steps, int branches, MPI_Comm agree, MPI_Comm sp);
void block_cache_free(block_cache *bc);
/* Before each transformer call: the denoising step and the CFG branch. */
void block_cache_call(block_cache *bc, int step, int branch);
/* CFG parallelism: the two halves of the job group each ran one branch
 * (cfg rank r: branch r); give each half the other's record of decisions
 * and residual diffs, so that the log is the serial run's. Collective over
 * cfg (2 ranks). */
int block_cache_share_branches(block_cache *bc, MPI_Comm cfg);
/* Move the record of the image into *out (bc stays usable). */
void block_cache_take_log(block_cache *bc, bc_log *out);

/* Run block i of the group; -1 + tp_error on failure. */
typedef int (*bc_block_fn)(void *ctx, int i);
/* Run group g of n blocks on the stream x (all its rows; the whole stream
 * is what a cached step adds the residual to). The Fn residual is measured
 * on the rows [r0, r0 + rows) of x (FLUX.2's double group: the image rows).
 * bc NULL: the blocks one after another. Collective when bc is set (the
 * decision is agreed across the TP group). */
int block_cache_run(block_cache *bc, int g, int n, tensor *x, int64_t r0, int64_t rows, bc_block_fn run, void *ctx);

#endif
