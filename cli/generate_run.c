/* `tpgen generate`, the work: text encoding (then the encoder is freed),
 * transformer load (each rank its shard), and per job: seeded noise,
 * denoising in lockstep across the TP group, then on the group's first
 * rank the latents file, VAE decode and PNG. */
#include "generate.h"
#include "../core/lora.h"
#include "../core/comm.h"
#include "../core/err.h"
#include "../core/models/textenc.h"
#include "../core/models/vae.h"
#include "../core/pipeline.h"
#include "../core/png.h"
#include "../core/refs.h"
#include "../core/rng.h"
#include "../core/safetensors.h"
#include "../core/schedule.h"
#include "../kernels/ops.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_state {
    gen_setup *g;
    gen_metrics *m;
    backend *be;
    comm *c;
    flux2_model *model;
    vae_model *vae;
    float **prompt_embeds;       /* per prompt index (NULL: not this group's) */
    int64_t L;
    float *neg_embeds;           /* CFG */
    int job_pos;                 /* position of the current job in this group's list */
} run_state;

static int agree_tp(run_state *r, int rc) { return dist_agree(r->g->d->tp_comm, rc); }

/* ---- text ---- */

/* Encode the prompts of this group's jobs at positions [first, last) (and
 * the CFG negative prompt once); the text encoder is loaded for the call
 * and freed again, so the transformer gets its memory back. */
