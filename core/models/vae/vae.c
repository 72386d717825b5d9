/* Building the VAE decoder: binding the diffusers tensor names (spec
 * docs/spec/flux2-text-vae.md §6.4) to the model, from a checkpoint or from random
 * values, and the latent BatchNorm statistics. */
#include "vae_internal.h"
#include "kernels/err.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 160

/* Up block i uses reversed(block_out)[i] channels; its first resnet takes
 * the previous block's channels; all but the last block upsample. */
static int bind_up_blocks(vae_model *v, vae_getter get, void *ctx) {
    const vae_config *c = &v->cfg;
    int prev = c->block_out[c->n_blocks - 1];
    char n[NAME_MAX_LEN];
    for (int i = 0; i < c->n_blocks; i++) {
        vae_up_block *u = &v->up[i];
        u->cin = prev;
        u->cout = c->block_out[c->n_blocks - 1 - i];
        u->n_res = c->layers_per_block + 1;
        for (int j = 0; j < u->n_res; j++) {
            snprintf(n, sizeof n, "decoder.up_blocks.%d.resnets.%d", i, j);
            if (vae_bind_resnet(&u->res[j], n, j == 0 ? u->cin : u->cout, u->cout, get, ctx)) return -1;
        }
        if (i < c->n_blocks - 1) {
            snprintf(n, sizeof n, "decoder.up_blocks.%d.upsamplers.0.conv.weight", i);
            if (!(u->up_w = get(ctx, n, u->cout, (int64_t)u->cout * 9, 3))) return -1;
            snprintf(n, sizeof n, "decoder.up_blocks.%d.upsamplers.0.conv.bias", i);
            if (!(u->up_b = vae_vec(get, ctx, n, u->cout))) return -1;
        }
        prev = u->cout;
    }
    return 0;
}

int vae_bind(vae_model *v, vae_getter get, void *ctx) {
    const vae_config *c = &v->cfg;
    int lc = c->latent_channels, top = c->block_out[c->n_blocks - 1];
    if (c->post_quant_conv &&
        (!(v->pq_w = get(ctx, "post_quant_conv.weight", lc, lc, 1)) ||
         !(v->pq_b = vae_vec(get, ctx, "post_quant_conv.bias", lc))))
        return -1;
    if (!(v->in_w = get(ctx, "decoder.conv_in.weight", top, (int64_t)lc * 9, 3)) ||
        !(v->in_b = vae_vec(get, ctx, "decoder.conv_in.bias", top)))
        return -1;
    if (vae_bind_resnet(&v->mid_res[0], "decoder.mid_block.resnets.0", top, top, get, ctx) ||
        vae_bind_resnet(&v->mid_res[1], "decoder.mid_block.resnets.1", top, top, get, ctx))
        return -1;
    if (c->mid_attention && vae_bind_attn(&v->mid_attn, "decoder.mid_block.attentions.0", top, get, ctx)) return -1;
    if (bind_up_blocks(v, get, ctx)) return -1;
    int last = c->block_out[0];
    if (!(v->out_norm_w = vae_vec(get, ctx, "decoder.conv_norm_out.weight", last)) ||
        !(v->out_norm_b = vae_vec(get, ctx, "decoder.conv_norm_out.bias", last)) ||
        !(v->out_w = get(ctx, "decoder.conv_out.weight", c->out_channels, (int64_t)last * 9, 3)) ||
        !(v->out_b = vae_vec(get, ctx, "decoder.conv_out.bias", c->out_channels)))
        return -1;
    return 0;
}

/* mean and std = sqrt(var + eps) on the host. The bf16 reference pipeline
 * holds the statistics in bf16, adds eps and takes the root in bf16. */
static int bn_prepare(vae_model *v, const tensor *mean_t, const tensor *var_t) {
    int n = vae_bn_channels(&v->cfg), bf = v->dt == DT_BF16;
    v->bn_mean = xmalloc((size_t)n * sizeof(float));
    v->bn_std = xmalloc((size_t)n * sizeof(float));
    float *var = xmalloc((size_t)n * sizeof(float));
    int rc = tensor_download_f32(mean_t, v->bn_mean) || tensor_download_f32(var_t, var) ? -1 : 0;
    for (int i = 0; !rc && i < n; i++) {
        if (!(var[i] >= 0) || !isfinite(v->bn_mean[i])) {
            rc = tp_error("VAE BatchNorm statistics are invalid at channel %d (mean %g, var %g); the checkpoint is damaged",
                          i, v->bn_mean[i], var[i]);
            break;
        }
        if (bf) {
            float s = bf16r(bf16r(var[i]) + bf16r(v->cfg.bn_eps));
            v->bn_std[i] = bf16r(sqrtf(s));
            v->bn_mean[i] = bf16r(v->bn_mean[i]);
        } else {
            v->bn_std[i] = sqrtf(var[i] + v->cfg.bn_eps);
        }
    }
    free(var);
    return rc;
}

