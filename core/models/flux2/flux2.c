/* FLUX.2 transformer: loading this rank's shard through the plan engine (or
 * generating random weights for benchmarks), binding the weight tensors by
 * name, and checking every shape against the config. */
#include "flux2_impl.h"
#include "kernels/err.h"
#include "core/formats/checkpoint.h"
#include "core/formats/lora.h"
#include "core/models/model_plan.h"
#include "core/models/flux3/flux3.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- shape checking and binding ---- */

/* The binder looks tensors up either in loaded weights or, for random init,
 * creates them; in both cases it checks the local (and global) shape. */
typedef struct binder {
    flux2_model *m;
    const char *dir;           /* for messages */
    uint64_t seed;             /* random init */
    int random;
    int bfl;                   /* BFL single-file names (spec Appendix A) */
    int dry;                   /* only check names and global shapes in ck (no weights) */
    const checkpoint *ck;
} binder;

/* what a dry-run bind returns for a tensor that exists with the right shape */
static const tensor k_dry_run;

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
    const tensor *t = NULL;
    const st_tensor_info *info;
    if (b->dry) {
        if (!(info = checkpoint_find(b->ck, name, NULL)))
            return tp_error("%s: tensor %s missing from the checkpoint", b->dir, name), NULL;
    } else {
        if (!(t = weights_req(m->w, "%s", name))) return NULL;
        info = weights_info(m->w, name);
    }
    int64_t rows = info->ndim >= 1 ? info->shape[0] : 1, cols = 1;
    for (int d = 1; d < info->ndim; d++) cols *= info->shape[d];
    if (info->ndim == 1) { cols = rows; rows = 1; }
    if (rows != grows || cols != gcols)
        return tp_error("%s: tensor %s has shape [%lld, %lld] but config.json implies [%lld, %lld]; "
                        "the config does not belong to this checkpoint", b->dir, name, (long long)rows,
                        (long long)cols, (long long)grows, (long long)gcols), NULL;
    if (b->dry) return &k_dry_run;
    if (t->rows != lrows || t->cols != lcols)
        return tp_error("%s: shard of %s on rank %d is [%lld, %lld], expected [%lld, %lld] (plan mismatch)",
                        b->dir, name, m->rank, (long long)t->rows, (long long)t->cols, (long long)lrows,
                        (long long)lcols), NULL;
    return t;
}

#define BIND(dst, gr, gc, lr, lc, ...) do { if (!((dst) = bind(b, gr, gc, lr, lc, __VA_ARGS__))) return -1; } while (0)
/* the tensor's name in the checkpoint's layout: diffusers or BFL (Appendix A) */
#define NAME(diffusers_name, bfl_name) (b->bfl ? (bfl_name) : (diffusers_name))

/* A tensor struct for a view into a loaded weight, owned by the model (its
 * data is not: tensor_free releases only the struct). */
static const tensor *keep_view(flux2_model *m, tensor v) {
    tensor *t = xmalloc(sizeof *t);
    *t = v;
    t->owner = 0;
    m->owned = xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned++] = t;
    return t;
}

/* BFL's final layer emits (shift, scale), diffusers' norm_out (scale,
 * shift): swap the two [D, D] row halves once, in place, through a
 * temporary of one half. The weights object owns the memory and nothing
 * else reads it, so the const is cast away deliberately. */
static int swap_halves(flux2_model *m, const tensor *w, int64_t D) {
    if (w->dtype == DT_GGML)   /* quantised, whole rows: swap the rows' stored bytes */
        return op_swap_ggml_row_halves((tensor *)w, D)
                   ? tp_error_context("swapping the halves of final_layer.adaLN_modulation.1.weight") : 0;
    tensor *tmp = tensor_new(m->be, w->dtype, D, w->cols);
    if (!tmp) return tp_error_context("swapping the halves of final_layer.adaLN_modulation.1.weight");
    tensor *mw = (tensor *)w;
    tensor top = tensor_rows(mw, 0, D), bottom = tensor_rows(mw, D, D);
    op_copy(m->be, tmp, &top);
    op_copy(m->be, &top, &bottom);
    op_copy(m->be, &bottom, tmp);
    tensor_free(tmp);
    if (w->scale && w->scale_per_row) {   /* an fp8 weight's per-row scales swap with their rows */
        tensor s = tensor_wrap(m->be, DT_F32, 2, D, w->scale), st = tensor_rows(&s, 0, 1), sb = tensor_rows(&s, 1, 1);
        tensor *t1 = tensor_new(m->be, DT_F32, 1, D);
        if (!t1) return tp_error_context("swapping the scales of final_layer.adaLN_modulation.1.weight");
        op_copy(m->be, t1, &st);
        op_copy(m->be, &st, &sb);
        op_copy(m->be, &sb, t1);
        int rc = be_sync(m->be);
        tensor_free(t1);
        return rc;
    }
    return be_sync(m->be);
}

