/* `tpgen generate`, the work, on the pipeline library (core/tp_pipe.h):
 * text encoding (then the encoder is freed), transformer load (each rank
 * its shard), and per job: denoising in lockstep across the TP group, the
 * VAE decode across the group (a row band per rank), then on the group's
 * first rank the latents file and the PNG. */
#include "generate.h"
#include "core/dist/watchdog.h"
#include "kernels/err.h"
#include "core/image/png.h"
#include "core/formats/safetensors.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_state {
    gen_setup *g;
    gen_metrics *m;
    tp_pipe *pipe;
    float **prompt_embeds;       /* per prompt index (NULL: not this group's) */
    int64_t *prompt_L;           /* their lengths (FLUX.3: each prompt's window) */
    int64_t L;                   /* --prompt-embeds: its length */
    float *neg_embeds;           /* CFG */
    int64_t neg_L;
    int job_pos;                 /* position of the current job in this group's list */
    int job, width, height;      /* the current job, for its previews */
    uint8_t *preview_rgb;        /* --preview-every: the decoded preview (group's first rank) */
    char *preview_err;           /* why a preview stopped the job (the loop then reports only "stopped") */
    int preview_err_rank;        /* its agreed rank */
    float *step_latents;         /* --save-step-latents: [steps, N, C] of the current job, else NULL */
    size_t step_n;               /* N * C */
} run_state;

static int agree_tp(run_state *r, int rc) { return dist_agree(r->g->d->grp_comm, rc); }

/* ---- text ---- */

/* Encode the prompts of this group's jobs at positions [first, last) (and
 * the CFG negative prompt once), all in one call: the job group's TP
 * groups encode different prompts at once (tp_pipe_encode_many). The text
 * encoder is freed afterwards, so the transformer gets its memory back. */
static int encode_prompts(run_state *r, int first, int last) {
    gen_setup *g = r->g;
    const run_spec *s = g->spec;
    if (s->prompt_embeds) {      /* read at setup */
        r->L = g->embeds_len;
        return 0;
    }
    int ns = s->n_seeds ? s->n_seeds : 1, n = 0;
    const char **texts = xcalloc((size_t)(last - first) + 1, sizeof *texts);
    int *which = xcalloc((size_t)(last - first) + 1, sizeof *which);   /* prompt index, -1: the negative */
    for (int i = first; i < last; i++) {
        int p = g->my_jobs[i] / ns, seen = 0;
        for (int k = 0; k < n && !seen; k++) seen = which[k] == p;
        if (!r->prompt_embeds[p] && !seen) which[n] = p, texts[n++] = s->prompts[p];
    }
    if (g->use_cfg && !r->neg_embeds && last > first) which[n] = -1, texts[n++] = s->negative_prompt;
    float **out = xcalloc((size_t)n + 1, sizeof *out);
    int64_t *L = xcalloc((size_t)n + 1, sizeof *L);
    int rc = tp_pipe_encode_many(r->pipe, n, texts, out, L, NULL);
    for (int k = 0; !rc && k < n; k++) {
        if (which[k] < 0) r->neg_embeds = out[k], r->neg_L = L[k];
        else r->prompt_embeds[which[k]] = out[k], r->prompt_L[which[k]] = L[k];
    }
    tp_pipe_text_done(r->pipe);
    free(texts), free(which), free(out), free(L);
    return rc;
}

/* Prompt embeddings of a whole batch may not fit in memory (FLUX.2-dev: 31 MB
 * per prompt in f32), so a batch with many prompts runs in chunks: encode a
 * chunk's prompts, load the transformer, render, free, repeat. The budget
 * is TPGEN_EMBED_BUDGET_MB (default 2048 MB) per rank. */
static int chunk_end(const run_state *r, int first) {
    const gen_setup *g = r->g;
    const run_spec *s = g->spec;
    if (s->prompt_embeds) return g->n_my_jobs;
    const char *env = getenv("TPGEN_EMBED_BUDGET_MB");
    double budget = (env && *env ? atof(env) : 2048.0) * 1048576.0;
    double per_prompt = (double)s->max_sequence_length * g->info.joint_dim * sizeof(float);
    long max_prompts = (long)(budget / per_prompt);
    if (max_prompts < 1) max_prompts = 1;
    int ns = s->n_seeds ? s->n_seeds : 1, prev = -1;
    long distinct = 0;
    int i = first;
    for (; i < g->n_my_jobs; i++) {
        int p = g->my_jobs[i] / ns;
        if (p != prev && ++distinct > max_prompts) break;
        prev = p;
    }
    return i;
}

static void free_chunk_embeds(run_state *r, int first, int last) {
    int ns = r->g->spec->n_seeds ? r->g->spec->n_seeds : 1;
    for (int i = first; i < last; i++) {
        int p = r->g->my_jobs[i] / ns;
        free(r->prompt_embeds[p]);
        r->prompt_embeds[p] = NULL;
    }
}

