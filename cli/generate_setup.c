/* `tpgen generate`, setup: the model family and its defaults, and every
 * check that can fail before heavy work starts (see generate.h). */
#include "generate.h"
#include "commands.h"
#include "core/formats/checkpoint.h"
#include "kernels/err.h"
#include "core/image/sha256.h"
#include "core/image/image.h"
#include "core/formats/safetensors.h"
#include "core/models/flux2/flux2.h"
#include "core/flux3_pipe.h"
#include "core/models/llm/textenc.h"
#include "core/rng.h"
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* what names the model in messages and PNG parameters: the folder, else the transformer file */
static const char *gen_model_name(const run_spec *s) { return s->model ? s->model : s->transformer; }

/* the model folder: family, sizes, components (core/tp_pipe.c) */
static int read_model(gen_setup *g, const run_spec *s) {
    char warning[1024];
    flux2_components c = {.model = s->model, .transformer = s->transformer, .text_encoder = s->text_encoder,
                          .vae = s->vae, .family = s->family};
    if (tp_pipe_probe_components(&c, &g->info, warning, sizeof warning)) return -1;
    /* a tokenizer is needed for prompts: found now, before any weight is read */
    if (s->n_prompts && g->info.has_text_encoder) {
        textenc_source src = tp_pipe_text_source(&g->info);
        char *tok = textenc_tokenizer_dir(&src);
        if (!tok) return tp_error_context("--text-encoder %s", g->info.te_path);
        free(tok);
    }
    if (warning[0] && g->d->world_rank == 0) fprintf(stderr, "tpgen: warning: %s\n", warning);
    return 0;
}

/* Every reference image of the run, before any weight is read: each
 * distinct file is probed (readable, PNG/JPEG, size limit, diffusers' side
 * and aspect checks) and hashed; the ranks that will encode it (each TP
 * group's first) also decode it whole, so that a truncated file fails
 * here. The output size of a prompt with references and no --width/--height
 * is its first reference's processed size (diffusers: height = height or
 * image_height). */