static int bind_top(binder *b) {
    flux2_model *m = b->m;
    const flux2_config *c = &m->cfg;
    int64_t D = c->D;
    BIND(m->x_emb, D, c->in_channels, D, c->in_channels, "%s", NAME("x_embedder.weight", "img_in.weight"));
    BIND(m->ctx_emb, D, c->joint_dim, D, c->joint_dim, "%s", NAME("context_embedder.weight", "txt_in.weight"));
    BIND(m->t_lin1, D, c->time_channels, D, c->time_channels, "%s",
         NAME("time_guidance_embed.timestep_embedder.linear_1.weight", "time_in.in_layer.weight"));
    BIND(m->t_lin2, D, D, D, D, "%s",
         NAME("time_guidance_embed.timestep_embedder.linear_2.weight", "time_in.out_layer.weight"));
    if (c->guidance_embeds) {
        BIND(m->g_lin1, D, c->time_channels, D, c->time_channels, "%s",
             NAME("time_guidance_embed.guidance_embedder.linear_1.weight", "guidance_in.in_layer.weight"));
        BIND(m->g_lin2, D, D, D, D, "%s",
             NAME("time_guidance_embed.guidance_embedder.linear_2.weight", "guidance_in.out_layer.weight"));
    }
    BIND(m->mod_img, 6 * D, D, 6 * D, D, "%s",
         NAME("double_stream_modulation_img.linear.weight", "double_stream_modulation_img.lin.weight"));
    BIND(m->mod_txt, 6 * D, D, 6 * D, D, "%s",
         NAME("double_stream_modulation_txt.linear.weight", "double_stream_modulation_txt.lin.weight"));
    BIND(m->mod_single, 3 * D, D, 3 * D, D, "%s",
         NAME("single_stream_modulation.linear.weight", "single_stream_modulation.lin.weight"));
    BIND(m->norm_out, 2 * D, D, 2 * D, D, "%s", NAME("norm_out.linear.weight", "final_layer.adaLN_modulation.1.weight"));
    if (b->bfl && !b->random && !b->dry && swap_halves(m, m->norm_out, D)) return -1;
    BIND(m->proj_out, c->out_dim, D, c->out_dim, D, "%s", NAME("proj_out.weight", "final_layer.linear.weight"));
    return 0;
}

/* BFL fuses each stream's Q, K, V into one qkv [3D, D], loaded packed
 * colwise as [Q_k; K_k; V_k] = [3D/tp, D]: the three local blocks are row
 * views, no copy. */
static int bind_fused_qkv(binder *b, const tensor **q, const tensor **k, const tensor **v, const char *fmt, int i) {
    flux2_model *m = b->m;
    int64_t D = m->cfg.D, Dl = m->Dl;
    const tensor *qkv = bind(b, 3 * D, D, 3 * Dl, D, fmt, i);
    if (!qkv) return -1;
    if (b->dry) return 0;
    *q = keep_view(m, tensor_rows(qkv, 0, Dl));
    *k = keep_view(m, tensor_rows(qkv, Dl, Dl));
    *v = keep_view(m, tensor_rows(qkv, 2 * Dl, Dl));
    return 0;
}

