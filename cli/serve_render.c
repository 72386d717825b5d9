/* `tpgen serve`: rendering one request on every rank of a TP group
 * (serve_render.h). A request is a one-job run spec over the server's
 * settings; an edit's uploads become files in a private folder on the
 * group's first rank. */
#include "serve_render.h"
#include "core/rng.h"
#include "core/dist/watchdog.h"
#include "kernels/err.h"
#include "core/image/image.h"
#include "core/image/png.h"
#include "core/image/sha256.h"
#include "core/flux3_pipe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


/* An edit's references on the group's first rank: the uploads written to a
 * private temporary folder (the VAE encoder reads files), probed and
 * checked as generate checks --image files, hashed for the PNG parameters.
 * Errors name the upload, not the folder. */
typedef struct req_refs {
    char dir[64];
    char **paths;
    char (*sha)[65];
    int w, h;                    /* the first reference's processed size */
    int crop[4];                 /* FLUX.3, one reference, no size asked: the PNG cropped back to it */
    int has_crop;
} req_refs;

static void refs_cleanup(req_refs *r, int n) {
    for (int i = 0; r->paths && i < n; i++) {
        if (r->paths[i]) remove(r->paths[i]);
        free(r->paths[i]);
    }
    if (r->dir[0]) rmdir(r->dir);
    free(r->paths);
    free(r->sha);
    memset(r, 0, sizeof *r);
}

/* flux3: FLUX.3's preparation (flux3_pipe.h: none of FLUX.2's checks, its
 * own sizes, a single reference's canvas cropped back), as generate does */
static int refs_prepare(const serve_request *q, int flux3, req_refs *r) {
    const char *tmp = getenv("TMPDIR");
    snprintf(r->dir, sizeof r->dir, "%.40s/tpgen-serve-XXXXXX", tmp && *tmp && strlen(tmp) < 40 ? tmp : "/tmp");
    if (!mkdtemp(r->dir)) {
        r->dir[0] = 0;
        return tp_error("cannot create a temporary folder for the reference images (TMPDIR)");
    }
    r->paths = xcalloc((size_t)q->n_images, sizeof *r->paths);
    r->sha = xcalloc((size_t)q->n_images, sizeof *r->sha);
    for (int k = 0; k < q->n_images; k++) {
        r->paths[k] = xasprintf("%s/%d-%s", r->dir, k + 1, q->image_names[k]);
        int w, h;
        if (file_write_atomic(r->paths[k], q->images[k], q->image_sizes[k]) || image_probe(r->paths[k], &w, &h) ||
            (flux3 ? flux3_check_reference(r->paths[k], w, h, q->n_images) : image_check_reference(r->paths[k], w, h)) ||
            file_sha256(r->paths[k], r->sha[k]))
            return -1;
        uint8_t *rgb = NULL;   /* decoded whole here, so that a truncated file is a bad request */
        int dw, dh;
        if (image_read_rgb(r->paths[k], &rgb, &dw, &dh)) return -1;
        free(rgb);
        if (k == 0 && flux3) {
            flux3_reference_size(w, h, q->n_images, &r->w, &r->h);
            r->has_crop = q->n_images == 1 && !q->width && flux3_reference_crop_box(w, h, r->crop);
        } else if (k == 0) {
            image_reference_size(w, h, &r->w, &r->h);
        }
    }
    return 0;
}

/* tp_error's message with the temporary folder taken out */
static void message_without(const char *dir, char *out, size_t n) {
    const char *m = tp_error_msg();
    size_t dl = strlen(dir), k = 0;
    for (const char *p = m; *p && k + 1 < n;) {
        if (dl && !strncmp(p, dir, dl) && p[dl] == '/') {
            p += dl + 1;
            while (*p >= '0' && *p <= '9') p++;   /* the "K-" of K-name */
            if (*p == '-') p++;
            continue;
        }
        out[k++] = *p++;
    }
    out[k] = 0;
}

/* The steps after which a stream with `partials` partial images shows
 * one: evenly spaced, floor(k·steps / (partials + 1)) for k = 1..partials,
 * never after the last step (that is the completed image) nor twice after
 * one step, so a short render may get fewer (the OpenAI API allows it). */
