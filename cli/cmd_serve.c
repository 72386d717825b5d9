/* `mpirun -np N tpgen serve --model DIR`: a resident image server. The
 * model is loaded once (each rank its shard, as generate does) and requests
 * arriving over HTTP on world rank 0 (cli/serve_http.c, the OpenAI images
 * API) are queued (cli/serve_queue.c) and rendered by the TP groups in
 * lockstep (cli/serve_ranks.c) on the pipeline library (core/flux2_pipe.h).
 *
 * A request is a one-job run spec: the server's start-up settings with the
 * request's prompt, seed, steps, guidance and size, so that its PNG, and
 * the PNG's `parameters` chunk, are byte-identical to `tpgen generate` with
 * the same settings. */
#include "commands.h"
#include "generate.h"
#include "serve_http.h"
#include "serve_ranks.h"
#include "../core/err.h"
#include "../core/checkpoint.h"
#include "../core/image.h"
#include "../core/png.h"
#include "../core/sha256.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

typedef struct serve_opts {
    const char *listen, *api_key_file;
    int keep_text_encoder;
    double prompt_cache_mb;
    int queue, max_n, max_side;
    double max_upload_mb;
} serve_opts;

static void print_help(void) {
    printf("usage: mpirun -np N tpgen serve --model DIR [OPTIONS]\n\n"
           "Serve a FLUX.2 model split over N ranks (tp x dp) through the OpenAI images API:\n"
           "  POST /v1/images/generations   {\"prompt\", \"n\", \"size\": \"WxH\", \"response_format\": \"b64_json\",\n"
           "                                 \"seed\", \"steps\", \"guidance\", \"negative_prompt\", \"precision\"}\n"
           "  POST /v1/images/edits        multipart: prompt, image or image[] (1 to 10 reference images),\n"
           "                                 and the fields above\n"
           "  GET /health, GET /v1/models, GET /metrics (Prometheus)\n\n"
           "server options:\n"
           "  --listen HOST:PORT        address to bind (default 127.0.0.1:8080; 0.0.0.0:PORT for every interface)\n"
           "  --api-key-file FILE       require 'Authorization: Bearer KEY' (KEY: the file's first line)\n"
           "  --keep-text-encoder       keep the text encoder resident (default: loaded per request and freed)\n"
           "  --prompt-cache-mb MB      LRU cache of prompt embeddings per rank (default 256; 0: off)\n"
           "  --queue N                 requests waiting at most (default 16; more get 429)\n"
           "  --max-images N            images per request at most (default 4)\n"
           "  --max-side PX             pixels per side at most (default 2048)\n"
           "  --max-upload-mb MB        largest edit request (its reference images), default 50\n\n"
           "model options (as for generate): --model DIR (required), --tp T, --precision bf16|f32,\n"
           "  --backend cpu|cuda, --quantize fp8, --lora FILE[:WEIGHT] (repeatable), --max-sequence-length L,\n"
           "  and the defaults of requests that leave them out: --steps, --guidance, --width, --height,\n"
           "  --negative-prompt; --spec FILE reads them from a run spec.\n\n"
           "SIGTERM, SIGINT or SIGUSR1 (to world rank 0; mpirun forwards SIGUSR1 to every rank, while its own SIGTERM\n"
           "kills the ranks a few seconds later): stop taking requests, finish the running ones, answer the queued\n"
           "ones 503, exit 0.\n");
}

/* Split serve's own flags from the model flags (passed to the run-spec
 * parser, argv[0] kept). */
