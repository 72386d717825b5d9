/* The FLUX.3 forward pass: the per-mode timestep embeddings and
 * modulations, the three embedders, the RoPE tables of the joint sequence,
 * the mode blocks and single blocks (flux3_blocks.c), and the output layer
 * on the image rows. Activation buffers are kept for the last (L, N, R),
 * so a denoising loop allocates once. */
#include "flux3_impl.h"
#include "core/models/flux2/flux2.h"
#include "kernels/err.h"
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

/* ---- host-side tables ---- */

void flux3_rope_table(const flux3_config *cfg, const int32_t *ids, int64_t n, float *cos_out, float *sin_out) {
    flux3_rope_table_scaled(cfg, ids, n, 1.0f, cos_out, sin_out);
}

void flux3_rope_table_scaled(const flux3_config *cfg, const int32_t *ids, int64_t n, float hw_scale, float *cos_out,
                             float *sin_out) {
    int hd = cfg->head_dim;
    double omega[FLUX3_MAX_AXES][64];   /* small axes: the frequencies once; wider ones below */
    for (int a = 0; a < cfg->n_axes; a++)
        for (int k = 0; k < cfg->axes_dims[a] / 2 && k < 64; k++)
            omega[a][k] = 1.0 / pow(cfg->rope_theta, (double)(2 * k) / (double)cfg->axes_dims[a]);
    for (int64_t t = 0; t < n; t++) {
        float *co = cos_out + t * hd, *si = sin_out + t * hd;
        int d0 = 0;
        for (int a = 0; a < cfg->n_axes; a++) {
            int da = cfg->axes_dims[a];
            float id = (float)ids[t * 4 + a];    /* ids.float(), h and w scaled in f32, promoted to float64 */
            double pos = (double)(a == 1 || a == 2 ? id * hw_scale : id);
            for (int k = 0; k < da / 2; k++) {
                double w = k < 64 ? omega[a][k] : 1.0 / pow(cfg->rope_theta, (double)(2 * k) / (double)da);
                float c = (float)cos(pos * w), s = (float)sin(pos * w);
                co[d0 + 2 * k] = co[d0 + 2 * k + 1] = c;
                si[d0 + 2 * k] = si[d0 + 2 * k + 1] = s;
            }
            d0 += da;
        }
    }
}

/* ---- workspace ---- */

static void ws_free(flux3_ws *ws) {
    if (!ws) return;
    tensor *all[] = {ws->x, ws->nrm, ws->proj, ws->cat, ws->part, ws->part2, ws->qk32, ws->out, ws->rope_cos,
                     ws->rope_sin, ws->sinus, ws->hid, ws->tmp, ws->temb_img, ws->temb_zero, ws->mod_out,
                     ws->out_full};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
    for (int k = 0; k < FLUX3_MODES; k++) tensor_free(ws->in[k]), tensor_free(ws->mod_early[k]),
                                           tensor_free(ws->mod_single[k]);
    for (int k = 0; k <= FLUX3_MODES; k++) ulysses_bufs_free(&ws->ub[k]);
    free(ws);
}

void flux3_release_ws(flux3_model *m) {
    ws_free(m->ws);
    m->ws = NULL;
}

