/* FLUX.3 transformer: config.json parsing with bounds, the plan's symbols,
 * and loading this rank's shard: every tensor name and global shape is
 * checked against the config before a weight byte is read, then the
 * shard is read through the plan engine and bound by name. */
#include "flux3_impl.h"
#include "core/models/config_json.h"
#include "kernels/err.h"
#include "core/formats/checkpoint.h"
#include "core/formats/lora.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- config ---- */

/* Far above every FLUX.3 model (D 3072, joint dim 20480, 5 + 28 blocks)
 * and low enough that every size formed from them fits an int64. */
#define FLUX3_MAX_FIELD (1 << 20)
#define FLUX3_MAX_LAYERS 4096
#define FLUX3_MAX_D (1 << 20)
#define FLUX3_MAX_MLP_RATIO 64.0

int flux3_config_parse(const json_t *cfg, const char *where, flux3_config *c) {
    memset(c, 0, sizeof *c);
    if (!json_is_object(cfg)) return tp_error("%s: config is not a JSON object", where);
    json_t *cls = json_object_get(cfg, "_class_name");
    if (cls && (!json_is_string(cls) || strcmp(json_string_value(cls), FLUX3_CLASS_NAME)))
        return tp_error("%s: _class_name is %s, not %s: this is not a FLUX.3 transformer config", where,
                        json_is_string(cls) ? json_string_value(cls) : "not a string", FLUX3_CLASS_NAME);
    double eps = 1e-6;
    /* defaults: the diffusers class's */
    if (cfg_int(cfg, "in_channels", 128, FLUX3_MAX_FIELD, where, &c->in_channels) ||
        cfg_int(cfg, "cond_in_channels", 128, FLUX3_MAX_FIELD, where, &c->cond_in_channels) ||
        cfg_int(cfg, "num_layers", 5, FLUX3_MAX_LAYERS, where, &c->num_layers) ||
        cfg_int(cfg, "num_single_layers", 28, FLUX3_MAX_LAYERS, where, &c->num_single_layers) ||
        cfg_int(cfg, "attention_head_dim", 128, FLUX3_MAX_FIELD, where, &c->head_dim) ||
        cfg_int(cfg, "num_attention_heads", 24, FLUX3_MAX_FIELD, where, &c->heads) ||
        cfg_int(cfg, "joint_attention_dim", 20480, FLUX3_MAX_FIELD, where, &c->joint_dim) ||
        cfg_int(cfg, "timestep_channels", 256, FLUX3_MAX_FIELD, where, &c->time_channels) ||
        cfg_num(cfg, "mlp_ratio", 3.0, where, &c->mlp_ratio) || cfg_num(cfg, "rope_theta", 10000, where, &c->rope_theta) ||
        cfg_num(cfg, "eps", 1e-6, where, &eps) ||
        cfg_rope_axes(cfg, where, FLUX3_MAX_AXES, FLUX3_MAX_FIELD, &c->n_axes, c->axes_dims))
        return -1;
    c->eps = (float)eps;
    json_t *fm = json_object_get(cfg, "flow_map");
    if (fm && !json_is_null(fm) && !json_is_boolean(fm)) return tp_error("%s: 'flow_map' must be true or false", where);
    c->flow_map = fm && json_is_true(fm);

    struct { const char *name; int v; } pos[] = {
        {"in_channels", c->in_channels}, {"cond_in_channels", c->cond_in_channels},
        {"attention_head_dim", c->head_dim}, {"num_attention_heads", c->heads},
        {"joint_attention_dim", c->joint_dim}, {"timestep_channels", c->time_channels}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0) return tp_error("%s: '%s' must be positive (got %d)", where, pos[i].name, pos[i].v);
    if (c->time_channels % 2) return tp_error("%s: timestep_channels must be even", where);
    int sum = 0;
    for (int i = 0; i < c->n_axes; i++) sum += c->axes_dims[i];
    if (sum != c->head_dim)
        return tp_error("%s: axes_dims_rope sum to %d but attention_head_dim is %d; they must be equal", where, sum,
                        c->head_dim);
    if (!(c->mlp_ratio > 0 && c->mlp_ratio <= FLUX3_MAX_MLP_RATIO))
        return tp_error("%s: mlp_ratio %g is out of range (above 0, at most %g)", where, c->mlp_ratio,
                        FLUX3_MAX_MLP_RATIO);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta) || !(c->eps > 0) || !isfinite(c->eps))
        return tp_error("%s: rope_theta and eps must be positive finite numbers", where);
    if ((int64_t)c->heads * c->head_dim > FLUX3_MAX_D)
        return tp_error("%s: num_attention_heads %d x attention_head_dim %d is more than %d; the config is corrupt",
                        where, c->heads, c->head_dim, FLUX3_MAX_D);
    c->D = (int64_t)c->heads * c->head_dim;
    c->M = (int64_t)((double)c->D * c->mlp_ratio);   /* Python int() truncation */
    if (c->M < 1) return tp_error("%s: mlp_ratio %g leaves no MLP width", where, c->mlp_ratio);
    return 0;
}

