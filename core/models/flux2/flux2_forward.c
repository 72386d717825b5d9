/* The FLUX.2 forward pass (docs/spec/flux2-transformer.md §4): timestep/guidance embedding, global
 * modulation, embedders, RoPE tables, the blocks (flux2_blocks.c, on the
 * layers of flux2_layers.c) and the
 * output layer. Activation buffers are kept for the last (N, L) so that a
 * denoising loop allocates once; the context projection and the RoPE tables
 * are cached because they do not change across steps. */
#include "flux2_impl.h"
#include "kernels/err.h"
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

/* ---- workspace ---- */

static void ws_free(flux2_ws *ws) {
    if (!ws) return;
    tensor *all[] = {ws->x, ws->nrm, ws->proj, ws->cat, ws->part, ws->xin, ws->out, ws->temb, ws->silu_temb,
                     ws->hid, ws->sinus, ws->mod_img, ws->mod_txt, ws->mod_single, ws->mod_out,
                     ws->mod_img_ref, ws->mod_single_ref, ws->kcat, ws->vcat, ws->out_full};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tensor_free(all[i]);
    ulysses_bufs_free(&ws->ub);
    free(ws);
}

static flux2_ws *ws_get(flux2_model *m, int64_t N, int64_t L) {
    if (m->ws && m->ws->N == N && m->ws->L == L) return m->ws;
    ws_free(m->ws);
    m->ws = NULL;
    const flux2_config *c = &m->cfg;
    int64_t S = N + L, D = c->D;
    flux2_ws *ws = xcalloc(1, sizeof *ws);
    ws->N = N, ws->L = L, ws->S = S;
    struct { tensor **t; int64_t r, c; } spec[] = {
        {&ws->x, S, D}, {&ws->nrm, S, D}, {&ws->proj, S, 3 * m->Dl + 2 * m->Ml}, {&ws->cat, S, m->Dl + m->Ml},
        {&ws->part, S, D}, {&ws->xin, N, c->in_channels}, {&ws->out, N, c->out_dim}, {&ws->temb, 1, D},
        {&ws->silu_temb, 1, D}, {&ws->hid, 1, D}, {&ws->sinus, 1, c->time_channels}, {&ws->mod_img, 1, 6 * D},
        {&ws->mod_txt, 1, 6 * D}, {&ws->mod_single, 1, 3 * D}, {&ws->mod_out, 1, 2 * D}};
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++)
        if (!(*spec[i].t = tensor_new(m->be, m->act, spec[i].r, spec[i].c))) {
            tp_error_context("flux2: activations for %lld image + %lld text tokens", (long long)N, (long long)L);
            ws_free(ws);
            return NULL;
        }
    return m->ws = ws;
}

/* The workspace of a forward over N image and L text tokens, the first R
 * image rows reference rows of a KV extract pass (else R = 0): with sequence
 * parallelism this rank's slices of the text, the references and the other
 * image rows (three segments, ulysses.h: each split on its own, so a rank's
 * rows keep the one-rank order text, references, noise), where they start,
 * and the buffer the output rows (the noise rows) are gathered into. */
static flux2_ws *ws_for(flux2_model *m, int64_t N, int64_t R, int64_t L) {
    int sp = m->sp > 1 ? m->sp : 1, r = m->sp > 1 ? m->sp_rank : 0;
    int64_t nr = ulysses_rows(R, sp, r), nn = ulysses_rows(N - R, sp, r);
    flux2_ws *ws = ws_get(m, nr + nn, ulysses_rows(L, sp, r));
    if (!ws) return NULL;
    ws->lay = (ulysses_layout){.sp = sp, .rank = r, .nseg = 3, .total = {L, R, N - R}};
    ws->l0 = ulysses_first(L, sp, r);
    ws->img_at[0] = ulysses_first(R, sp, r), ws->img_n[0] = nr;
    ws->img_at[1] = R + ulysses_first(N - R, sp, r), ws->img_n[1] = nn;
    ws->L_full = L, ws->N_full = N, ws->R_full = R;
    if (sp == 1) return ws;
    if (ulysses_reserve(&ws->ub, &ws->lay, m->Dl, m->act, m->be)) return NULL;
    if (!ws->out_full || ws->out_full->rows != N - R) {
        tensor_free(ws->out_full);
        if (!(ws->out_full = tensor_new(m->be, m->act, N - R, m->cfg.out_dim))) {
            tp_error_context("flux2: the gathered output of %lld image tokens", (long long)(N - R));
            return NULL;
        }
    }
    return ws;
}

