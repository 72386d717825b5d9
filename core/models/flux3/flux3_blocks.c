/* The two block kinds of the FLUX.3 transformer on this rank's heads. Both
 * are "parallel" blocks: one modulated LayerNorm feeds attention and the
 * SwiGLU feed-forward side by side, and the residual update is
 * x + gate * (attn_out + ff_out). They differ in what attends to what:
 *   mode block:   each token mode (text, image, references) has its own
 *                 weights and attends only within itself;
 *   single block: one set of weights for the whole joint sequence, which
 *                 attends jointly; each mode keeps its own modulation.
 * The joint sequence is one buffer (text, image, reference rows), so the
 * modes are row views and one all-reduce per layer joins the partial sums
 * of every mode's to_out + ff.linear_out (rowwise: summed locally first). */
#include "flux3_impl.h"
#include <mpi.h>
#include <math.h>
#include "kernels/err.h"

/* ---- the timed layers the blocks and the forward pass (flux3_forward.c) use ---- */

void flux3_gemm(flux3_model *m, tensor *y, const tensor *x, const tensor *w) {
    op_gemm(m->be, y, x, w, NULL);
    m->stats.gemm_flops += 2.0 * (double)x->rows * (double)x->cols * (double)w->rows;
}

/* over the heads in q's columns: this rank's, or with SP its share of them */
void flux3_attention(flux3_model *m, tensor *o, const tensor *q, const tensor *k, const tensor *v) {
    int heads = (int)(q->cols / m->cfg.head_dim);
    attn_params p = {.n_q_heads = heads, .n_kv_heads = heads, .head_dim = m->cfg.head_dim,
                     .scale = 1.0f / sqrtf((float)m->cfg.head_dim)};
    op_attention(m->be, o, q, k, v, &p);
    m->stats.attention_flops += 4.0 * (double)q->rows * (double)k->rows * m->cfg.head_dim * heads;
}

static void attention_cb(void *ctx, tensor *o, const tensor *q, const tensor *k, const tensor *v) {
    flux3_attention(ctx, o, q, k, v);
}

int flux3_attention_seq(flux3_model *m, int mode, tensor *o, const tensor *q, const tensor *k, const tensor *v) {
    if (m->sp <= 1) {
        flux3_attention(m, o, q, k, v);
        return 0;
    }
    flux3_ws *ws = m->ws;
    ulysses_layout l = {.sp = m->sp, .rank = m->sp_rank, .nseg = mode < 0 ? FLUX3_MODES : 1};
    for (int k2 = 0; k2 < l.nseg; k2++) l.total[k2] = ws->total[mode < 0 ? k2 : mode];
    return ulysses_attention(m->sp_comm, &l, m->cfg.head_dim, &ws->ub[mode + 1], o, q, k, v, attention_cb, m);
}

int flux3_allreduce(flux3_model *m, tensor *t) {
    if (m->tp == 1) return 0;
    double t0 = MPI_Wtime();
    int rc = comm_allreduce_sum(m->comm, t);
    m->stats.allreduce_seconds += MPI_Wtime() - t0;
    m->stats.allreduces++;
    m->stats.allreduce_bytes += tensor_nbytes(t);
    return rc ? tp_error_context("flux3 forward: all-reduce of a [%lld, %lld] partial", (long long)t->rows,
                                 (long long)t->cols) : 0;
}


/* chunk k (width D) of a modulation vector [1, n*D] */
static tensor chunk(const tensor *mod, int k, int64_t D) { return tensor_cols(mod, k * D, D); }

/* QK RMSNorm per head and RoPE on rows [r0, r0+n) of Q and K. In bf16 mode
 * through an fp32 copy and one rounding back, as diffusers runs norm_q,
 * norm_k and the rotary embedding in fp32. */
static void qk_norm_rope(flux3_model *m, flux3_ws *ws, const flux3_block_w *w, tensor *q, tensor *k, int64_t r0,
                         int64_t n) {
    int hd = m->cfg.head_dim;
    float eps = m->cfg.eps;
    tensor cs = tensor_rows(ws->rope_cos, r0, n), sn = tensor_rows(ws->rope_sin, r0, n);
    tensor qv = tensor_rows(q, r0, n), kv = tensor_rows(k, r0, n);
    tensor q32 = qv, k32 = kv;
    if (ws->qk32) {
        tensor rows = tensor_rows(ws->qk32, r0, n);
        q32 = tensor_cols(&rows, 0, m->Dl), k32 = tensor_cols(&rows, m->Dl, m->Dl);
        op_copy(m->be, &q32, &qv);
        op_copy(m->be, &k32, &kv);
    }
    op_rmsnorm(m->be, &q32, &q32, w->norm_q, hd, eps);
    op_rmsnorm(m->be, &k32, &k32, w->norm_k, hd, eps);
    op_rope(m->be, &q32, &cs, &sn, hd, ROPE_INTERLEAVED);
    op_rope(m->be, &k32, &cs, &sn, hd, ROPE_INTERLEAVED);
    if (ws->qk32) {
        op_copy(m->be, &qv, &q32);
        op_copy(m->be, &kv, &k32);
    }
}