static flux3_ws *ws_get(flux3_model *m, int64_t L, int64_t N, int64_t R) {
    if (m->ws && m->ws->L == L && m->ws->N == N && m->ws->R == R) return m->ws;
    flux3_release_ws(m);
    const flux3_config *c = &m->cfg;
    int64_t S = L + N + R, D = c->D, Dl = m->Dl, Ml = m->Ml;
    flux3_ws *ws = xcalloc(1, sizeof *ws);
    ws->L = L, ws->N = N, ws->R = R, ws->S = S;
    ws->r0[FLUX3_TXT] = 0, ws->n[FLUX3_TXT] = L;
    ws->r0[FLUX3_IMG] = L, ws->n[FLUX3_IMG] = N;
    ws->r0[FLUX3_COND] = L + N, ws->n[FLUX3_COND] = R;
    int64_t in_w[FLUX3_MODES] = {c->joint_dim, c->in_channels, c->cond_in_channels};
    struct { tensor **t; dtype_t dt; int64_t r, c; } spec[] = {
        {&ws->x, m->act, S, D}, {&ws->nrm, m->act, S, D}, {&ws->proj, m->act, S, 3 * Dl + 2 * Ml},
        {&ws->cat, m->act, S, Dl + Ml}, {&ws->part, m->act, S, D}, {&ws->part2, m->act, S, D},
        {&ws->out, m->act, N, c->in_channels}, {&ws->rope_cos, DT_F32, S, c->head_dim},
        {&ws->rope_sin, DT_F32, S, c->head_dim}, {&ws->sinus, m->act, 1, c->time_channels},
        {&ws->hid, m->act, 1, D}, {&ws->tmp, m->act, 1, D}, {&ws->temb_img, m->act, 1, D},
        {&ws->temb_zero, m->act, 1, D}, {&ws->mod_out, m->act, 1, 2 * D},
        {&ws->qk32, DT_F32, m->act == DT_BF16 ? S : 0, 2 * Dl},
        {&ws->in[0], m->act, L, in_w[0]}, {&ws->in[1], m->act, N, in_w[1]}, {&ws->in[2], m->act, R, in_w[2]},
        {&ws->mod_early[0], m->act, 1, 3 * D}, {&ws->mod_early[1], m->act, 1, 3 * D},
        {&ws->mod_early[2], m->act, 1, 3 * D}, {&ws->mod_single[0], m->act, 1, 3 * D},
        {&ws->mod_single[1], m->act, 1, 3 * D}, {&ws->mod_single[2], m->act, 1, 3 * D}};
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
        if (spec[i].r == 0) continue;   /* no references, or f32 mode's unused QK copy */
        if (!(*spec[i].t = tensor_new(m->be, spec[i].dt, spec[i].r, spec[i].c))) {
            tp_error_context("flux3: activations for %lld text + %lld image + %lld reference tokens", (long long)L,
                             (long long)N, (long long)R);
            ws_free(ws);
            return NULL;
        }
    }
    return m->ws = ws;
}

/* The workspace of a forward over L text, N image and R reference tokens:
 * with sequence parallelism this rank's slices of each mode (ulysses.h),
 * where they start, and the buffer the image rows are gathered into. */
static flux3_ws *ws_for(flux3_model *m, int64_t L, int64_t N, int64_t R) {
    int sp = m->sp > 1 ? m->sp : 1, r = m->sp_rank;
    const int64_t tot[FLUX3_MODES] = {L, N, R};
    flux3_ws *ws = ws_get(m, ulysses_rows(L, sp, r), ulysses_rows(N, sp, r), ulysses_rows(R, sp, r));
    if (!ws) return NULL;
    for (int k = 0; k < FLUX3_MODES; k++) ws->total[k] = tot[k], ws->first[k] = ulysses_first(tot[k], sp, r);
    for (int k = -1; sp > 1 && k < FLUX3_MODES; k++) {   /* the all-to-all's buffers: joint sequence, each mode */
        if (k >= 0 && !tot[k]) continue;
        ulysses_layout l = {.sp = sp, .rank = r, .nseg = k < 0 ? FLUX3_MODES : 1};
        for (int s = 0; s < l.nseg; s++) l.total[s] = tot[k < 0 ? s : k];
        if (ulysses_reserve(&ws->ub[k + 1], &l, m->Dl, m->act, m->be)) return NULL;
    }
    if (sp > 1 && (!ws->out_full || ws->out_full->rows != N)) {
        tensor_free(ws->out_full);
        if (!(ws->out_full = tensor_new(m->be, m->act, N, m->cfg.in_channels))) {
            tp_error_context("flux3: the gathered output of %lld image tokens", (long long)N);
            return NULL;
        }
    }
    return ws;
}

/* The image rows' output of every SP rank, into out_full (on every rank) */
static const tensor *whole_output(flux3_model *m, flux3_ws *ws) {
    if (m->sp <= 1) return ws->out;
    ulysses_layout img = {.sp = m->sp, .rank = m->sp_rank, .nseg = 1, .total = {ws->total[FLUX3_IMG]}};
    return ulysses_gather(m->sp_comm, &img, ws->out, ws->out_full) ? NULL : ws->out_full;
}

int flux3_set_sp(flux3_model *m, comm *sp) {
    int had = m->sp > 1;
    if (ulysses_join(sp, m->heads_local, "flux3", &m->sp_comm, &m->sp, &m->sp_rank)) return -1;
    if (m->sp > 1 || had) flux3_release_ws(m);   /* the activations are sized by the slice */
    return 0;
}