/* The output rows (the image rows after any references) of every SP rank,
 * into out_full (on every rank); without SP a view of this rank's in *view */
static const tensor *whole_output(flux2_model *m, flux2_ws *ws, tensor *view) {
    *view = tensor_rows(ws->out, 0, ws->img_n[1]);
    if (m->sp <= 1) return view;
    ulysses_layout img = {.sp = m->sp, .rank = m->sp_rank, .nseg = 1, .total = {ws->N_full - ws->R_full}};
    return ulysses_gather(m->sp_comm, &img, view, ws->out_full) ? NULL : ws->out_full;
}

/* rows [at, at + n) of each piece of the whole image input host [N_full, w],
 * contiguous: a pointer into host when they are one piece, else a copy in
 * *tmp (freed by the caller) */
static const void *local_image_rows(const flux2_ws *ws, const void *host, size_t row_bytes, void **tmp) {
    const char *h = host;
    *tmp = NULL;
    if (!ws->img_n[0] || ws->img_at[0] + ws->img_n[0] == ws->img_at[1])   /* one piece */
        return h + (size_t)(ws->img_n[0] ? ws->img_at[0] : ws->img_at[1]) * row_bytes;
    size_t b0 = (size_t)ws->img_n[0] * row_bytes, b1 = (size_t)ws->img_n[1] * row_bytes;
    char *c = *tmp = xmalloc(b0 + b1 + 1);
    memcpy(c, h + (size_t)ws->img_at[0] * row_bytes, b0);
    memcpy(c + b0, h + (size_t)ws->img_at[1] * row_bytes, b1);
    return c;
}

int flux2_set_sp(flux2_model *m, comm *sp) {
    int had = m->sp > 1;
    if (ulysses_join(sp, m->heads_local, "flux2", &m->sp_comm, &m->sp, &m->sp_rank)) return -1;
    if (m->sp > 1 || had) flux2_release_caches(m);   /* the activations are sized by the slice */
    return 0;
}

void flux2_release_caches(flux2_model *m) {
    ws_free(m->ws);
    m->ws = NULL;
    for (int i = 0; i < FLUX2_TXT_CACHE; i++) {
        tensor_free(m->txt_cache[i].proj);
        free(m->txt_cache[i].embeds);
        memset(&m->txt_cache[i], 0, sizeof m->txt_cache[i]);
    }
    tensor_free(m->rope_cos);
    tensor_free(m->rope_sin);
    m->rope_cos = m->rope_sin = NULL;
    free(m->rope_ids);
    m->rope_ids = NULL;
    m->rope_rows = m->rope_L = 0;
}

void flux2_set_block_cache(flux2_model *m, block_cache *bc) { m->bc = bc; }

/* ---- cached inputs ---- */

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001B3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* The context projection txt·Wᵀ [L, D], computed once per prompt. */
static const tensor *text_projection(flux2_model *m, const float *txt, int64_t L) {
    size_t bytes = (size_t)(L * m->cfg.joint_dim) * sizeof(float);
    uint64_t key = hash_bytes(0xcbf29ce484222325ull ^ (uint64_t)L, txt, bytes);
    flux2_txt_cache *slot = NULL;
    m->use_clock++;
    for (int i = 0; i < FLUX2_TXT_CACHE; i++) {
        flux2_txt_cache *e = &m->txt_cache[i];
        if (e->proj && e->key == key && e->L == L && !memcmp(e->embeds, txt, bytes)) {
            e->last_use = m->use_clock;
            m->stats.txt_cache_hits++;
            return e->proj;
        }
        /* replace an empty slot, else the least recently used one */
        if (!slot || (slot->proj && (!e->proj || e->last_use < slot->last_use))) slot = e;
    }
    m->stats.txt_cache_misses++;
    tensor_free(slot->proj);
    free(slot->embeds);
    memset(slot, 0, sizeof *slot);
    tensor *in = tensor_new(m->be, m->act, L, m->cfg.joint_dim);
    tensor *proj = in ? tensor_new(m->be, m->act, L, m->cfg.D) : NULL;
    if (!proj || tensor_upload_f32(in, txt)) {
        tensor_free(in);
        tensor_free(proj);
        return NULL;
    }
    flux2_gemm(m, proj, in, m->ctx_emb);
    be_sync(m->be);
    tensor_free(in);
    float *copy = xmalloc(bytes);
    memcpy(copy, txt, bytes);
    *slot = (flux2_txt_cache){.key = key, .L = L, .embeds = copy, .proj = proj, .last_use = m->use_clock};
    return proj;
}