/* ---- BFL single files (the inverse of diffusers 0.42.1's
 * convert_flux3_transformer_checkpoint_to_diffusers) ---- */

/* "" when the checkpoint is a FLUX.3 BFL one, NULL when it is not. The key
 * is the one diffusers detects FLUX.3 by (CHECKPOINT_KEY_NAMES["flux3"]); a
 * FLUX.2 BFL file has single_stream_modulation.lin.weight instead. Names
 * behind model.diffusion_model. are read without it (checkpoint_open). */
const char *flux3_bfl_prefix(const checkpoint *ck) {
    return ck && checkpoint_find(ck, "early_stream_modulations.image.lin.weight", NULL) ? "" : NULL;
}

/* The name map, [diffusers, BFL] pairs: exact names, then one prefix and
 * one suffix rewrite. */
static const char *const k_exact[][2] = {
    {"timestep_embedder.linear_1.weight", "time_in.in_layer.weight"},
    {"timestep_embedder.linear_2.weight", "time_in.out_layer.weight"},
    {"target_timestep_embedder.linear_1.weight", "ref_time_in.in_layer.weight"},
    {"target_timestep_embedder.linear_2.weight", "ref_time_in.out_layer.weight"},
    {"proj_out.weight", "final_layer.image.linear.weight"},
    {"norm_out.linear.weight", "final_layer.image.adaLN_modulation.1.weight"},   /* halves swapped */
};
static const char *const k_prefix[][2] = {{"x_embedders.", "emb_in."}, {"context_embedder.", "txt_in."},
                                          {"mode_blocks.", "content_mode_blocks."},
                                          {"single_transformer_blocks.", "single_blocks."}};
static const char *const k_suffix[][2] = {
    {"attn.to_q.weight", "q_proj.weight"}, {"attn.to_k.weight", "k_proj.weight"},
    {"attn.to_v.weight", "v_proj.weight"}, {"attn.to_out.0.weight", "attn_out.weight"},
    {"attn.norm_q.weight", "norm.query_norm.scale"}, {"attn.norm_k.weight", "norm.key_norm.scale"},
    {"ff.linear_in.weight", "mlp_in.weight"}, {"ff.linear_out.weight", "mlp_out.weight"},
    {".linear.weight", ".lin.weight"}};

/* `in` mapped from side `from` (0 diffusers, 1 BFL) to the other, into out[n] */
static void map_name(const char *in, int from, char *out, size_t n) {
    int to = !from;
    for (size_t i = 0; i < sizeof k_exact / sizeof k_exact[0]; i++)
        if (!strcmp(in, k_exact[i][from])) { snprintf(out, n, "%s", k_exact[i][to]); return; }
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", in);
    for (size_t i = 0; i < sizeof k_prefix / sizeof k_prefix[0]; i++) {
        size_t l = strlen(k_prefix[i][from]);
        if (!strncmp(in, k_prefix[i][from], l)) { snprintf(tmp, sizeof tmp, "%s%s", k_prefix[i][to], in + l); break; }
    }
    size_t tl = strlen(tmp);
    for (size_t i = 0; i < sizeof k_suffix / sizeof k_suffix[0]; i++) {
        size_t l = strlen(k_suffix[i][from]);
        if (tl >= l && !strcmp(tmp + tl - l, k_suffix[i][from])) {
            snprintf(tmp + tl - l, sizeof tmp - (tl - l), "%s", k_suffix[i][to]);
            break;
        }
    }
    snprintf(out, n, "%s", tmp);
}

/* diffusers name -> BFL name (behind pfx), into out[n] (flux3.h) */
void flux3_bfl_name(const char *d, const char *pfx, char *out, size_t n) {
    char tmp[256];
    map_name(d, 0, tmp, sizeof tmp);
    snprintf(out, n, "%s%s", pfx, tmp);
}

/* checkpoint_rename callback: a BFL name (behind the prefix ctx) -> its
 * diffusers name (the REPA heads keep theirs, without the prefix) */
static int bfl_to_diffusers(const char *name, char *out, size_t cap, void *ctx) {
    const char *pfx = ctx;
    size_t l = strlen(pfx);
    if (strncmp(name, pfx, l)) return 0;
    if (!strncmp(name + l, "repa_projectors.", 16)) return snprintf(out, cap, "%s", name + l), 1;
    map_name(name + l, 1, out, cap);
    return 1;
}

/* A FLUX.3 checkpoint's naming: its BFL prefix, or NULL with *diffusers
 * set for diffusers names (a GGUF or safetensors file without config.json).
 * 0 when neither. */
