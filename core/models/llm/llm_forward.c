/* The LLM forward pass on the op interface (llm.h). The residual stream and
 * the GEMM outputs are f32 in both precisions. With bf16 weights the GEMM
 * inputs (normed hidden states, attention output, SwiGLU output) are bf16,
 * as in the bf16 reference: that is where the reference rounds too, and
 * bf16 x bf16 GEMMs run on the CPU's bf16 dot-product units (about 3x the
 * f32-activation path on AVX512-BF16; docs/text-encoder.md). */
#include "llm_internal.h"
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Per-forward scratch, all f32 on the backend. */
typedef struct fwd_bufs {
    tensor *x, *xn, *q, *k, *v, *att, *y, *gate, *up, *act, *out, *cos, *sin, *key_valid, *emb;
} fwd_bufs;

static void bufs_free(fwd_bufs *b) {
    tensor *all[] = {b->x, b->xn, b->q, b->k, b->v, b->att, b->y, b->gate, b->up, b->act, b->out,
                     b->cos, b->sin, b->key_valid, b->emb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
}

static int bufs_alloc(llm *m, int n, int n_idx, fwd_bufs *b) {
    const llm_config *c = &m->cfg;
    backend *be = m->be;
    int64_t H = c->hidden, D = c->head_dim;
    /* the run's precision: the embedding's dtype, or a norm's when the
     * embedding is stored fp8 or as GGUF blocks (norms never are; its rows
     * are dequantised into emb by op_gather_rows) */
    dtype_t prec = m->embed->dtype;
    if (dtype_is_fp8(prec) || prec == DT_GGML)
        prec = m->n_run > 0 ? m->layers[0].in_norm->dtype : m->norm ? m->norm->dtype : DT_F32;
    dtype_t in_dt = prec == DT_BF16 ? DT_BF16 : DT_F32;   /* GEMM inputs */
    struct { tensor **t; dtype_t dt; int64_t r, cols; } want[] = {
        {&b->x, DT_F32, n, H}, {&b->xn, in_dt, n, H}, {&b->y, DT_F32, n, H},
        {&b->q, DT_F32, n, m->nq_local * D}, {&b->att, in_dt, n, m->nq_local * D},
        {&b->k, DT_F32, n, m->nkv_held * D}, {&b->v, DT_F32, n, m->nkv_held * D},
        {&b->gate, DT_F32, n, m->ffn_local}, {&b->up, DT_F32, n, m->ffn_local},
        {&b->act, in_dt, n, m->ffn_local}, {&b->out, DT_F32, n, (int64_t)n_idx * H},
        {&b->cos, DT_F32, n, D}, {&b->sin, DT_F32, n, D}, {&b->key_valid, DT_I32, 1, n},
        {&b->emb, prec, n, H},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!(*want[i].t = tensor_new(be, want[i].dt, want[i].r, want[i].cols)))
            return tp_error_context("text encoder activations for %d tokens", n);
    return 0;
}

static int upload_inputs(llm *m, const int32_t *mask, const int32_t *pos, int n, fwd_bufs *b) {
    int D = m->cfg.head_dim, rc = 0;
    float *cs = xmalloc((size_t)n * D * sizeof *cs), *sn = xmalloc((size_t)n * D * sizeof *sn);
    int32_t *kv = xmalloc((size_t)n * sizeof *kv);
    llm_rope_tables_pos(n, pos, D, m->cfg.rope_theta, cs, sn);
    if (m->cfg.rope_interleaved) {   /* llama.cpp's Q/K row order: frequency j at columns 2j, 2j+1 */
        float *row = xmalloc((size_t)D * sizeof *row);
        for (int i = 0; i < n; i++)
            for (float *t = cs; t; t = t == cs ? sn : NULL) {
                float *r = t + (size_t)i * D;
                for (int j = 0; j < D / 2; j++) row[2 * j] = row[2 * j + 1] = r[j];
                memcpy(r, row, (size_t)D * sizeof *row);
            }
        free(row);
    }
    for (int i = 0; i < n; i++) kv[i] = mask ? (mask[i] != 0) : 1;
    if (tensor_upload_f32(b->cos, cs) || tensor_upload_f32(b->sin, sn) || tensor_upload_raw(b->key_valid, kv)) rc = -1;
    free(cs), free(sn), free(kv);
    return rc;
}

static int allreduce(llm *m, tensor *t) {
    return m->comm && m->tp > 1 ? comm_allreduce_sum(m->comm, t) : 0;
}

/* Hidden state 0: embedding rows (vocab shards gather their rows, zeros
 * elsewhere, then sum). */
static int embed(llm *m, const int32_t *ids, int n, fwd_bufs *b) {
    int64_t row0 = m->vocab_sharded ? (int64_t)m->rank * (m->cfg.vocab / m->tp) : 0;
    op_gather_rows(m->be, b->emb, m->embed, ids, n, row0);
    op_copy(m->be, b->x, b->emb);
    return m->vocab_sharded ? allreduce(m, b->x) : 0;
}

/* Attention of this rank's query heads. With sharded K/V the local heads
 * map onto local KV heads like the global ones; with replicated K/V each
 * KV head gets one call with the local query heads that use it. */
static void attend(llm *m, fwd_bufs *b) {
    const llm_config *c = &m->cfg;
    int D = c->head_dim;
    attn_params p = {.n_q_heads = m->nq_local, .n_kv_heads = m->nkv_held, .head_dim = D,
                     .scale = 1.0f / sqrtf((float)D), .causal = 1, .q_pos0 = 0, .key_valid = b->key_valid};
    if (m->kv_sharded) {
        op_attention(m->be, b->att, b->q, b->k, b->v, &p);
        return;
    }
    int group = c->n_heads / c->n_kv_heads, h0 = m->rank * m->nq_local, h1 = h0 + m->nq_local;
    for (int j = h0 / group; j * group < h1; j++) {
        int a = j * group > h0 ? j * group : h0, e = (j + 1) * group < h1 ? (j + 1) * group : h1;
        tensor q = tensor_cols(b->q, (int64_t)(a - h0) * D, (int64_t)(e - a) * D);
        tensor o = tensor_cols(b->att, (int64_t)(a - h0) * D, (int64_t)(e - a) * D);
        tensor k = tensor_cols(b->k, (int64_t)j * D, D), v = tensor_cols(b->v, (int64_t)j * D, D);
        p.n_q_heads = e - a;
        p.n_kv_heads = 1;
        op_attention(m->be, &o, &q, &k, &v, &p);
    }
}

static int layer_forward(llm *m, const llm_layer *L, fwd_bufs *b) {
    const llm_config *c = &m->cfg;
    backend *be = m->be;
    op_rmsnorm(be, b->xn, b->x, L->in_norm, c->hidden, c->eps);
    op_gemm(be, b->q, b->xn, L->q, NULL);
    op_gemm(be, b->k, b->xn, L->k, NULL);
    op_gemm(be, b->v, b->xn, L->v, NULL);
    if (c->qk_norm) {
        op_rmsnorm(be, b->q, b->q, L->q_norm, c->head_dim, c->eps);
        op_rmsnorm(be, b->k, b->k, L->k_norm, c->head_dim, c->eps);
    }
    /* the HF rotate-half pairs (j, j + D/2); a llama GGUF's permuted rows hold them at (2j, 2j + 1) */
    rope_mode rm = c->rope_interleaved ? ROPE_INTERLEAVED : ROPE_HALF;
    op_rope(be, b->q, b->cos, b->sin, c->head_dim, rm);
    op_rope(be, b->k, b->cos, b->sin, c->head_dim, rm);
    attend(m, b);
    op_gemm(be, b->y, b->att, L->o, NULL);
    if (allreduce(m, b->y)) return -1;
    op_add(be, b->x, b->x, b->y);

    op_rmsnorm(be, b->xn, b->x, L->post_norm, c->hidden, c->eps);
    op_gemm(be, b->gate, b->xn, L->gate, NULL);
    op_gemm(be, b->up, b->xn, L->up, NULL);
    op_swiglu(be, b->act, b->gate, b->up);
    op_gemm(be, b->y, b->act, L->down, NULL);
    if (allreduce(m, b->y)) return -1;
    op_add(be, b->x, b->x, b->y);
    return 0;
}

/* Copy hidden state `index` (in src) into every output slot that asks for it. */
static void capture(llm *m, fwd_bufs *b, const tensor *src, int index, const int *idx, int n_idx) {
    int64_t H = m->cfg.hidden;
    for (int k = 0; k < n_idx; k++)
        if (idx[k] == index) {
            tensor dst = tensor_cols(b->out, k * H, H);
            op_copy(m->be, &dst, src);
        }
}

static int check_request(llm *m, const int32_t *ids, const int32_t *pos, int n, const int *idx, int n_idx,
                         int *max_idx) {
    const llm_config *c = &m->cfg;
    if (n <= 0) return tp_error("text encoder: no tokens to encode");
    if (n_idx <= 0) return tp_error("text encoder: no hidden states requested");
    if (c->sliding_window > 0 && n > c->sliding_window)
        return tp_error("text encoder: %d tokens exceed the model's sliding_window %d, which is not implemented; "
                        "use a --max-sequence-length <= %d", n, c->sliding_window, c->sliding_window);
    *max_idx = 0;
    for (int k = 0; k < n_idx; k++) {
        int top = m->with_norm ? c->n_layers : m->n_run;
        if (idx[k] < 0 || idx[k] > top)
            return tp_error("text encoder: hidden state %d requested but only 0..%d are loaded (%d layers)",
                            idx[k], top, c->n_layers);
        if (idx[k] > *max_idx) *max_idx = idx[k];
    }
    for (int i = 0; pos && i < n; i++)
        if (pos[i] < 0)
            return tp_error("text encoder: position id %d at row %d is negative", pos[i], i);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return tp_error("text encoder: token id %d at position %d is outside the vocabulary (0..%d); "
                            "tokenizer and text encoder do not match", ids[i], i, c->vocab - 1);
    return 0;
}

int llm_forward(llm *m, const int32_t *ids, const int32_t *mask, int n, const int *idx, int n_idx,
                float *out) {
    return llm_forward_pos(m, ids, mask, NULL, n, idx, n_idx, out);
}

int llm_forward_pos(llm *m, const int32_t *ids, const int32_t *mask, const int32_t *pos, int n, const int *idx,
                    int n_idx, float *out) {
    fwd_bufs b = {0};
    int max_idx = 0;
    int rc = check_request(m, ids, pos, n, idx, n_idx, &max_idx);
    if (!rc) rc = bufs_alloc(m, n, n_idx, &b);
    if (!rc) rc = upload_inputs(m, mask, pos, n, &b);
    /* the buffers are the prepare step, agreed before the first collective */
    rc = dist_lockstep_begin(m->comm && m->tp > 1 ? m->comm->mpi : MPI_COMM_NULL, rc);
    int lockstep = !rc;
    if (!rc) rc = embed(m, ids, n, &b);
    if (!rc) capture(m, &b, b.x, 0, idx, n_idx);
    int n_layers = max_idx < m->cfg.n_layers ? max_idx : m->cfg.n_layers;
    for (int i = 0; !rc && i < n_layers; i++) {
        rc = layer_forward(m, &m->layers[i], &b);
        if (!rc && i + 1 < m->cfg.n_layers) capture(m, &b, b.x, i + 1, idx, n_idx);
    }
    if (!rc && max_idx == m->cfg.n_layers) {   /* the last entry is after the final norm */
        op_rmsnorm(m->be, b.xn, b.x, m->norm, m->cfg.hidden, m->cfg.eps);
        capture(m, &b, b.xn, max_idx, idx, n_idx);
    }
    if (lockstep) dist_lockstep_end();
    if (!rc) rc = tensor_download_f32(b.out, out);
    bufs_free(&b);
    return rc;
}