int flux3_prepare(flux3_model *m, int64_t L, int64_t N, int64_t R) { return ws_for(m, L, N, R) ? 0 : -1; }
comm *flux3_comm(const flux3_model *m) { return m->comm; }
comm *flux3_sp_comm(const flux3_model *m) { return m->sp_comm; }

/* ---- embeddings and modulation ---- */

/* The value the model embeds: t * 1000, with eager bf16's roundings (the
 * timestep tensor is cast to bf16, so is the product) unless exact_time. */
static float scaled_time(const flux3_model *m, float t) {
    if (m->act == DT_BF16 && !m->exact_time) return bf16r(bf16r(t) * 1000.0f);
    return t * 1000.0f;
}

/* y = linear_2(silu(linear_1(sinusoid(value)))), y [1, D] */
static int embed_scalar(flux3_model *m, flux3_ws *ws, float value, const tensor *l1, const tensor *l2, tensor *y) {
    float *e = xmalloc((size_t)m->cfg.time_channels * sizeof *e);
    flux2_sinusoid(value, m->cfg.time_channels, e);   /* the same get_timestep_embedding (cos first) */
    int rc = tensor_upload_f32(ws->sinus, e);
    free(e);
    if (rc) return -1;
    flux3_gemm(m, ws->hid, ws->sinus, l1);
    op_silu(m->be, ws->hid, ws->hid);
    flux3_gemm(m, y, ws->hid, l2);
    return 0;
}

/* The image mode embeds the flow timestep, text and references timestep 0;
 * a flow map adds the target timestep's embedding to both. Each mode's two
 * modulations (mode blocks, single blocks) come from its silu'd embedding,
 * and so does the output layer's (image). */
static int modulations(flux3_model *m, flux3_ws *ws, float timestep, const float *target) {
    if (embed_scalar(m, ws, scaled_time(m, timestep), m->t_lin1, m->t_lin2, ws->temb_img) ||
        embed_scalar(m, ws, 0.0f, m->t_lin1, m->t_lin2, ws->temb_zero))
        return -1;
    if (target) {
        if (embed_scalar(m, ws, scaled_time(m, *target), m->tt_lin1, m->tt_lin2, ws->tmp)) return -1;
        op_add(m->be, ws->temb_img, ws->temb_img, ws->tmp);
        op_add(m->be, ws->temb_zero, ws->temb_zero, ws->tmp);
    }
    op_silu(m->be, ws->temb_img, ws->temb_img);
    op_silu(m->be, ws->temb_zero, ws->temb_zero);
    for (int k = 0; k < FLUX3_MODES; k++) {
        if (!ws->n[k]) continue;
        const tensor *s = k == FLUX3_IMG ? ws->temb_img : ws->temb_zero;
        flux3_gemm(m, ws->mod_early[k], s, m->early_mod[k]);
        flux3_gemm(m, ws->mod_single[k], s, m->single_mod[k]);
    }
    flux3_gemm(m, ws->mod_out, ws->temb_img, m->norm_out);
    return 0;
}

/* ---- the forward ---- */

static int check_inputs(const flux3_model *m, const flux3_inputs *in, const float *out) {
    if (!in || !in->x || !in->img_ids || !in->txt || !in->txt_ids || !out)
        return tp_error("flux3 forward: a required input (image tokens, text features, their ids or the output) "
                        "is NULL");
    if (in->N < 1 || in->L < 1 || in->R < 0)
        return tp_error("flux3 forward: need at least one image and one text token (got N=%lld, L=%lld, R=%lld)",
                        (long long)in->N, (long long)in->L, (long long)in->R);
    if ((in->R > 0) != (in->cond != NULL) || (in->R > 0 && !in->cond_ids))
        return tp_error("flux3 forward: reference tokens need both their latents and their ids (R=%lld)",
                        (long long)in->R);
    if ((in->target_timestep != NULL) != (m->cfg.flow_map != 0))
        return tp_error("flux3 forward: target_timestep is required by, and only by, a flow-map transformer "
                        "(this one has flow_map %s)", m->cfg.flow_map ? "true" : "false");
    if (!isfinite(in->timestep) || (in->target_timestep && !isfinite(*in->target_timestep)))
        return tp_error("flux3 forward: the timestep is not a finite number");
    if (!(in->image_rope_scale >= 0) || !isfinite(in->image_rope_scale))
        return tp_error("flux3 forward: image_rope_scale must be a finite number >= 0 (0 means 1)");
    return 0;
}

