/* The two block types of the FLUX.2 transformer (docs/spec/flux2-transformer.md §4.6, §4.7) on this
 * rank's heads. The joint sequence is one buffer, text rows first, so the
 * text and image streams are row views of the same tensors and attention
 * runs once over the whole sequence.
 *
 * Tensor parallelism: Q/K/V and the MLP input projections are colwise
 * (local heads, local MLP columns), the output projections rowwise; each
 * rowwise GEMM writes a partial sum into ws->part, which is all-reduced.
 * With fused all-reduce the text and image partials of one sub-layer share
 * one buffer (text rows, then image rows) and one collective. */
#include "flux2_impl.h"

/* chunk k (width D) of a modulation vector [1, n*D] */
static tensor chunk(const tensor *mod, int k, int64_t D) { return tensor_cols(mod, k * D, D); }

/* All-reduce the partial sums of the text rows and image rows: one call
 * over the whole buffer when fused, else one per stream. */
static int reduce_streams(flux2_model *m, flux2_ws *ws) {
    if (m->fused_allreduce) return flux2_allreduce(m, ws->part);
    tensor t = tensor_rows(ws->part, 0, ws->L), i = tensor_rows(ws->part, ws->L, ws->N);
    if (flux2_allreduce(m, &i)) return -1;
    return flux2_allreduce(m, &t);
}

/* QK RMSNorm per head over the rows [r0, r0+n) of the Q and K column views */
static void qk_norm(flux2_model *m, tensor *q, tensor *k, int64_t r0, int64_t n, const tensor *wq,
                    const tensor *wk) {
    tensor qv = tensor_rows(q, r0, n), kv = tensor_rows(k, r0, n);
    op_rmsnorm(m->be, &qv, &qv, wq, m->cfg.head_dim, m->cfg.eps);
    op_rmsnorm(m->be, &kv, &kv, wk, m->cfg.head_dim, m->cfg.eps);
}

static void rope_qk(flux2_model *m, tensor *q, tensor *k) {
    op_rope(m->be, q, m->rope_cos, m->rope_sin, m->cfg.head_dim, ROPE_INTERLEAVED);
    op_rope(m->be, k, m->rope_cos, m->rope_sin, m->cfg.head_dim, ROPE_INTERLEAVED);
}

/* The KV-cached reference modes of flux2_forward_kv on the whole sequence
 * (text, then image rows; with SP after the all-to-all, this rank's share of
 * the heads): extract stores the reference rows' K/V and lets them attend
 * only to each other; cached injects the stored K/V between the text and
 * image keys. */
static void kv_attention(void *ctx, tensor *o, const tensor *q, const tensor *k, const tensor *v) {
    flux2_model *m = ctx;
    flux2_ws *ws = m->ws;
    flux2_kv_cache *kv = ws->kv;
    int64_t L = ws->L_full, S = q->rows;
    if (ws->kv_mode == FLUX2_KV_EXTRACT) {
        int64_t R = ws->R_full, r1 = L + R;
        tensor kr = tensor_rows(k, L, R), vr = tensor_rows(v, L, R);
        op_copy(m->be, kv->k[ws->kv_layer], &kr);
        op_copy(m->be, kv->v[ws->kv_layer], &vr);
        tensor qt = tensor_rows(q, 0, L), ot = tensor_rows(o, 0, L);
        flux2_attention(m, &ot, &qt, k, v);
        if (S > r1) {
            tensor qi = tensor_rows(q, r1, S - r1), oi = tensor_rows(o, r1, S - r1);
            flux2_attention(m, &oi, &qi, k, v);
        }
        tensor qr = tensor_rows(q, L, R), orf = tensor_rows(o, L, R);
        flux2_attention(m, &orf, &qr, &kr, &vr);
        return;
    }
    int64_t R = kv->R, N = S - L;
    tensor *cat[2] = {ws->kcat, ws->vcat}, *mem[2] = {kv->k[ws->kv_layer], kv->v[ws->kv_layer]};
    const tensor *src[2] = {k, v};
    for (int i = 0; i < 2; i++) {
        tensor a = tensor_rows(cat[i], 0, L), b = tensor_rows(cat[i], L, R), c = tensor_rows(cat[i], L + R, N);
        tensor sa = tensor_rows(src[i], 0, L), sc = tensor_rows(src[i], L, N);
        op_copy(m->be, &a, &sa);
        op_copy(m->be, &b, mem[i]);
        op_copy(m->be, &c, &sc);
    }
    flux2_attention(m, o, q, ws->kcat, ws->vcat);
}

/* Attention of the joint sequence on this rank's heads; with SP around the
 * all-to-all (the KV modes too: the cache is kept in the layout after it) */