static int check_references(gen_setup *g, const run_spec *s, int width_given, int height_given) {
    int np = s->n_prompts ? s->n_prompts : 1;
    g->prompt_w = xmalloc(sizeof(int) * (size_t)np);
    g->prompt_h = xmalloc(sizeof(int) * (size_t)np);
    g->prompt_crop = xcalloc((size_t)np, sizeof *g->prompt_crop);
    int flux3 = model_family_is_flux3(g->info.family);
    for (int p = 0; p < np; p++) {
        int n = 0;
        char *const *imgs = runspec_prompt_images(s, p, &n);
        int first = -1;
        for (int k = 0; k < n; k++) {
            int idx = gen_ref_index(g, imgs[k]);
            if (idx < 0) {
                int w, h;
                /* diffusers' FLUX.2 checks (sides >= 64, aspect <= 8); FLUX.3 has none (flux3_check_reference) */
                if (image_probe(imgs[k], &w, &h) || (!flux3 && image_check_reference(imgs[k], w, h))) return -1;
                if (g->d->grp_rank == 0) {
                    uint8_t *rgb = NULL;
                    int dw, dh;
                    if (image_read_rgb(imgs[k], &rgb, &dw, &dh)) return -1;
                    free(rgb);
                }
                idx = g->n_ref_files++;
                g->ref_files = xrealloc(g->ref_files, sizeof *g->ref_files * (size_t)g->n_ref_files);
                g->ref_sha256 = xrealloc(g->ref_sha256, sizeof *g->ref_sha256 * (size_t)g->n_ref_files);
                g->ref_w = xrealloc(g->ref_w, sizeof(int) * (size_t)g->n_ref_files);
                g->ref_h = xrealloc(g->ref_h, sizeof(int) * (size_t)g->n_ref_files);
                g->ref_files[idx] = xstrdup(imgs[k]);
                image_reference_size(w, h, &g->ref_w[idx], &g->ref_h[idx]);
                g->ref_ow = xrealloc(g->ref_ow, sizeof(int) * (size_t)g->n_ref_files);
                g->ref_oh = xrealloc(g->ref_oh, sizeof(int) * (size_t)g->n_ref_files);
                g->ref_ow[idx] = w, g->ref_oh[idx] = h;
                if (file_sha256(imgs[k], g->ref_sha256[idx])) return -1;
            }
            if (flux3 && flux3_check_reference(imgs[k], g->ref_ow[idx], g->ref_oh[idx], n)) return -1;
            if (k == 0) first = idx;
        }
        g->has_refs |= n > 0;
        int rw = first >= 0 ? g->ref_w[first] : s->width, rh = first >= 0 ? g->ref_h[first] : s->height;
        if (flux3 && first >= 0) {   /* FLUX.3: one reference gives its canvas, cropped back when no size is given */
            int ow = g->ref_ow[first], oh = g->ref_oh[first];
            flux3_reference_size(ow, oh, n, &rw, &rh);
            int box[4];   /* the resized reference inside its canvas */
            if (n == 1 && !width_given && !height_given && flux3_reference_crop_box(ow, oh, box))
                memcpy(g->prompt_crop[p], box, sizeof box);
        }
        g->prompt_w[p] = width_given ? s->width : rw;
        g->prompt_h[p] = height_given ? s->height : rh;
    }
    if (!g->has_refs) return 0;
    if (g->info.kv_refs && g->use_cfg)
        return tp_error("%s is a Flux2KleinKVPipeline: its KV-cached references run one pass per step, without CFG; "
                        "use --guidance 1", gen_model_name(s));
    if (!g->info.has_vae)
        return tp_error("reference images need the VAE encoder, but %s has no vae/ folder (vae/config.json)", gen_model_name(s));
    if (g->d->grp_rank == 0) {   /* the VAE file is only opened where the VAE runs */
        checkpoint *ck = NULL;
        if (checkpoint_open(g->info.vae_dir, &ck)) return tp_error_context("checking the VAE for reference images");
        int has = checkpoint_find(ck, "encoder.conv_in.weight", NULL) != NULL;
        checkpoint_close(ck);
        if (!has)
            return tp_error("%s has no encoder (tensor encoder.conv_in.weight is missing), so reference images cannot "
                            "be encoded; use the full AutoencoderKLFlux2 checkpoint", g->info.vae_dir);
    }
    return 0;
}

int gen_ref_index(const gen_setup *g, const char *path) {
    for (int i = 0; i < g->n_ref_files; i++)
        if (!strcmp(g->ref_files[i], path)) return i;
    return -1;
}

int gen_job_crop(const gen_setup *g, int job, int box[4]) {
    const run_spec *s = g->spec;
    int p = job / (s->n_seeds ? s->n_seeds : 1);
    if (!g->prompt_crop || !g->prompt_crop[p][2]) return 0;
    memcpy(box, g->prompt_crop[p], sizeof(int) * 4);
    return 1;
}

void gen_job_size(const gen_setup *g, int job, int *w, int *h) {
    const run_spec *s = g->spec;
    int p = job / (s->n_seeds ? s->n_seeds : 1);
    *w = g->prompt_w ? g->prompt_w[p] : s->width;
    *h = g->prompt_h ? g->prompt_h[p] : s->height;
}

static void apply_defaults(gen_setup *g, run_spec *s) {
    if ((g->info.family == FAMILY_KLEIN_DISTILLED || g->info.family == FAMILY_FLUX3_FLOWMAP) && s->guidance >= 0 &&
        g->d->world_rank == 0)
        fprintf(stderr, "tpgen: note: %s is a guidance-distilled model; --guidance %g is ignored\n", gen_model_name(s), s->guidance);
    if (!s->steps) s->steps = tp_default_steps(&g->info);
    if (s->guidance < 0) s->guidance = tp_default_guidance(&g->info);
    if (!s->width) s->width = 1024;
    if (!s->height) s->height = 1024;
    /* FLUX.3 pads each prompt to its own window, at most 8192 tokens (the modular pipeline's cap) */
    if (!s->max_sequence_length) s->max_sequence_length = tp_default_max_sequence_length(&g->info);
    if (!s->negative_prompt) s->negative_prompt = xstrdup("");
    if (!s->output) s->output = xstrdup(runspec_n_jobs(s) > 1 ? "tpgen-{index:04}-{seed}.png" : "tpgen.png");
    g->use_cfg = tp_uses_cfg(&g->info, s->guidance);
    g->precision = s->precision && !strcmp(s->precision, "f32") ? DT_F32 : DT_BF16;
    g->quantize_fp8 = s->quantize && !strcmp(s->quantize, "fp8");
}