/* ---- one job ---- */

/* --preview-every: after this step, on every rank of the group (the
 * decode is collective), the prediction of the clean image x − σ·v decoded
 * with the VAE (resident with the transformer, so no weights are loaded
 * for it), written by the group's first rank; agreed, so that a write
 * that fails stops every rank of the group at this step. */
static int write_preview(run_state *r, int step, const float *v, const float *x, float sigma) {
    const gen_setup *g = r->g;
    int W = r->width, H = r->height, first = g->d->grp_rank == 0;
    if (first && !r->preview_rgb) r->preview_rgb = xmalloc((size_t)W * H * 3);
    watchdog_phase_set(WD_STARTUP, "decoding a preview");
    double dt = 0;
    int rc = tp_pipe_decode_x0(r->pipe, x, v, sigma, W, H, r->preview_rgb, &dt);
    watchdog_phase_set(WD_STEPS, "denoising");
    r->m->t_preview += dt;
    if (rc) return -1;
    int mine = 0;
    if (first) {
        int box[4];
        if (gen_job_crop(g, r->job, box)) {   /* FLUX.3: cropped back to the reference, as the image is */
            for (int y = 0; y < box[3]; y++)
                memmove(r->preview_rgb + (size_t)y * box[2] * 3, r->preview_rgb + ((size_t)(box[1] + y) * W + box[0]) * 3,
                        (size_t)box[2] * 3);
            W = box[2], H = box[3];
        }
        char *path = runspec_preview_path(g->spec, g->spec->preview, r->job, step);
        mine = path ? png_write_rgb(path, r->preview_rgb, W, H, NULL, NULL) : -1;
        if (!mine) r->m->previews++;
        free(path);
    }
    return agree_tp(r, mine) ? -1 : 0;
}

static int on_step(int step, int steps, double seconds, const float *v, const float *x, float sigma, void *ctx) {
    run_state *r = ctx;
    gen_progress(r->g, r->job_pos, step, steps, seconds);
    int k = r->g->spec->preview_every;
    if (r->step_latents) memcpy(r->step_latents + (size_t)step * r->step_n, x, r->step_n * sizeof *x);
    if (!k || (step + 1) % k || !write_preview(r, step + 1, v, x, sigma)) return 0;
    r->preview_err = xasprintf("the preview after step %d: %s", step + 1, tp_error_body());
    r->preview_err_rank = tp_error_rank();
    return 1;
}

static int save_latents(run_state *r, int job, const float *latents) {
    const run_spec *s = r->g->spec;
    char *path = runspec_output_path(s, s->save_latents, job);
    if (!path) return -1;
    int W, H;
    gen_job_size(r->g, job, &W, &H);
    int64_t N = (int64_t)(H / 16) * (W / 16);
    st_write_tensor t[2] = {
        {.name = "latents", .dtype = DT_F32, .ndim = 3, .shape = {1, N, r->g->info.in_channels}, .data = latents},
        {.name = "step_latents", .dtype = DT_F32, .ndim = 3, .shape = {s->steps, N, r->g->info.in_channels},
         .data = r->step_latents}};
    char hs[16], ws[16], seed[32], steps[16];
    snprintf(hs, sizeof hs, "%d", H);
    snprintf(ws, sizeof ws, "%d", W);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)runspec_job_seed(s, job));
    snprintf(steps, sizeof steps, "%d", s->steps);
    const char *meta[] = {"height", hs, "width", ws, r->g->init_latents ? "initial_latents" : "seed",
                          r->g->init_latents ? r->g->init_desc[job] : seed, "steps", steps, "format",
                          "packed [1, (H/16)*(W/16), C], row-major tokens", NULL};
    double t0 = gen_now();
    int rc = st_write(path, t, r->step_latents ? 2 : 1, meta);
    r->m->t_write += gen_now() - t0;
    if (!rc) r->m->latents++;
    free(path);
    return rc;
}

static int decode_and_write(run_state *r, int job, const float *latents) {
    const run_spec *s = r->g->spec;
    int W, H;
    gen_job_size(r->g, job, &W, &H);
    int first = r->g->d->grp_rank == 0;
    uint8_t *rgb = first ? xmalloc((size_t)W * H * 3) : NULL;
    double dt = 0;
    int rc = tp_pipe_decode(r->pipe, latents, W, H, rgb, &dt);   /* collective, agreed */
    r->m->t_decode += dt;
    if (rc || !first) {
        free(rgb);
        return rc;
    }
    int box[4];
    if (gen_job_crop(r->g, job, box)) {   /* FLUX.3: the padded reference's canvas, cropped back to the reference */
        for (int y = 0; y < box[3]; y++)
            memmove(rgb + (size_t)y * box[2] * 3, rgb + ((size_t)(box[1] + y) * W + box[0]) * 3, (size_t)box[2] * 3);
        W = box[2], H = box[3];
    }
    char *path = runspec_output_path(s, s->output, job);
    if (!path) rc = -1;
    if (!rc) {
        char *params = gen_parameters_text(r->g, job);
        double t0 = gen_now();
        rc = png_write_rgb(path, rgb, W, H, "parameters", params);
        r->m->t_write += gen_now() - t0;
        free(params);
        if (!rc) r->m->images++;
    }
    free(path);
    free(rgb);
    return rc;
}

