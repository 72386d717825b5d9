/* The FLUX.2 pipeline object (flux2_pipe.h): the work of a generation job
 * without its files. Text encoding (the encoder loaded on demand and freed
 * again unless kept), the transformer shard of each rank, the VAE on the
 * TP group's first rank, and per job: seeded noise, reference tokens
 * (encoded where the VAE is, broadcast to the group), denoising in
 * lockstep, decoding. */
#include "flux2_pipe.h"
#include "core/formats/checkpoint.h"
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "embed_cache.h"
#include "kernels/err.h"
#include "core/models/flux2.h"
#include "core/models/textenc.h"
#include "core/models/vae.h"
#include "core/image/image.h"
#include "flux3_pipe.h"
#include "refs.h"
#include "rng.h"
#include "schedule.h"
#include "kernels/ops.h"
#include "kernels/fault.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct flux2_pipe {
    flux2_pipe_config cfg;
    const flux2_pipe_info *info;
    MPI_Comm tp_comm;
    int tp_rank;
    backend *be;
    comm *c;
    textenc *te;
    flux2_model *model;
    flux3_model *model3;         /* a FLUX.3 folder (model_family_is_flux3) */
    vae_model *vae;
    embed_cache *cache;
    flux2_pipe_stats st;
    /* the current job's step callback, wrapped to count steps */
    denoise_step_fn user_step;
    void *user_ctx;
};

/* ---- probing a folder ---- */

static json_t *load_json(const char *path, int required) {
    if (!path_is_file(path)) {
        if (required) tp_error("%s is missing", path);
        return NULL;
    }
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j || !json_is_object(j)) {
        tp_error("%s:%d: not a valid JSON object (%s)", path, e.line, j ? "not an object" : e.text);
        json_decref(j);
        return NULL;
    }
    return j;
}

static int json_int(const json_t *o, const char *key, int def, const char *where, int *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return *out = def, 0;
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 20))
        return tp_error("%s: '%s' must be an integer from 1 to %d", where, key, 1 << 20);
    *out = (int)json_integer_value(v);
    return 0;
}

int flux2_pipe_probe(const char *root, flux2_pipe_info *g, char *warning, size_t warning_len) {
    return flux2_pipe_probe_with(root, NULL, g, warning, warning_len);
}

int flux2_pipe_probe_with(const char *root, const char *transformer, flux2_pipe_info *g, char *warning,
                          size_t warning_len) {
    flux2_components c = {.model = root, .transformer = transformer};
    return flux2_pipe_probe_components(&c, g, warning, warning_len);
}

/* model_index.json of a --family: the class diffusers' pipeline of that name writes */
static json_t *family_index(const char *family) {
    if (!strcmp(family, "dev")) return json_pack("{s:s}", "_class_name", "Flux2Pipeline");
    if (!strcmp(family, "klein")) return json_pack("{s:s,s:b}", "_class_name", "Flux2KleinPipeline", "is_distilled", 1);
    if (!strcmp(family, "klein-base")) return json_pack("{s:s,s:b}", "_class_name", "Flux2KleinPipeline", "is_distilled", 0);
    return NULL;
}

/* "file" / "folder" of a path given by a flag, after checking it exists */
static int component_path(const char *flag, const char *path, const char **kind) {
    if (path_is_file(path)) *kind = "file";
    else if (path_is_dir(path)) *kind = "folder";
    else return tp_error("%s %s does not exist (give a .safetensors or .gguf file, or a folder holding one)", flag, path);
    return 0;
}