int serve_partial_step(int step, int steps, int partials) {
    for (int k = 1; k <= partials; k++) {
        int s = (int)((int64_t)k * steps / (partials + 1));
        if (s >= 1 && s < steps && s == step) return 1;
    }
    return 0;
}

/* rgb [H, W] cropped in place to the job's box (FLUX.3's padded single
 * reference); *pw, *ph the size kept */
static void crop_rgb(const gen_setup *gs, uint8_t *rgb, int W, int H, int *pw, int *ph) {
    int box[4];
    *pw = W, *ph = H;
    if (!gen_job_crop(gs, 0, box)) return;
    for (int y = 0; y < box[3]; y++)
        memmove(rgb + (size_t)y * box[2] * 3, rgb + ((size_t)(box[1] + y) * W + box[0]) * 3, (size_t)box[2] * 3);
    *pw = box[2], *ph = box[3];
}

/* A partial image of a streamed job after this step, on every rank of the
 * group (the decode is collective): the prediction of the clean image
 * x − σ·v decoded with the resident VAE, its PNG to the stream. The
 * watchdog allows a decode's time (as for the final decode). */
static int send_partial(serve_ctx *sc, const float *v, const float *x, float sigma) {
    const dist *d = sc->g->d;
    watchdog_phase_set(WD_STARTUP, "decoding a partial image");
    int rc = tp_pipe_decode_x0(sc->pipe, x, v, sigma, sc->width, sc->height, sc->rgb, NULL);
    watchdog_phase_set(WD_STEPS, "rendering a request");
    if (rc) {
        snprintf(sc->preview_err, sizeof sc->preview_err, "decoding a partial image: %s", tp_error_msg());
        sc->preview_failed = 1;
        return -1;
    }
    if (d->grp_rank != 0) return 0;   /* the job group's first rank holds the decoded image */
    int pw, ph;
    uint8_t *png = NULL;
    size_t n = 0;
    crop_rgb(sc->gs, sc->rgb, sc->width, sc->height, &pw, &ph);
    if (png_encode_rgb(sc->rgb, pw, ph, NULL, NULL, &png, &n)) {
        tp_error_clear();   /* only this preview is lost (first rank alone: no agreement needed) */
        return 0;
    }
    serve_ranks_event(sc->ranks, sc->job, 0, sc->image, png, n);
    free(png);
    return 0;
}

/* After every denoising step, on every rank of the group: a streamed
 * job's partial image when this step has one; then the group's first rank
 * decides whether the job goes on (serve_ranks_cancel_wanted; world rank
 * 0 also feeds the other groups there) and the group follows, so that all
 * its ranks stop at the same step. */
static int on_step(int step, int steps, double seconds, const float *v, const float *x, float sigma, void *ctx) {
    (void)seconds;
    serve_ctx *sc = ctx;
    const serve_request *q = &sc->job->req;
    if (q->stream && serve_partial_step(step + 1, steps, q->partial_images) && send_partial(sc, v, x, sigma))
        return 1;   /* the decode's failure is agreed: every rank stops here */
    int why = serve_ranks_cancel_wanted(sc->ranks, sc->job);
    MPI_Bcast(&why, 1, MPI_INT, 0, sc->g->d->grp_comm);
    if (!why) return 0;
    sc->cancelled = why;
    sc->cancelled_step = step + 1;
    sc->cancelled_steps = steps;
    return 1;
}

/* The request as a one-job run spec over the server's (shallow copies:
 * nothing here is freed). */
static void request_spec(const serve_ctx *sc, const serve_request *q, run_spec *rs, gen_setup *gs, char **prompt,
                         uint64_t *seed) {
    const gen_setup *g = sc->g;
    *rs = *g->spec;
    *gs = *g;
    gs->spec = rs;
    *prompt = q->prompt;
    rs->prompts = prompt, rs->n_prompts = 1;
    rs->seeds = seed, rs->n_seeds = 1;
    if (q->steps) rs->steps = q->steps;
    if (q->has_guidance) rs->guidance = q->guidance;
    if (q->width) rs->width = q->width, rs->height = q->height;
    if (q->negative_prompt) rs->negative_prompt = q->negative_prompt;
    if (q->rng && rng_kind_parse(q->rng) >= 0) gs->rng = rng_kind_parse(q->rng);   /* the parser took only torch2, torch1 */
    if (q->cache && bc_spec_parse(q->cache, &gs->cache)) tp_error_clear();   /* the parser checked it: cannot fail */
    gs->cache_json = NULL;
    rs->images = NULL, rs->n_images = 0, rs->prompt_images = NULL;
    gs->prompt_w = gs->prompt_h = NULL;
    gs->prompt_crop = NULL;
    gs->use_cfg = tp_uses_cfg(&g->info, rs->guidance);
}