static int bind_all(vae_model *v, vae_getter get, void *ctx) {
    int n = vae_bn_channels(&v->cfg);
    const tensor *mean = vae_vec(get, ctx, "bn.running_mean", n);
    const tensor *var = mean ? vae_vec(get, ctx, "bn.running_var", n) : NULL;
    if (!var) return -1;
    if ((v->parts & VAE_DECODER) && vae_bind(v, get, ctx)) return -1;
    if ((v->parts & VAE_ENCODER) && vae_bind_encoder(v, get, ctx)) return -1;
    return bn_prepare(v, mean, var);
}

static vae_model *model_new(const vae_config *cfg, backend *be, dtype_t dt, int parts) {
    vae_model *v = xcalloc(1, sizeof *v);
    v->parts = parts;
    v->cfg = *cfg;
    v->be = be;
    v->dt = dt;
    v->band_bytes = (size_t)64 << 20;
    return v;
}

/* ---- from a checkpoint ---- */

typedef struct load_ctx {
    const weights *w;
    const char *dir;
    const char *cfg_src;     /* where the config came from (for messages) */
    int bfl, n_up;           /* BFL/LDM names: map each diffusers name (vae_bfl_names.c) */
} load_ctx;

static const tensor *load_get(void *vctx, const char *name, int64_t rows, int64_t cols, int k) {
    load_ctx *lc = vctx;
    char bfl[NAME_MAX_LEN];
    const char *file_name = name;
    if (lc->bfl) {
        if (!vae_bfl_name(name, lc->n_up, bfl, sizeof bfl))
            return tp_error("%s: VAE tensor name %s is too long", lc->dir, name), NULL;
        file_name = bfl;
    }
    const tensor *t = weights_get(lc->w, file_name);
    if (!t) {
        if (lc->bfl)
            return tp_error("%s: tensor %s (diffusers %s) is missing; the file has BFL/LDM VAE names but lacks this "
                            "tensor of the VAE %s describes (an incomplete or different VAE)", lc->dir, file_name,
                            name, lc->cfg_src), NULL;
        return tp_error("%s: tensor %s is missing; the VAE needs the diffusers AutoencoderKLFlux2 names "
                        "(docs/spec/flux2-text-vae.md §6.4; the encoder.* tensors for reference images) or the BFL/LDM names, and a "
                        "checkpoint that matches %s", lc->dir, name, lc->cfg_src), NULL;
    }
    if (t->rows != rows || t->cols != cols)
        return tp_error("%s: tensor %s is [%lld, %lld] as a matrix, %s implies [%lld, %lld]; "
                        "the config and the weights do not match%s", lc->dir, file_name, (long long)t->rows,
                        (long long)t->cols, lc->cfg_src, (long long)rows, (long long)cols,
                        strstr(lc->cfg_src, "FLUX.2 default") ? " (a VAE of other widths needs its config.json "
                        "beside the file, or in its folder)" : ""), NULL;
    (void)k;
    return t;
}

static int want_parts(const char *name, void *ctx) {
    int parts = *(const int *)ctx;
    if ((parts & VAE_DECODER) && (!strncmp(name, "decoder.", 8) || !strncmp(name, "post_quant_conv.", 16))) return 1;
    if ((parts & VAE_ENCODER) && (!strncmp(name, "encoder.", 8) || !strncmp(name, "quant_conv.", 11))) return 1;
    return !strcmp(name, "bn.running_mean") || !strcmp(name, "bn.running_var");
}

char *vae_config_path(const char *vae_path) {
    if (path_is_dir(vae_path)) return xasprintf("%s/config.json", vae_path);
    const char *slash = strrchr(vae_path, '/');
    return slash ? xasprintf("%.*s/config.json", (int)(slash - vae_path), vae_path) : xstrdup("config.json");
}

/* The VAE's config: config.json in its folder (or beside its file), else
 * FLUX.2's AutoencoderKLFlux2 configuration (ComfyUI's flux2-vae file has
 * none); *src names which (malloc'ed). */
static int read_config(const char *vae_path, vae_config *cfg, char **src) {
    char *path = vae_config_path(vae_path);
    *src = NULL;
    if (!path_is_file(path)) {
        vae_flux2_config(cfg);
        *src = xasprintf("the FLUX.2 default VAE config (no %s)", path);
        free(path);
        return 0;
    }
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    int rc;
    if (!j) rc = tp_error("%s: %s (line %d); the VAE's config.json is not valid JSON", path, je.text, je.line);
    else rc = vae_config_parse(j, path, cfg);
    json_decref(j);
    if (!rc) *src = xstrdup(path);
    free(path);
    return rc;
}