int flux2_pipe_probe_components(const flux2_components *cp, flux2_pipe_info *g, char *warning, size_t warning_len) {
    memset(g, 0, sizeof *g);
    if (warning_len) warning[0] = 0;
    const char *root = cp->model, *kind = NULL;
    if (root && !path_is_dir(root))
        return tp_error("model folder %s does not exist (give --model a FLUX.2 pipeline folder in the diffusers layout)", root);
    if (!root && !cp->transformer)
        return tp_error("no model: pass --model PIPELINE_FOLDER, or the components --transformer FILE (with "
                        "--text-encoder, --vae and --family)");
    if (cp->family && strcmp(cp->family, "dev") && strcmp(cp->family, "klein") && strcmp(cp->family, "klein-base"))
        return tp_error("--family '%s' is not a FLUX.2 family: use dev, klein or klein-base", cp->family);
    if (cp->transformer && component_path("--transformer", cp->transformer, &kind)) return -1;
    g->model_root = root ? xstrdup(root) : NULL;
    g->transformer_dir = cp->transformer ? xstrdup(cp->transformer) : xasprintf("%s/transformer", root);
    g->transformer_src = cp->transformer ? (!strcmp(kind, "file") ? "--transformer file" : "--transformer folder")
                                         : "pipeline folder";
    int is_file = path_is_file(g->transformer_dir);
    char *cfg_path = xasprintf("%s/config.json", g->transformer_dir);
    /* a BFL single-file checkpoint (or a GGUF, BFL names) may come without config.json: derived from its shapes */
    int bfl3 = 0;   /* a folder holding a FLUX.3 BFL single file: its own derivation */
    json_t *cfg = !is_file && path_is_dir(g->transformer_dir) && !path_is_file(cfg_path)
                      ? flux3_bfl_dir_config(g->transformer_dir, &bfl3) : NULL;
    char *derived = NULL;   /* where flux2_transformer_config found or derived it */
    if (!bfl3)
        cfg = is_file || (path_is_dir(g->transformer_dir) && !path_is_file(cfg_path))
                  ? flux2_transformer_config(g->transformer_dir, &derived) : load_json(cfg_path, 1);
    if (is_file || !path_is_file(cfg_path)) {
        free(cfg_path);
        cfg_path = derived ? derived : xasprintf("%s (config derived from the BFL tensor shapes)", g->transformer_dir);
    } else {
        free(derived);
    }
    int rc = cfg ? 0 : -1;
    if (!cfg && !path_is_dir(g->transformer_dir) && !is_file)
        rc = tp_error("%s has no transformer/ folder: is it a FLUX.2 pipeline folder (diffusers layout)? (or pass "
                      "--transformer FILE)", root);
    const json_t *tcls = cfg ? json_object_get(cfg, "_class_name") : NULL;
    const char *tclass = json_is_string(tcls) ? json_string_value(tcls) : NULL;
    int flux3 = tclass && !strcmp(tclass, FLUX3_CLASS_NAME), flow_map = 0;
    if (!rc && flux3) {   /* FLUX.3: every field checked by the transformer's own parser */
        flux3_config c3;
        rc = flux3_config_parse(cfg, cfg_path, &c3);
        g->in_channels = c3.in_channels, g->joint_dim = c3.joint_dim, g->cond_in_channels = c3.cond_in_channels;
        flow_map = c3.flow_map;
        g->embedded_guidance = 0;
    } else if (!rc) {
        rc = json_int(cfg, "in_channels", 128, cfg_path, &g->in_channels);
        if (!rc) rc = json_int(cfg, "joint_attention_dim", 15360, cfg_path, &g->joint_dim);
        g->cond_in_channels = g->in_channels;
        json_t *ge = json_object_get(cfg, "guidance_embeds");
        g->embedded_guidance = !ge || json_is_true(ge);   /* diffusers' default is true */
    }
    if (rc) return json_decref(cfg), free(cfg_path), flux2_pipe_info_free(g), -1;

    /* the pipeline class: model_index.json, else a modular pipeline's modular_model_index.json, else --family */
    int overrides = cp->transformer || cp->text_encoder || cp->vae;
    char *idx_path = NULL;
    if (root) {
        idx_path = xasprintf("%s/model_index.json", root);
        if (!path_is_file(idx_path)) {
            char *m = xasprintf("%s/modular_model_index.json", root);
            if (path_is_file(m)) free(idx_path), idx_path = m;
            else free(m);
        }
    }
    json_t *idx = idx_path ? load_json(idx_path, 0) : NULL;
    if (!idx && idx_path && path_is_file(idx_path)) rc = -1;
    if (!rc && cp->family) {
        json_t *fi = family_index(cp->family);
        const char *mine = json_string_value(json_object_get(fi, "_class_name"));
        const char *theirs = idx ? json_string_value(json_object_get(idx, "_class_name")) : NULL;
        if (theirs && (strcmp(theirs, mine) ||
                       (!strcmp(mine, "Flux2KleinPipeline") &&
                        json_is_true(json_object_get(idx, "is_distilled")) != json_is_true(json_object_get(fi, "is_distilled")))))
            rc = tp_error("--family %s contradicts %s (_class_name %s%s); leave out --family or the folder", cp->family,
                          idx_path, theirs, json_is_true(json_object_get(idx, "is_distilled")) ? ", distilled" : "");
        json_decref(idx);
        idx = fi;
        free(idx_path);
        idx_path = xasprintf("--family %s", cp->family);
        g->family_src = "--family";
    } else if (!rc && !idx && !flux3 && (!root || overrides)) {
        rc = tp_error("which FLUX.2 family is this? %s: pass --family dev (FLUX.2-dev, Mistral text encoder), "
                      "--family klein (klein distilled, Qwen3) or --family klein-base (klein base, CFG)",
                      root ? "the model folder has no model_index.json" : "a model assembled from component files has no model_index.json");
    } else if (!rc) {
        g->family_src = idx ? (strstr(idx_path, "modular_model_index.json") ? "modular_model_index.json" : "model_index.json")
                        : flux3 ? "transformer config (_class_name)" : "transformer config (guidance_embeds)";
    }
    family_input fi = {.index = idx, .index_path = idx_path ? idx_path : "(none)", .transformer_class = tclass,
                       .guidance_embeds = g->embedded_guidance, .flow_map = flow_map, .config_path = cfg_path};
    if (!rc) rc = model_family_resolve(&fi, &g->family, &g->family_name, warning, warning_len);
    json_decref(cfg);
    if (!rc && g->family == FAMILY_KLEIN_KV) {
        /* Flux2KleinKVPipeline (e.g. FLUX.2-klein-9b-kv): a klein model whose reference K/V are cached after step 0 */
        int distilled = json_is_true(json_object_get(idx, "is_distilled"));
        g->kv_refs = 1;
        g->family = distilled ? FAMILY_KLEIN_DISTILLED : FAMILY_KLEIN_BASE;
        g->family_name = distilled ? "FLUX.2-klein-kv (distilled)" : "FLUX.2-klein-kv (base)";
    }
    free(idx_path);
    free(cfg_path);
    json_decref(idx);
    if (!rc && cp->vae && component_path("--vae", cp->vae, &kind)) rc = -1;
    if (!rc) {
        g->vae_src = cp->vae ? (!strcmp(kind, "file") ? "--vae file" : "--vae folder") : "pipeline folder";
        g->vae_dir = cp->vae ? xstrdup(cp->vae) : xasprintf("%s/vae", root);
    }
    if (!rc && cp->text_encoder && component_path("--text-encoder", cp->text_encoder, &kind)) rc = -1;
    if (!rc) {
        g->te_src = cp->text_encoder ? (!strcmp(kind, "file") ? "--text-encoder file" : "--text-encoder folder")
                                     : "pipeline folder";
        g->te_path = cp->text_encoder ? xstrdup(cp->text_encoder) : root ? xasprintf("%s/text_encoder", root) : NULL;
    }
    if (rc) return flux2_pipe_info_free(g), -1;
    char *vc = xasprintf("%s/config.json", g->vae_dir);
    g->has_vae = cp->vae ? 1 : path_is_file(vc);
    g->has_text_encoder = g->te_path && (cp->text_encoder || path_is_dir(g->te_path));
    free(vc);
    return 0;
}