/* The text encoder was loaded for this request: while it is there, world
 * rank 0's group also encodes the prompts waiting in the queue into the
 * cache (as generate encodes a chunk of prompts per load), so that they do
 * not load it again. Other groups (no queue of their own) skip this. A
 * failure here only costs the cache entries: the waiting requests encode
 * their prompts themselves. Collective over the group. */
enum { PREFETCH_PROMPTS = 8 };
static void encode_queued(serve_ctx *sc) {
    const dist *d = sc->g->d;
    char *prompts[PREFETCH_PROMPTS];
    int n = d->world_rank == 0 && sc->ranks->queue ? serve_queue_peek_prompts(sc->ranks->queue, prompts, PREFETCH_PROMPTS)
                                                   : 0;
    MPI_Bcast(&n, 1, MPI_INT, 0, d->grp_comm);
    for (int i = 0; i < n; i++) {
        int64_t len = d->grp_rank == 0 ? (int64_t)strlen(prompts[i]) : 0;
        MPI_Bcast(&len, 1, MPI_INT64_T, 0, d->grp_comm);
        if (d->grp_rank != 0) prompts[i] = xmalloc((size_t)len + 1);
        MPI_Bcast(prompts[i], (int)len, MPI_CHAR, 0, d->grp_comm);
        prompts[i][len] = 0;
    }
    int rc = tp_pipe_prefetch_many(sc->pipe, n, (const char *const *)prompts);   /* spread over the TP groups */
    if (rc) tp_error_clear();   /* agreed inside the group; each waiting request will encode its own */
    for (int i = 0; i < n; i++) free(prompts[i]);
}

/* What can be refused from the request alone (the same answer on every
 * rank, before anything collective): -1 with e filled (400). */
static int check_request(const serve_ctx *sc, const serve_request *q, const run_spec *rs, const gen_setup *gs,
                         serve_error *e) {
    const gen_setup *g = sc->g;
    const char *prec = g->precision == DT_F32 ? "f32" : "bf16";
    if (q->precision && strcmp(q->precision, prec)) {
        serve_error_set(e, 400, "invalid_request_error", "precision",
                        "this server runs %s; start one with --precision %s for %s requests", prec, q->precision,
                        q->precision);
        return -1;
    }
    if (rs->width % 16 || rs->height % 16) {
        serve_error_set(e, 400, "invalid_request_error", "size", "the size %dx%d must be a multiple of 16",
                        rs->width, rs->height);
        return -1;
    }
    if (q->n_images && !sc->has_encoder) {
        serve_error_set(e, 400, "invalid_request_error", "image",
                        "this model's VAE has no encoder (encoder.conv_in.weight), so it cannot take reference images");
        return -1;
    }
    /* a request's cache spec was checked by the parser; here against the model's block groups */
    const char *groups[2] = {"double blocks", "single blocks"}, *groups3[2] = {"mode blocks", "single blocks"};
    if (bc_spec_check_model(&gs->cache, g->info.n_blocks[0], g->info.n_blocks[1],
                            model_family_is_flux3(g->info.family) ? groups3 : groups)) {
        serve_error_set(e, 400, "invalid_request_error", "cache", "%s", tp_error_msg());
        tp_error_clear();
        return -1;
    }
    if (q->n_images && g->info.kv_refs && gs->use_cfg) {
        serve_error_set(e, 400, "invalid_request_error", "guidance",
                        "this Flux2KleinKVPipeline runs its KV-cached references without CFG; use guidance 1");
        return -1;
    }
    return 0;
}