/* From the modulated rows [r0, r0+n) of ws->nrm to this rank's partial sum
 * of attn_out + ff_out in the same rows of ws->part; the rows attend among
 * themselves. */
static int attn_ff_rows(flux3_model *m, flux3_ws *ws, const flux3_block_w *w, int mode, int64_t r0, int64_t n) {
    int64_t Dl = m->Dl, Ml = m->Ml;
    tensor in = tensor_rows(ws->nrm, r0, n);
    tensor q = tensor_cols(ws->proj, 0, Dl), k = tensor_cols(ws->proj, Dl, Dl), v = tensor_cols(ws->proj, 2 * Dl, Dl);
    tensor u = tensor_cols(ws->proj, 3 * Dl, 2 * Ml);
    tensor qr = tensor_rows(&q, r0, n), kr = tensor_rows(&k, r0, n), vr = tensor_rows(&v, r0, n);
    tensor ur = tensor_rows(&u, r0, n);
    flux3_gemm(m, &qr, &in, w->to_q);
    flux3_gemm(m, &kr, &in, w->to_k);
    flux3_gemm(m, &vr, &in, w->to_v);
    flux3_gemm(m, &ur, &in, w->ff_in);
    qk_norm_rope(m, ws, w, &q, &k, r0, n);
    tensor crow = tensor_rows(ws->cat, r0, n);
    tensor o = tensor_cols(&crow, 0, Dl), h = tensor_cols(&crow, Dl, Ml);
    if (flux3_attention_seq(m, mode, &o, &qr, &kr, &vr)) return -1;
    tensor gate = tensor_cols(&ur, 0, Ml), up = tensor_cols(&ur, Ml, Ml);
    op_swiglu(m->be, &h, &gate, &up);
    tensor p = tensor_rows(ws->part, r0, n), p2 = tensor_rows(ws->part2, r0, n);
    flux3_gemm(m, &p, &o, w->to_out);
    flux3_gemm(m, &p2, &h, w->ff_out);
    op_add(m->be, &p, &p, &p2);
    return 0;
}

/* nrm rows of mode k = LN(x) * (1 + scale) + shift with the mode's vector */
static void ln_mod(flux3_model *m, flux3_ws *ws, int k, const tensor *mod) {
    int64_t D = m->cfg.D;
    tensor shift = chunk(mod, 0, D), scale = chunk(mod, 1, D);
    tensor x = tensor_rows(ws->x, ws->r0[k], ws->n[k]), y = tensor_rows(ws->nrm, ws->r0[k], ws->n[k]);
    op_layernorm_mod(m->be, &y, &x, &shift, &scale, m->cfg.eps);
}

/* all-reduce the partials of every row, then x += gate * part per mode */
static int reduce_and_update(flux3_model *m, flux3_ws *ws, tensor *const *mods) {
    if (flux3_allreduce(m, ws->part)) return -1;
    for (int k = 0; k < FLUX3_MODES; k++) {
        if (!ws->n[k]) continue;
        tensor gate = chunk(mods[k], 2, m->cfg.D);
        tensor x = tensor_rows(ws->x, ws->r0[k], ws->n[k]), p = tensor_rows(ws->part, ws->r0[k], ws->n[k]);
        op_gated_add(m->be, &x, &gate, &p);
    }
    return 0;
}

int flux3_mode_layer(flux3_model *m, int i, flux3_ws *ws) {
    for (int k = 0; k < FLUX3_MODES; k++) {   /* with SP a mode whose tokens are elsewhere still joins its all-to-all */
        if (!ws->total[k]) continue;
        ln_mod(m, ws, k, ws->mod_early[k]);
        if (attn_ff_rows(m, ws, &m->mode[k][i], k, ws->r0[k], ws->n[k])) return -1;
    }
    return reduce_and_update(m, ws, ws->mod_early);
}

int flux3_single_block(flux3_model *m, const flux3_block_w *w, flux3_ws *ws) {
    for (int k = 0; k < FLUX3_MODES; k++)
        if (ws->n[k]) ln_mod(m, ws, k, ws->mod_single[k]);
    if (attn_ff_rows(m, ws, w, -1, 0, ws->S)) return -1;
    return reduce_and_update(m, ws, ws->mod_single);
}