int vae_load(const char *vae_dir, backend *be, dtype_t precision, vae_model **out) {
    return vae_load_parts(vae_dir, be, precision, VAE_DECODER, out);
}

int vae_load_parts(const char *vae_dir, backend *be, dtype_t precision, int parts, vae_model **out) {
    *out = NULL;
    if (precision != DT_F32 && precision != DT_BF16)
        return tp_error("VAE precision must be f32 or bf16, not %s", dtype_name(precision));
    if (!path_is_dir(vae_dir) && !path_is_file(vae_dir))
        return tp_error("the VAE %s does not exist (give a folder with config.json and the weights, or one VAE "
                        "checkpoint file)", vae_dir);
    vae_config cfg;
    char *src = NULL;
    if (read_config(vae_dir, &cfg, &src)) return -1;
    checkpoint *ck = NULL;
    if (checkpoint_open(vae_dir, &ck)) return free(src), tp_error_context("loading the VAE from %s", vae_dir);
    int bfl = vae_checkpoint_is_bfl(ck);
    vae_model *v = model_new(&cfg, be, precision, parts);
    load_opts o = {.tp = 1, .rank = 0, .be = be, .dtype = precision, .want = want_parts, .want_ctx = &parts};
    load_stats st;
    int rc = weights_load(ck, NULL, &o, &v->w, &st);
    checkpoint_close(ck);
    if (!rc) v->held_bytes = st.bytes_held;
    load_ctx lc = {v->w, vae_dir, src, bfl, cfg.n_blocks};
    if (!rc) rc = bind_all(v, load_get, &lc);
    free(src);
    if (rc) {
        vae_free(v);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- random weights (benchmarks) ---- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((splitmix(s) >> 40) * (1.0 / 16777216.0));
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

void vae_random_values(const char *name, int64_t rows, int64_t cols, uint64_t *rng, float *out) {
    size_t n = (size_t)rows * (size_t)cols;
    int is_norm = strstr(name, "norm") != NULL, is_bias = ends_with(name, ".bias");
    float a = sqrtf(3.0f / (float)cols);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(name, "bn.running_var")) out[i] = uniform(rng, 0.5f, 2.0f);
        else if (!strcmp(name, "bn.running_mean")) out[i] = uniform(rng, -0.5f, 0.5f);
        else if (is_norm && !is_bias) out[i] = uniform(rng, 0.8f, 1.2f);
        else if (is_bias) out[i] = uniform(rng, -0.1f, 0.1f);
        else out[i] = uniform(rng, -a, a);
    }
}

typedef struct random_ctx {
    vae_model *v;
    uint64_t rng;
} random_ctx;

static const tensor *random_get(void *vctx, const char *name, int64_t rows, int64_t cols, int k) {
    random_ctx *rc = vctx;
    vae_model *v = rc->v;
    (void)k;
    tensor *t = tensor_new(v->be, v->dt, rows, cols);
    if (!t) return NULL;
    v->owned = xrealloc(v->owned, (size_t)(v->n_owned + 1) * sizeof *v->owned);
    v->owned[v->n_owned++] = t;
    float *host = xmalloc((size_t)rows * (size_t)cols * sizeof(float));
    vae_random_values(name, rows, cols, &rc->rng, host);
    int err = tensor_upload_f32(t, host);
    free(host);
    return err ? NULL : t;
}

int vae_create_random(const vae_config *cfg, backend *be, dtype_t precision, unsigned seed, vae_model **out) {
    return vae_create_random_parts(cfg, be, precision, seed, VAE_DECODER, out);
}

int vae_create_random_parts(const vae_config *cfg, backend *be, dtype_t precision, unsigned seed, int parts,
                            vae_model **out) {
    *out = NULL;
    vae_model *v = model_new(cfg, be, precision, parts);
    random_ctx rc = {v, 0x5eedull ^ ((uint64_t)seed << 20)};
    if (bind_all(v, random_get, &rc)) {
        vae_free(v);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- accessors ---- */

void vae_free(vae_model *v) {
    if (!v) return;
    for (int i = 0; i < v->n_owned; i++) tensor_free(v->owned[i]);
    free(v->owned);
    weights_free(v->w);
    free(v->bn_mean);
    free(v->bn_std);
    free(v);
}

const vae_config *vae_get_config(const vae_model *v) { return &v->cfg; }
void vae_set_band_bytes(vae_model *v, size_t bytes) { v->band_bytes = bytes; }
void vae_set_profile(vae_model *v, double *seconds) { v->prof = seconds; }

size_t vae_weight_bytes(const vae_model *v) {
    size_t n = 0;
    for (int i = 0; i < v->n_owned; i++) n += tensor_nbytes(v->owned[i]);
    return n + v->held_bytes;   /* loaded weights: the loader's count */
}