/* RoPE tables [S, hd] for the joint sequence (text ids, then image ids),
 * rebuilt only when the ids change (they do not across denoising steps). */
static int rope_tables(flux2_model *m, const int32_t *txt_ids, int64_t L, const int32_t *img_ids, int64_t N) {
    int64_t S = L + N, hd = m->cfg.head_dim;
    if (m->rope_cos && m->rope_rows == S && m->rope_L == L && !memcmp(m->rope_ids, txt_ids, (size_t)L * 16) &&
        !memcmp(m->rope_ids + L * 4, img_ids, (size_t)N * 16))
        return 0;
    tensor_free(m->rope_cos);
    tensor_free(m->rope_sin);
    m->rope_rows = m->rope_L = 0;
    m->rope_cos = tensor_new(m->be, DT_F32, S, hd);
    m->rope_sin = m->rope_cos ? tensor_new(m->be, DT_F32, S, hd) : NULL;
    float *c = xmalloc((size_t)(S * hd) * sizeof *c), *s = xmalloc((size_t)(S * hd) * sizeof *s);
    flux2_rope_table(&m->cfg, txt_ids, L, c, s);
    flux2_rope_table(&m->cfg, img_ids, N, c + L * hd, s + L * hd);
    int rc = !m->rope_sin || tensor_upload_f32(m->rope_cos, c) || tensor_upload_f32(m->rope_sin, s) || be_sync(m->be);
    free(c);
    free(s);
    if (rc) {
        tensor_free(m->rope_cos), tensor_free(m->rope_sin);
        m->rope_cos = m->rope_sin = NULL;
        return -1;
    }
    m->rope_rows = S, m->rope_L = L;
    m->rope_ids = xrealloc(m->rope_ids, (size_t)S * 16);
    memcpy(m->rope_ids, txt_ids, (size_t)L * 16);
    memcpy(m->rope_ids + L * 4, img_ids, (size_t)N * 16);
    return 0;
}

/* RoPE tables of this rank's rows */
static int local_rope(flux2_model *m, flux2_ws *ws, const int32_t *txt_ids, const int32_t *img_ids) {
    void *tmp;
    const int32_t *ids = local_image_rows(ws, img_ids, 4 * sizeof *img_ids, &tmp);
    int rc = rope_tables(m, txt_ids + ws->l0 * 4, ws->L, ids, ws->N);
    free(tmp);
    return rc;
}

int flux2_prepare(flux2_model *m, int64_t N, int64_t R, const int32_t *img_ids, const float *txt, int64_t L,
                  const int32_t *txt_ids, const float *txt2, int64_t L2) {
    flux2_ws *ws = ws_for(m, N, R, L);
    if (!ws) return -1;
    if (!text_projection(m, txt, L) || (txt2 && !text_projection(m, txt2, L2)))
        return tp_error_context("flux2: the context projection of %lld text tokens", (long long)L);
    return img_ids && local_rope(m, ws, txt_ids, img_ids) ? tp_error_context("flux2: RoPE tables") : 0;
}

/* ---- embeddings and modulation ---- */

/* The value the model embeds: value * 1000, with the bf16 roundings of the
 * eager reference in bf16 mode (the input tensor is bf16, so is the product). */
static float scaled_time(const flux2_model *m, float v) {
    if (m->act == DT_BF16 && !m->exact_time) return bf16r(bf16r(v) * 1000.0f);
    return v * 1000.0f;
}