void flux2_pipe_info_free(flux2_pipe_info *info) {
    free(info->transformer_dir);
    free(info->vae_dir);
    free(info->te_path);
    free(info->model_root);
    memset(info, 0, sizeof *info);
}

static int is_flux3(const flux2_pipe_info *info) { return model_family_is_flux3(info->family); }

int flux2_default_steps(const flux2_pipe_info *info) {
    if (is_flux3(info)) return flux3_default_steps(info->family == FAMILY_FLUX3_FLOWMAP);
    return info->family == FAMILY_KLEIN_DISTILLED ? 4 : 50;
}
double flux2_default_guidance(const flux2_pipe_info *info) {
    if (is_flux3(info)) return flux3_default_guidance(info->family == FAMILY_FLUX3_FLOWMAP);
    return info->family == FAMILY_KLEIN_DISTILLED ? 1.0 : 4.0;
}

textenc_source flux2_pipe_text_source(const flux2_pipe_info *info) {
    return (textenc_source){.model_dir = info->model_root, .path = info->te_path,
                            .dev = info->family == FAMILY_DEV};
}

int flux2_uses_cfg(const flux2_pipe_info *info, double guidance) {
    if (is_flux3(info)) return flux3_uses_cfg(info->family == FAMILY_FLUX3_FLOWMAP, guidance);
    return info->family == FAMILY_KLEIN_BASE && guidance > 1.0;
}