static int parse_flags(int argc, char **argv, serve_opts *o, run_spec *s) {
    char **rest = xmalloc(sizeof(char *) * (size_t)(argc + 1));
    int nrest = 0, rc = 0;
    rest[nrest++] = argv[0];
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--keep-text-encoder")) {
            o->keep_text_encoder = 1;
            continue;
        }
        static const char *own[] = {"--listen", "--api-key-file", "--prompt-cache-mb", "--queue", "--max-images",
                                    "--max-side", "--max-upload-mb"};
        int mine = 0;
        for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) {
            size_t n = strlen(own[k]);
            if (!strncmp(a, own[k], n) && (a[n] == 0 || a[n] == '=')) mine = 1;
        }
        if (!mine) {
            rest[nrest++] = argv[i];
            continue;
        }
        char key[64];
        const char *v;
        if (cli_flag(argc, argv, &i, "serve", key, &v)) { rc = -1; break; }
        char *end;
        if (!strcmp(key, "--listen")) o->listen = v;
        else if (!strcmp(key, "--api-key-file")) o->api_key_file = v;
        else if (!strcmp(key, "--prompt-cache-mb") || !strcmp(key, "--max-upload-mb")) {
            double x = strtod(v, &end);
            if (*end || end == v || !(x >= 0 && x <= 1 << 20))
                rc = tp_error("serve: %s '%s' must be a number of MB from 0 to %d", key, v, 1 << 20);
            else if (!strcmp(key, "--prompt-cache-mb")) o->prompt_cache_mb = x;
            else o->max_upload_mb = x;
        } else {
            long x = strtol(v, &end, 10);
            int lo = 1, hi = !strcmp(key, "--queue") ? 4096 : !strcmp(key, "--max-images") ? 64 : 16384;
            if (*end || end == v || x < lo || x > hi)
                rc = tp_error("serve: %s '%s' must be an integer from %d to %d", key, v, lo, hi);
            else if (!strcmp(key, "--queue")) o->queue = (int)x;
            else if (!strcmp(key, "--max-images")) o->max_n = (int)x;
            else o->max_side = (int)x;
            if (!rc && !strcmp(key, "--max-side") && x % 16)
                rc = tp_error("serve: --max-side %ld must be a multiple of 16", x);
        }
    }
    rest[nrest] = NULL;
    if (!rc) rc = runspec_parse_args(s, nrest, rest);
    free(rest);
    if (rc) return rc;
    /* generate's per-job options have no meaning here: a request carries them */
    const char *job_opt = s->n_prompts ? "--prompt" : s->prompts_file ? "--prompts-file" : s->prompt_embeds ? "--prompt-embeds"
                          : s->n_seeds ? "--seed" : s->output ? "--output" : s->save_latents ? "--save-latents"
                          : s->json_metrics ? "--json-metrics" : s->skip_existing ? "--skip-existing"
                          : s->no_decode ? "--no-decode" : s->n_images ? "--image" : NULL;
    if (job_opt)
        return tp_error("serve: %s is an option of generate; a server takes prompts, seeds and images from its requests "
                        "(see tpgen serve --help)", job_opt);
    if (!s->model) return tp_error("serve: --model DIR is required (a FLUX.2 pipeline folder, diffusers layout)");
    return 0;
}

/* ---- rendering a request (every rank of a TP group) ---- */

typedef struct serve_ctx {
    gen_setup *g;                /* the server's settings, defaults applied */
    flux2_pipe *pipe;
    serve_ranks *ranks;
    int L;
    int has_encoder;             /* the VAE can encode reference images (same on every rank) */
} serve_ctx;

/* An edit's references on the group's first rank: the uploads written to a
 * private temporary folder (the VAE encoder reads files), probed and
 * checked as generate checks --image files, hashed for the PNG parameters.
 * Errors name the upload, not the folder. */