int flux3_checkpoint_names(const checkpoint *ck, const char **bfl) {
    *bfl = flux3_bfl_prefix(ck);
    if (*bfl) return 1;
    return ck && checkpoint_find(ck, "early_stream_modulations.image.linear.weight", NULL) ? 1 : 0;
}

/* the [rows, cols] of the tensor of diffusers name `name`, looked up under
 * the checkpoint's naming (pfx: BFL prefix, NULL: diffusers names) */
static int shape_dim(const checkpoint *ck, const char *pfx, const char *name, int64_t *rows, int64_t *cols) {
    char full[256];
    if (pfx) flux3_bfl_name(name, pfx, full, sizeof full);
    else snprintf(full, sizeof full, "%s", name);
    const st_tensor_info *t = checkpoint_find(ck, full, NULL);
    if (!t)
        return tp_error("%s: FLUX.3 %s checkpoint has no tensor %s (needed to derive the config; the file is "
                        "incomplete, or put the model's diffusers config.json next to it)", ck->dir,
                        pfx ? "BFL" : "diffusers-named", full);
    *rows = t->ndim >= 1 ? t->shape[0] : 1;
    *cols = 1;
    for (int d = 1; d < t->ndim; d++) *cols *= t->shape[d];
    return 0;
}

static int shape_count(const checkpoint *ck, const char *pfx, const char *fmt) {
    char name[256], full[256];
    int n = 0;
    for (;; n++) {
        snprintf(name, sizeof name, fmt, n);
        if (pfx) flux3_bfl_name(name, pfx, full, sizeof full);
        else snprintf(full, sizeof full, "%s", name);
        if (!checkpoint_find(ck, full, NULL)) return n;
    }
}

json_t *flux3_config_from_shapes(const checkpoint *ck) {
    const char *pfx;
    if (!flux3_checkpoint_names(ck, &pfx))
        return tp_error("%s: not a FLUX.3 checkpoint (no early_stream_modulations.image.lin.weight (BFL) or "
                        "early_stream_modulations.image.linear.weight (diffusers))", ck->dir), NULL;
    int64_t D, cin, Dc, ccin, Dt, J, Dte, Ct, hd, one, M2, Dm, Dmod, D3, out_c, Dp;
    if (shape_dim(ck, pfx, "x_embedders.image.weight", &D, &cin) ||
        shape_dim(ck, pfx, "x_embedders.image_cond.weight", &Dc, &ccin) ||
        shape_dim(ck, pfx, "context_embedder.weight", &Dt, &J) ||
        shape_dim(ck, pfx, "timestep_embedder.linear_1.weight", &Dte, &Ct) ||
        shape_dim(ck, pfx, "early_stream_modulations.image.linear.weight", &D3, &Dmod) ||
        shape_dim(ck, pfx, "proj_out.weight", &out_c, &Dp))
        return NULL;
    int layers = shape_count(ck, pfx, "mode_blocks.image.%d.attn.to_q.weight");
    int singles = shape_count(ck, pfx, "single_transformer_blocks.%d.attn.to_q.weight");
    if (layers + singles == 0)
        return tp_error("%s: FLUX.3 checkpoint has neither mode block 0 (content_mode_blocks.image.0 / "
                        "mode_blocks.image.0) nor single block 0", ck->dir), NULL;
    const char *blk = singles ? "single_transformer_blocks.0." : "mode_blocks.image.0.";
    char name[128];
    snprintf(name, sizeof name, "%sattn.norm_q.weight", blk);
    if (shape_dim(ck, pfx, name, &hd, &one)) return NULL;
    snprintf(name, sizeof name, "%sff.linear_in.weight", blk);
    if (shape_dim(ck, pfx, name, &M2, &Dm)) return NULL;
    if (D <= 0 || D > FLUX3_MAX_D || Dc != D || Dt != D || Dte != D || Dmod != D || D3 != 3 * D || Dp != D ||
        out_c != cin || Dm != D || one != 1 || hd <= 0 || D % hd || hd % 8 || M2 <= 0 || M2 % 2)
        return tp_error("%s: FLUX.3 checkpoint shapes are inconsistent (emb_in.image [%lld, %lld], "
                        "emb_in.image_cond [%lld, %lld], txt_in [%lld, %lld], time_in [%lld, %lld], final_layer "
                        "[%lld, %lld], head_dim %lld, mlp_in [%lld, %lld]); supply a config.json", ck->dir,
                        (long long)D, (long long)cin, (long long)Dc, (long long)ccin, (long long)Dt, (long long)J,
                        (long long)Dte, (long long)Ct, (long long)out_c, (long long)Dp, (long long)hd,
                        (long long)M2, (long long)Dm), NULL;
    int64_t M = M2 / 2, ax = hd / 4;
    double ratio = (double)M / (double)D;
    if ((int64_t)((double)D * ratio) != M)
        return tp_error("%s: MLP width %lld is not int(D * ratio) for any ratio; supply a config.json", ck->dir,
                        (long long)M), NULL;
    /* Not in the shapes: four equal RoPE axes ([32,32,32,32] at head_dim
     * 128), theta 10000 and eps 1e-6, the diffusers class defaults. */
    if (pfx) flux3_bfl_name("target_timestep_embedder.linear_1.weight", pfx, name, sizeof name);
    else snprintf(name, sizeof name, "target_timestep_embedder.linear_1.weight");
    return json_pack("{s:s, s:I, s:I, s:i, s:i, s:I, s:I, s:I, s:I, s:f, s:[I,I,I,I], s:i, s:f, s:b}",
                     "_class_name", FLUX3_CLASS_NAME, "in_channels", (json_int_t)cin, "cond_in_channels",
                     (json_int_t)ccin, "num_layers", layers, "num_single_layers", singles, "attention_head_dim",
                     (json_int_t)hd, "num_attention_heads", (json_int_t)(D / hd), "joint_attention_dim", (json_int_t)J,
                     "timestep_channels", (json_int_t)Ct, "mlp_ratio", ratio, "axes_dims_rope", (json_int_t)ax,
                     (json_int_t)ax, (json_int_t)ax, (json_int_t)ax, "rope_theta", 10000, "eps", 1e-6, "flow_map",
                     checkpoint_find(ck, name, NULL) != NULL);
}