static void render(void *ctx, const serve_request *q, serve_job *out) {
    serve_ctx *sc = ctx;
    const gen_setup *g = sc->g;
    const dist *d = g->d;
    run_spec rs;
    gen_setup gs;
    char *prompt;
    uint64_t seed = q->seed;
    request_spec(sc, q, &rs, &gs, &prompt, &seed);
    sc->job = out;
    sc->cancelled = 0;
    sc->preview_failed = 0;
    sc->gs = &gs;
    if (check_request(sc, q, &rs, &gs, &out->err)) {
        out->status = 400;
        return;
    }
    /* the references, on the group's first rank; the group agrees, and learns the output size */
    req_refs refs = {0};
    if (q->n_images) {
        int bad = d->grp_rank == 0 ? refs_prepare(q, model_family_is_flux3(g->info.family), &refs) : 0;
        if (dist_agree(d->grp_comm, bad)) {
            char msg[sizeof out->err.message];
            message_without(refs.dir, msg, sizeof msg);
            refs_cleanup(&refs, q->n_images);
            serve_error_set(&out->err, 400, "invalid_request_error", "image", "%s", msg);
            out->status = 400;
            return;
        }
        int wh[2] = {refs.w, refs.h};
        MPI_Bcast(wh, 2, MPI_INT, 0, d->grp_comm);
        if (!q->width) rs.width = wh[0], rs.height = wh[1];   /* diffusers: the first reference's size */
        if (refs.has_crop) gs.prompt_crop = &refs.crop;      /* rank 0 writes the PNG, and only it needs the box */
        /* the PNG parameters name the uploads and their sha256 */
        rs.images = q->image_names, rs.n_images = q->n_images;
        gs.ref_files = q->image_names, gs.n_ref_files = q->n_images, gs.ref_sha256 = refs.sha;
    }
    const tp_pipe_stats *st = tp_pipe_get_stats(sc->pipe);
    double t_enc = st->t_encode + st->t_te_load, t_den = st->t_denoise, s_steps = st->step_seconds;
    int n_steps = st->steps;
    uint64_t hits = st->cache_hits, misses = st->cache_misses;
    /* the prompt and, with CFG, the negative prompt: on two TP groups at once when the group has them */
    const char *texts[2] = {prompt, rs.negative_prompt};
    float *embs[2] = {NULL, NULL};
    int64_t lens[2] = {0, 0};
    int rc = tp_pipe_encode_many(sc->pipe, gs.use_cfg ? 2 : 1, texts, embs, lens, NULL);
    float *emb = embs[0], *neg = embs[1];
    int64_t L = lens[0], Ln = lens[1];
    if (!rc && st->cache_misses > misses) encode_queued(sc);
    tp_pipe_text_done(sc->pipe);
    int W = rs.width, H = rs.height;
    size_t nlat = (size_t)(H / 16) * (W / 16) * (size_t)g->info.in_channels;
    float *lat = xmalloc(nlat * sizeof(float));
    uint8_t *rgb = d->grp_rank == 0 ? xmalloc((size_t)W * H * 3) : NULL;
    double t_dec = 0;
    int block_steps[2][2] = {{0, 0}, {0, 0}};
    if (!rc) {
        out->pngs = xcalloc((size_t)q->n, sizeof *out->pngs);
        out->png_sizes = xcalloc((size_t)q->n, sizeof *out->png_sizes);
    }
    sc->width = W, sc->height = H, sc->rgb = rgb;
    for (int k = 0; k < q->n && !rc; k++) {
        seed = q->seed + (uint64_t)k;
        sc->image = k;
        tp_job j = {.seed = seed, .rng = gs.rng, .steps = rs.steps, .guidance = rs.guidance, .width = W, .height = H,
                       .embeds = emb, .L = L, .neg_embeds = neg, .Ln = Ln, .on_step = on_step, .ctx = sc,
                       .images = refs.paths ? refs.paths : q->image_names, .n_images = q->n_images,
                       .cache = gs.cache.on ? &gs.cache : NULL};
        bc_log cache_log = {0};
        j.cache_log = j.cache ? &cache_log : NULL;
        watchdog_phase_set(WD_STEPS, "rendering a request");   /* each step is a progress point */
        serve_ranks_beat(sc->ranks);   /* world rank 0's heartbeat carries the new bound */
        rc = tp_pipe_render(sc->pipe, &j, lat);
        for (int b = 0; !rc && b < cache_log.branches; b++)   /* for /metrics: the block-group steps */
            for (int gr = 0; gr < 2; gr++)
                for (const char *p = cache_log.dec[b][gr]; *p; p++) block_steps[gr][*p == 'K']++;
        bc_log_free(&cache_log);
        if (rc) break;
        watchdog_phase_set(WD_STARTUP, "decoding a request's image");
        serve_ranks_beat(sc->ranks);   /* world rank 0's heartbeat carries the new bound */
        double dt = 0;
        int mine = tp_pipe_decode(sc->pipe, lat, W, H, rgb, &dt);   /* every rank decodes a band */
        t_dec += dt;
        if (!mine && d->grp_rank == 0) {
            char *params = gen_parameters_text(&gs, 0);
            int pw, ph;
            crop_rgb(&gs, rgb, W, H, &pw, &ph);   /* FLUX.3: the padded reference's canvas, cropped back to it */
            if (!mine) mine = png_encode_rgb(rgb, pw, ph, "parameters", params, &out->pngs[k], &out->png_sizes[k]);
            free(params);
            if (!mine) out->n_pngs++;
            if (!mine) serve_ranks_event(sc->ranks, out, 1, k, out->pngs[k], out->png_sizes[k]);   /* a stream's completed event */
        }
        rc = dist_agree(d->grp_comm, mine);
    }
    free(emb), free(neg), free(lat), free(rgb);
    if (q->n_images) refs_cleanup(&refs, q->n_images);
    out->timing = (serve_timing){
        .steps = st->steps - n_steps, .step_seconds = st->step_seconds - s_steps,
        .encode_seconds = st->t_encode + st->t_te_load - t_enc, .denoise_seconds = st->t_denoise - t_den, .decode_seconds = t_dec,
        .cache_hit = st->cache_hits > hits ? 1 : g->info.has_text_encoder ? 0 : -1,
        .block_steps = {{block_steps[0][0], block_steps[0][1]}, {block_steps[1][0], block_steps[1][1]}},
    };
    if (rc && sc->cancelled) {   /* nobody waits for it: the answer goes nowhere, or says why */
        tp_error_clear();
        serve_job_free_result(out);
        out->timing.cancelled = 1;
        out->status = sc->cancelled;
        if (sc->cancelled == 504)
            serve_error_set(&out->err, 504, "server_error", NULL,
                            "the request ran past this server's --request-timeout; stopped at step %d of %d",
                            sc->cancelled_step, sc->cancelled_steps);
        else
            serve_error_set(&out->err, 499, "invalid_request_error", NULL,
                            "the client closed the connection; stopped at step %d of %d", sc->cancelled_step,
                            sc->cancelled_steps);
        if (d->world_rank == 0 || d->grp_rank == 0)
            fprintf(stderr, "tpgen: serve: request %llu cancelled at step %d of %d (%s)\n", (unsigned long long)out->id,
                    sc->cancelled_step, sc->cancelled_steps, sc->cancelled == 504 ? "--request-timeout" : "client gone");
        return;
    }
    if (rc) {
        serve_job_free_result(out);
        out->status = 500;
        serve_error_set(&out->err, 500, "server_error", NULL, "rendering failed: %s",
                        sc->preview_failed ? sc->preview_err : tp_error_msg());
        if (d->world_rank == 0) fprintf(stderr, "tpgen: serve: request %llu failed: %s\n", (unsigned long long)out->id,
                                        tp_error_msg());
        return;
    }
    out->status = 200;
}

/* the watchdog watches a request from its first collective to its last;
 * waiting for the next one is not progress */
void serve_render(void *ctx, const serve_request *q, serve_job *out) {
    watchdog_phase_set(WD_STARTUP, "encoding a request's prompts");
    serve_ranks_beat(((serve_ctx *)ctx)->ranks);   /* world rank 0's heartbeat carries the new bound */
    render(ctx, q, out);
    watchdog_phase_set(WD_OFF, "waiting for requests");
}

