/* Ulysses sequence parallelism (ulysses.h). The all-to-all needs equal
 * parts, so each rank's rows travel padded to the largest slice (pad rows);
 * the padding is never copied into the whole-sequence buffers. */
#include "ulysses.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <stdlib.h>

int64_t ulysses_first(int64_t total, int sp, int r) {
    int64_t q = total / sp, e = total % sp;
    return r * q + (r < e ? r : e);
}
int64_t ulysses_rows(int64_t total, int sp, int r) { return total / sp + (r < total % sp ? 1 : 0); }

int64_t ulysses_local_rows(const ulysses_layout *l, int r) {
    int64_t n = 0;
    for (int s = 0; s < l->nseg; s++) n += ulysses_rows(l->total[s], l->sp, r);
    return n;
}

int64_t ulysses_full_rows(const ulysses_layout *l) {
    int64_t n = 0;
    for (int s = 0; s < l->nseg; s++) n += l->total[s];
    return n;
}

/* the largest local row count: rank 0's (it takes the extra rows first) */
static int64_t pad_rows(const ulysses_layout *l) { return ulysses_local_rows(l, 0); }

/* Copy between rank r's rows in a local-layout block (slices in segment
 * order, from row `base`) and their places in the whole sequence: to_full 1
 * copies block -> full, 0 full -> block. Column windows are the callers'. */
static void scatter_rank(backend *be, const ulysses_layout *l, int r, tensor *block, int64_t base, tensor *full,
                         int to_full) {
    int64_t at = base, seg0 = 0;
    for (int s = 0; s < l->nseg; s++) {
        int64_t n = ulysses_rows(l->total[s], l->sp, r), f = seg0 + ulysses_first(l->total[s], l->sp, r);
        if (n > 0) {
            tensor b = tensor_rows(block, at, n), w = tensor_rows(full, f, n);
            if (to_full) op_copy(be, &w, &b);
            else op_copy(be, &b, &w);
        }
        at += n;
        seg0 += l->total[s];
    }
}

/* the shapes of the buffers: send/recv [sp x pad, 3w] (q|k|v of one rank's heads per block), the whole
 * sequence's q, k, v, o [S, w] */
static void buf_shapes(const ulysses_layout *l, int64_t cols, int64_t shape[6][2]) {
    int64_t w = cols / l->sp, pad = pad_rows(l), S = ulysses_full_rows(l);
    for (int i = 0; i < 6; i++) shape[i][0] = i < 2 ? l->sp * pad : S, shape[i][1] = i < 2 ? 3 * w : w;
}

int ulysses_reserve(ulysses_bufs *b, const ulysses_layout *l, int64_t cols, dtype_t dt, struct backend *be) {
    int64_t shape[6][2];
    buf_shapes(l, cols, shape);
    for (int i = 0; i < 6; i++) {
        tensor *t = b->t[i];
        if (t && t->rows == shape[i][0] && t->cols == shape[i][1] && t->dtype == dt) continue;
        tensor_free(t);
        if (!(b->t[i] = tensor_new(be, dt, shape[i][0], shape[i][1])))
            return tp_error_context("sequence parallelism: the all-to-all buffers ([%lld, %lld])",
                                    (long long)shape[i][0], (long long)shape[i][1]);
    }
    return 0;
}

void ulysses_bufs_free(ulysses_bufs *b) {
    for (int i = 0; i < 6; i++) tensor_free(b->t[i]), b->t[i] = NULL;
}