/* FILE[:TENSOR]: the part after the last ':' names a tensor unless the
 * whole argument is an existing file */
static int read_embeds(gen_setup *g, const char *arg, const char *flag, const char *deftensor, float **out,
                       int64_t *len, char **desc) {
    char *file = xstrdup(arg);
    const char *tensor = deftensor;
    char *colon = strrchr(file, ':');
    if (colon && !path_is_file(arg)) {
        *colon = 0;
        tensor = colon + 1;
    }
    st_file *f = NULL;
    int rc = st_open(file, &f);
    const st_tensor_info *t = rc ? NULL : st_find(f, tensor);
    if (!rc && !t) rc = tp_error("%s: %s has no tensor '%s' (name it with FILE:TENSOR)", flag, file, tensor);
    if (!rc) {
        int ok3 = t->ndim == 3 && t->shape[0] == 1, ok2 = t->ndim == 2;
        int64_t L = ok3 ? t->shape[1] : ok2 ? t->shape[0] : 0, J = ok3 ? t->shape[2] : ok2 ? t->shape[1] : 0;
        if ((!ok3 && !ok2) || L < 1)
            rc = tp_error("%s: %s:%s must have shape [1, L, %d] (or [L, %d])", flag, file, tensor, g->info.joint_dim,
                          g->info.joint_dim);
        else if (J != g->info.joint_dim)
            rc = tp_error("%s: %s:%s has %lld features per token but the transformer's "
                          "joint_attention_dim is %d (embeddings from another model?)", flag, file, tensor, (long long)J,
                          g->info.joint_dim);
        else *len = L;
    }
    if (!rc) rc = st_read_f32(f, tensor, out, NULL);
    if (!rc) *desc = xasprintf("%s:%s", file, tensor);
    if (f) st_close(f);
    free(file);
    return rc;
}

/* --initial-latents FILE[:TENSOR]: each job's tensor [1, C, H/16, W/16]
 * (TENSOR expanded per job like --output), finite, packed for the
 * pipeline. Every rank reads the file and takes the same decision. */
