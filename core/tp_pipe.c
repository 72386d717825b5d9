/* The pipeline object (tp_pipe.h), family-neutral: what a family does
 * differently comes from its table (family.h, pipe_family_of), the
 * sampling loop is core/sampler.c. The work of a generation job
 * without its files. Text encoding (the encoder loaded on demand and freed
 * again unless kept), the transformer shard of each rank, the VAE on the
 * TP group's first rank, and per job: seeded noise, reference tokens
 * (encoded where the VAE is, broadcast to the group), denoising in
 * lockstep, decoding. */
#include "tp_pipe.h"
#include "core/formats/checkpoint.h"
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "embed_cache.h"
#include "kernels/err.h"
#include "core/models/flux2/flux2.h"
#include "core/models/llm/textenc.h"
#include "core/models/vae/vae.h"
#include "core/image/image.h"
#include "family.h"
#include "core/models/flux3/flux3.h"
#include "refs.h"
#include "kernels/ops.h"
#include "kernels/fault.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tp_pipe {
    tp_pipe_config cfg;
    const tp_pipe_info *info;
    MPI_Comm group;              /* the job group: every call is collective over it */
    int grank;                   /* this rank in it (0: reads images, gets the PNG) */
    dist_mesh mesh;              /* its TP groups, SP positions and CFG halves */
    comm *cfg_comm;              /* the CFG halves' host communicator (NULL: serial CFG) */
    comm *sp_comm;               /* the SP group's communicator on the backend (NULL: no SP) */
    backend *be;
    comm *c;
    textenc *te;
    const pipe_family *fam;      /* what the family brings (family.h): no family branch below */
    void *model;                 /* the family's transformer shard, NULL until loaded */
    vae_model *vae;
    embed_cache *cache;
    int vae_all;                 /* the VAE runs over the whole group (vae_group) */
    tp_pipe_stats st;
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

int tp_pipe_probe(const char *root, tp_pipe_info *g, char *warning, size_t warning_len) {
    return tp_pipe_probe_with(root, NULL, g, warning, warning_len);
}

