/* FLUX.2 transformer: loading this rank's shard through the plan engine (or
 * generating random weights for benchmarks), binding the weight tensors by
 * name, and checking every shape against the config. */
#include "flux2_impl.h"
#include "../err.h"
#include "../checkpoint.h"
#include "../../plans/plan.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- shape checking and binding ---- */

/* The binder looks tensors up either in loaded weights or, for random init,
 * creates them; in both cases it checks the local (and global) shape. */
typedef struct binder {
    flux2_model *m;
    const char *dir;           /* for messages */
    uint64_t seed;             /* random init */
    int random;
} binder;

static void fill_random(tensor *t, uint64_t seed, float scale, float offset);

static const tensor *bind(binder *b, int64_t grows, int64_t gcols, int64_t lrows, int64_t lcols,
                          const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static const tensor *bind(binder *b, int64_t grows, int64_t gcols, int64_t lrows, int64_t lcols,
                          const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    flux2_model *m = b->m;
    if (b->random) {
        tensor *t = tensor_new(m->be, m->act, lrows, lcols);
        if (!t) return NULL;
        m->owned = xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *m->owned);
        m->owned[m->n_owned++] = t;
        int is_norm = grows == 1;   /* the QK-RMSNorm weights [hd]: around 1 */
        uint64_t h = b->seed * 0x9E3779B97F4A7C15ull + (uint64_t)m->rank * 0x632BE59BD9B4E019ull;
        for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001B3ull;
        fill_random(t, h, is_norm ? 0.1f : sqrtf(3.0f / (float)gcols), is_norm ? 1.0f : 0.0f);
        return t;
    }
    const tensor *t = weights_req(m->w, "%s", name);
    if (!t) return NULL;
    const st_tensor_info *info = weights_info(m->w, name);
    int64_t rows = info->ndim >= 1 ? info->shape[0] : 1, cols = 1;
    for (int d = 1; d < info->ndim; d++) cols *= info->shape[d];
    if (info->ndim == 1) { cols = rows; rows = 1; }
    if (rows != grows || cols != gcols)
        return tp_error("%s: tensor %s has shape [%lld, %lld] but config.json implies [%lld, %lld]; "
                        "the config does not belong to this checkpoint", b->dir, name, (long long)rows,
                        (long long)cols, (long long)grows, (long long)gcols), NULL;
    if (t->rows != lrows || t->cols != lcols)
        return tp_error("%s: shard of %s on rank %d is [%lld, %lld], expected [%lld, %lld] (plan mismatch)",
                        b->dir, name, m->rank, (long long)t->rows, (long long)t->cols, (long long)lrows,
                        (long long)lcols), NULL;
    return t;
}

#define BIND(dst, gr, gc, lr, lc, ...) do { if (!((dst) = bind(b, gr, gc, lr, lc, __VA_ARGS__))) return -1; } while (0)

static int bind_top(binder *b) {
    flux2_model *m = b->m;
    const flux2_config *c = &m->cfg;
    int64_t D = c->D;
    const char *te = "time_guidance_embed.timestep_embedder", *ge = "time_guidance_embed.guidance_embedder";
    BIND(m->x_emb, D, c->in_channels, D, c->in_channels, "x_embedder.weight");
    BIND(m->ctx_emb, D, c->joint_dim, D, c->joint_dim, "context_embedder.weight");
    BIND(m->t_lin1, D, c->time_channels, D, c->time_channels, "%s.linear_1.weight", te);
    BIND(m->t_lin2, D, D, D, D, "%s.linear_2.weight", te);
    if (c->guidance_embeds) {
        BIND(m->g_lin1, D, c->time_channels, D, c->time_channels, "%s.linear_1.weight", ge);
        BIND(m->g_lin2, D, D, D, D, "%s.linear_2.weight", ge);
    }
    BIND(m->mod_img, 6 * D, D, 6 * D, D, "double_stream_modulation_img.linear.weight");
    BIND(m->mod_txt, 6 * D, D, 6 * D, D, "double_stream_modulation_txt.linear.weight");
    BIND(m->mod_single, 3 * D, D, 3 * D, D, "single_stream_modulation.linear.weight");
    BIND(m->norm_out, 2 * D, D, 2 * D, D, "norm_out.linear.weight");
    BIND(m->proj_out, c->out_dim, D, c->out_dim, D, "proj_out.weight");
    return 0;
}