static int read_initial_latents(gen_setup *g, const run_spec *s) {
    const char *arg = s->initial_latents;
    char *file = xstrdup(arg);
    const char *pattern = "initial_latents";
    char *colon = strrchr(file, ':');
    if (colon && !path_is_file(arg)) {
        *colon = 0;
        pattern = colon + 1;
    }
    int rc = 0;
    if (!*pattern) rc = tp_error("--initial-latents %s: the tensor name after ':' is empty", arg);
    if (!rc && g->n_jobs > 1 && !runspec_pattern_varies(pattern))
        rc = tp_error("--initial-latents %s: this run has %d jobs, and each needs its own tensor, but '%s' names one for "
                      "all; put a job placeholder in the tensor name, e.g. %s:initial_latents_{index} for tensors "
                      "initial_latents_0 to initial_latents_%d (one per job, in job order: prompt_index x n_seeds + "
                      "seed_index), or run one job per file", arg, g->n_jobs, pattern, file, g->n_jobs - 1);
    st_file *f = NULL;
    if (!rc) rc = st_open(file, &f) ? tp_error_context("--initial-latents") : 0;
    if (!rc) rc = file_sha256(file, g->init_sha256) ? tp_error("--initial-latents: cannot read %s", file) : 0;
    if (!rc) {
        g->init_latents = xcalloc((size_t)g->n_jobs, sizeof *g->init_latents);
        g->init_desc = xcalloc((size_t)g->n_jobs, sizeof *g->init_desc);
    }
    int C = g->info.in_channels;
    for (int j = 0; j < g->n_jobs && !rc; j++) {
        char *name = runspec_output_path(s, pattern, j);
        if (!name) {
            rc = tp_error_context("--initial-latents %s", arg);
            break;
        }
        int w, h;
        gen_job_size(g, j, &w, &h);
        const st_tensor_info *t = st_find(f, name);
        char job[48] = "";
        if (g->n_jobs > 1) snprintf(job, sizeof job, " (job %d)", j);
        if (!t)
            rc = tp_error("--initial-latents: %s has no tensor '%s'%s; name the tensor with FILE:TENSOR (the default is "
                          "'initial_latents')", file, name, job);
        else if (t->ndim != 4 || t->shape[0] != 1 || t->shape[1] != C || t->shape[2] != h / 16 || t->shape[3] != w / 16) {
            char got[128] = "";
            for (int d = 0; d < t->ndim && d < 8; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
            rc = tp_error("--initial-latents: %s:%s%s has shape [%s], but a %dx%d image on this transformer (%d "
                          "channels) starts from [1, %d, %d, %d] (diffusers' prepare_latents shape [1, C, H/16, W/16]); "
                          "give latents made for this size and model, or change --width/--height", file, name, job, got,
                          w, h, C, C, h / 16, w / 16);
        }
        float *v = NULL;
        if (!rc) rc = st_read_f32(f, name, &v, NULL) ? tp_error_context("--initial-latents") : 0;
        size_t n = (size_t)C * (size_t)(h / 16) * (size_t)(w / 16);
        for (size_t i = 0; !rc && i < n; i++)
            if (!isfinite(v[i]))
                rc = tp_error("--initial-latents: %s:%s%s has a non-finite value (%g) at element %zu (channel %zu); "
                              "latents must be finite numbers", file, name, job, v[i], i, i / (n / (size_t)C));
        if (!rc) {
            g->init_latents[j] = flux2_latents_pack(v, C, h / 16, w / 16);
            g->init_desc[j] = xasprintf("%s:%s", file, name);
        }
        free(v);
        free(name);
    }
    if (f) st_close(f);
    free(file);
    return rc;
}

static int check_parent_dir(const char *path, const char *what) {
    const char *slash = strrchr(path, '/');
    if (!slash) return 0;
    char *dir = slash == path ? xstrdup("/") : xasprintf("%.*s", (int)(slash - path), path);
    int ok = path_is_dir(dir);
    int rc = ok ? 0 : tp_error("%s %s: the directory %s does not exist (create it first)", what, path, dir);
    free(dir);
    return rc;
}

static int check_outputs(gen_setup *g, const run_spec *s) {
    for (int j = 0; j < g->n_jobs; j++) {
        if (g->write_png) {
            char *p = runspec_output_path(s, s->output, j);
            int rc = p ? check_parent_dir(p, "--output") : -1;
            free(p);
            if (rc) return -1;
        }
        if (s->save_latents) {
            char *p = runspec_output_path(s, s->save_latents, j);
            int rc = p ? check_parent_dir(p, "--save-latents") : -1;
            free(p);
            if (rc) return -1;
        }
        if (s->preview) {
            char *p = runspec_preview_path(s, s->preview, j, s->preview_every);
            int rc = p ? check_parent_dir(p, "--preview") : -1;
            free(p);
            if (rc) return -1;
        }
    }
    if (s->json_metrics && check_parent_dir(s->json_metrics, "--json-metrics")) return -1;
    return 0;
}

/* --cache: parsed and checked against the transformer's block groups
 * before anything is loaded (every rank reads the same config: the same
 * answer everywhere) */
static int setup_cache(gen_setup *g, const run_spec *s) {
    if (bc_spec_parse(s->cache, &g->cache)) return -1;
    int flux3 = model_family_is_flux3(g->info.family);
    const char *flux2_names[2] = {"double blocks", "single blocks"}, *flux3_names[2] = {"mode blocks", "single blocks"};
    if (bc_spec_check_model(&g->cache, g->info.n_blocks[0], g->info.n_blocks[1], flux3 ? flux3_names : flux2_names))
        return tp_error_context("%s", gen_model_name(s));
    if (g->cache.on) g->cache_json = xcalloc((size_t)(runspec_n_jobs(s) ? runspec_n_jobs(s) : 1), sizeof(char *));
    return 0;
}

/* the degrees that would work: those of "tp x sp" dividing the heads */
static void fitting_degrees(int heads, int tp, char *out, size_t n) {
    size_t at = 0;
    out[0] = 0;
    for (int sp = 1; sp <= heads / tp && at + 16 < n; sp++)
        if (heads % (tp * sp) == 0) at += (size_t)snprintf(out + at, n - at, "%s%d", at ? ", " : "", sp);
}

/* The mesh against the model, before any weight is read (the same verdict
 * on every rank): each TP rank of an SP group takes heads / (tp x sp)
 * heads of the all-to-all, and CFG parallelism needs two predictions. */
static int check_mesh(gen_setup *g, const run_spec *s) {
    const dist *d = g->d;
    int H = g->info.heads;
    if (d->cfg == 2 && !g->use_cfg)
        return tp_error("--cfg-parallel runs the two CFG predictions of each step on two halves of the ranks, but %s "
                        "(%s) %s one prediction a step: drop --cfg-parallel%s", gen_model_name(s),
                        g->info.family_name, g->info.embedded_guidance ? "embeds its guidance and runs"
                        : g->info.family == FAMILY_KLEIN_BASE || g->info.family == FAMILY_FLUX3_BASE
                            ? "at this guidance runs" : "is guidance-distilled and runs",
                        g->info.family == FAMILY_KLEIN_BASE || g->info.family == FAMILY_FLUX3_BASE
                            ? " or use a guidance that turns CFG on" : "");
    if (H > 0 && H % (d->tp * d->sp)) {
        char fits[128];
        fitting_degrees(H, d->tp, fits, sizeof fits);
        return tp_error("tp %d x sp %d = %d does not divide num_attention_heads %d of %s (each rank takes heads / "
                        "(tp x sp) of them around attention): %s%s%s", d->tp, d->sp, d->tp * d->sp, H,
                        gen_model_name(s), *fits ? "with this tp, --sp " : "use a --tp that divides the heads",
                        fits, *fits ? " would work" : "");
    }
    return 0;
}

int gen_setup_init(gen_setup *g, run_spec *s, dist *d) {
    memset(g, 0, sizeof *g);
    g->spec = s;
    g->d = d;
    if (read_model(g, s)) return -1;
    int width_given = s->width != 0, height_given = s->height != 0;
    apply_defaults(g, s);
    g->write_png = g->info.has_vae && !s->no_decode;
    if (s->preview_every && !g->info.has_vae)
        return tp_error("--preview-every decodes previews with the VAE, and %s has none (vae/config.json); pass --vae PATH",
                        gen_model_name(s));
    if (s->n_prompts && !g->info.has_text_encoder)
        return tp_error("%s has no text encoder (text_encoder/), so --prompt cannot be used; pass --text-encoder "
                        "PATH, or precomputed embeddings with --prompt-embeds FILE[:TENSOR] (e.g. from 'tpgen encode' "
                        "on a full model)", gen_model_name(s));
    if (!g->write_png && !s->save_latents)
        return tp_error("%s has no VAE (vae/config.json), so no PNG can be written; pass --vae PATH, or add "
                        "--save-latents FILE to keep the final latents (tpgen decode can turn them into an image "
                        "later)", gen_model_name(s));
    int flux3 = model_family_is_flux3(g->info.family);
    if (flux3 && g->use_cfg && s->prompt_embeds && !s->negative_prompt_embeds)
        return tp_error("%s is a FLUX.3 base model: guidance %.3g means CFG, which needs negative embeddings; add "
                        "--negative-prompt-embeds FILE[:TENSOR], or --guidance 1 to turn CFG off", gen_model_name(s),
                        s->guidance);
    if (!flux3 && g->use_cfg && s->prompt_embeds && !s->negative_prompt_embeds)
        return tp_error("%s is a klein base model: guidance %.3g means CFG, which needs negative embeddings with "
                        "--prompt-embeds; add --negative-prompt-embeds FILE[:TENSOR], use --prompt instead (the text "
                        "encoder embeds the negative prompt), or --guidance 1 to turn CFG off",
                        gen_model_name(s), s->guidance);
    if (setup_cache(g, s)) return -1;
    if (s->width % 16 || s->height % 16)
        return tp_error("the image size %dx%d must be a multiple of 16 in both directions", s->width, s->height);
    if (check_mesh(g, s)) return -1;
    g->n_jobs = runspec_n_jobs(s);
    if (check_outputs(g, s)) return -1;
    if (check_references(g, s, width_given, height_given)) return -1;
    if (s->prompt_embeds && read_embeds(g, s->prompt_embeds, "--prompt-embeds", "prompt_embeds", &g->embeds,
                                        &g->embeds_len, &g->embeds_desc))
        return -1;
    if (s->negative_prompt_embeds && g->use_cfg &&
        read_embeds(g, s->negative_prompt_embeds, "--negative-prompt-embeds", "negative_prompt_embeds", &g->neg_embeds,
                    &g->neg_embeds_len, &g->neg_embeds_desc))
        return -1;
    g->rng = rng_kind_parse(s->rng ? s->rng : "torch2");
    if (g->rng < 0) return tp_error("--rng %s: expected torch2 or torch1", s->rng);
    if (s->initial_latents && read_initial_latents(g, s)) return -1;
    if (gen_lora_setup(g)) return -1;
    g->my_jobs = xmalloc(sizeof(int) * (size_t)(g->n_jobs ? g->n_jobs : 1));
    g->n_my_jobs = runspec_group_jobs(g->n_jobs, d->dp, d->dp_rank, g->my_jobs);
    g->n_todo_world = g->n_jobs;
    return 0;
}

/* every output of the job is there (a directory of that name is not) */
static int job_outputs_exist(const gen_setup *g, int job) {
    const run_spec *s = g->spec;
    const char *pats[2] = {g->write_png ? s->output : NULL, s->save_latents};
    for (int i = 0; i < 2; i++) {
        if (!pats[i]) continue;
        char *p = runspec_output_path(s, pats[i], job);   /* checked at setup: cannot fail */
        int there = p && path_is_file(p);
        free(p);
        if (!there) return 0;
    }
    return 1;
}

int gen_skip_existing(gen_setup *g) {
    dist *d = g->d;
    if (g->spec->skip_existing) {
        char *done = xcalloc((size_t)(g->n_my_jobs ? g->n_my_jobs : 1), 1);
        if (d->grp_rank == 0)
            for (int i = 0; i < g->n_my_jobs; i++) done[i] = (char)job_outputs_exist(g, g->my_jobs[i]);
        if (g->n_my_jobs) MPI_Bcast(done, g->n_my_jobs, MPI_CHAR, 0, d->grp_comm);
        int k = 0;
        for (int i = 0; i < g->n_my_jobs; i++)
            if (!done[i]) g->my_jobs[k++] = g->my_jobs[i];
        g->n_skipped = g->n_my_jobs - k;
        g->n_my_jobs = k;
        free(done);
    }
    /* each group counted once, by its first rank */
    int todo = d->grp_rank == 0 ? g->n_my_jobs : 0;
    MPI_Allreduce(&todo, &g->n_todo_world, 1, MPI_INT, MPI_SUM, d->world);
    return 0;
}

void gen_setup_free(gen_setup *g) {
    tp_pipe_info_free(&g->info);
    free(g->embeds);
    free(g->embeds_desc);
    free(g->neg_embeds);
    free(g->neg_embeds_desc);
    free(g->my_jobs);
    for (int j = 0; g->cache_json && j < g->n_jobs; j++) free(g->cache_json[j]);
    free(g->cache_json);
    for (int j = 0; g->init_latents && j < g->n_jobs; j++) free(g->init_latents[j]);
    for (int j = 0; g->init_desc && j < g->n_jobs; j++) free(g->init_desc[j]);
    free(g->init_latents);
    free(g->init_desc);
    gen_lora_free(g);
    for (int i = 0; i < g->n_ref_files; i++) free(g->ref_files[i]);
    free(g->ref_files);
    free(g->ref_sha256);
    free(g->ref_w);
    free(g->ref_h);
    free(g->ref_ow);
    free(g->ref_oh);
    free(g->prompt_crop);
    free(g->prompt_w);
    free(g->prompt_h);
    memset(g, 0, sizeof *g);
}

char *gen_parameters_text(const gen_setup *g, int job) {
    const run_spec *s = g->spec;
    const char *prompt = runspec_job_prompt(s, job);
    char guidance[96];
    if (g->info.embedded_guidance) snprintf(guidance, sizeof guidance, "%g (embedded)", s->guidance);
    else if (g->use_cfg) snprintf(guidance, sizeof guidance, "%g (CFG)", s->guidance);
    else snprintf(guidance, sizeof guidance, "none (distilled)");
    char *neg = !g->use_cfg ? xstrdup("")
                : g->neg_embeds_desc ? xasprintf("negative_prompt_embeds: %s\n", g->neg_embeds_desc)
                                     : xasprintf("negative_prompt: %s\n", s->negative_prompt);
    char *loras = gen_lora_parameters(g);
    /* the references: one line each, path and sha256 */
    int nref = 0;
    char *const *imgs = runspec_job_images(s, job, &nref);
    char *refs = xstrdup("");
    for (int k = 0; k < nref; k++) {
        int idx = gen_ref_index(g, imgs[k]);
        char *t = xasprintf("%sreference %d: %s (sha256 %s)\n", refs, k + 1, imgs[k], idx >= 0 ? g->ref_sha256[idx] : "?");
        free(refs);
        refs = t;
    }
    int w, h, box[4];
    gen_job_size(g, job, &w, &h);
    char size[96];   /* FLUX.3: the PNG's size, and the canvas it was generated at when cropped back */
    if (gen_job_crop(g, job, box)) snprintf(size, sizeof size, "%dx%d (generated at %dx%d, cropped back to the reference)",
                                            box[2], box[3], w, h);
    else snprintf(size, sizeof size, "%dx%d", w, h);
    /* single components replacing (or making up) the pipeline: each one named */
    if (s->transformer || s->text_encoder || s->vae) {
        char *t = xasprintf("%scomponents:%s%s%s%s%s%s\n", loras, s->transformer ? " transformer " : "",
                            s->transformer ? s->transformer : "", s->text_encoder ? " text_encoder " : "",
                            s->text_encoder ? s->text_encoder : "", s->vae ? " vae " : "", s->vae ? s->vae : "");
        free(loras);
        loras = t;
    }
    /* the start: the seed (and whose draw when not the default), or the latents file and its sha256 */
    char *start = g->init_latents ? xasprintf("initial_latents: %s (sha256 %s)", g->init_desc[job], g->init_sha256)
                  : g->rng == TP_RNG_TORCH1 ? xasprintf("seed: %llu\nrng: torch1", (unsigned long long)runspec_job_seed(s, job))
                                            : xasprintf("seed: %llu", (unsigned long long)runspec_job_seed(s, job));
    /* block caching: the spec, only when on (an uncached PNG's text is as before) */
    char *spec = g->cache.on ? bc_spec_format(&g->cache) : NULL;
    char *cache = spec ? xasprintf("cache: %s\n", spec) : xstrdup("");
    free(spec);
    /* the mesh beyond TP (the same image as the serial run at this tp; docs/parallel.md) */
    char mesh[96] = "";
    if (g->d->sp > 1 || g->d->cfg > 1)
        snprintf(mesh, sizeof mesh, "mesh: cfg %d x sp %d x tp %d\n", g->d->cfg, g->d->sp, g->d->tp);
    char *txt = xasprintf("prompt: %s\n%sprompt_embeds: %s\n%s%s\nsteps: %d\n%sguidance: %s\nsize: %s\n"
                          "model: %s (%s)\n%stp: %d\n%sprecision: %s\ntpgen: %s\n",
                          prompt ? prompt : "(precomputed embeddings)", neg, g->embeds_desc ? g->embeds_desc : "none",
                          refs, start, s->steps, cache, guidance, size,
                          gen_model_name(s), g->info.family_name, loras, g->d->tp, mesh,
                          g->precision == DT_F32 ? (g->quantize_fp8 ? "f32, fp8 weights (--quantize)" : "f32")
                          : g->quantize_fp8 ? "bf16, fp8 weights (--quantize)" : "bf16",
                          TPGEN_VERSION);
    free(cache);
    free(neg);
    free(refs);
    free(loras);
    free(start);
    return txt;
}