static int upload_rope(flux3_model *m, flux3_ws *ws, const flux3_inputs *in) {
    int64_t hd = m->cfg.head_dim, S = ws->S;
    float *c = xmalloc((size_t)(S * hd) * sizeof *c), *s = xmalloc((size_t)(S * hd) * sizeof *s);
    const int32_t *ids[FLUX3_MODES] = {in->txt_ids, in->img_ids, in->cond_ids};
    float scale = in->image_rope_scale > 0 ? in->image_rope_scale : 1.0f;
    for (int k = 0; k < FLUX3_MODES; k++)   /* this rank's rows of each mode: from first[k] (SP) */
        if (ws->n[k]) flux3_rope_table_scaled(&m->cfg, ids[k] + ws->first[k] * 4, ws->n[k], k == FLUX3_TXT ? 1.0f : scale,
                                              c + ws->r0[k] * hd, s + ws->r0[k] * hd);
    int rc = tensor_upload_f32(ws->rope_cos, c) || tensor_upload_f32(ws->rope_sin, s);
    free(c), free(s);
    return rc ? -1 : 0;
}

void flux3_set_block_cache(flux3_model *m, block_cache *bc) { m->bc = bc; }

/* one block of each group, for the block cache's loop (block_cache.h) */
typedef struct block_args {
    flux3_model *m;
    flux3_ws *ws;
} block_args;

static int run_mode(void *ctx, int i) {
    block_args *a = ctx;
    return flux3_mode_layer(a->m, i, a->ws) ? tp_error_context("mode blocks %d", i) : 0;
}

static int run_single(void *ctx, int j) {
    block_args *a = ctx;
    return flux3_single_block(a->m, &a->m->single[j], a->ws) ? tp_error_context("single block %d", j) : 0;
}

static int forward_body(flux3_model *m, flux3_ws *ws, const flux3_inputs *in) {
    int64_t D = m->cfg.D, L = ws->L, N = ws->N;
    if (modulations(m, ws, in->timestep, in->target_timestep) || upload_rope(m, ws, in)) return -1;
    const float *src[FLUX3_MODES] = {in->txt, in->x, in->cond};
    for (int k = 0; k < FLUX3_MODES; k++) {
        if (!ws->n[k]) continue;
        tensor xr = tensor_rows(ws->x, ws->r0[k], ws->n[k]);
        if (tensor_upload_f32(ws->in[k], src[k] + ws->first[k] * ws->in[k]->cols)) return -1;
        flux3_gemm(m, &xr, ws->in[k], m->x_emb[k]);
    }
    /* the two block groups through the block cache's loop (plain without
     * --cache), as FLUX.2's double and single groups (docs/cache.md): the
     * mode blocks keep text, image and references apart, like FLUX.2's
     * double blocks, so their Fn residual is measured on the image rows;
     * the single blocks are joint, measured on every row */
    block_args ba = {m, ws};
    if (block_cache_run(m->bc, BC_DOUBLE, m->cfg.num_layers, ws->x, L, N, run_mode, &ba) ||
        block_cache_run(m->bc, BC_SINGLE, m->cfg.num_single_layers, ws->x, 0, ws->S, run_single, &ba))
        return -1;
    /* output layer on the image rows; norm_out's chunks are (scale, shift) */
    tensor scale = tensor_cols(ws->mod_out, 0, D), shift = tensor_cols(ws->mod_out, D, D);
    tensor xi = tensor_rows(ws->x, L, N), ni = tensor_rows(ws->nrm, L, N);
    op_layernorm_mod(m->be, &ni, &xi, &shift, &scale, m->cfg.eps);
    flux3_gemm(m, ws->out, &ni, m->proj_out);
    return 0;
}

int flux3_forward(flux3_model *m, const flux3_inputs *in, float *out) {
    if (check_inputs(m, in, out)) return -1;
    double t0 = MPI_Wtime();
    flux3_ws *ws = ws_for(m, in->L, in->N, in->R);
    if (!ws) return -1;
    const tensor *o = NULL;
    if (forward_body(m, ws, in) || !(o = whole_output(m, ws)) || tensor_download_f32(o, out) || be_sync(m->be))
        return tp_error_context("flux3 forward");
    m->stats.forwards++;
    m->stats.seconds += MPI_Wtime() - t0;
    return 0;
}