static int bind_double(binder *b, int i) {
    flux2_model *m = b->m;
    int64_t D = m->cfg.D, M = m->cfg.M, Dl = m->Dl, Ml = m->Ml, hd = m->cfg.head_dim;
    flux2_double_w *w = &m->dbl[i];
    const char *p = "transformer_blocks";
    BIND(w->to_q, D, D, Dl, D, "%s.%d.attn.to_q.weight", p, i);
    BIND(w->to_k, D, D, Dl, D, "%s.%d.attn.to_k.weight", p, i);
    BIND(w->to_v, D, D, Dl, D, "%s.%d.attn.to_v.weight", p, i);
    BIND(w->norm_q, 1, hd, 1, hd, "%s.%d.attn.norm_q.weight", p, i);
    BIND(w->norm_k, 1, hd, 1, hd, "%s.%d.attn.norm_k.weight", p, i);
    BIND(w->to_out, D, D, D, Dl, "%s.%d.attn.to_out.0.weight", p, i);
    BIND(w->add_q, D, D, Dl, D, "%s.%d.attn.add_q_proj.weight", p, i);
    BIND(w->add_k, D, D, Dl, D, "%s.%d.attn.add_k_proj.weight", p, i);
    BIND(w->add_v, D, D, Dl, D, "%s.%d.attn.add_v_proj.weight", p, i);
    BIND(w->norm_added_q, 1, hd, 1, hd, "%s.%d.attn.norm_added_q.weight", p, i);
    BIND(w->norm_added_k, 1, hd, 1, hd, "%s.%d.attn.norm_added_k.weight", p, i);
    BIND(w->to_add_out, D, D, D, Dl, "%s.%d.attn.to_add_out.weight", p, i);
    BIND(w->ff_in, 2 * M, D, 2 * Ml, D, "%s.%d.ff.linear_in.weight", p, i);
    BIND(w->ff_out, D, M, D, Ml, "%s.%d.ff.linear_out.weight", p, i);
    BIND(w->ffc_in, 2 * M, D, 2 * Ml, D, "%s.%d.ff_context.linear_in.weight", p, i);
    BIND(w->ffc_out, D, M, D, Ml, "%s.%d.ff_context.linear_out.weight", p, i);
    return 0;
}

static int bind_single(binder *b, int j) {
    flux2_model *m = b->m;
    int64_t D = m->cfg.D, M = m->cfg.M, Dl = m->Dl, Ml = m->Ml, hd = m->cfg.head_dim;
    flux2_single_w *w = &m->sgl[j];
    const char *p = "single_transformer_blocks";
    BIND(w->qkv_mlp, 3 * D + 2 * M, D, 3 * Dl + 2 * Ml, D, "%s.%d.attn.to_qkv_mlp_proj.weight", p, j);
    BIND(w->norm_q, 1, hd, 1, hd, "%s.%d.attn.norm_q.weight", p, j);
    BIND(w->norm_k, 1, hd, 1, hd, "%s.%d.attn.norm_k.weight", p, j);
    BIND(w->to_out, D, D + M, D, Dl + Ml, "%s.%d.attn.to_out.weight", p, j);
    return 0;
}

static int bind_all(binder *b) {
    flux2_model *m = b->m;
    m->dbl = xcalloc((size_t)m->cfg.num_layers + 1, sizeof *m->dbl);
    m->sgl = xcalloc((size_t)m->cfg.num_single_layers + 1, sizeof *m->sgl);
    if (bind_top(b)) return -1;
    for (int i = 0; i < m->cfg.num_layers; i++)
        if (bind_double(b, i)) return -1;
    for (int j = 0; j < m->cfg.num_single_layers; j++)
        if (bind_single(b, j)) return -1;
    return 0;
}

/* ---- model creation ---- */

static int model_new(const flux2_config *cfg, backend *be, comm *c, dtype_t precision, flux2_model **out) {
    *out = NULL;
    if (precision != DT_F32 && precision != DT_BF16)
        return tp_error("flux2: precision must be f32 or bf16 (got %s)", dtype_name(precision));
    int tp = c ? c->size : 1;
    if (cfg->heads % tp)
        return tp_error("flux2: tensor-parallel degree %d does not divide num_attention_heads %d; "
                        "use a tp that divides it", tp, cfg->heads);
    if (cfg->M % tp)
        return tp_error("flux2: tensor-parallel degree %d does not divide the MLP width %lld", tp,
                        (long long)cfg->M);
    flux2_model *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->be = be;
    m->comm = c;
    m->act = precision;
    m->tp = tp;
    m->rank = c ? c->rank : 0;
    m->heads_local = cfg->heads / tp;
    m->Dl = cfg->D / tp;
    m->Ml = cfg->M / tp;
    m->fused_allreduce = 1;
    m->profiling = be->kind == BACKEND_CPU;
    *out = m;
    return 0;
}

static int expected_tensor_count(const flux2_config *c) {
    return 9 + (c->guidance_embeds ? 2 : 0) + 16 * c->num_layers + 4 * c->num_single_layers;
}