static int block_attention(flux2_model *m, flux2_ws *ws, tensor *o, tensor *q, tensor *k, tensor *v) {
    if (ws->kv_mode == FLUX2_KV_NONE) return flux2_attention_seq(m, o, q, k, v);
    if (m->sp <= 1) {
        kv_attention(m, o, q, k, v);
        return 0;
    }
    return ulysses_attention(m->sp_comm, &ws->lay, m->cfg.head_dim, &ws->ub, o, q, k, v, kv_attention, m);
}

/* y_rows = LN(x_rows) * (1 + scale) + shift for one stream */
static void ln_mod(flux2_model *m, flux2_ws *ws, int64_t r0, int64_t n, const tensor *shift, const tensor *scale) {
    tensor x = tensor_rows(ws->x, r0, n), y = tensor_rows(ws->nrm, r0, n);
    op_layernorm_mod(m->be, &y, &x, shift, scale, m->cfg.eps);
}

static void gated_add_rows(flux2_model *m, flux2_ws *ws, int64_t r0, int64_t n, const tensor *gate) {
    tensor x = tensor_rows(ws->x, r0, n), p = tensor_rows(ws->part, r0, n);
    op_gated_add(m->be, &x, gate, &p);
}

/* local Q, K, V of one stream: three colwise GEMMs into column views of proj */
static void qkv_stream(flux2_model *m, flux2_ws *ws, int64_t r0, int64_t n, const tensor *wq, const tensor *wk,
                       const tensor *wv) {
    int64_t Dl = m->Dl;
    tensor in = tensor_rows(ws->nrm, r0, n), rows = tensor_rows(ws->proj, r0, n);
    tensor q = tensor_cols(&rows, 0, Dl), k = tensor_cols(&rows, Dl, Dl), v = tensor_cols(&rows, 2 * Dl, Dl);
    flux2_gemm(m, &q, &in, wq);
    flux2_gemm(m, &k, &in, wk);
    flux2_gemm(m, &v, &in, wv);
}

/* SwiGLU MLP of one stream up to its partial sum: in -> [gate | up] ->
 * silu(gate) * up -> partial of linear_out */
static void mlp_stream(flux2_model *m, flux2_ws *ws, int64_t r0, int64_t n, const tensor *w_in, const tensor *w_out) {
    int64_t Ml = m->Ml, Dl = m->Dl;
    tensor in = tensor_rows(ws->nrm, r0, n);
    tensor prow = tensor_rows(ws->proj, r0, n), crow = tensor_rows(ws->cat, r0, n);
    tensor u = tensor_cols(&prow, 0, 2 * Ml), gate = tensor_cols(&prow, 0, Ml), up = tensor_cols(&prow, Ml, Ml);
    tensor h = tensor_cols(&crow, Dl, Ml), part = tensor_rows(ws->part, r0, n);
    flux2_gemm(m, &u, &in, w_in);
    op_swiglu(m->be, &h, &gate, &up);
    flux2_gemm(m, &part, &h, w_out);
}

/* The image stream's modulated LayerNorm / gated residual: in extract
 * mode its first R rows (the references) take their own modulation. */
static void ln_mod_img(flux2_model *m, flux2_ws *ws, const tensor *mi, const tensor *mr, int ks, int kc) {
    int64_t L = ws->L, N = ws->N, R = ws->kv_mode == FLUX2_KV_EXTRACT ? ws->R : 0;
    if (R) ln_mod(m, ws, L, R, &mr[ks], &mr[kc]);
    if (N > R) ln_mod(m, ws, L + R, N - R, &mi[ks], &mi[kc]);
}

static void gated_add_img(flux2_model *m, flux2_ws *ws, const tensor *mi, const tensor *mr, int kg) {
    int64_t L = ws->L, N = ws->N, R = ws->kv_mode == FLUX2_KV_EXTRACT ? ws->R : 0;
    if (R) gated_add_rows(m, ws, L, R, &mr[kg]);
    if (N > R) gated_add_rows(m, ws, L + R, N - R, &mi[kg]);
}