static int bind_double_bfl(binder *b, int i) {
    flux2_model *m = b->m;
    int64_t D = m->cfg.D, M = m->cfg.M, Dl = m->Dl, Ml = m->Ml, hd = m->cfg.head_dim;
    flux2_double_w *w = &m->dbl[i];
    if (bind_fused_qkv(b, &w->to_q, &w->to_k, &w->to_v, "double_blocks.%d.img_attn.qkv.weight", i) ||
        bind_fused_qkv(b, &w->add_q, &w->add_k, &w->add_v, "double_blocks.%d.txt_attn.qkv.weight", i))
        return -1;
    BIND(w->norm_q, 1, hd, 1, hd, "double_blocks.%d.img_attn.norm.query_norm.scale", i);
    BIND(w->norm_k, 1, hd, 1, hd, "double_blocks.%d.img_attn.norm.key_norm.scale", i);
    BIND(w->to_out, D, D, D, Dl, "double_blocks.%d.img_attn.proj.weight", i);
    BIND(w->norm_added_q, 1, hd, 1, hd, "double_blocks.%d.txt_attn.norm.query_norm.scale", i);
    BIND(w->norm_added_k, 1, hd, 1, hd, "double_blocks.%d.txt_attn.norm.key_norm.scale", i);
    BIND(w->to_add_out, D, D, D, Dl, "double_blocks.%d.txt_attn.proj.weight", i);
    BIND(w->ff_in, 2 * M, D, 2 * Ml, D, "double_blocks.%d.img_mlp.0.weight", i);
    BIND(w->ff_out, D, M, D, Ml, "double_blocks.%d.img_mlp.2.weight", i);
    BIND(w->ffc_in, 2 * M, D, 2 * Ml, D, "double_blocks.%d.txt_mlp.0.weight", i);
    BIND(w->ffc_out, D, M, D, Ml, "double_blocks.%d.txt_mlp.2.weight", i);
    return 0;
}

static int bind_double(binder *b, int i) {
    if (b->bfl) return bind_double_bfl(b, i);
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
    BIND(w->qkv_mlp, 3 * D + 2 * M, D, 3 * Dl + 2 * Ml, D,
         NAME("single_transformer_blocks.%d.attn.to_qkv_mlp_proj.weight", "single_blocks.%d.linear1.weight"), j);
    BIND(w->norm_q, 1, hd, 1, hd,
         NAME("single_transformer_blocks.%d.attn.norm_q.weight", "single_blocks.%d.norm.query_norm.scale"), j);
    BIND(w->norm_k, 1, hd, 1, hd,
         NAME("single_transformer_blocks.%d.attn.norm_k.weight", "single_blocks.%d.norm.key_norm.scale"), j);
    BIND(w->to_out, D, D + M, D, Dl + Ml,
         NAME("single_transformer_blocks.%d.attn.to_out.weight", "single_blocks.%d.linear2.weight"), j);
    return 0;
}