int ulysses_attention(comm *c, const ulysses_layout *l, int head_dim, ulysses_bufs *b, tensor *o, const tensor *q,
                      const tensor *k, const tensor *v, ulysses_attn_fn fn, void *ctx) {
    backend *be = q->be;
    int sp = l->sp, me = l->rank;
    int64_t cols = q->cols, w = cols / sp, pad = pad_rows(l), nl = q->rows;
    if (c->size != sp || cols % sp || w % head_dim || nl != ulysses_local_rows(l, me))
        return tp_error("sequence parallelism: %lld local rows of %lld columns do not fit an SP group of %d (rank %d "
                        "holds %lld rows; the heads must split evenly)", (long long)nl, (long long)cols, sp, me,
                        (long long)ulysses_local_rows(l, me));
    ulysses_bufs mine = {{NULL}}, *bufs = b ? b : &mine;
    if (ulysses_reserve(bufs, l, cols, q->dtype, be)) {
        if (!b) ulysses_bufs_free(&mine);
        return -1;
    }
    tensor **t = bufs->t, *send = t[0], *recv = t[1], *fo = t[5];
    const tensor *in[3] = {q, k, v};
    /* block j of send: my rows, heads [j·w, (j+1)·w) of q, k and v side by side */
    for (int j = 0; nl > 0 && j < sp; j++)
        for (int x = 0; x < 3; x++) {
            tensor blk = tensor_rows(send, j * pad, nl), src = tensor_cols(in[x], j * w, w);
            tensor dst = tensor_cols(&blk, x * w, w);
            op_copy(be, &dst, &src);
        }
    int rc = comm_alltoall(c, send, recv);
    /* block i of recv: rank i's rows of my heads, into their places in the sequence */
    for (int i = 0; !rc && i < sp; i++)
        for (int x = 0; x < 3; x++) {
            tensor b = tensor_cols(recv, x * w, w);
            scatter_rank(be, l, i, &b, i * pad, t[2 + x], 1);
        }
    if (!rc) fn(ctx, fo, t[2], t[3], t[4]);
    /* back, through contiguous [sp x pad, w] views of the same memory: rank i's rows of o (my heads) in
     * block i; block j of what arrives holds my rows' heads of rank j */
    if (!rc) {
        tensor so = tensor_wrap(be, q->dtype, sp * pad, w, send->data), ro = tensor_wrap(be, q->dtype, sp * pad, w, recv->data);
        for (int i = 0; i < sp; i++) scatter_rank(be, l, i, &so, i * pad, fo, 0);
        rc = comm_alltoall(c, &so, &ro);
        for (int j = 0; !rc && nl > 0 && j < sp; j++) {
            tensor src = tensor_rows(&ro, j * pad, nl), dst = tensor_cols(o, j * w, w);
            op_copy(be, &dst, &src);
        }
    }
    if (!b) ulysses_bufs_free(&mine);
    return rc ? tp_error_context("sequence parallelism: the all-to-all around attention") : 0;
}

int ulysses_gather(comm *c, const ulysses_layout *l, const tensor *local, tensor *full) {
    int64_t pad = pad_rows(l), cols = local->cols;
    tensor *all = tensor_new(local->be, local->dtype, l->sp * pad, cols);
    if (!all) return tp_error_context("sequence parallelism: gathering [%lld, %lld]", (long long)(l->sp * pad),
                                      (long long)cols);
    tensor mine = tensor_rows(all, l->rank * pad, local->rows);
    if (local->rows) op_copy(local->be, &mine, local);
    int rc = comm_allgather(c, all);
    for (int i = 0; !rc && i < l->sp; i++) scatter_rank(local->be, l, i, all, i * pad, full, 1);
    tensor_free(all);
    return rc ? tp_error_context("sequence parallelism: gathering the output rows") : 0;
}

int ulysses_join(comm *sp, int heads_local, const char *who, comm **out, int *degree, int *rank) {
    if (!sp || sp->size <= 1) {
        *out = NULL, *degree = 1, *rank = 0;
        return 0;
    }
    if (heads_local % sp->size)
        return tp_error("%s: %d heads per TP rank do not split over sequence-parallel degree %d", who, heads_local,
                        sp->size);
    *out = sp, *degree = sp->size, *rank = sp->rank;
    return 0;
}