json_t *flux3_config_from_bfl(const checkpoint *ck) {
    const char *pfx;
    if (!flux3_checkpoint_names(ck, &pfx) || !pfx)
        return tp_error("%s: not a FLUX.3 BFL checkpoint (no early_stream_modulations.image.lin.weight)", ck->dir),
               NULL;
    return flux3_config_from_shapes(ck);
}

json_t *flux3_bfl_dir_config(const char *dir, int *is_flux3) {
    *is_flux3 = 0;
    struct stat s;
    checkpoint *ck = NULL;
    json_t *cfg = NULL;
    const char *pfx;
    if (stat(dir, &s) == 0 && S_ISDIR(s.st_mode) && checkpoint_open(dir, &ck) == 0 && flux3_checkpoint_names(ck, &pfx)) {
        *is_flux3 = 1;
        cfg = flux3_config_from_shapes(ck);
    }
    checkpoint_close(ck);
    return cfg;
}

int flux3_is_transformer_dir(const char *dir) {
    char *path = xasprintf("%s/config.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    free(path);
    json_t *cls = json_object_get(j, "_class_name");
    int yes = json_is_string(cls) && !strcmp(json_string_value(cls), FLUX3_CLASS_NAME);
    json_decref(j);
    if (!yes && !j) {   /* no config.json: a FLUX.3 BFL single file? */
        struct stat s;
        checkpoint *ck = NULL;
        const char *pfx;
        if (stat(dir, &s) == 0 && S_ISDIR(s.st_mode) && checkpoint_open(dir, &ck) == 0) yes = flux3_checkpoint_names(ck, &pfx);
        checkpoint_close(ck);
    }
    return yes;
}

static int flux3_plan_table(const flux3_config *c, const plan_table *tb, plan *out) {
    *out = (plan){.model = tb->model, .rules = tb->rules, .n_rules = tb->n_rules};
    plan_add_symbol(out, "D", c->D);
    plan_add_symbol(out, "M", c->M);
    plan_add_divisor(out, "num_attention_heads", c->heads);
    return 0;
}

int flux3_plan(const flux3_config *c, plan *out) { return flux3_plan_table(c, &plan_table_flux3, out); }
int flux3_plan_bfl(const flux3_config *c, plan *out) { return flux3_plan_table(c, &plan_table_flux3_bfl, out); }

/* ---- binding tensors by name, with shape checks ---- */

typedef struct binder {
    flux3_model *m;
    const char *dir;
    const checkpoint *ck;      /* dry run: names and global shapes only */
    char **names;              /* dry run: the names bound, to find the unexpected ones */
    int n_names;
    int random;                /* flux3_init_random: create and fill each local tensor */
    const char *bfl;           /* BFL names behind this prefix; NULL: diffusers names */
    int derived;               /* the config was derived from the BFL shapes (no config.json) */
    uint64_t seed;
} binder;

static const tensor *random_tensor(binder *b, const char *name, int64_t grows, int64_t gcols, int64_t lrows,
                                   int64_t lcols);

static const tensor k_dry_run;   /* what a dry-run bind returns */

/* the QK-RMSNorm weights, which diffusers keeps in fp32 in a bf16 model
 * (_keep_in_fp32_modules); a load filter (want), hence the ctx */
static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), l = strlen(suf);
    return n > l && !strcmp(s + n - l, suf);
}
static int is_qk_norm(const char *name, void *ctx) {
    (void)ctx;
    return ends_with(name, ".attn.norm_q.weight") || ends_with(name, ".attn.norm_k.weight") ||
           ends_with(name, ".norm.query_norm.scale") || ends_with(name, ".norm.key_norm.scale");   /* BFL */
}
/* BFL files may carry training-only REPA projection heads, which diffusers'
 * converter drops: never loaded */