static int bind_all(binder *b) {
    flux2_model *m = b->m;
    if (!m->dbl) m->dbl = xcalloc((size_t)m->cfg.num_layers + 1, sizeof *m->dbl);
    if (!m->sgl) m->sgl = xcalloc((size_t)m->cfg.num_single_layers + 1, sizeof *m->sgl);
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

static int expected_tensor_count(const flux2_config *c, int bfl) {
    /* BFL: one fused qkv per stream instead of three projections */
    return 9 + (c->guidance_embeds ? 2 : 0) + (bfl ? 12 : 16) * c->num_layers + 4 * c->num_single_layers;
}

json_t *flux2_transformer_config(const char *dir, char **where) {
    char *path = xasprintf("%s/config.json", dir);
    json_error_t jerr;
    json_t *cfg = NULL;
    checkpoint *ck = NULL;
    if (access(path, F_OK) == 0) {
        if (!(cfg = json_load_file(path, 0, &jerr)))
            tp_error("%s: cannot read the transformer config (%s, line %d)", path, jerr.text, jerr.line);
    } else if (access(dir, F_OK) == 0 && checkpoint_open(dir, &ck) == 0 &&
               (checkpoint_is_bfl(ck) || flux2_checkpoint_is_diffusers(ck))) {
        int bfl = checkpoint_is_bfl(ck);
        free(path);
        path = xasprintf("%s (config derived from the %s checkpoint's tensor shapes)", dir, bfl ? "BFL" : "diffusers-named");
        cfg = bfl ? flux2_config_from_bfl(ck) : flux2_config_from_diffusers(ck);
    } else if (ck && flux3_checkpoint_names(ck, &(const char *){NULL})) {   /* FLUX.3 (BFL or GGUF), no config.json */
        free(path);
        path = xasprintf("%s (config derived from the FLUX.3 checkpoint's tensor shapes)", dir);
        cfg = flux3_config_from_shapes(ck);
    } else if (access(dir, F_OK) == 0 && ck) {
        tp_error("%s: config.json is missing, and its tensors are neither BFL- nor diffusers-named FLUX.2 or FLUX.3 "
                 "transformer weights (no img_in.weight or x_embedder.weight): pass the pipeline's transformer/ "
                 "folder (with config.json) or a FLUX.2 transformer checkpoint", dir);
    } else if (access(dir, F_OK) == 0) {
        tp_error_context("%s (no config.json beside it)", dir);
    } else {
        tp_error("%s is missing: pass the pipeline's transformer/ folder (diffusers layout, with config.json), "
                 "or a BFL- or diffusers-named transformer checkpoint (a config is derived from its shapes)", path);
    }
    checkpoint_close(ck);
    if (cfg && where) *where = path;
    else free(path);
    return cfg;
}

int flux2_load(const char *dir, backend *be, comm *c, dtype_t precision, flux2_model **out, load_stats *st) {
    return flux2_load_ex(dir, be, c, precision, NULL, out, st);
}

int flux2_load_ex(const char *dir, backend *be, comm *c, dtype_t precision, const flux2_load_extras *x,
                  flux2_model **out, load_stats *st) {
    static const flux2_load_extras none = {0};
    if (!x) x = &none;
    const lora_spec *loras = x->loras;
    int n_loras = x->n_loras;
    lora_set **set_out = x->lora_set_out;
    *out = NULL;
    if (set_out) *set_out = NULL;
    lora_set *ls = NULL;
    char *cfg_path = NULL;
    int rc = -1;
    flux2_config cfg;
    checkpoint *ck = NULL;
    flux2_model *m = NULL;
    json_t *cfg_json = flux2_transformer_config(dir, &cfg_path);
    if (!cfg_json) goto done;
    if (flux2_config_parse(cfg_json, cfg_path, &cfg) || model_new(&cfg, be, c, precision, &m)) goto done;
    if (checkpoint_open(dir, &ck)) goto done;
    int bfl = checkpoint_is_bfl(ck);
    if (ck->n != expected_tensor_count(&cfg, bfl)) {
        /* name the first tensor the config expects and the file lacks */
        binder dry = {.m = m, .dir = dir, .bfl = bfl, .dry = 1, .ck = ck};
        char *why = bind_all(&dry) ? xstrdup(tp_error_msg()) : xstrdup("no expected tensor is missing");
        tp_error("%s: the checkpoint has %d tensors but its config (%d double, %d single blocks%s%s) implies %d; "
                 "the config does not match the weights (%s)", dir, ck->n, cfg.num_layers, cfg.num_single_layers,
                 cfg.guidance_embeds ? ", guidance embedder" : "", bfl ? ", BFL names" : "",
                 expected_tensor_count(&cfg, bfl), why);
        free(why);
        goto done;
    }
    plan p;
    if (bfl ? plan_flux2_bfl(cfg_json, &p) : plan_flux2(cfg_json, &p)) goto done;
    load_opts o = {.tp = m->tp, .rank = m->rank, .be = be, .dtype = precision, .quantize_fp8 = x->quantize_fp8};
    if (n_loras) {
        /* every adapter is checked against the checkpoint before a weight byte is read */
        if (lora_set_open(loras, n_loras, ck, m->rank == 0, &ls)) goto done;
        o.transform = lora_merge_shard;
        o.transform_ctx = ls;
    }
    if (weights_load(ck, &p, &o, &m->w, st)) goto done;
    binder b = {.m = m, .dir = dir, .bfl = bfl};
    if (bind_all(&b)) goto done;
    rc = 0;
done:
    if (rc) {
        tp_error_context("loading the FLUX.2 transformer");
        flux2_free(m);
    } else {
        *out = m;
    }
    if (rc || !set_out) lora_set_free(ls);
    else *set_out = ls;
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
comm *flux2_sp_comm(const flux2_model *m) { return m->sp_comm; }
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