/* y = linear_2(silu(linear_1(sinusoid(value)))) into y [1, D] */
static int embed_scalar(flux2_model *m, flux2_ws *ws, float value, const tensor *l1, const tensor *l2, tensor *y) {
    float *e = xmalloc((size_t)m->cfg.time_channels * sizeof *e);
    flux2_sinusoid(value, m->cfg.time_channels, e);
    int rc = tensor_upload_f32(ws->sinus, e);
    free(e);
    if (rc) return -1;
    flux2_gemm(m, ws->hid, ws->sinus, l1);
    op_silu(m->be, ws->hid, ws->hid);
    flux2_gemm(m, y, ws->hid, l2);
    return 0;
}

static int time_embedding(flux2_model *m, flux2_ws *ws, float timestep, const float *guidance) {
    if (embed_scalar(m, ws, scaled_time(m, timestep), m->t_lin1, m->t_lin2, ws->temb)) return -1;
    if (guidance && m->g_lin1) {
        /* silu_temb is free until modulation: hold the guidance embedding there */
        if (embed_scalar(m, ws, scaled_time(m, *guidance), m->g_lin1, m->g_lin2, ws->silu_temb)) return -1;
        op_add(m->be, ws->temb, ws->temb, ws->silu_temb);
    }
    op_silu(m->be, ws->silu_temb, ws->temb);
    flux2_gemm(m, ws->mod_img, ws->silu_temb, m->mod_img);
    flux2_gemm(m, ws->mod_txt, ws->silu_temb, m->mod_txt);
    flux2_gemm(m, ws->mod_single, ws->silu_temb, m->mod_single);
    flux2_gemm(m, ws->mod_out, ws->silu_temb, m->norm_out);
    return 0;
}

/* ---- the forward ---- */

static int check_args(const flux2_model *m, const float *x, int64_t N, const int32_t *img_ids, const float *txt,
                      int64_t L, const int32_t *txt_ids, float timestep, const float *out) {
    if (!x || !img_ids || !txt || !txt_ids || !out)
        return tp_error("flux2 forward: a required input (latents, ids, text embeddings or output) is NULL");
    if (N < 1 || L < 1)
        return tp_error("flux2 forward: need at least one image and one text token (got N=%lld, L=%lld)",
                        (long long)N, (long long)L);
    if (!(timestep == timestep)) return tp_error("flux2 forward: timestep is NaN");
    return 0;
}

/* extract mode: the reference rows' modulation, from the embedding of the
 * fixed reference timestep (the step's temb is no longer needed: its
 * output-layer modulation is already in mod_out) */
static int ref_modulation(flux2_model *m, flux2_ws *ws, float ref_timestep, const float *guidance) {
    if (!ws->mod_img_ref) ws->mod_img_ref = tensor_new(m->be, m->act, 1, 6 * m->cfg.D);
    if (!ws->mod_single_ref) ws->mod_single_ref = tensor_new(m->be, m->act, 1, 3 * m->cfg.D);
    if (!ws->mod_img_ref || !ws->mod_single_ref) return -1;
    if (embed_scalar(m, ws, scaled_time(m, ref_timestep), m->t_lin1, m->t_lin2, ws->temb)) return -1;
    if (guidance && m->g_lin1) {
        if (embed_scalar(m, ws, scaled_time(m, *guidance), m->g_lin1, m->g_lin2, ws->silu_temb)) return -1;
        op_add(m->be, ws->temb, ws->temb, ws->silu_temb);
    }
    op_silu(m->be, ws->silu_temb, ws->temb);
    flux2_gemm(m, ws->mod_img_ref, ws->silu_temb, m->mod_img);
    flux2_gemm(m, ws->mod_single_ref, ws->silu_temb, m->mod_single);
    return 0;
}

/* one block of each group, for the block cache's loop (block_cache.h) */
typedef struct block_args {
    flux2_model *m;
    flux2_ws *ws;
} block_args;

static int run_double(void *ctx, int i) {
    block_args *a = ctx;
    a->ws->kv_layer = i;
    return flux2_double_block(a->m, &a->m->dbl[i], a->ws) ? tp_error_context("double block %d", i) : 0;
}