static int is_repa(const char *name) {
    return !strncmp(name, "repa_projectors.", 16);
}
static int is_not_qk_norm(const char *name, void *ctx) { return !is_qk_norm(name, ctx) && !is_repa(name); }
static int is_model_tensor(const char *name, void *ctx) { (void)ctx; return !is_repa(name); }

static const tensor *bind(binder *b, int64_t grows, int64_t gcols, int64_t lrows, int64_t lcols, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static const tensor *bind(binder *b, int64_t grows, int64_t gcols, int64_t lrows, int64_t lcols, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (b->bfl) {
        char d[256];
        snprintf(d, sizeof d, "%s", name);
        flux3_bfl_name(d, b->bfl, name, sizeof name);
    }
    if (b->random) return random_tensor(b, name, grows, gcols, lrows, lcols);
    const tensor *t = NULL;
    const st_tensor_info *info;
    if (b->ck) {
        if (!(info = checkpoint_find(b->ck, name, NULL))) {
            const char *why = strstr(name, "target_timestep")
                                  ? " (config.json says flow_map: true, which needs the target-timestep embedder)"
                                  : "";
            /* a single file (a BFL file, a GGUF) is named too */
            const char *file = b->ck->n_files == 1 ? b->ck->files[0]->path : "";
            if (b->derived)
                return tp_error("%s: tensor %s missing from the FLUX.3 %s checkpoint %s (its config derived from the "
                                "shapes has %d mode and %d single blocks); the file is incomplete", b->dir, name,
                                b->bfl ? "BFL" : "diffusers-named", file,
                                b->m->cfg.num_layers, b->m->cfg.num_single_layers), NULL;
            return tp_error("%s: tensor %s missing from the checkpoint %s%s; the config does not belong to these "
                            "weights", b->dir, name, file, why), NULL;
        }
        b->names = xrealloc(b->names, (size_t)(b->n_names + 1) * sizeof *b->names);
        b->names[b->n_names++] = xstrdup(name);
    } else {
        const weights *w = b->m->w_norm && is_qk_norm(name, NULL) ? b->m->w_norm : b->m->w;
        if (!(t = weights_req(w, "%s", name))) return NULL;
        info = weights_info(w, name);
    }
    int64_t rows = info->ndim >= 1 ? info->shape[0] : 1, cols = 1;
    for (int d = 1; d < info->ndim; d++) cols *= info->shape[d];
    if (info->ndim == 1) cols = rows, rows = 1;
    if (rows != grows || cols != gcols)
        return tp_error("%s: tensor %s has shape [%lld, %lld] but config.json implies [%lld, %lld]; "
                        "the config does not belong to this checkpoint", b->dir, name, (long long)rows,
                        (long long)cols, (long long)grows, (long long)gcols), NULL;
    if (b->ck) return &k_dry_run;
    if (t->rows != lrows || t->cols != lcols)
        return tp_error("%s: shard of %s on rank %d is [%lld, %lld], expected [%lld, %lld] (plan mismatch)", b->dir,
                        name, b->m->rank, (long long)t->rows, (long long)t->cols, (long long)lrows, (long long)lcols),
               NULL;
    return t;
}

#define BIND(dst, gr, gc, lr, lc, ...) do { if (!((dst) = bind(b, gr, gc, lr, lc, __VA_ARGS__))) return -1; } while (0)

static int bind_block(binder *b, flux3_block_w *w, const char *prefix, int i) {
    flux3_model *m = b->m;
    int64_t D = m->cfg.D, M = m->cfg.M, Dl = m->Dl, Ml = m->Ml, hd = m->cfg.head_dim;
    BIND(w->to_q, D, D, Dl, D, "%s.%d.attn.to_q.weight", prefix, i);
    BIND(w->to_k, D, D, Dl, D, "%s.%d.attn.to_k.weight", prefix, i);
    BIND(w->to_v, D, D, Dl, D, "%s.%d.attn.to_v.weight", prefix, i);
    BIND(w->norm_q, 1, hd, 1, hd, "%s.%d.attn.norm_q.weight", prefix, i);
    BIND(w->norm_k, 1, hd, 1, hd, "%s.%d.attn.norm_k.weight", prefix, i);
    BIND(w->to_out, D, D, D, Dl, "%s.%d.attn.to_out.0.weight", prefix, i);
    BIND(w->ff_in, 2 * M, D, 2 * Ml, D, "%s.%d.ff.linear_in.weight", prefix, i);
    BIND(w->ff_out, D, M, D, Ml, "%s.%d.ff.linear_out.weight", prefix, i);
    return 0;
}

/* BFL's final layer emits (shift, scale), diffusers' norm_out (scale,
 * shift): swap the two [D, D] row halves once, in place (norm_out is
 * replicated and never quantised), through a temporary of one half. The
 * weights object owns the memory and nothing else reads it. */
static int swap_halves(flux3_model *m, const tensor *w, int64_t D) {
    if (w->dtype == DT_GGML)   /* quantised (a GGUF), whole rows: swap the rows' stored bytes, on any backend */
        return op_swap_ggml_row_halves((tensor *)w, D)
                   ? tp_error_context("swapping the halves of final_layer.image.adaLN_modulation.1.weight") : 0;
    tensor *tmp = tensor_new(m->be, w->dtype, D, w->cols);
    if (!tmp) return tp_error_context("swapping the halves of final_layer.image.adaLN_modulation.1.weight");
    tensor *mw = (tensor *)w;
    tensor top = tensor_rows(mw, 0, D), bottom = tensor_rows(mw, D, D);
    op_copy(m->be, tmp, &top);
    op_copy(m->be, &top, &bottom);
    op_copy(m->be, &bottom, tmp);
    tensor_free(tmp);
    return be_sync(m->be);
}

static const char *const k_mode_names[FLUX3_MODES] = {"txt", "image", "image_cond"};
static const char *const k_mode_blocks[FLUX3_MODES] = {"txt_mode_blocks", "mode_blocks.image",
                                                       "mode_blocks.image_cond"};

static int bind_all(binder *b) {
    flux3_model *m = b->m;
    const flux3_config *c = &m->cfg;
    int64_t D = c->D, Ct = c->time_channels;
    BIND(m->t_lin1, D, Ct, D, Ct, "timestep_embedder.linear_1.weight");
    BIND(m->t_lin2, D, D, D, D, "timestep_embedder.linear_2.weight");
    if (c->flow_map) {
        BIND(m->tt_lin1, D, Ct, D, Ct, "target_timestep_embedder.linear_1.weight");
        BIND(m->tt_lin2, D, D, D, D, "target_timestep_embedder.linear_2.weight");
    }
    for (int k = 0; k < FLUX3_MODES; k++) {
        BIND(m->early_mod[k], 3 * D, D, 3 * D, D, "early_stream_modulations.%s.linear.weight", k_mode_names[k]);
        BIND(m->single_mod[k], 3 * D, D, 3 * D, D, "single_stream_modulations.%s.linear.weight", k_mode_names[k]);
    }
    BIND(m->x_emb[FLUX3_TXT], D, c->joint_dim, D, c->joint_dim, "context_embedder.weight");
    BIND(m->x_emb[FLUX3_IMG], D, c->in_channels, D, c->in_channels, "x_embedders.image.weight");
    BIND(m->x_emb[FLUX3_COND], D, c->cond_in_channels, D, c->cond_in_channels, "x_embedders.image_cond.weight");
    BIND(m->norm_out, 2 * D, D, 2 * D, D, "norm_out.linear.weight");
    if (b->bfl && !b->ck && swap_halves(m, m->norm_out, D)) return -1;
    BIND(m->proj_out, c->in_channels, D, c->in_channels, D, "proj_out.weight");
    for (int k = 0; k < FLUX3_MODES; k++)
        for (int i = 0; i < c->num_layers; i++)
            if (bind_block(b, &m->mode[k][i], k_mode_blocks[k], i)) return -1;
    for (int j = 0; j < c->num_single_layers; j++)
        if (bind_block(b, &m->single[j], "single_transformer_blocks", j)) return -1;
    return 0;
}

/* Every name and global shape the config implies is in the checkpoint, and
 * the checkpoint holds nothing else (e.g. a target-timestep embedder under a
 * config without flow_map, or more blocks than num_layers). */
static int check_names(flux3_model *m, const char *dir, const checkpoint *ck, const char *bfl, int derived,
                       int renamed) {
    binder b = {.m = m, .dir = dir, .ck = ck, .bfl = bfl, .derived = derived};
    int rc = bind_all(&b);
    for (int k = 0; !rc && k < ck->n; k++) {
        const char *name = ck->infos[k]->name;
        if ((bfl || renamed) && is_repa(name)) continue;
        int known = 0;
        for (int i = 0; i < b.n_names && !known; i++) known = !strcmp(b.names[i], name);
        if (!known)
            rc = tp_error("%s: tensor %s is not part of the model config.json describes (%d mode blocks, %d single "
                          "blocks, flow_map %s); the config does not belong to these weights", dir, name,
                          m->cfg.num_layers, m->cfg.num_single_layers, m->cfg.flow_map ? "true" : "false");
    }
    for (int i = 0; i < b.n_names; i++) free(b.names[i]);
    free(b.names);
    return rc;
}

/* ---- random weights (benchmarks) ---- */

/* Uniform in [offset - scale, offset + scale) from splitmix64, per tensor
 * seeded by (seed, rank, name); linears get scale sqrt(3 / in_features)
 * (variance 1/in), the QK-norm weights 1 +- 0.1. */
static const tensor *random_tensor(binder *b, const char *name, int64_t grows, int64_t gcols, int64_t lrows,
                                   int64_t lcols) {
    flux3_model *m = b->m;
    int is_norm = grows == 1;   /* the QK norms, f32 in both precisions as flux3_load keeps them */
    tensor *t = tensor_new(m->be, is_norm ? DT_F32 : m->act, lrows, lcols);
    if (!t) return NULL;
    m->owned = xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned++] = t;
    float scale = is_norm ? 0.1f : sqrtf(3.0f / (float)gcols), offset = is_norm ? 1.0f : 0.0f;
    uint64_t s = b->seed * 0x9E3779B97F4A7C15ull + (uint64_t)m->rank * 0x632BE59BD9B4E019ull;
    for (const char *p = name; *p; p++) s = (s ^ (uint8_t)*p) * 0x100000001B3ull;
    int64_t chunk = (1 << 20) / lcols > 0 ? (1 << 20) / lcols : 1;
    float *buf = xmalloc((size_t)(chunk * lcols) * sizeof *buf);
    for (int64_t r0 = 0; r0 < lrows; r0 += chunk) {
        int64_t n = lrows - r0 < chunk ? lrows - r0 : chunk;
        for (int64_t i = 0; i < n * lcols; i++) {
            uint64_t z = (s += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            z ^= z >> 31;
            buf[i] = offset + scale * (2.0f * (float)(z >> 40) * (1.0f / 16777216.0f) - 1.0f);
        }
        tensor v = tensor_rows(t, r0, n);
        if (tensor_upload_f32(&v, buf)) { free(buf); return NULL; }
    }
    free(buf);
    return t;
}

/* ---- loading ---- */

static int model_new(const flux3_config *cfg, backend *be, comm *c, dtype_t precision, flux3_model **out) {
    *out = NULL;
    if (precision != DT_F32 && precision != DT_BF16)
        return tp_error("flux3: precision must be f32 or bf16 (got %s)", dtype_name(precision));
    int tp = c ? c->size : 1;
    if (cfg->heads % tp)
        return tp_error("flux3: tensor-parallel degree %d does not divide num_attention_heads %d; "
                        "use a tp that divides it", tp, cfg->heads);
    if (cfg->M % tp)
        return tp_error("flux3: tensor-parallel degree %d does not divide the MLP width %lld", tp, (long long)cfg->M);
    flux3_model *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->be = be, m->comm = c, m->act = precision, m->tp = tp, m->rank = c ? c->rank : 0;
    m->heads_local = cfg->heads / tp;
    m->Dl = cfg->D / tp, m->Ml = cfg->M / tp;
    for (int k = 0; k < FLUX3_MODES; k++) m->mode[k] = xcalloc((size_t)cfg->num_layers + 1, sizeof *m->mode[k]);
    m->single = xcalloc((size_t)cfg->num_single_layers + 1, sizeof *m->single);
    *out = m;
    return 0;
}

/* LoRA on a BFL file (renamed to diffusers names at load): norm_out's
 * halves are put in diffusers' order before the adapter merges into them */
typedef struct swap_merge {
    flux3_model *m;
    lora_set *ls;
} swap_merge;
static int swap_then_merge(void *ctx, const st_tensor_info *ti, const shard_info *si, int tp, int rank, tensor *t) {
    swap_merge *sm = ctx;
    if (!strcmp(ti->name, "norm_out.linear.weight") && swap_halves(sm->m, t, t->rows / 2)) return -1;
    return lora_merge_shard(sm->ls, ti, si, tp, rank, t);
}

int flux3_load(const char *dir, backend *be, comm *c, dtype_t precision, flux3_model **out, load_stats *st) {
    return flux3_load_ex(dir, be, c, precision, NULL, out, st);
}

int flux3_load_ex(const char *dir, backend *be, comm *c, dtype_t precision, const flux3_load_extras *x,
                  flux3_model **out, load_stats *st) {
    static const flux3_load_extras none = {0};
    if (!x) x = &none;
    *out = NULL;
    if (x->lora_set_out) *x->lora_set_out = NULL;
    lora_set *ls = NULL;
    swap_merge sm = {0};
    char *path = xasprintf("%s/config.json", dir);
    json_error_t jerr;
    json_t *cfg_json = NULL;
    checkpoint *ck = NULL;
    flux3_model *m = NULL;
    flux3_config cfg;
    int rc = -1;
    const char *bfl = NULL;
    int derived = 0;
    if (access(path, F_OK) == 0) {
        if (!(cfg_json = json_load_file(path, 0, &jerr))) {
            tp_error("%s: cannot read the transformer config (%s, line %d)", path, jerr.text, jerr.line);
            goto done;
        }
        if (checkpoint_open(dir, &ck)) goto done;
        bfl = flux3_bfl_prefix(ck);
    } else if (access(dir, F_OK) == 0 && checkpoint_open(dir, &ck) == 0 && flux3_checkpoint_names(ck, &bfl)) {
        free(path);   /* a BFL single file or a GGUF/safetensors file of either naming: the config from its shapes */
        path = xasprintf("%s (config derived from the FLUX.3 %s checkpoint's tensor shapes)", dir,
                         bfl ? "BFL" : "diffusers-named");
        derived = 1;
        if (!(cfg_json = flux3_config_from_shapes(ck))) goto done;
    } else {
        tp_error("%s is missing: pass the pipeline's transformer/ folder (diffusers layout, with config.json) "
                 "or a folder holding a FLUX.3 BFL single-file checkpoint or a FLUX.3 GGUF (need no config.json)",
                 path);
        goto done;
    }
    /* LoRA on a BFL file: the adapter maps onto diffusers names, so the file is
     * renamed (checkpoint_rename: the same tensors and bytes) and norm_out's
     * halves swapped before the merge (swap_then_merge) */
    int renamed = 0;
    if (bfl && x->n_loras) {
        if (ck->fp8) {
            tp_error("%s: LoRA on an fp8 FLUX.3 checkpoint in BFL names is not supported (use a bf16/f32 or GGUF "
                     "file, or diffusers names)", dir);
            goto done;
        }
        if (checkpoint_rename(ck, bfl_to_diffusers, (void *)bfl)) goto done;
        bfl = NULL, renamed = 1;
    }
    if (flux3_config_parse(cfg_json, path, &cfg) || model_new(&cfg, be, c, precision, &m) ||
        check_names(m, dir, ck, bfl, derived, renamed))
        goto done;
    plan p;
    load_opts o = {.tp = m->tp, .rank = m->rank, .be = be, .dtype = precision, .quantize_fp8 = x->quantize_fp8,
                   .want = is_model_tensor};
    if (precision == DT_BF16) o.want = is_not_qk_norm;   /* the QK norms load in f32, below */
    if (x->n_loras) {   /* every adapter is checked against the checkpoint before a weight byte is read */
        if (lora_set_open(x->loras, x->n_loras, ck, m->rank == 0, &ls)) goto done;
        sm = (swap_merge){m, ls};
        o.transform = lora_merge_shard;
        o.transform_ctx = ls;
        if (renamed) o.transform = swap_then_merge, o.transform_ctx = &sm;
    }
    if ((bfl ? flux3_plan_bfl(&cfg, &p) : flux3_plan(&cfg, &p)) || weights_load(ck, &p, &o, &m->w, st)) goto done;
    if (precision == DT_BF16) {
        load_opts o32 = {.tp = m->tp, .rank = m->rank, .be = be, .dtype = DT_F32, .want = is_qk_norm};
        if (weights_load(ck, &p, &o32, &m->w_norm, NULL)) goto done;
    }
    binder b = {.m = m, .dir = dir, .bfl = bfl};
    if (bind_all(&b)) goto done;
    rc = 0;
done:
    if (rc) {
        tp_error_context("loading the FLUX.3 transformer");
        flux3_free(m);
    } else {
        *out = m;
    }
    if (rc || !x->lora_set_out) lora_set_free(ls);
    else *x->lora_set_out = ls;
    checkpoint_close(ck);
    json_decref(cfg_json);
    free(path);
    return rc;
}

int flux3_init_random(const flux3_config *cfg, backend *be, comm *c, dtype_t precision, uint64_t seed,
                      flux3_model **out) {
    flux3_model *m;
    if (model_new(cfg, be, c, precision, &m)) return -1;
    binder b = {.m = m, .dir = "(random weights)", .random = 1, .seed = seed};
    if (bind_all(&b)) {
        flux3_free(m);
        *out = NULL;
        return tp_error_context("flux3: random weights");
    }
    *out = m;
    return 0;
}

void flux3_free(flux3_model *m) {
    if (!m) return;
    flux3_release_ws(m);
    for (int i = 0; i < m->n_owned; i++) tensor_free(m->owned[i]);
    free(m->owned);
    weights_free(m->w);
    weights_free(m->w_norm);
    for (int k = 0; k < FLUX3_MODES; k++) free(m->mode[k]);
    free(m->single);
    free(m);
}

const flux3_config *flux3_get_config(const flux3_model *m) { return &m->cfg; }
dtype_t flux3_precision(const flux3_model *m) { return m->act; }
void flux3_set_exact_timestep(flux3_model *m, int on) { m->exact_time = on; }
void flux3_get_stats(const flux3_model *m, flux3_stats *st) { *st = m->stats; }
void flux3_reset_stats(flux3_model *m) { memset(&m->stats, 0, sizeof m->stats); }