typedef struct req_refs {
    char dir[64];
    char **paths;
    char (*sha)[65];
    int w, h;                    /* the first reference's processed size */
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

static int refs_prepare(const serve_request *q, req_refs *r) {
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
            image_check_reference(r->paths[k], w, h) || file_sha256(r->paths[k], r->sha[k]))
            return -1;
        uint8_t *rgb = NULL;   /* decoded whole here, so that a truncated file is a bad request */
        int dw, dh;
        if (image_read_rgb(r->paths[k], &rgb, &dw, &dh)) return -1;
        free(rgb);
        if (k == 0) image_reference_size(w, h, &r->w, &r->h);
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

static int on_step(int step, int steps, double seconds, const float *v, const float *x, void *ctx) {
    (void)step, (void)steps, (void)seconds, (void)v, (void)x;
    serve_ranks_service(((serve_ctx *)ctx)->ranks);   /* feed the other TP groups between steps */
    return 0;
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
    rs->images = NULL, rs->n_images = 0, rs->prompt_images = NULL;
    gs->prompt_w = gs->prompt_h = NULL;
    gs->use_cfg = flux2_uses_cfg(&g->info, rs->guidance);
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
    MPI_Bcast(&n, 1, MPI_INT, 0, d->tp_comm);
    for (int i = 0; i < n; i++) {
        int64_t len = d->tp_rank == 0 ? (int64_t)strlen(prompts[i]) : 0;
        MPI_Bcast(&len, 1, MPI_INT64_T, 0, d->tp_comm);
        if (d->tp_rank != 0) prompts[i] = xmalloc((size_t)len + 1);
        MPI_Bcast(prompts[i], (int)len, MPI_CHAR, 0, d->tp_comm);
        prompts[i][len] = 0;
    }
    size_t sz = (size_t)sc->L * (size_t)sc->g->info.joint_dim;
    float *tmp = xmalloc(sz * sizeof(float));
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = flux2_pipe_prefetch(sc->pipe, prompts[i], tmp);
    if (rc) tp_error_clear();   /* agreed inside the group; each waiting request will encode its own */
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(tmp);
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
    if (check_request(sc, q, &rs, &gs, &out->err)) {
        out->status = 400;
        return;
    }
    /* the references, on the group's first rank; the group agrees, and learns the output size */
    req_refs refs = {0};
    if (q->n_images) {
        int bad = d->tp_rank == 0 ? refs_prepare(q, &refs) : 0;
        if (dist_agree(d->tp_comm, bad)) {
            char msg[sizeof out->err.message];
            message_without(refs.dir, msg, sizeof msg);
            refs_cleanup(&refs, q->n_images);
            serve_error_set(&out->err, 400, "invalid_request_error", "image", "%s", msg);
            out->status = 400;
            return;
        }
        int wh[2] = {refs.w, refs.h};
        MPI_Bcast(wh, 2, MPI_INT, 0, d->tp_comm);
        if (!q->width) rs.width = wh[0], rs.height = wh[1];   /* diffusers: the first reference's size */
        /* the PNG parameters name the uploads and their sha256 */
        rs.images = q->image_names, rs.n_images = q->n_images;
        gs.ref_files = q->image_names, gs.n_ref_files = q->n_images, gs.ref_sha256 = refs.sha;
    }
    const flux2_pipe_stats *st = flux2_pipe_get_stats(sc->pipe);
    double t_enc = st->t_encode, t_den = st->t_denoise, s_steps = st->step_seconds;
    int n_steps = st->steps;
    uint64_t hits = st->cache_hits, misses = st->cache_misses;
    size_t sz = (size_t)sc->L * (size_t)g->info.joint_dim;
    float *emb = xmalloc(sz * sizeof(float)), *neg = gs.use_cfg ? xmalloc(sz * sizeof(float)) : NULL;
    int rc = flux2_pipe_encode(sc->pipe, prompt, emb, NULL);
    if (!rc && neg) rc = flux2_pipe_encode(sc->pipe, rs.negative_prompt, neg, NULL);
    if (!rc && st->cache_misses > misses) encode_queued(sc);
    flux2_pipe_text_done(sc->pipe);
    int W = rs.width, H = rs.height;
    size_t nlat = (size_t)(H / 16) * (W / 16) * (size_t)g->info.in_channels;
    float *lat = xmalloc(nlat * sizeof(float));
    uint8_t *rgb = d->tp_rank == 0 ? xmalloc((size_t)W * H * 3) : NULL;
    double t_dec = 0;
    if (!rc) {
        out->pngs = xcalloc((size_t)q->n, sizeof *out->pngs);
        out->png_sizes = xcalloc((size_t)q->n, sizeof *out->png_sizes);
    }
    for (int k = 0; k < q->n && !rc; k++) {
        seed = q->seed + (uint64_t)k;
        flux2_job j = {.seed = seed, .steps = rs.steps, .guidance = rs.guidance, .width = W, .height = H,
                       .embeds = emb, .L = sc->L, .neg_embeds = neg, .on_step = on_step, .ctx = sc,
                       .images = refs.paths ? refs.paths : q->image_names, .n_images = q->n_images};
        rc = flux2_pipe_render(sc->pipe, &j, lat);
        if (rc) break;
        int mine = 0;
        if (d->tp_rank == 0) {
            double dt = 0;
            mine = flux2_pipe_decode(sc->pipe, lat, W, H, rgb, &dt);
            t_dec += dt;
            char *params = mine ? NULL : gen_parameters_text(&gs, 0);
            if (!mine) mine = png_encode_rgb(rgb, W, H, "parameters", params, &out->pngs[k], &out->png_sizes[k]);
            free(params);
            if (!mine) out->n_pngs++;
        }
        rc = dist_agree(d->tp_comm, mine);
    }
    free(emb), free(neg), free(lat), free(rgb);
    if (q->n_images) refs_cleanup(&refs, q->n_images);
    out->timing = (serve_timing){
        .steps = st->steps - n_steps, .step_seconds = st->step_seconds - s_steps,
        .encode_seconds = st->t_encode - t_enc, .denoise_seconds = st->t_denoise - t_den, .decode_seconds = t_dec,
        .cache_hit = st->cache_hits > hits ? 1 : g->info.has_text_encoder ? 0 : -1,
    };
    if (rc) {
        serve_job_free_result(out);
        out->status = 500;
        serve_error_set(&out->err, 500, "server_error", NULL, "rendering failed: %s", tp_error_msg());
        if (d->world_rank == 0) fprintf(stderr, "tpgen: serve: request %llu failed: %s\n", (unsigned long long)out->id,
                                        tp_error_msg());
        return;
    }
    out->status = 200;
}

/* ---- the command ---- */

static const char *base_name(const char *p) {
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    const char *s = p + n;
    while (s > p && s[-1] != '/') s--;
    return s;
}

static int start(dist *d, serve_opts *o, run_spec *s, gen_setup *g, int argc, char **argv) {
    int rc = parse_flags(argc, argv, o, s);
    if (dist_agree(d->world, rc)) return -1;
    if (dist_agree(d->world, dist_set_tp(d, s->tp))) return -1;
    rc = gen_setup_init(g, s, d);
    if (!rc && !g->write_png)
        rc = tp_error("%s has no VAE (vae/config.json): a server answers with PNG images and needs one", s->model);
    if (!rc && !g->info.has_text_encoder)
        rc = tp_error("%s has no text encoder (text_encoder/): a server encodes the prompts of its requests", s->model);
    return dist_agree(d->world, rc);
}

int cmd_serve(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help();
            return 0;
        }
    dist d;
    if (dist_init(&argc, &argv, &d)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    /* every rank: rank 0 acts on it, the others wait for its STOP */
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);   /* mpirun forwards SIGUSR1; its SIGTERM kills after a few seconds */
    signal(SIGPIPE, SIG_IGN);

    serve_opts o = {.listen = "127.0.0.1:8080", .prompt_cache_mb = 256, .queue = 16, .max_n = 4, .max_side = 2048,
                    .max_upload_mb = 50};
    run_spec spec;
    runspec_init(&spec);
    gen_setup g;
    memset(&g, 0, sizeof g);
    serve_queue queue;
    serve_metrics metrics;
    serve_http_config hc = {0};
    serve_http *http = NULL;
    char *api_key = NULL;
    flux2_pipe *pipe = NULL;
    double t0 = MPI_Wtime();
    int queue_ok = 0;
    int rc = start(&d, &o, &spec, &g, argc, argv);
    /* world rank 0 binds the address before the long load: /health answers "loading" meanwhile */
    if (!rc) {
        int mine = 0;
        if (d.world_rank == 0) {
            serve_queue_init(&queue, o.queue);
            serve_metrics_init(&metrics, d.world_size);
            queue_ok = 1;
            if (o.api_key_file && !(api_key = serve_read_api_key(o.api_key_file))) mine = -1;
            hc.listen = o.listen;
            hc.api_key = api_key;
            hc.max_body_bytes = 1 << 20;
            hc.max_upload_bytes = (size_t)(o.max_upload_mb * 1048576.0);
            hc.max_connections = 64;
            serve_limits_default(&hc.limits, base_name(spec.model));
            hc.limits.max_n = o.max_n;
            hc.limits.max_side = o.max_side;
            if ((int64_t)o.max_side * o.max_side < hc.limits.max_pixels)
                hc.limits.max_pixels = (int64_t)o.max_side * o.max_side;
            hc.queue = &queue;
            hc.metrics = &metrics;
            if (!mine && !(http = serve_http_start(&hc))) mine = -1;
            if (!mine)
                fprintf(stderr, "tpgen: serve: listening on %s (port %d), loading %s on %d rank%s (tp %d x dp %d)\n",
                        o.listen, serve_http_port(http), spec.model, d.world_size, d.world_size == 1 ? "" : "s", d.tp,
                        d.dp);
        }
        rc = dist_agree(d.world, mine);
    }
    serve_ctx sc = {.g = &g, .L = spec.max_sequence_length};
    if (!rc) {   /* edits need the VAE encoder: the group's first rank looks, the group follows */
        if (d.tp_rank == 0) {
            checkpoint *ck = NULL;
            if (!checkpoint_open(g.info.vae_dir, &ck)) {
                sc.has_encoder = checkpoint_find(ck, "encoder.conv_in.weight", NULL) != NULL;
                checkpoint_close(ck);
            }
        }
        MPI_Bcast(&sc.has_encoder, 1, MPI_INT, 0, d.tp_comm);
    }
    if (!rc) {
        flux2_pipe_config cfg = {
            .model = spec.model, .backend = spec.backend, .precision = g.precision, .quantize_fp8 = g.quantize_fp8,
            .loras = spec.loras, .n_loras = spec.n_loras, .decoder = 1, .encoder = sc.has_encoder,
            .keep_text_encoder = o.keep_text_encoder, .prompt_cache_bytes = (size_t)(o.prompt_cache_mb * 1048576.0),
            .max_sequence_length = spec.max_sequence_length,
        };
        rc = dist_agree(d.world, flux2_pipe_open(&cfg, &g.info, d.tp_comm, d.local_rank, d.local_size, &pipe));
        if (!rc) rc = dist_agree(d.world, flux2_pipe_load(pipe));
        if (!rc && o.keep_text_encoder) {   /* load it now, not on the first request */
            float *tmp = xmalloc(sizeof(float) * (size_t)sc.L * (size_t)g.info.joint_dim);
            rc = dist_agree(d.world, flux2_pipe_encode(pipe, spec.negative_prompt, tmp, NULL));
            free(tmp);
        }
    }
    if (!rc) {
        uint64_t mine = flux2_pipe_resident_bytes(pipe);
        uint64_t *all = d.world_rank == 0 ? xmalloc(sizeof(uint64_t) * (size_t)d.world_size) : NULL;
        MPI_Gather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, d.world);
        if (d.world_rank == 0) {
            for (int r = 0; r < d.world_size && r < SERVE_MAX_RANKS; r++) metrics.resident_bytes[r] = all[r];
            metrics.load_seconds = MPI_Wtime() - t0;
            serve_http_set_ready(http, 1);
            fprintf(stderr, "tpgen: serve: ready after %.3f s (%s, %s); stop: SIGTERM to pid %ld, or SIGUSR1 to "
                    "mpirun\n", MPI_Wtime() - t0, g.info.family_name, g.precision == DT_F32 ? "f32" : "bf16",
                    (long)getpid());
        }
        free(all);
        serve_ranks sr = {.d = &d, .queue = d.world_rank == 0 ? &queue : NULL,
                          .metrics = d.world_rank == 0 ? &metrics : NULL, .render = render, .ctx = &sc, .stop = &g_stop};
        sc.ranks = &sr;
        sc.pipe = pipe;
        rc = dist_agree(d.world, serve_ranks_run(&sr));
        if (d.world_rank == 0 && !rc) fprintf(stderr, "tpgen: serve: stopped\n");
    }
    if (rc) dist_report_error(d.world);
    if (queue_ok) serve_queue_close(&queue);   /* anything still queued gets 503 */
    if (http) serve_http_stop(http);
    if (queue_ok) serve_queue_destroy(&queue);
    free(api_key);
    flux2_pipe_free(pipe);
    gen_setup_free(&g);
    runspec_free(&spec);
    dist_finalize(&d);
    return rc ? 1 : 0;
}