static int run_single(void *ctx, int j) {
    block_args *a = ctx;
    a->ws->kv_layer = a->m->cfg.num_layers + j;
    return flux2_single_block(a->m, &a->m->sgl[j], a->ws) ? tp_error_context("single block %d", j) : 0;
}

static int forward_body(flux2_model *m, flux2_ws *ws, const float *x, const int32_t *img_ids, const float *txt,
                        const int32_t *txt_ids, float timestep, const float *guidance) {
    int64_t N = ws->N, L = ws->L, D = m->cfg.D;
    if (time_embedding(m, ws, timestep, guidance)) return -1;
    if (ws->kv_mode == FLUX2_KV_EXTRACT && ws->R && ref_modulation(m, ws, ws->ref_t, guidance)) return -1;
    /* with sequence parallelism: this rank's rows (ws_for) of the whole inputs */
    const tensor *tp = text_projection(m, txt, ws->L_full);
    if (!tp || local_rope(m, ws, txt_ids, img_ids)) return -1;
    tensor x_txt = tensor_rows(ws->x, 0, L), x_img = tensor_rows(ws->x, L, N), t_rows = tensor_rows(tp, ws->l0, L);
    if (L) op_copy(m->be, &x_txt, &t_rows);
    void *tmp;
    int rc = tensor_upload_f32(ws->xin, local_image_rows(ws, x, (size_t)m->cfg.in_channels * sizeof *x, &tmp));
    free(tmp);
    if (rc) return -1;
    flux2_gemm(m, &x_img, ws->xin, m->x_emb);
    /* the two block groups, each through the block cache's loop (plain
     * without --cache): the double group's Fn residual is measured on the
     * image rows, the single group's on the whole joint stream (spec
     * block-cache.md §1) */
    block_args ba = {m, ws};
    if (block_cache_run(m->bc, BC_DOUBLE, m->cfg.num_layers, ws->x, L, N, run_double, &ba) ||
        block_cache_run(m->bc, BC_SINGLE, m->cfg.num_single_layers, ws->x, 0, L + N, run_single, &ba))
        return -1;
    /* output layer on the image rows (extract: the noise rows after the
     * references); norm_out chunks are (scale, shift) */
    int64_t R = ws->kv_mode == FLUX2_KV_EXTRACT ? ws->R : 0;
    tensor scale = tensor_cols(ws->mod_out, 0, D), shift = tensor_cols(ws->mod_out, D, D);
    tensor n_img = tensor_rows(ws->nrm, L + R, N - R), o = tensor_rows(ws->out, 0, N - R);
    x_img = tensor_rows(ws->x, L + R, N - R);
    op_layernorm_mod(m->be, &n_img, &x_img, &shift, &scale, m->cfg.eps);
    flux2_gemm(m, &o, &n_img, m->proj_out);
    return 0;
}

int flux2_forward(flux2_model *m, const float *x, int64_t N, const int32_t *img_ids, const float *txt, int64_t L,
                  const int32_t *txt_ids, float timestep, const float *guidance, float *out) {
    if (check_args(m, x, N, img_ids, txt, L, txt_ids, timestep, out)) return -1;
    double t0 = MPI_Wtime();
    flux2_ws *ws = ws_for(m, N, 0, L);
    if (!ws) return -1;
    ws->kv_mode = FLUX2_KV_NONE, ws->R = 0, ws->kv = NULL;
    const tensor *o = NULL;
    tensor view;
    if (forward_body(m, ws, x, img_ids, txt, txt_ids, timestep, guidance) || !(o = whole_output(m, ws, &view)) ||
        tensor_download_f32(o, out) || be_sync(m->be))
        return tp_error_context("flux2 forward");
    m->stats.forwards++;
    m->stats.seconds += MPI_Wtime() - t0;
    return 0;
}

/* ---- KV-cached references ---- */

flux2_kv_cache *flux2_kv_new(void) { return xcalloc(1, sizeof(flux2_kv_cache)); }

static void kv_clear(flux2_kv_cache *kv) {
    for (int i = 0; i < kv->n_layers; i++) tensor_free(kv->k[i]), tensor_free(kv->v[i]);
    free(kv->k), free(kv->v);
    kv->k = kv->v = NULL;
    kv->n_layers = 0, kv->R = 0;
}