int tp_pipe_probe_with(const char *root, const char *transformer, tp_pipe_info *g, char *warning,
                          size_t warning_len) {
    flux2_components c = {.model = root, .transformer = transformer};
    return tp_pipe_probe_components(&c, g, warning, warning_len);
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

int tp_pipe_probe_components(const flux2_components *cp, tp_pipe_info *g, char *warning, size_t warning_len) {
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
    /* the transformer's class names its family (FLUX.2's configs have none or Flux2Transformer2DModel) */
    int flux3 = tclass && !strcmp(tclass, FLUX3_CLASS_NAME), flow_map = 0;
    if (!rc) rc = (flux3 ? &family_flux3 : &family_flux2)->read_config(cfg, cfg_path, g, &flow_map);
    if (rc) return json_decref(cfg), free(cfg_path), tp_pipe_info_free(g), -1;

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
    /* Flux2KleinPipeline calls its transformer with guidance=None, whatever
     * the config's guidance_embeds says (a klein transformer with the
     * guidance embedder, as the block-cache golden model has, does not use it) */
    if (!rc && (g->family == FAMILY_KLEIN_BASE || g->family == FAMILY_KLEIN_DISTILLED)) g->embedded_guidance = 0;
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
    if (rc) return tp_pipe_info_free(g), -1;
    char *vc = xasprintf("%s/config.json", g->vae_dir);
    g->has_vae = cp->vae ? 1 : path_is_file(vc);
    g->has_text_encoder = g->te_path && (cp->text_encoder || path_is_dir(g->te_path));
    free(vc);
    return 0;
}

void tp_pipe_info_free(tp_pipe_info *info) {
    free(info->transformer_dir);
    free(info->vae_dir);
    free(info->te_path);
    free(info->model_root);
    memset(info, 0, sizeof *info);
}

int tp_default_steps(const tp_pipe_info *info) { return pipe_family_of(info->family)->default_steps(info->family); }
double tp_default_guidance(const tp_pipe_info *info) {
    return pipe_family_of(info->family)->default_guidance(info->family);
}
int tp_default_max_sequence_length(const tp_pipe_info *info) {
    return pipe_family_of(info->family)->default_max_sequence_length;
}

textenc_source tp_pipe_text_source(const tp_pipe_info *info) {
    return (textenc_source){.model_dir = info->model_root, .path = info->te_path,
                            .dev = info->family == FAMILY_DEV};
}

int tp_uses_cfg(const tp_pipe_info *info, double guidance) {
    return pipe_family_of(info->family)->uses_cfg(info->family, guidance);
}

/* ---- the object ---- */

static int agree(tp_pipe *p, int rc) { return dist_agree(p->group, rc); }

/* the mesh inside the group: tp is what cfg halves and sp positions leave */
static int split_mesh(tp_pipe *p) {
    int size, sp = p->cfg.sp > 1 ? p->cfg.sp : 1, cfgn = p->cfg.cfg_parallel ? 2 : 1;
    MPI_Comm_size(p->group, &size);
    if (size % (sp * cfgn))
        return tp_error("the job group of %d ranks does not split into %s%d sequence-parallel positions", size,
                        cfgn == 2 ? "two CFG halves of " : "", sp);
    dist_mesh_split(p->group, size / (sp * cfgn), sp, cfgn, &p->mesh);
    return 0;
}

int tp_pipe_open(const tp_pipe_config *cfg, const tp_pipe_info *info, MPI_Comm group, int local_rank,
                    int local_size, tp_pipe **out) {
    *out = NULL;
    tp_pipe *p = xcalloc(1, sizeof *p);
    p->cfg = *cfg;
    p->info = info;
    p->fam = pipe_family_of(info->family);
    p->group = group;
    p->mesh.tp_comm = p->mesh.sp_comm = p->mesh.cfg_comm = MPI_COMM_NULL;
    MPI_Comm_rank(group, &p->grank);
    int rc = agree(p, split_mesh(p));
    if (!rc) rc = agree(p, backend_select(cfg->backend, local_rank, local_size, &p->be));
    if (!rc) {
        p->c = comm_create(p->mesh.tp_comm, p->be);
        rc = agree(p, p->c ? 0 : -1);
    }
    if (!rc && p->mesh.sp > 1) {
        p->sp_comm = comm_create(p->mesh.sp_comm, p->be);
        rc = agree(p, p->sp_comm ? 0 : -1);
    }
    if (!rc && p->mesh.cfg == 2) p->cfg_comm = comm_create_mpi(p->mesh.cfg_comm, NULL);   /* host latents */
    if (!rc && cfg->prompt_cache_bytes) p->cache = embed_cache_create(cfg->prompt_cache_bytes);
    if (!rc) {   /* the same choice on every rank, even on unlike CPUs */
        p->vae_all = op_rows_invariant(p->be, cfg->precision);
        MPI_Allreduce(MPI_IN_PLACE, &p->vae_all, 1, MPI_INT, MPI_MIN, group);
    }
    if (rc) {
        tp_pipe_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

void tp_pipe_free(tp_pipe *p) {
    if (!p) return;
    if (p->te) textenc_free(p->te);
    if (p->vae) vae_free(p->vae);
    if (p->model) p->fam->free_model(p->model);
    embed_cache_free(p->cache);
    if (p->c) comm_destroy(p->c);
    if (p->cfg_comm) comm_destroy(p->cfg_comm);
    if (p->sp_comm) comm_destroy(p->sp_comm);
    dist_mesh_free(&p->mesh);
    if (p->be) backend_destroy(p->be);
    free(p);
}

int tp_pipe_decode_x0(tp_pipe *p, const float *x, const float *v, float sigma, int width, int height, uint8_t *rgb,
                      double *seconds) {
    size_t n = (size_t)(height / 16) * (size_t)(width / 16) * (size_t)p->info->in_channels;
    float *x0 = xmalloc(n * sizeof *x0);
    for (size_t i = 0; i < n; i++) x0[i] = x[i] - sigma * v[i];
    int rc = tp_pipe_decode(p, x0, width, height, rgb, seconds);
    free(x0);
    return rc;
}

const tp_pipe_stats *tp_pipe_get_stats(const tp_pipe *p) { return &p->st; }
uint64_t tp_pipe_resident_bytes(const tp_pipe *p) { return p->be ? p->be->bytes_in_use : 0; }

/* ---- text ---- */

/* Not agreed here: only the TP groups that encode load it (collective over
 * the TP group); the caller agrees over the job group. */
static int load_text_encoder(tp_pipe *p) {
    if (p->te) return 0;
    load_stats ls = {0};
    double t0 = MPI_Wtime();
    textenc_source src = tp_pipe_text_source(p->info);
    const char *phase = tp_phase_set("load");   /* TPGEN_FAIL_ALLOC's phases */
    int rc = textenc_load_from(&src, p->be, p->c, p->cfg.precision, &p->te, &ls);
    tp_phase_set(phase);
    p->st.t_te_load += MPI_Wtime() - t0;
    p->st.te_bytes_loaded += ls.bytes_read;
    p->st.te_load_seconds += ls.seconds;
    if (!rc && textenc_embed_dim(p->te) != p->info->joint_dim)
        rc = tp_error("the text encoder gives %d features per token but the transformer expects %d (joint_attention_dim)",
                      textenc_embed_dim(p->te), p->info->joint_dim);
    return rc;
}

/* One prompt of a many-prompt encode. */
typedef struct enc_item {
    char *key;                   /* its cache key (NULL: no cache) */
    int hit;                     /* the cache answered on every rank of the group */
    int dup;                     /* an earlier prompt of the call with the same text, else -1 */
    int owner;                   /* the TP group that encodes it (-1: a hit or a duplicate) */
} enc_item;

/* The TP groups of the job group (cfg x sp of them) and this rank's. */
static int tp_groups(const tp_pipe *p) { return p->mesh.cfg * p->mesh.sp; }
static int my_tp_group(const tp_pipe *p) { return p->grank / p->mesh.tp; }

/* FLUX.2 embeds every prompt over max_sequence_length tokens; FLUX.3 over
 * the prompt's own window (its tokens rounded up to the encoder's pad
 * multiple, at most max_sequence_length), which a cached entry gives back
 * by its size. A cached entry counts when it has a length the encoder
 * could have given; every rank of the group must take the same branch (the
 * encoder is collective), so the answers are agreed (one all-reduce). */
static void look_up(tp_pipe *p, int n, const char *const *prompts, enc_item *it) {
    int cap = p->cfg.max_sequence_length, own = p->fam->own_window;
    size_t J = (size_t)p->info->joint_dim;
    int *mine = xcalloc((size_t)n, sizeof *mine);
    for (int i = 0; i < n; i++) {
        it[i].dup = -1, it[i].owner = -1;
        for (int k = 0; k < i && it[i].dup < 0; k++)
            if (!strcmp(prompts[k], prompts[i])) it[i].dup = k;
        /* the embedding depends on the encoder's recipe, the length, the precision and the prompt */
        it[i].key = p->cache ? embed_cache_key(p->fam->text_recipe, cap, p->fam->pad_multiple,
                                               dtype_name(p->cfg.precision), prompts[i])
                             : NULL;
        size_t got = 0;
        const float *cached = it[i].key ? embed_cache_get(p->cache, it[i].key, &got) : NULL;
        int64_t L = cached && got % J == 0 ? (int64_t)(got / J) : 0;
        mine[i] = cached && (own ? L >= 1 && L <= cap : L == cap);
    }
    MPI_Allreduce(MPI_IN_PLACE, mine, n, MPI_INT, MPI_MIN, p->group);
    for (int i = 0; i < n; i++) it[i].hit = mine[i];
    free(mine);
}

/* A copy of the cache's entry for key (the look-up found it on every rank). */
static float *from_cache(tp_pipe *p, const char *key, int64_t *L) {
    size_t got = 0;
    const float *cached = embed_cache_get(p->cache, key, &got);
    float *out = xmalloc(got * sizeof *out);
    memcpy(out, cached, got * sizeof *out);
    *L = (int64_t)(got / (size_t)p->info->joint_dim);
    return out;
}

/* This rank's TP group encodes the prompts it owns, one after another,
 * each agreed inside the TP group (a failure stops the group's list at
 * once; the job group agrees afterwards). The same TP computation as a
 * TP group alone runs, so the embeddings are its bits. */
static int encode_owned(tp_pipe *p, int n, const char *const *prompts, const enc_item *it, float **out, int64_t *L) {
    int cap = p->cfg.max_sequence_length, own = p->fam->own_window, me = my_tp_group(p), rc = 0;
    size_t J = (size_t)p->info->joint_dim;
    for (int i = 0; i < n && !rc; i++) {
        if (it[i].owner != me) continue;
        int win = cap;
        if (own) rc = textenc_window(p->te, prompts[i], cap, &win);
        L[i] = win;
        if (!rc) out[i] = xmalloc((size_t)win * J * sizeof **out);
        if (!rc) rc = textenc_encode(p->te, prompts[i], win, out[i], NULL, NULL);
        rc = dist_agree(p->mesh.tp_comm, rc);
        if (!rc) p->st.prompts_encoded++;
    }
    return rc;
}

/* Each encoded prompt from its TP group's first rank to the whole group. */
static void share_encoded(tp_pipe *p, int n, const enc_item *it, float **out, int64_t *L) {
    size_t J = (size_t)p->info->joint_dim;
    for (int i = 0; i < n; i++) {
        if (it[i].owner < 0) continue;
        int root = it[i].owner * p->mesh.tp;   /* tp innermost: TP group g is group ranks [g*tp, (g+1)*tp) */
        MPI_Bcast(&L[i], 1, MPI_INT64_T, root, p->group);
        if (p->grank != root && !out[i]) out[i] = xmalloc((size_t)L[i] * J * sizeof **out);
        dist_bcast_large(out[i], (size_t)L[i] * J, MPI_FLOAT, sizeof **out, root, p->group);
    }
}

/* count: lookups of requests count as hits and misses; prefetches do not.
 * The misses are dealt out to the job group's TP groups (the k-th on TP
 * group k mod G), which encode at once; a prompt given twice is encoded
 * once and counts as the sequential calls would (a hit when the cache kept
 * the first, else a miss). */
static int encode_set(tp_pipe *p, int n, const char *const *prompts, float **out, int64_t *L, int *hit, int count) {
    double t0 = MPI_Wtime(), te0 = p->st.t_te_load;
    const char *phase = tp_phase_set("encode");
    enc_item *it = xcalloc((size_t)(n > 0 ? n : 1), sizeof *it);
    for (int i = 0; i < n; i++) out[i] = NULL, L[i] = 0;
    look_up(p, n, prompts, it);
    int G = tp_groups(p), misses = 0, mine = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        if (it[i].dup >= 0) continue;
        if (it[i].hit) {   /* copied now: the entries put below may evict it */
            out[i] = from_cache(p, it[i].key, &L[i]);
            if (count) p->st.cache_hits++;
        } else {
            it[i].owner = misses++ % G;
            mine += it[i].owner == my_tp_group(p);
        }
    }
    /* only the TP groups with prompts to encode load the encoder, unless it is kept resident */
    if (misses) rc = agree(p, mine || p->cfg.keep_text_encoder ? load_text_encoder(p) : 0);
    if (!rc && mine) rc = encode_owned(p, n, prompts, it, out, L);
    if (misses) rc = agree(p, rc);
    if (!rc) share_encoded(p, n, it, out, L);
    for (int i = 0; !rc && i < n; i++) {
        if (it[i].owner < 0 || !it[i].key) continue;
        embed_cache_put(p->cache, it[i].key, out[i], (size_t)L[i] * (size_t)p->info->joint_dim);   /* full: only speed */
        if (count) p->st.cache_misses++;
        else p->st.prefetched++;
    }
    for (int i = 0; !rc && i < n; i++) {
        if (it[i].dup < 0) continue;
        /* as a second call would: a hit when the cache still holds it (the same on every rank), else encoded
         * again (here copied) */
        int cached = it[i].key && embed_cache_get(p->cache, it[i].key, &(size_t){0});
        if (cached) out[i] = from_cache(p, it[i].key, &L[i]);
        else {
            int k = it[i].dup;
            size_t nf = (size_t)L[k] * (size_t)p->info->joint_dim;
            out[i] = xmalloc(nf * sizeof **out);
            memcpy(out[i], out[k], nf * sizeof **out);
            L[i] = L[k];
        }
        if (it[i].key && cached && count) p->st.cache_hits++;
        else if (it[i].key && !cached && count) p->st.cache_misses++;
        else if (it[i].key && !cached) p->st.prefetched++;
        it[i].hit = cached;
    }
    for (int i = 0; i < n; i++) {
        if (hit) hit[i] = !rc && it[i].hit;
        if (rc) free(out[i]), out[i] = NULL, L[i] = 0;
        free(it[i].key);
    }
    free(it);
    p->st.t_encode += MPI_Wtime() - t0 - (p->st.t_te_load - te0);   /* the load has its own figure */
    tp_phase_set(phase);
    return rc ? tp_error_context("encoding the prompts") : 0;
}

int tp_pipe_encode_many(tp_pipe *p, int n, const char *const *prompts, float **out, int64_t *L, int *hit) {
    return encode_set(p, n, prompts, out, L, hit, 1);
}

int tp_pipe_encode(tp_pipe *p, const char *prompt, float **out, int64_t *L, int *hit) {
    int64_t len = 0;
    int rc = encode_set(p, 1, &prompt, out, &len, hit, 1);
    if (L) *L = len;
    return rc;
}

int tp_pipe_prefetch_many(tp_pipe *p, int n, const char *const *prompts) {
    if (!p->cache || n < 1) return 0;
    float **tmp = xcalloc((size_t)n, sizeof *tmp);
    int64_t *L = xcalloc((size_t)n, sizeof *L);
    int rc = encode_set(p, n, prompts, tmp, L, NULL, 0);
    for (int i = 0; i < n; i++) free(tmp[i]);
    free(tmp), free(L);
    return rc;
}

int tp_pipe_prefetch(tp_pipe *p, const char *prompt) { return tp_pipe_prefetch_many(p, 1, &prompt); }

void tp_pipe_text_done(tp_pipe *p) {
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
static int load_vae(tp_pipe *p) {
    const tp_pipe_info *g = p->info;
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

int tp_pipe_load(tp_pipe *p) {
    double t0 = MPI_Wtime();
    const char *phase = tp_phase_set("load");
    int rc = 0;
    if (!p->model) {
        load_stats ls = {0};
        struct lora_set *lset = NULL;
        family_load x = {.be = p->be, .c = p->c, .sp = p->sp_comm, .precision = p->cfg.precision, .quantize_fp8 = p->cfg.quantize_fp8,
                         .loras = p->cfg.loras, .n_loras = p->cfg.n_loras, .lora_set_out = &lset};
        rc = p->fam->load(p->info->transformer_dir, &x, &p->model, &ls);
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

void tp_pipe_unload(tp_pipe *p) {
    if (p->model) p->fam->free_model(p->model);
    p->model = NULL;
}

/* ---- one job ---- */

static int count_step(int step, int steps, double seconds, const float *v, const float *x, float sigma, void *ctx) {
    tp_pipe *p = ctx;
    p->st.steps++;
    p->st.step_seconds += seconds;
    return p->user_step ? p->user_step(step, steps, seconds, v, x, sigma, p->user_ctx) : 0;
}

/* The ranks the VAE runs on, patch-parallel (a row band each). Where the
 * backend is rows-invariant (op_rows_invariant: every op gives a pixel the
 * same bits in any band, and the GroupNorm statistics are folded in row
 * order, core/models/vae/vae_band.c), the band count changes no bit, so the
 * whole job group decodes and encodes: a CFG-parallel or SP group gets the
 * serial run's image at the same tp. Elsewhere (the CPU's f32 Winograd
 * route, whose 4x4 tiles start at each call's first row; CUDA, not
 * established) the first TP group of the job group runs it, as the serial
 * run at that tp would, and the other ranks wait. in: this rank takes part. */
static MPI_Comm vae_group(const tp_pipe *p, int *in) {
    *in = p->vae_all || p->grank < p->mesh.tp;
    return p->vae_all ? p->group : p->mesh.tp_comm;
}

/* The job's reference tokens: encoded across the first TP group (the first
 * rank reads the images), then broadcast from the first rank. */
static int job_refs(tp_pipe *p, const tp_job *j, ref_set *rs) {
    memset(rs, 0, sizeof *rs);
    if (!j->n_images) return 0;
    double t0 = MPI_Wtime();
    int rc = p->vae && p->cfg.encoder ? 0 : tp_error("reference images need the VAE encoder, which this pipeline did not load");
    /* what FLUX.3's processor would refuse, on the first rank (the only one that reads the images: a
     * server's uploads are files on it alone) */
    for (int k = 0; !rc && p->fam->check_reference && p->grank == 0 && k < j->n_images; k++) {
        int w = 0, h = 0;
        rc = image_probe(j->images[k], &w, &h) || p->fam->check_reference(j->images[k], w, h, j->n_images) ? -1 : 0;
    }
    if (agree(p, rc)) return -1;
    refs_load_fn load = p->fam->reference_loader(j->n_images);
    /* the VAE's ranks encode (agreed among them), the group agrees, rank 0's tokens go to all below */
    int in;
    MPI_Comm vc = vae_group(p, &in);
    if (agree(p, in ? refs_encode_group_with(p->vae, vc, j->images, j->n_images, load, rs) : 0)) return -1;
    if (p->grank == 0 && p->fam->reference_ids) p->fam->reference_ids(rs);   /* the others get them below */
    int64_t hdr[2] = {rs->R, rs->C};
    MPI_Bcast(hdr, 2, MPI_INT64_T, 0, p->group);
    if (p->grank != 0) {
        rs->R = hdr[0], rs->C = (int)hdr[1], rs->n = j->n_images;
        rs->tokens = xmalloc(sizeof(float) * (size_t)rs->R * (size_t)rs->C);
        rs->ids = xmalloc(sizeof(int32_t) * 4 * (size_t)rs->R);
    }
    dist_bcast_large(rs->tokens, (size_t)rs->R * (size_t)rs->C, MPI_FLOAT, sizeof *rs->tokens, 0, p->group);
    dist_bcast_large(rs->ids, (size_t)rs->R * 4, MPI_INT32_T, sizeof *rs->ids, 0, p->group);
    p->st.t_refs += MPI_Wtime() - t0;
    p->st.refs_encoded += p->grank == 0 ? j->n_images : 0;
    if (rs->C != p->info->cond_in_channels)
        return tp_error("reference tokens have %d channels but the transformer takes %d", rs->C,
                        p->info->cond_in_channels);
    return 0;
}

/* what this rank's communicators have sent (the ring formulas' count) */
static double sent_bytes(const tp_pipe *p) {
    return p->c->sent_bytes + (p->cfg_comm ? p->cfg_comm->sent_bytes : 0) + (p->sp_comm ? p->sp_comm->sent_bytes : 0);
}

static int denoise(tp_pipe *p, const tp_job *j, const ref_set *rs, float *latents) {
    if (!p->model) return tp_error("tp_pipe_render: the transformer is not loaded (call tp_pipe_load)");
    p->user_step = j->on_step;
    p->user_ctx = j->ctx;
    double t0 = MPI_Wtime();
    family_mesh mesh = {.cfg = p->cfg_comm, .group = &p->group};
    double sent0 = sent_bytes(p);
    int rc = p->fam->denoise(p->model, p->info, j, rs, &mesh, count_step, p, latents);
    p->st.comm_bytes += sent_bytes(p) - sent0;
    p->st.t_denoise += MPI_Wtime() - t0;
    int64_t kv_tokens = 0;
    uint64_t kv = p->fam->kv_cache_bytes ? p->fam->kv_cache_bytes(p->model, &kv_tokens) : 0;
    if (kv > p->st.kv_cache_bytes) p->st.kv_cache_bytes = kv, p->st.kv_cache_tokens = kv_tokens;
    return rc;
}

/* What every family needs of a job, before any collective: a library caller's
 * sizes are the buffers' sizes (embeds [L, joint_dim], neg_embeds [Ln or L,
 * joint_dim], latents and init_latents [(H/16)*(W/16), in_channels]), so a
 * bad one is refused here rather than read out of bounds */
static int check_job(const tp_job *j) {
    if (j->width < 16 || j->height < 16 || j->width % 16 || j->height % 16 || j->width > 65536 || j->height > 65536)
        return tp_error("the image size %dx%d must be a multiple of 16 in both directions, from 16 to 65536",
                        j->width, j->height);
    if (!j->embeds || j->L < 1) return tp_error("render: the prompt embeddings and their length L >= 1 are required");
    if (j->Ln < 0 || (j->Ln && !j->neg_embeds))
        return tp_error("render: a negative prompt length Ln = %lld needs negative embeddings of that many tokens "
                        "(Ln = 0: L tokens)", (long long)j->Ln);
    if (j->steps < 1) return tp_error("render: steps must be at least 1 (got %d)", j->steps);
    return 0;
}

int tp_pipe_render(tp_pipe *p, const tp_job *j, float *latents) {
    ref_set rs = {0};
    const char *phase = tp_phase_set("denoise");
    int rc = agree(p, check_job(j));
    if (!rc) rc = agree(p, job_refs(p, j, &rs));
    if (!rc) rc = agree(p, denoise(p, j, &rs, latents));
    refs_free(&rs);
    tp_phase_set(phase);
    return rc;
}

int tp_pipe_decode(tp_pipe *p, const float *latents, int width, int height, uint8_t *rgb, double *seconds) {
    double t0 = MPI_Wtime();
    const char *phase = tp_phase_set("decode");
    int rc = agree(p, p->vae ? 0 : tp_error("decoding needs the VAE decoder, which this rank did not load"));
    int in, vrank = 0;
    MPI_Comm vc = vae_group(p, &in);
    if (!rc && in) rc = vae_decode_packed_group(p->vae, vc, latents, height / 16, width / 16, NULL, rgb);
    if (in) MPI_Comm_rank(vc, &vrank);
    rc = agree(p, rc);
    if (!rc && in && vrank < height / 8) p->st.decode_bands++;   /* a band of the H/8 latent rows (vae_group_pass) */
    tp_phase_set(phase);
    if (seconds) *seconds = MPI_Wtime() - t0;
    return rc;
}
