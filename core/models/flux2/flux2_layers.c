/* The timed layers every FLUX.2 block is made of (flux2_impl.h): a GEMM
 * with FLOP counting, the all-reduce of a partial-sum buffer, attention over
 * this rank's heads. The blocks (flux2_blocks.c) and the forward pass
 * (flux2_forward.c) both sit on these, so neither calls the other back. */
#include "flux2_impl.h"
#include "kernels/err.h"
#include <math.h>
#include <mpi.h>

void flux2_gemm(flux2_model *m, tensor *y, const tensor *x, const tensor *w) {
    double t0 = MPI_Wtime();
    op_gemm(m->be, y, x, w, NULL);
    if (m->profiling) be_sync(m->be);
    m->stats.gemm_seconds += MPI_Wtime() - t0;
    m->stats.gemm_flops += 2.0 * (double)x->rows * (double)x->cols * (double)w->rows;
    if (m->gemm_log) m->gemm_log(m->gemm_log_ctx, x->rows, w->rows, x->cols);
}

int flux2_allreduce(flux2_model *m, tensor *t) {
    if (m->tp == 1) return 0;
    if (m->profiling) be_sync(m->be);
    double t0 = MPI_Wtime();
    int rc = comm_allreduce_sum(m->comm, t);
    if (m->profiling) be_sync(m->be);
    m->stats.allreduce_seconds += MPI_Wtime() - t0;
    m->stats.allreduces++;
    m->stats.allreduce_bytes += tensor_nbytes(t);
    return rc ? tp_error_context("flux2 forward: all-reduce of a [%lld, %lld] partial", (long long)t->rows,
                                 (long long)t->cols) : 0;
}

/* over the heads in q's columns: this rank's, or with SP its share of them */
void flux2_attention(flux2_model *m, tensor *o, const tensor *q, const tensor *k, const tensor *v) {
    int heads = (int)(q->cols / m->cfg.head_dim);
    attn_params p = {.n_q_heads = heads, .n_kv_heads = heads, .head_dim = m->cfg.head_dim,
                     .scale = 1.0f / sqrtf((float)m->cfg.head_dim)};
    if (m->profiling) be_sync(m->be);
    double t0 = MPI_Wtime();
    op_attention(m->be, o, q, k, v, &p);
    if (m->profiling) be_sync(m->be);
    m->stats.attention_seconds += MPI_Wtime() - t0;
    m->stats.attention_flops += 4.0 * (double)q->rows * (double)k->rows * m->cfg.head_dim * heads;
}

static void attention_cb(void *ctx, tensor *o, const tensor *q, const tensor *k, const tensor *v) {
    flux2_attention(ctx, o, q, k, v);
}

int flux2_attention_seq(flux2_model *m, tensor *o, const tensor *q, const tensor *k, const tensor *v) {
    if (m->sp <= 1) {
        flux2_attention(m, o, q, k, v);
        return 0;
    }
    return ulysses_attention(m->sp_comm, &m->ws->lay, m->cfg.head_dim, &m->ws->ub, o, q, k, v, attention_cb, m);
}
