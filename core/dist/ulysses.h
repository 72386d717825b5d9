/* Ulysses sequence parallelism (docs/parallel.md): the S ranks of an SP
 * group each hold a slice of the joint token sequence and run all the
 * per-token work (norms, projections, MLP, RoPE) on it; around attention an
 * all-to-all turns [local tokens x all local heads] into [all tokens x
 * heads/S] and back, so each rank attends over the whole sequence for its
 * share of the heads.
 *
 * The sequence is a list of segments (FLUX.2: text, then image tokens),
 * each split in contiguous slices over the ranks (the first total % S ranks
 * take one row more: any token count works, no padding reaches the
 * attention). A rank's local rows are its slice of each segment in segment
 * order; the full sequence handed to the attention kernel is the segments
 * whole, in the order of the one-rank forward, so the kernel sees the same
 * rows in the same order and its per-head result is the one-rank result. */
#ifndef TPGEN_ULYSSES_H
#define TPGEN_ULYSSES_H
#include "kernels/comm.h"
#include <stdint.h>

#define ULYSSES_MAX_SEG 4

typedef struct ulysses_layout {
    int sp, rank;
    int nseg;
    int64_t total[ULYSSES_MAX_SEG];   /* rows of each segment in the full sequence */
} ulysses_layout;

/* rank r's slice of a segment of `total` rows: its first row and count */
int64_t ulysses_first(int64_t total, int sp, int r);
int64_t ulysses_rows(int64_t total, int sp, int r);
/* rows a rank holds (its slices of every segment), and the whole sequence */
int64_t ulysses_local_rows(const ulysses_layout *l, int r);
int64_t ulysses_full_rows(const ulysses_layout *l);

/* The buffers of the all-to-all around attention for one layout, kept
 * between calls: ulysses_reserve makes them in a prepare step (before the
 * lockstep loop, where an allocation must not fail alone) and again only
 * when the layout or width changes. */
typedef struct ulysses_bufs {
    tensor *t[6];
} ulysses_bufs;
/* buffers for q, k, v of `cols` columns (this rank's heads) in layout l, dtype dt on be; -1 + tp_error */
int ulysses_reserve(ulysses_bufs *b, const ulysses_layout *l, int64_t cols, dtype_t dt, struct backend *be);
void ulysses_bufs_free(ulysses_bufs *b);

/* The attention kernel on whole-sequence buffers: o, q, k, v [rows, heads x
 * head_dim] of the heads this rank attends for. */
typedef void (*ulysses_attn_fn)(void *ctx, tensor *o, const tensor *q, const tensor *k, const tensor *v);

/* o = attention(q, k, v) for this rank's local rows and all of its local
 * heads (q, k, v, o [local rows, H x head_dim], views allowed), over the SP
 * group `c` (c->size == l->sp): an all-to-all of q|k|v (H/sp heads to each
 * rank), the kernel over the whole sequence, an all-to-all of o back. H
 * must be a multiple of sp. The buffers are b's (reserved for this layout
 * and width if they are not yet; NULL: made and freed in the call).
 * Collective; -1 + tp_error when a buffer cannot be allocated or a
 * collective fails. */
int ulysses_attention(comm *c, const ulysses_layout *l, int head_dim, ulysses_bufs *b, tensor *o, const tensor *q,
                      const tensor *k, const tensor *v, ulysses_attn_fn fn, void *ctx);

/* The local rows of every rank gathered into the whole sequence, for the
 * output layer's rows: local [local rows, cols] -> full [full rows, cols]
 * (on every rank; both on the comm's backend). Collective. */
/* A model's SP group: NULL or one rank is none (*out NULL, *degree 1,
 * *rank 0); else the heads a TP rank holds must split over it (-1 +
 * tp_error naming `who` otherwise). */
int ulysses_join(comm *sp, int heads_local, const char *who, comm **out, int *degree, int *rank);
int ulysses_gather(comm *c, const ulysses_layout *l, const tensor *local, tensor *full);

#endif