void flux2_kv_free(flux2_kv_cache *kv) {
    if (!kv) return;
    kv_clear(kv);
    free(kv);
}

/* [R, Dl/sp] per block: all the reference tokens of the heads this rank attends for */
static int kv_alloc(flux2_model *m, flux2_kv_cache *kv, int64_t R) {
    kv_clear(kv);
    int n = m->cfg.num_layers + m->cfg.num_single_layers;
    int64_t w = m->Dl / (m->sp > 1 ? m->sp : 1);
    kv->k = xcalloc((size_t)n, sizeof *kv->k);
    kv->v = xcalloc((size_t)n, sizeof *kv->v);
    kv->n_layers = n, kv->R = R;
    for (int i = 0; i < n; i++)
        if (!(kv->k[i] = tensor_new(m->be, m->act, R, w)) || !(kv->v[i] = tensor_new(m->be, m->act, R, w)))
            return tp_error_context("flux2: KV cache of %lld reference tokens", (long long)R);
    uint64_t bytes = 2 * (uint64_t)n * tensor_nbytes(kv->k[0]);
    if (bytes > m->stats.kv_cache_bytes) m->stats.kv_cache_bytes = bytes, m->stats.kv_cache_tokens = R;
    return 0;
}

/* cached: the keys and values of the whole sequence with the cached rows
 * between text and image, [L + R + N, Dl/sp] (kept while the shape stays) */
static int kv_concat_bufs(flux2_model *m, flux2_ws *ws, int64_t rows) {
    int64_t w = m->Dl / (m->sp > 1 ? m->sp : 1);
    if (ws->kcat && ws->kcat->rows == rows && ws->kcat->cols == w) return 0;
    tensor_free(ws->kcat), tensor_free(ws->vcat);
    ws->kcat = tensor_new(m->be, m->act, rows, w);
    ws->vcat = ws->kcat ? tensor_new(m->be, m->act, rows, w) : NULL;
    return ws->vcat ? 0 : tp_error_context("flux2: attention keys with %lld cached tokens", (long long)ws->kv->R);
}

int flux2_forward_kv(flux2_model *m, int mode, flux2_kv_cache *kv, const float *x, int64_t N, int64_t R,
                     const int32_t *img_ids, const float *txt, int64_t L, const int32_t *txt_ids, float timestep,
                     const float *guidance, float ref_timestep, float *out) {
    if (mode == FLUX2_KV_NONE || !kv)
        return flux2_forward(m, x, N, img_ids, txt, L, txt_ids, timestep, guidance, out);
    if (check_args(m, x, N, img_ids, txt, L, txt_ids, timestep, out)) return -1;
    if (mode == FLUX2_KV_EXTRACT && (R < 1 || R >= N))
        return tp_error("flux2 forward (KV extract): %lld reference tokens of %lld image rows; need 0 < R < N",
                        (long long)R, (long long)N);
    if (mode == FLUX2_KV_CACHED && (kv->R < 1 || kv->n_layers != m->cfg.num_layers + m->cfg.num_single_layers))
        return tp_error("flux2 forward (KV cached): the cache is empty; run an extract pass first");
    double t0 = MPI_Wtime();
    int extract = mode == FLUX2_KV_EXTRACT;
    flux2_ws *ws = ws_for(m, N, extract ? R : 0, L);
    if (!ws) return -1;
    ws->kv_mode = mode, ws->kv = kv, ws->ref_t = ref_timestep;
    ws->R = extract ? ws->img_n[0] : 0;   /* my reference rows */
    const tensor *o = NULL;
    tensor view;
    int rc = (extract ? kv_alloc(m, kv, R) : kv_concat_bufs(m, ws, L + kv->R + N)) ||
             forward_body(m, ws, x, img_ids, txt, txt_ids, timestep, guidance) || !(o = whole_output(m, ws, &view)) ||
             tensor_download_f32(o, out) || be_sync(m->be);
    ws->kv_mode = FLUX2_KV_NONE, ws->kv = NULL, ws->R = 0;
    if (rc) return tp_error_context("flux2 forward (KV %s)", extract ? "extract" : "cached");
    m->stats.forwards++;
    m->stats.seconds += MPI_Wtime() - t0;
    return 0;
}