static int encode_prompts(run_state *r, int first, int last) {
    gen_setup *g = r->g;
    const run_spec *s = g->spec;
    if (s->prompt_embeds) {      /* read at setup */
        r->L = g->embeds_len;
        return 0;
    }
    double t0 = gen_now();
    textenc *te = NULL;
    load_stats ls = {0};
    int rc = dist_agree(g->d->tp_comm, textenc_load(s->model, r->be, r->c, g->precision, &te, &ls));
    r->m->bytes_loaded += ls.bytes_read;
    r->m->load_seconds += ls.seconds;
    if (!rc && textenc_embed_dim(te) != g->joint_dim)
        rc = tp_error("the text encoder gives %d features per token but the transformer expects %d (joint_attention_dim)",
                      textenc_embed_dim(te), g->joint_dim);
    r->L = s->max_sequence_length;
    size_t sz = (size_t)r->L * (size_t)g->joint_dim;
    int ns = s->n_seeds ? s->n_seeds : 1;
    for (int i = first; i < last && !rc; i++) {
        int p = g->my_jobs[i] / ns;
        if (r->prompt_embeds[p]) continue;
        r->prompt_embeds[p] = xmalloc(sz * sizeof(float));
        rc = textenc_encode(te, s->prompts[p], (int)r->L, r->prompt_embeds[p], NULL, NULL);
    }
    if (!rc && g->use_cfg && !r->neg_embeds && last > first) {
        r->neg_embeds = xmalloc(sz * sizeof(float));
        rc = textenc_encode(te, s->negative_prompt, (int)r->L, r->neg_embeds, NULL, NULL);
    }
    if (te) textenc_free(te);
    r->m->t_encode += gen_now() - t0;
    return rc ? tp_error_context("encoding the prompts") : 0;
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
    double per_prompt = (double)s->max_sequence_length * g->joint_dim * sizeof(float);
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

/* ---- models ---- */

static int load_transformer(run_state *r) {
    gen_setup *g = r->g;
    double t0 = gen_now();
    load_stats ls = {0};
    struct lora_set *lset = NULL;
    flux2_load_extras x = {.loras = g->spec->loras, .n_loras = g->spec->n_loras, .quantize_fp8 = g->quantize_fp8,
                           .lora_set_out = &lset};
    int rc = flux2_load_ex(g->transformer_dir, r->be, r->c, g->precision, &x, &r->model, &ls);
    gen_lora_loaded(g, lset);
    lora_set_free(lset);
    r->m->bytes_loaded += ls.bytes_read;
    r->m->load_seconds += ls.seconds;
    r->m->t_load += gen_now() - t0;
    return rc ? tp_error_context("loading %s", g->transformer_dir) : 0;
}

static void free_transformer(run_state *r) {
    if (r->model) flux2_free(r->model);
    r->model = NULL;
}

/* the VAE lives on the first rank of each TP group, which writes the PNGs
 * and encodes the reference images */
static int load_vae(run_state *r) {
    gen_setup *g = r->g;
    if (!(g->write_png || g->has_refs) || g->d->tp_rank != 0) return 0;
    double t0 = gen_now();
    int parts = (g->write_png ? VAE_DECODER : 0) | (g->has_refs ? VAE_ENCODER : 0);
    int rc = vae_load_parts(g->vae_dir, r->be, g->precision, parts, &r->vae);
    r->m->t_load += gen_now() - t0;
    if (rc) return tp_error_context("loading %s", g->vae_dir);
    /* the image is (H/16) x (W/16) tokens of in_channels = 4 x latent channels */
    const vae_config *vc = vae_get_config(r->vae);
    if (vae_pixels_per_token(vc) != 16 || 4 * vc->latent_channels != g->in_channels)
        return tp_error("%s does not fit the transformer: %d latent channels and %d pixels per token, the transformer "
                        "needs %d channels (4 x latent channels) and 16 pixels per token", g->vae_dir,
                        vc->latent_channels, vae_pixels_per_token(vc), g->in_channels);
    return 0;
}

/* ---- one job ---- */

float *gen_noise_packed(uint64_t seed, int C, int h, int w) {
    size_t n = (size_t)C * (size_t)h * (size_t)w;
    uint16_t *raw = xmalloc(n * sizeof *raw);
    tp_rng rng;
    rng_seed(&rng, seed);
    rng_randn_bf16(&rng, raw, n);
    float *x = xmalloc(n * sizeof *x);
    for (int c = 0; c < C; c++)
        for (int t = 0; t < h * w; t++) x[(size_t)t * C + c] = bf16_to_f32(raw[(size_t)c * h * w + t]);
    free(raw);
    return x;
}

static int on_step(int step, int steps, double seconds, const float *v, const float *x, void *ctx) {
    run_state *r = ctx;
    r->m->steps_total++;
    r->m->step_seconds += seconds;
    gen_progress(r->g, r->job_pos, step, steps, seconds);
    return 0;
}

/* The job's reference tokens: encoded by the group's first rank (where the
 * VAE is), then broadcast to the group. Collective over the TP group. */
static int job_refs(run_state *r, int job, ref_set *rs) {
    gen_setup *g = r->g;
    memset(rs, 0, sizeof *rs);
    int n = 0;
    char *const *imgs = runspec_job_images(g->spec, job, &n);
    if (!n) return 0;
    double t0 = gen_now();
    int rc = 0;
    if (g->d->tp_rank == 0) rc = refs_encode(r->vae, imgs, n, rs);
    if (agree_tp(r, rc)) return -1;
    int64_t hdr[2] = {rs->R, rs->C};
    MPI_Bcast(hdr, 2, MPI_INT64_T, 0, g->d->tp_comm);
    if (g->d->tp_rank != 0) {
        rs->R = hdr[0], rs->C = (int)hdr[1], rs->n = n;
        rs->tokens = xmalloc(sizeof(float) * (size_t)rs->R * (size_t)rs->C);
        rs->ids = xmalloc(sizeof(int32_t) * 4 * (size_t)rs->R);
    }
    MPI_Bcast(rs->tokens, (int)(rs->R * rs->C), MPI_FLOAT, 0, g->d->tp_comm);
    MPI_Bcast(rs->ids, (int)(rs->R * 4), MPI_INT32_T, 0, g->d->tp_comm);
    r->m->t_refs += gen_now() - t0;
    r->m->refs_encoded += g->d->tp_rank == 0 ? n : 0;
    if (rs->C != g->in_channels)
        return tp_error("reference tokens have %d channels but the transformer takes %d", rs->C, g->in_channels);
    return 0;
}

static int denoise_job(run_state *r, int job, const ref_set *rs, float *latents) {
    gen_setup *g = r->g;
    const run_spec *s = g->spec;
    int W, H;
    gen_job_size(g, job, &W, &H);
    int h = H / 16, w = W / 16, C = g->in_channels;
    int64_t N = (int64_t)h * w;
    float *noise = gen_noise_packed(runspec_job_seed(s, job), C, h, w);
    float *sigmas = xmalloc(sizeof(float) * (size_t)(s->steps + 1)), *ts = xmalloc(sizeof(float) * (size_t)s->steps);
    int32_t *img_ids = xmalloc(sizeof(int32_t) * 4 * (size_t)N), *txt_ids = xmalloc(sizeof(int32_t) * 4 * (size_t)r->L);
    flux2_image_ids(h, w, 0, img_ids);
    flux2_text_ids(r->L, txt_ids);
    int ns = s->n_seeds ? s->n_seeds : 1;
    float gval = (float)s->guidance;
    denoise_params p = {
        .latents = noise, .N = N, .img_ids = img_ids,
        .prompt_embeds = s->prompt_embeds ? g->embeds : r->prompt_embeds[job / ns], .L = r->L, .txt_ids = txt_ids,
        .neg_embeds = g->use_cfg ? r->neg_embeds : NULL, .Ln = r->L, .neg_txt_ids = txt_ids, .cfg_scale = gval,
        .sigmas = sigmas, .steps = s->steps, .guidance = g->embedded_guidance ? &gval : NULL,
        .on_step = on_step, .ctx = r,
        .ref_tokens = rs->R ? rs->tokens : NULL, .R = rs->R, .ref_ids = rs->ids,
        .kv_refs = g->kv_refs, .ref_timestep = 0.0f,
    };
    int rc = schedule_flux2(N, s->steps, sigmas, ts);
    double t0 = gen_now();
    if (!rc) rc = flux2_denoise(r->model, &p, latents);
    r->m->t_denoise += gen_now() - t0;
    free(noise), free(sigmas), free(ts), free(img_ids), free(txt_ids);
    return rc;
}

static int save_latents(run_state *r, int job, const float *latents) {
    const run_spec *s = r->g->spec;
    char *path = runspec_output_path(s, s->save_latents, job);
    if (!path) return -1;
    int W, H;
    gen_job_size(r->g, job, &W, &H);
    int64_t N = (int64_t)(H / 16) * (W / 16);
    st_write_tensor t = {.name = "latents", .dtype = DT_F32, .ndim = 3, .shape = {1, N, r->g->in_channels}, .data = latents};
    char hs[16], ws[16], seed[32], steps[16];
    snprintf(hs, sizeof hs, "%d", H);
    snprintf(ws, sizeof ws, "%d", W);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)runspec_job_seed(s, job));
    snprintf(steps, sizeof steps, "%d", s->steps);
    const char *meta[] = {"height", hs, "width", ws, "seed", seed, "steps", steps, "format", "packed [1, (H/16)*(W/16), C], row-major tokens", NULL};
    double t0 = gen_now();
    int rc = st_write(path, &t, 1, meta);
    r->m->t_write += gen_now() - t0;
    if (!rc) r->m->latents++;
    free(path);
    return rc;
}