/* ---- the object ---- */

static int agree(flux2_pipe *p, int rc) { return dist_agree(p->tp_comm, rc); }

int flux2_pipe_open(const flux2_pipe_config *cfg, const flux2_pipe_info *info, MPI_Comm tp_comm, int local_rank,
                    int local_size, flux2_pipe **out) {
    *out = NULL;
    flux2_pipe *p = xcalloc(1, sizeof *p);
    p->cfg = *cfg;
    p->info = info;
    p->tp_comm = tp_comm;
    MPI_Comm_rank(tp_comm, &p->tp_rank);
    int rc = agree(p, backend_select(cfg->backend, local_rank, local_size, &p->be));
    if (!rc) {
        p->c = comm_create(tp_comm, p->be);
        rc = agree(p, p->c ? 0 : -1);
    }
    if (!rc && cfg->prompt_cache_bytes) p->cache = embed_cache_create(cfg->prompt_cache_bytes);
    if (rc) {
        flux2_pipe_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

void flux2_pipe_free(flux2_pipe *p) {
    if (!p) return;
    if (p->te) textenc_free(p->te);
    if (p->vae) vae_free(p->vae);
    if (p->model) flux2_free(p->model);
    if (p->model3) flux3_free(p->model3);
    embed_cache_free(p->cache);
    if (p->c) comm_destroy(p->c);
    if (p->be) backend_destroy(p->be);
    free(p);
}

const flux2_pipe_stats *flux2_pipe_get_stats(const flux2_pipe *p) { return &p->st; }
uint64_t flux2_pipe_resident_bytes(const flux2_pipe *p) { return p->be ? p->be->bytes_in_use : 0; }

/* ---- text ---- */

static int load_text_encoder(flux2_pipe *p) {
    if (p->te) return 0;
    load_stats ls = {0};
    double t0 = MPI_Wtime();
    textenc_source src = flux2_pipe_text_source(p->info);
    const char *phase = tp_phase_set("load");   /* TPGEN_FAIL_ALLOC's phases */
    int rc = agree(p, textenc_load_from(&src, p->be, p->c, p->cfg.precision, &p->te, &ls));
    tp_phase_set(phase);
    p->st.t_te_load += MPI_Wtime() - t0;
    p->st.te_bytes_loaded += ls.bytes_read;
    p->st.te_load_seconds += ls.seconds;
    if (!rc && textenc_embed_dim(p->te) != p->info->joint_dim)
        rc = tp_error("the text encoder gives %d features per token but the transformer expects %d (joint_attention_dim)",
                      textenc_embed_dim(p->te), p->info->joint_dim);
    return rc;
}

/* count: lookups of requests count as hits and misses; prefetches do not.
 * FLUX.2 embeds every prompt over max_sequence_length tokens; FLUX.3 over
 * the prompt's own window (its tokens rounded up to the encoder's pad
 * multiple, at most max_sequence_length), which a cached entry gives back
 * by its size. */
static int encode(flux2_pipe *p, const char *prompt, float **out, int64_t *Lout, int *hit, int count) {
    double t0 = MPI_Wtime(), te0 = p->st.t_te_load;
    const char *phase = tp_phase_set("encode");
    int cap = p->cfg.max_sequence_length, f3 = is_flux3(p->info);
    size_t J = (size_t)p->info->joint_dim;
    /* the embedding depends on the encoder's recipe, the length, the precision and the prompt */
    char *key = p->cache ? embed_cache_key(f3 ? "qwen3vl" : "flux2", cap, f3 ? TEXTENC_FLUX3_PAD_MULTIPLE : 0,
                                           dtype_name(p->cfg.precision), prompt)
                         : NULL;
    size_t got = 0;
    const float *cached = key ? embed_cache_get(p->cache, key, &got) : NULL;
    int64_t L = cached && got % J == 0 ? (int64_t)(got / J) : 0;
    /* every rank of the group must take the same branch (the encoder is collective) */
    int mine = cached && (f3 ? L >= 1 && L <= cap : L == cap), all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, p->tp_comm);
    int rc = 0;
    *out = NULL;
    if (all) {
        *out = xmalloc(got * sizeof **out);
        memcpy(*out, cached, got * sizeof **out);
        if (count) p->st.cache_hits++;
    } else {
        int win = cap;
        rc = load_text_encoder(p);
        if (!rc && f3) rc = agree(p, textenc_window(p->te, prompt, cap, &win));
        L = win;
        if (!rc) *out = xmalloc((size_t)L * J * sizeof **out);
        if (!rc) rc = agree(p, textenc_encode(p->te, prompt, (int)L, *out, NULL, NULL));
        if (!rc && key && embed_cache_put(p->cache, key, *out, (size_t)L * J) < 0) rc = 0;   /* a full cache only costs speed */
        if (key && count) p->st.cache_misses++;
        if (key && !count) p->st.prefetched++;
    }
    if (rc) free(*out), *out = NULL, L = 0;
    if (Lout) *Lout = L;
    if (hit) *hit = all;
    free(key);
    p->st.t_encode += MPI_Wtime() - t0 - (p->st.t_te_load - te0);   /* the load has its own figure */
    tp_phase_set(phase);
    return rc ? tp_error_context("encoding the prompts") : 0;
}

int flux2_pipe_encode(flux2_pipe *p, const char *prompt, float **out, int64_t *L, int *hit) {
    return encode(p, prompt, out, L, hit, 1);
}

int flux2_pipe_prefetch(flux2_pipe *p, const char *prompt) {
    if (!p->cache) return 0;
    float *tmp = NULL;
    int rc = encode(p, prompt, &tmp, NULL, NULL, 0);
    free(tmp);
    return rc;
}

void flux2_pipe_text_done(flux2_pipe *p) {
    if (p->te && !p->cfg.keep_text_encoder) {
        textenc_free(p->te);
        p->te = NULL;
    }
}

/* ---- weights ---- */

/* Every rank of the TP group holds the whole VAE (it is small: ~160 MB in
 * bf16 at FLUX.2's widths, decoder ~100 MB) and decodes one row band of
 * each image (vae_decode_packed_group) and encodes one row band of each
 * reference image (refs_encode_group). */
static int load_vae(flux2_pipe *p) {
    const flux2_pipe_info *g = p->info;
    int parts = (p->cfg.decoder ? VAE_DECODER : 0) | (p->cfg.encoder ? VAE_ENCODER : 0);
    if (p->vae || !parts) return 0;
    if (vae_load_parts(g->vae_dir, p->be, p->cfg.precision, parts, &p->vae))
        return tp_error_context("loading %s", g->vae_dir);
    /* the image is (H/16) x (W/16) tokens of in_channels = 4 x latent channels */
    const vae_config *vc = vae_get_config(p->vae);
    if (vae_pixels_per_token(vc) != 16 || 4 * vc->latent_channels != g->in_channels)
        return tp_error("%s does not fit the transformer: %d latent channels and %d pixels per token, the transformer "
                        "needs %d channels (4 x latent channels) and 16 pixels per token", g->vae_dir,
                        vc->latent_channels, vae_pixels_per_token(vc), g->in_channels);
    return 0;
}

int flux2_pipe_load(flux2_pipe *p) {
    double t0 = MPI_Wtime();
    const char *phase = tp_phase_set("load");
    int rc = 0;
    if (is_flux3(p->info) && !p->model3) {
        load_stats ls = {0};
        struct lora_set *lset = NULL;
        flux3_load_extras x3 = {.quantize_fp8 = p->cfg.quantize_fp8, .loras = p->cfg.loras, .n_loras = p->cfg.n_loras,
                                .lora_set_out = &lset};
        rc = flux3_load_ex(p->info->transformer_dir, p->be, p->c, p->cfg.precision, &x3, &p->model3, &ls);
        for (int i = 0; lset && i < lset->n && i < LORA_MAX_ADAPTERS; i++) p->st.lora_bytes[i] = lset->ad[i].bytes_read;
        lora_set_free(lset);
        p->st.bytes_loaded += ls.bytes_read;
        p->st.load_seconds += ls.seconds;
        if (rc) tp_error_context("loading %s", p->info->transformer_dir);
    } else if (!is_flux3(p->info) && !p->model) {
        load_stats ls = {0};
        struct lora_set *lset = NULL;
        flux2_load_extras x = {.loras = p->cfg.loras, .n_loras = p->cfg.n_loras, .quantize_fp8 = p->cfg.quantize_fp8,
                               .lora_set_out = &lset};
        rc = flux2_load_ex(p->info->transformer_dir, p->be, p->c, p->cfg.precision, &x, &p->model, &ls);
        for (int i = 0; lset && i < lset->n && i < LORA_MAX_ADAPTERS; i++) p->st.lora_bytes[i] = lset->ad[i].bytes_read;
        lora_set_free(lset);
        p->st.bytes_loaded += ls.bytes_read;
        p->st.load_seconds += ls.seconds;
        if (rc) tp_error_context("loading %s", p->info->transformer_dir);
    }
    rc = agree(p, rc);
    if (!rc) rc = agree(p, load_vae(p));
    p->st.t_load += MPI_Wtime() - t0;
    tp_phase_set(phase);
    return rc;
}

void flux2_pipe_unload(flux2_pipe *p) {
    if (p->model) flux2_free(p->model);
    if (p->model3) flux3_free(p->model3);
    p->model = NULL;
    p->model3 = NULL;
}

/* ---- one job ---- */

float *flux2_latents_pack(const float *nchw, int C, int h, int w) {
    size_t hw = (size_t)h * (size_t)w;
    float *x = xmalloc((size_t)C * hw * sizeof *x);
    for (size_t c = 0; c < (size_t)C; c++)
        for (size_t t = 0; t < hw; t++) x[t * (size_t)C + c] = nchw[c * hw + t];
    return x;
}

float *flux2_noise_packed(uint64_t seed, int C, int h, int w) { return flux2_noise_packed_as(seed, C, h, w, TP_RNG_TORCH2); }

float *flux2_noise_packed_as(uint64_t seed, int C, int h, int w, int rng_kind) {
    size_t n = (size_t)C * (size_t)h * (size_t)w;
    uint16_t *raw = xmalloc(n * sizeof *raw);
    tp_rng rng;
    rng_seed(&rng, seed);
    rng_randn_bf16_as(&rng, raw, n, rng_kind == TP_RNG_TORCH1 ? TP_RNG_TORCH1 : TP_RNG_TORCH2);
    float *x = xmalloc(n * sizeof *x);
    for (int c = 0; c < C; c++)
        for (int t = 0; t < h * w; t++) x[(size_t)t * C + c] = bf16_to_f32(raw[(size_t)c * h * w + t]);
    free(raw);
    return x;
}

static int count_step(int step, int steps, double seconds, const float *v, const float *x, void *ctx) {
    flux2_pipe *p = ctx;
    p->st.steps++;
    p->st.step_seconds += seconds;
    return p->user_step ? p->user_step(step, steps, seconds, v, x, p->user_ctx) : 0;
}

/* The job's reference tokens: encoded across the group (the first rank
 * reads the images), then broadcast from the first rank. */
static int job_refs(flux2_pipe *p, const flux2_job *j, ref_set *rs) {
    memset(rs, 0, sizeof *rs);
    if (!j->n_images) return 0;
    double t0 = MPI_Wtime();
    int rc = p->vae && p->cfg.encoder ? 0 : tp_error("reference images need the VAE encoder, which this pipeline did not load");
    /* what FLUX.3's processor would refuse, on the first rank (the only one that reads the images: a
     * server's uploads are files on it alone) */
    for (int k = 0; !rc && is_flux3(p->info) && p->tp_rank == 0 && k < j->n_images; k++) {
        int w = 0, h = 0;
        rc = image_probe(j->images[k], &w, &h) || flux3_check_reference(j->images[k], w, h, j->n_images) ? -1 : 0;
    }
    if (agree(p, rc)) return -1;
    /* FLUX.3: one reference "fill" (downscaled under 4 MP, reflect-padded to its canvas), several "crop" (FLUX.2's
     * preprocessing without its checks); FLUX.2: image_load_reference */
    refs_load_fn load = !is_flux3(p->info) ? image_load_reference
                        : j->n_images == 1 ? flux3_load_reference : flux3_load_reference_crop;
    if (refs_encode_group_with(p->vae, p->tp_comm, j->images, j->n_images, load, rs)) return -1;   /* agreed inside */
    if (p->tp_rank == 0 && is_flux3(p->info)) flux3_ref_ids(rs);   /* (0, y, x, -(1+k)); the others get them below */
    int64_t hdr[2] = {rs->R, rs->C};
    MPI_Bcast(hdr, 2, MPI_INT64_T, 0, p->tp_comm);
    if (p->tp_rank != 0) {
        rs->R = hdr[0], rs->C = (int)hdr[1], rs->n = j->n_images;
        rs->tokens = xmalloc(sizeof(float) * (size_t)rs->R * (size_t)rs->C);
        rs->ids = xmalloc(sizeof(int32_t) * 4 * (size_t)rs->R);
    }
    dist_bcast_large(rs->tokens, (size_t)rs->R * (size_t)rs->C, MPI_FLOAT, sizeof *rs->tokens, 0, p->tp_comm);
    dist_bcast_large(rs->ids, (size_t)rs->R * 4, MPI_INT32_T, sizeof *rs->ids, 0, p->tp_comm);
    p->st.t_refs += MPI_Wtime() - t0;
    p->st.refs_encoded += p->tp_rank == 0 ? j->n_images : 0;
    if (rs->C != p->info->cond_in_channels)
        return tp_error("reference tokens have %d channels but the transformer takes %d", rs->C,
                        p->info->cond_in_channels);
    return 0;
}

static int denoise3(flux2_pipe *p, const flux2_job *j, const ref_set *rs, float *latents) {
    if (!p->model3) return tp_error("flux2_pipe_render: the transformer is not loaded (call flux2_pipe_load)");
    if (j->width % 16 || j->height % 16)
        return tp_error("the image size %dx%d must be a multiple of 16 in both directions", j->width, j->height);
    p->user_step = j->on_step;
    p->user_ctx = j->ctx;
    flux3_job f = {.seed = j->seed, .init_latents = j->init_latents, .steps = j->steps, .guidance = j->guidance, .h = j->height / 16,
                   .w = j->width / 16, .embeds = j->embeds, .L = j->L, .neg_embeds = j->neg_embeds,
                   .Ln = j->Ln ? j->Ln : j->L, .refs = rs, .on_step = count_step, .ctx = p};
    double t0 = MPI_Wtime();
    int rc = flux3_denoise(p->model3, &f, latents);
    p->st.t_denoise += MPI_Wtime() - t0;
    return rc;
}

static int denoise(flux2_pipe *p, const flux2_job *j, const ref_set *rs, float *latents) {
    if (is_flux3(p->info)) return denoise3(p, j, rs, latents);
    if (!p->model) return tp_error("flux2_pipe_render: the transformer is not loaded (call flux2_pipe_load)");
    int h = j->height / 16, w = j->width / 16, C = p->info->in_channels;
    int64_t N = (int64_t)h * w;
    float *noise = xmalloc((size_t)N * (size_t)C * sizeof *noise);
    if (j->init_latents) memcpy(noise, j->init_latents, (size_t)N * (size_t)C * sizeof *noise);
    else {
        free(noise);
        noise = flux2_noise_packed_as(j->seed, C, h, w, j->rng);
    }
    float *sigmas = xmalloc(sizeof(float) * (size_t)(j->steps + 1)), *ts = xmalloc(sizeof(float) * (size_t)j->steps);
    int32_t *img_ids = xmalloc(sizeof(int32_t) * 4 * (size_t)N), *txt_ids = xmalloc(sizeof(int32_t) * 4 * (size_t)j->L);
    flux2_image_ids(h, w, 0, img_ids);
    flux2_text_ids(j->L, txt_ids);
    float gval = (float)j->guidance;
    p->user_step = j->on_step;
    p->user_ctx = j->ctx;
    denoise_params dp = {
        .latents = noise, .N = N, .img_ids = img_ids,
        .prompt_embeds = j->embeds, .L = j->L, .txt_ids = txt_ids,
        .neg_embeds = j->neg_embeds, .Ln = j->L, .neg_txt_ids = txt_ids, .cfg_scale = gval,
        .sigmas = sigmas, .steps = j->steps, .guidance = p->info->embedded_guidance ? &gval : NULL,
        .on_step = count_step, .ctx = p,
        .ref_tokens = rs->R ? rs->tokens : NULL, .R = rs->R, .ref_ids = rs->ids,
        .kv_refs = p->info->kv_refs, .ref_timestep = 0.0f,
    };
    int rc = schedule_flux2(N, j->steps, sigmas, ts);
    double t0 = MPI_Wtime();
    if (!rc) rc = flux2_denoise(p->model, &dp, latents);
    p->st.t_denoise += MPI_Wtime() - t0;
    free(noise), free(sigmas), free(ts), free(img_ids), free(txt_ids);
    return rc;
}

int flux2_pipe_render(flux2_pipe *p, const flux2_job *j, float *latents) {
    ref_set rs;
    const char *phase = tp_phase_set("denoise");
    int rc = agree(p, job_refs(p, j, &rs));
    if (!rc) rc = agree(p, denoise(p, j, &rs, latents));
    refs_free(&rs);
    tp_phase_set(phase);
    return rc;
}

int flux2_pipe_decode(flux2_pipe *p, const float *latents, int width, int height, uint8_t *rgb, double *seconds) {
    double t0 = MPI_Wtime();
    const char *phase = tp_phase_set("decode");
    int rc = agree(p, p->vae ? 0 : tp_error("decoding needs the VAE decoder, which this rank did not load"));
    if (!rc) rc = vae_decode_packed_group(p->vae, p->tp_comm, latents, height / 16, width / 16, NULL, rgb);
    tp_phase_set(phase);
    if (seconds) *seconds = MPI_Wtime() - t0;
    return rc;
}