/* --cache: the job's decisions for --json-metrics and the summary, kept on
 * the group's first rank (every rank of the group has the same record) */
static void record_cache(run_state *r, int job, const bc_log *l) {
    if (r->g->d->grp_rank != 0) return;   /* the job group's first rank (it holds both CFG halves' records) */
    static const char *names[2][2] = {{"double", "single"}, {"double_uncond", "single_uncond"}};
    json_t *o = json_pack("{s:i}", "job", job), *diffs = json_object();
    for (int b = 0; b < l->branches; b++)
        for (int g = 0; g < BC_GROUPS; g++) {
            json_object_set_new(o, names[b][g], json_string(l->dec[b][g]));
            json_t *d = json_array();
            for (int i = 0; i < l->steps; i++)   /* null: no diff measured at that step */
                json_array_append_new(d, l->diff[b][g][i] == l->diff[b][g][i] ? json_real(l->diff[b][g][i]) : json_null());
            json_object_set_new(diffs, names[b][g], d);
            for (const char *p = l->dec[b][g]; *p; p++) r->m->cache_steps[g][*p == 'K']++;
        }
    json_object_set_new(o, "residual_diffs", diffs);
    json_object_set_new(o, "disagreements", json_integer(l->disagreements));
    json_object_set_new(o, "cache_bytes", json_integer((json_int_t)l->peak_bytes));
    free(r->g->cache_json[job]);
    r->g->cache_json[job] = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
}

static int run_job(run_state *r, int job) {
    gen_setup *g = r->g;
    const run_spec *s = g->spec;
    int W, H;
    gen_job_size(g, job, &W, &H);
    size_t n = (size_t)(H / 16) * (W / 16) * (size_t)g->info.in_channels;
    float *latents = xmalloc(n * sizeof *latents);
    int ns = s->n_seeds ? s->n_seeds : 1;
    tp_job j = {
        .seed = runspec_job_seed(s, job), .rng = g->rng, .init_latents = g->init_latents ? g->init_latents[job] : NULL,
        .steps = s->steps, .guidance = s->guidance, .width = W, .height = H,
        .embeds = s->prompt_embeds ? g->embeds : r->prompt_embeds[job / ns],
        .L = s->prompt_embeds ? r->L : r->prompt_L[job / ns],
        .neg_embeds = !g->use_cfg ? NULL : s->prompt_embeds ? g->neg_embeds : r->neg_embeds,
        .Ln = !g->use_cfg ? 0 : s->prompt_embeds ? g->neg_embeds_len : r->neg_L, .on_step = on_step, .ctx = r,
        .cache = g->cache.on ? &g->cache : NULL,
    };
    bc_log cache_log = {0};
    j.cache_log = j.cache ? &cache_log : NULL;
    r->step_n = n;
    r->step_latents = s->save_step_latents && s->save_latents ? xmalloc(n * (size_t)s->steps * sizeof(float)) : NULL;
    j.images = runspec_job_images(s, job, &j.n_images);
    double t0 = gen_now();
    r->job = job, r->width = W, r->height = H;
    watchdog_phase_set(WD_STEPS, "denoising");   /* each step is a progress point (core/pipeline.c) */
    int rc = tp_pipe_render(r->pipe, &j, latents);
    free(r->preview_rgb);
    r->preview_rgb = NULL;
    if (rc && r->preview_err) {   /* the cause, not "denoising stopped", with its one rank prefix */
        tp_error("%s", r->preview_err);
        if (r->preview_err_rank >= 0) tp_error_set_rank(r->preview_err_rank);
    }
    free(r->preview_err);
    r->preview_err = NULL;
    if (!rc && j.cache) record_cache(r, job, &cache_log);
    bc_log_free(&cache_log);
    if (!rc) {
        int mine = 0;
        watchdog_phase_set(WD_STARTUP, "decoding across the group and writing the image on the group's first rank");
        if (g->d->grp_rank == 0 && s->save_latents) mine = save_latents(r, job, latents);   /* the first rank writes */
        rc = agree_tp(r, mine);
        if (!rc && g->write_png) {
            mine = decode_and_write(r, job, latents);   /* decodes on every rank, writes on the first */
            rc = agree_tp(r, mine);
        }
    }
    watchdog_job(gen_now() - t0);
    free(latents);
    free(r->step_latents);
    r->step_latents = NULL;
    if (!rc) r->m->jobs_done++;
    return rc ? tp_error_context("job %d (seed %llu)", job, (unsigned long long)runspec_job_seed(s, job)) : 0;
}