static int decode_and_write(run_state *r, int job, const float *latents) {
    const run_spec *s = r->g->spec;
    int W, H;
    gen_job_size(r->g, job, &W, &H);
    int h = H / 16, w = W / 16;
    uint8_t *rgb = xmalloc((size_t)W * H * 3);
    double t0 = gen_now();
    int rc = vae_decode_packed(r->vae, latents, h, w, NULL, rgb);
    r->m->t_decode += gen_now() - t0;
    char *path = rc ? NULL : runspec_output_path(s, s->output, job);
    if (!rc && !path) rc = -1;
    if (!rc) {
        char *params = gen_parameters_text(r->g, job);
        t0 = gen_now();
        rc = png_write_rgb(path, rgb, W, H, "parameters", params);
        r->m->t_write += gen_now() - t0;
        free(params);
        if (!rc) r->m->images++;
    }
    free(path);
    free(rgb);
    return rc;
}

static int run_job(run_state *r, int job) {
    gen_setup *g = r->g;
    int W, H;
    gen_job_size(g, job, &W, &H);
    size_t n = (size_t)(H / 16) * (W / 16) * (size_t)g->in_channels;
    float *latents = xmalloc(n * sizeof *latents);
    ref_set rs;
    int rc = agree_tp(r, job_refs(r, job, &rs));
    if (!rc) rc = agree_tp(r, denoise_job(r, job, &rs, latents));
    refs_free(&rs);
    if (!rc) {
        int mine = 0;
        if (g->d->tp_rank == 0) {   /* the group's first rank writes the files */
            if (g->spec->save_latents) mine = save_latents(r, job, latents);
            if (!mine && g->write_png) mine = decode_and_write(r, job, latents);
        }
        rc = agree_tp(r, mine);
    }
    free(latents);
    if (!rc) r->m->jobs_done++;
    return rc ? tp_error_context("job %d (seed %llu)", job, (unsigned long long)runspec_job_seed(g->spec, job)) : 0;
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

int gen_run(gen_setup *g, gen_metrics *m) {
    run_state r = {.g = g, .m = m};
    dist *d = g->d;
    if (g->n_todo_world == 0) return 0;   /* --skip-existing: all there, load nothing */
    int rc = dist_agree(d->world, backend_select(g->spec->backend, d->local_rank, d->local_size, &r.be));
    if (!rc) {
        r.c = comm_create(d->tp_comm, r.be);
        rc = dist_agree(d->world, r.c ? 0 : -1);
    }
    int np = g->spec->n_prompts ? g->spec->n_prompts : 1;
    r.prompt_embeds = xcalloc((size_t)np, sizeof *r.prompt_embeds);
    /* the first chunk runs on every group (maybe empty), so that loading
     * errors are agreed by the whole world before any image is rendered */
    int last = chunk_end(&r, 0);
    if (!rc) rc = dist_agree(d->world, encode_prompts(&r, 0, last));
    if (!rc) rc = dist_agree(d->world, load_transformer(&r));
    if (!rc) rc = dist_agree(d->world, load_vae(&r));
    /* TP groups may have different numbers of jobs and chunks: from here on
     * errors are agreed inside the group, and the world agrees at the end */
    int job_rc = rc ? 0 : run_chunk(&r, 0, last);
    for (int first = last; !rc && !job_rc && first < g->n_my_jobs; first = last) {
        last = chunk_end(&r, first);
        free_transformer(&r);
        job_rc = agree_tp(&r, encode_prompts(&r, first, last));
        if (!job_rc) job_rc = agree_tp(&r, load_transformer(&r));
        if (!job_rc) job_rc = run_chunk(&r, first, last);
    }
    if (!rc) rc = dist_agree(d->world, job_rc);
    if (r.vae) vae_free(r.vae);
    free_transformer(&r);
    for (int i = 0; i < np; i++) free(r.prompt_embeds[i]);
    free(r.prompt_embeds);
    free(r.neg_embeds);
    if (r.c) comm_destroy(r.c);
    if (r.be) backend_destroy(r.be);
    return rc;
}