int flux2_double_block(flux2_model *m, const flux2_double_w *w, flux2_ws *ws) {
    int64_t D = m->cfg.D, Dl = m->Dl, L = ws->L, N = ws->N;
    /* chunks: 0 shift_msa, 1 scale_msa, 2 gate_msa, 3 shift_mlp, 4 scale_mlp, 5 gate_mlp */
    tensor mi[6], mt[6], mr[6];
    for (int k = 0; k < 6; k++) {
        mi[k] = chunk(ws->mod_img, k, D);
        mt[k] = chunk(ws->mod_txt, k, D);
        mr[k] = ws->kv_mode == FLUX2_KV_EXTRACT && ws->R ? chunk(ws->mod_img_ref, k, D) : mi[k];
    }
    /* attention */
    ln_mod(m, ws, 0, L, &mt[0], &mt[1]);
    ln_mod_img(m, ws, mi, mr, 0, 1);
    qkv_stream(m, ws, 0, L, w->add_q, w->add_k, w->add_v);
    qkv_stream(m, ws, L, N, w->to_q, w->to_k, w->to_v);
    tensor q = tensor_cols(ws->proj, 0, Dl), k = tensor_cols(ws->proj, Dl, Dl), v = tensor_cols(ws->proj, 2 * Dl, Dl);
    qk_norm(m, &q, &k, 0, L, w->norm_added_q, w->norm_added_k);
    qk_norm(m, &q, &k, L, N, w->norm_q, w->norm_k);
    rope_qk(m, &q, &k);
    tensor o = tensor_cols(ws->cat, 0, Dl);
    if (block_attention(m, ws, &o, &q, &k, &v)) return -1;
    tensor o_txt = tensor_rows(&o, 0, L), o_img = tensor_rows(&o, L, N);
    tensor p_txt = tensor_rows(ws->part, 0, L), p_img = tensor_rows(ws->part, L, N);
    flux2_gemm(m, &p_txt, &o_txt, w->to_add_out);
    flux2_gemm(m, &p_img, &o_img, w->to_out);
    if (reduce_streams(m, ws)) return -1;
    gated_add_rows(m, ws, 0, L, &mt[2]);
    gated_add_img(m, ws, mi, mr, 2);
    /* MLPs on the updated streams */
    ln_mod(m, ws, 0, L, &mt[3], &mt[4]);
    ln_mod_img(m, ws, mi, mr, 3, 4);
    mlp_stream(m, ws, 0, L, w->ffc_in, w->ffc_out);
    mlp_stream(m, ws, L, N, w->ff_in, w->ff_out);
    if (reduce_streams(m, ws)) return -1;
    gated_add_rows(m, ws, 0, L, &mt[5]);
    gated_add_img(m, ws, mi, mr, 5);
    return 0;
}

int flux2_single_block(flux2_model *m, const flux2_single_w *w, flux2_ws *ws) {
    int64_t D = m->cfg.D, Dl = m->Dl, Ml = m->Ml;
    tensor shift = chunk(ws->mod_single, 0, D), scale = chunk(ws->mod_single, 1, D),
           gate = chunk(ws->mod_single, 2, D);
    int64_t R = ws->kv_mode == FLUX2_KV_EXTRACT ? ws->R : 0, r1 = ws->L + R;
    tensor rshift, rscale, rgate;
    if (R) {   /* [txt, ref, img] rows: the references take their own modulation */
        rshift = chunk(ws->mod_single_ref, 0, D), rscale = chunk(ws->mod_single_ref, 1, D);
        rgate = chunk(ws->mod_single_ref, 2, D);
        ln_mod(m, ws, 0, ws->L, &shift, &scale);
        ln_mod(m, ws, ws->L, R, &rshift, &rscale);
        if (ws->S > r1) ln_mod(m, ws, r1, ws->S - r1, &shift, &scale);
    } else {
        op_layernorm_mod(m->be, ws->nrm, ws->x, &shift, &scale, m->cfg.eps);
    }
    flux2_gemm(m, ws->proj, ws->nrm, w->qkv_mlp);
    tensor q = tensor_cols(ws->proj, 0, Dl), k = tensor_cols(ws->proj, Dl, Dl), v = tensor_cols(ws->proj, 2 * Dl, Dl);
    tensor g = tensor_cols(ws->proj, 3 * Dl, Ml), u = tensor_cols(ws->proj, 3 * Dl + Ml, Ml);
    qk_norm(m, &q, &k, 0, ws->S, w->norm_q, w->norm_k);
    rope_qk(m, &q, &k);
    tensor o = tensor_cols(ws->cat, 0, Dl), h = tensor_cols(ws->cat, Dl, Ml);
    if (block_attention(m, ws, &o, &q, &k, &v)) return -1;
    op_swiglu(m->be, &h, &g, &u);
    flux2_gemm(m, ws->part, ws->cat, w->to_out);
    if (flux2_allreduce(m, ws->part)) return -1;
    if (R) {
        gated_add_rows(m, ws, 0, ws->L, &gate);
        gated_add_rows(m, ws, ws->L, R, &rgate);
        if (ws->S > r1) gated_add_rows(m, ws, r1, ws->S - r1, &gate);
    } else {
        op_gated_add(m->be, ws->x, &gate, ws->part);
    }
    return 0;
}