int flux2_load(const char *dir, backend *be, comm *c, dtype_t precision, flux2_model **out, load_stats *st) {
    *out = NULL;
    char *cfg_path = xasprintf("%s/config.json", dir);
    json_error_t jerr;
    json_t *cfg_json = json_load_file(cfg_path, 0, &jerr);
    int rc = -1;
    flux2_config cfg;
    checkpoint *ck = NULL;
    flux2_model *m = NULL;
    if (!cfg_json) {
        tp_error("%s: cannot read the transformer config (%s, line %d); pass the model folder's transformer/ "
                 "directory", cfg_path, jerr.text, jerr.line);
        goto done;
    }
    if (flux2_config_parse(cfg_json, cfg_path, &cfg) || model_new(&cfg, be, c, precision, &m)) goto done;
    if (checkpoint_open(dir, &ck)) goto done;
    if (ck->n != expected_tensor_count(&cfg)) {
        tp_error("%s: the checkpoint has %d tensors but config.json (%d double, %d single blocks%s) implies %d; "
                 "the config does not match the weights", dir, ck->n, cfg.num_layers, cfg.num_single_layers,
                 cfg.guidance_embeds ? ", guidance embedder" : "", expected_tensor_count(&cfg));
        goto done;
    }
    plan p;
    if (plan_flux2(cfg_json, &p)) goto done;
    load_opts o = {.tp = m->tp, .rank = m->rank, .be = be, .dtype = precision};
    if (weights_load(ck, &p, &o, &m->w, st)) goto done;
    binder b = {.m = m, .dir = dir};
    if (bind_all(&b)) goto done;
    rc = 0;
done:
    if (rc) {
        tp_error_context("loading the FLUX.2 transformer");
        flux2_free(m);
    } else {
        *out = m;
    }
    checkpoint_close(ck);
    json_decref(cfg_json);
    free(cfg_path);
    return rc;
}

int flux2_init_random(const flux2_config *cfg, backend *be, comm *c, dtype_t precision, uint64_t seed,
                      flux2_model **out) {
    flux2_model *m;
    if (model_new(cfg, be, c, precision, &m)) return -1;
    binder b = {.m = m, .dir = "(random weights)", .seed = seed, .random = 1};
    if (bind_all(&b)) {
        flux2_free(m);
        *out = NULL;
        return -1;
    }
    *out = m;
    return 0;
}

void flux2_free(flux2_model *m) {
    if (!m) return;
    flux2_release_caches(m);
    for (int i = 0; i < m->n_owned; i++) tensor_free(m->owned[i]);
    free(m->owned);
    weights_free(m->w);
    free(m->dbl);
    free(m->sgl);
    free(m);
}

const flux2_config *flux2_get_config(const flux2_model *m) { return &m->cfg; }
dtype_t flux2_precision(const flux2_model *m) { return m->act; }
comm *flux2_comm(const flux2_model *m) { return m->comm; }
backend *flux2_backend(const flux2_model *m) { return m->be; }
void flux2_set_fused_allreduce(flux2_model *m, int on) { m->fused_allreduce = on; }
void flux2_set_profiling(flux2_model *m, int on) { m->profiling = on; }
void flux2_set_exact_timestep(flux2_model *m, int on) { m->exact_time = on; }
void flux2_get_stats(const flux2_model *m, flux2_stats *st) { *st = m->stats; }
void flux2_reset_stats(flux2_model *m) { memset(&m->stats, 0, sizeof m->stats); }

/* Uniform values in [offset - scale, offset + scale), filled in host chunks
 * (splitmix64) and uploaded row range by row range. */
static void fill_random(tensor *t, uint64_t seed, float scale, float offset) {
    int64_t chunk_rows = (1 << 20) / (t->cols > 0 ? t->cols : 1);
    if (chunk_rows < 1) chunk_rows = 1;
    if (chunk_rows > t->rows) chunk_rows = t->rows;
    float *buf = xmalloc((size_t)(chunk_rows * t->cols) * sizeof *buf);
    uint64_t s = seed;
    for (int64_t r0 = 0; r0 < t->rows; r0 += chunk_rows) {
        int64_t n = t->rows - r0 < chunk_rows ? t->rows - r0 : chunk_rows;
        for (int64_t i = 0; i < n * t->cols; i++) {
            uint64_t z = (s += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            z ^= z >> 31;
            float u = (float)(z >> 40) * (1.0f / 16777216.0f);   /* [0, 1) */
            buf[i] = offset + scale * (2.0f * u - 1.0f);
        }
        tensor v = tensor_rows(t, r0, n);
        tensor_upload_f32(&v, buf);
    }
    free(buf);
}