/* One chunk of this group's jobs, positions [first, last). */
static int run_chunk(run_state *r, int first, int last) {
    int rc = 0;
    for (int i = first; i < last && !rc; i++) {
        r->job_pos = i;
        rc = run_job(r, r->g->my_jobs[i]);
    }
    free_chunk_embeds(r, first, last);
    return rc;
}

/* the pipeline's figures into the run's */
static void take_stats(run_state *r) {
    const tp_pipe_stats *st = tp_pipe_get_stats(r->pipe);
    gen_metrics *m = r->m;
    m->t_encode += st->t_encode, m->t_te_load += st->t_te_load, m->t_load += st->t_load, m->t_refs += st->t_refs;
    m->t_denoise += st->t_denoise;
    m->bytes_loaded += st->bytes_loaded, m->load_seconds += st->load_seconds, m->refs_encoded += st->refs_encoded;
    m->prompts_encoded += st->prompts_encoded, m->decode_bands += st->decode_bands;
    m->te_bytes_loaded += st->te_bytes_loaded, m->te_load_seconds += st->te_load_seconds;
    m->steps_total += st->steps, m->step_seconds += st->step_seconds, m->comm_bytes += st->comm_bytes;
    if ((double)st->kv_cache_bytes > m->kv_cache_bytes)
        m->kv_cache_bytes = (double)st->kv_cache_bytes, m->kv_cache_tokens = (double)st->kv_cache_tokens;
    gen_lora_loaded(r->g, st->lora_bytes);
}

int gen_run(gen_setup *g, gen_metrics *m) {
    run_state r = {.g = g, .m = m};
    dist *d = g->d;
    if (g->n_todo_world == 0) return 0;   /* --skip-existing: all there, load nothing */
    const run_spec *s = g->spec;
    tp_pipe_config cfg = {
        .model = s->model, .backend = s->backend, .precision = g->precision, .quantize_fp8 = g->quantize_fp8,
        .loras = s->loras, .n_loras = s->n_loras, .decoder = g->write_png || s->preview_every, .encoder = g->has_refs,
        .max_sequence_length = s->max_sequence_length, .sp = d->sp, .cfg_parallel = d->cfg == 2,
    };
    int rc = dist_agree(d->world, tp_pipe_open(&cfg, &g->info, d->grp_comm, d->local_rank, d->local_size, &r.pipe));
    int np = s->n_prompts ? s->n_prompts : 1;
    r.prompt_embeds = xcalloc((size_t)np, sizeof *r.prompt_embeds);
    r.prompt_L = xcalloc((size_t)np, sizeof *r.prompt_L);
    /* the first chunk runs on every group (maybe empty), so that loading
     * errors are agreed by the whole world before any image is rendered */
    int last = chunk_end(&r, 0);
    watchdog_phase_set(WD_STARTUP, "encoding the prompts");
    if (!rc) rc = dist_agree(d->world, encode_prompts(&r, 0, last));
    watchdog_phase_set(WD_STARTUP, "loading the transformer");
    if (!rc) rc = dist_agree(d->world, tp_pipe_load(r.pipe));
    /* TP groups may have different numbers of jobs and chunks: from here on
     * errors are agreed inside the group, and the world agrees at the end */
    int job_rc = rc ? 0 : run_chunk(&r, 0, last);
    for (int first = last; !rc && !job_rc && first < g->n_my_jobs; first = last) {
        last = chunk_end(&r, first);
        tp_pipe_unload(r.pipe);
        watchdog_phase_set(WD_STARTUP, "encoding the next prompts");
        job_rc = agree_tp(&r, encode_prompts(&r, first, last));
        watchdog_phase_set(WD_STARTUP, "loading the transformer again");
        if (!job_rc) job_rc = agree_tp(&r, tp_pipe_load(r.pipe));
        if (!job_rc) job_rc = run_chunk(&r, first, last);
    }
    watchdog_phase_set(WD_WAIT_GROUPS, "waiting for the other data-parallel groups to finish their jobs");
    if (!rc) rc = dist_agree(d->world, job_rc);
    if (r.pipe) take_stats(&r);
    tp_pipe_free(r.pipe);
    for (int i = 0; i < np; i++) free(r.prompt_embeds[i]);
    free(r.prompt_embeds);
    free(r.prompt_L);
    free(r.neg_embeds);
    return rc;
}
