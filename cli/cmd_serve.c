/* `mpirun -np N tpgen serve --model DIR`: a resident image server. The
 * model is loaded once (each rank its shard, as generate does) and requests
 * arriving over HTTP on world rank 0 (cli/serve_http.c, the OpenAI images
 * API) are queued (cli/serve_queue.c) and rendered by the TP groups in
 * lockstep (cli/serve_ranks.c, cli/serve_render.c) on the pipeline library
 * (core/tp_pipe.h).
 *
 * A request is a one-job run spec: the server's start-up settings with the
 * request's prompt, seed, steps, guidance and size, so that its PNG, and
 * the PNG's `parameters` chunk, are byte-identical to `tpgen generate` with
 * the same settings. */
#include "commands.h"
#include "generate.h"
#include "serve_http.h"
#include "serve_render.h"
#include "core/dist/watchdog.h"
#include "kernels/err.h"
#include "core/formats/checkpoint.h"
#include "core/image/image.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

typedef struct serve_opts {
    const char *listen, *api_key_file;
    int keep_text_encoder;
    int no_ui;
    double prompt_cache_mb;
    int queue, max_n, max_side, max_steps;
    double max_pixels_m;         /* megapixels (2^20 pixels) */
    double max_upload_mb;
    long max_ref_pixels;
    int max_connections, max_connections_per_ip;
    double header_timeout, keepalive_timeout, request_timeout;
} serve_opts;

static void print_help(void) {
    printf("usage: mpirun -np N tpgen serve --model DIR [OPTIONS]\n\n"
           "Serve a FLUX.2 model split over N ranks (tp x dp) through the OpenAI images API:\n"
           "  POST /v1/images/generations   {\"prompt\", \"n\", \"size\": \"WxH\", \"response_format\": \"b64_json\",\n"
           "                                 \"seed\", \"steps\", \"guidance\", \"negative_prompt\", \"precision\"}\n"
           "  POST /v1/images/edits        multipart: prompt, image or image[] (1 to 10 reference images),\n"
           "                                 and the fields above\n"
           "  GET /health, GET /v1/models, GET /metrics (Prometheus)\n"
           "  GET /                          a page: prompt, size, steps, seed, guidance, reference images; partial\n"
           "                                 images live (\"stream\": true, \"partial_images\" 0-3 on both POSTs)\n\n"
           "server options:\n"
           "  --listen HOST:PORT        address to bind (default 127.0.0.1:8080; 0.0.0.0:PORT for every interface)\n"
           "  --api-key-file FILE       require 'Authorization: Bearer KEY' (KEY: the file's first line)\n"
           "  --keep-text-encoder       keep the text encoder resident (default: loaded per request and freed)\n"
           "  --no-ui                   no page at / (the API only)\n"
           "  --prompt-cache-mb MB      LRU cache of prompt embeddings per rank (default 256; 0: off)\n"
           "  --queue N                 requests waiting at most (default 16; more get 429)\n"
           "  --max-images N            images per request at most (default 4)\n"
           "  --max-side PX             pixels per side at most (default 2048)\n"
           "  --max-upload-mb MB        largest edit request (its reference images), default 50\n"
           "  --max-steps N             denoising steps per request at most (default 200)\n"
           "  --max-pixels MPX          output pixels per image at most, in 2^20 pixels (default 4 = 2048x2048)\n"
           "  --max-connections N       open connections at most (default 4096; more get 503 at once)\n"
           "  --max-connections-per-ip N  from one address at most (default 256; 0: no limit; more are closed)\n"
           "  --header-timeout S        a new connection's request headers must be in within S seconds (default 10)\n"
           "  --keepalive-timeout S     an idle kept-alive connection is closed after S seconds (default 5)\n"
           "  --request-timeout S       a request not rendered within S seconds of its arrival is dropped (504),\n"
           "                            or cancelled at the next denoising step (default 0: no deadline)\n"
           "  --max-ref-pixels N        pixels of one reference image at most, before it is resized (default\n"
           "                            16777216 = 16 Mpx; at most 67108864, generate's cap)\n\n"
           "model options (as for generate): --model DIR (required), --tp T, --sp S, --cfg-parallel (each dp group\n"
           "  a mesh of cfg x sp x tp ranks, docs/parallel.md), --precision bf16|f32,\n"
           "  --backend cpu|cuda, --quantize fp8, --lora FILE[:WEIGHT] (repeatable), --max-sequence-length L,\n"
           "  and the defaults of requests that leave them out: --steps, --guidance, --width, --height,\n"
           "  --negative-prompt, --rng torch2|torch1 (a request's \"rng\" overrides it), --cache SPEC (block caching,\n"
           "  docs/cache.md; a request's \"cache\" overrides it); --spec FILE reads them from\n"
           "  a run spec. --initial-latents is not taken (a server never reads a file a client names).\n"
           "  --watchdog S: a rank silent for S seconds ends the server (renders: the watchdog; idle ranks: a\n"
           "  heartbeat every second, default bound 60 s; 0 turns both off; see docs/serve.md)\n\n"
           "SIGTERM, SIGINT or SIGUSR1 (to world rank 0; mpirun forwards SIGUSR1 to every rank, while its own SIGTERM\n"
           "kills the ranks a few seconds later): at once, the queued requests and new ones get 503 and no TP group\n"
           "starts another job; the running jobs finish (at most one render each), then every rank exits 0.\n");
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
        if (!strcmp(a, "--no-ui")) {
            o->no_ui = 1;
            continue;
        }
        static const char *own[] = {"--listen", "--api-key-file", "--prompt-cache-mb", "--queue", "--max-images",
                                    "--max-side", "--max-upload-mb", "--max-ref-pixels", "--max-steps", "--max-pixels",
                                    "--max-connections", "--max-connections-per-ip", "--header-timeout",
                                    "--keepalive-timeout", "--request-timeout"};
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
        } else if (!strcmp(key, "--max-ref-pixels")) {
            long x = strtol(v, &end, 10);
            if (*end || end == v || x < 64 * 64 || x > IMAGE_MAX_PIXELS)
                rc = tp_error("serve: --max-ref-pixels '%s' must be an integer from %d to %lld", v, 64 * 64,
                              (long long)IMAGE_MAX_PIXELS);
            else o->max_ref_pixels = x;
        } else if (!strcmp(key, "--max-pixels")) {
            double x = strtod(v, &end);
            if (*end || end == v || !(x >= 0.0009765625 && x <= 256))   /* 32x32 to 16384x16384 */
                rc = tp_error("serve: --max-pixels '%s' must be a number of megapixels (2^20) from 0.001 to 256", v);
            else o->max_pixels_m = x;
        } else if (!strcmp(key, "--header-timeout") || !strcmp(key, "--keepalive-timeout") ||
                   !strcmp(key, "--request-timeout")) {
            double x = strtod(v, &end);
            double lo = !strcmp(key, "--request-timeout") ? 0 : 0.1;
            if (*end || end == v || !(x >= lo && x <= 86400))
                rc = tp_error("serve: %s '%s' must be a number of seconds from %g to 86400", key, v, lo);
            else if (!strcmp(key, "--header-timeout")) o->header_timeout = x;
            else if (!strcmp(key, "--keepalive-timeout")) o->keepalive_timeout = x;
            else o->request_timeout = x;
        } else {
            long x = strtol(v, &end, 10);
            int lo = !strcmp(key, "--max-connections-per-ip") ? 0 : 1;
            int hi = !strcmp(key, "--queue") ? 4096 : !strcmp(key, "--max-images") ? 64 : !strcmp(key, "--max-steps") ? 10000
                     : !strcmp(key, "--max-connections") || !strcmp(key, "--max-connections-per-ip") ? 1 << 20 : 16384;
            if (*end || end == v || x < lo || x > hi)
                rc = tp_error("serve: %s '%s' must be an integer from %d to %d", key, v, lo, hi);
            else if (!strcmp(key, "--queue")) o->queue = (int)x;
            else if (!strcmp(key, "--max-images")) o->max_n = (int)x;
            else if (!strcmp(key, "--max-steps")) o->max_steps = (int)x;
            else if (!strcmp(key, "--max-connections")) o->max_connections = (int)x;
            else if (!strcmp(key, "--max-connections-per-ip")) o->max_connections_per_ip = (int)x;
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
                          : s->no_decode ? "--no-decode" : s->n_images ? "--image"
                          : s->initial_latents ? "--initial-latents" : s->preview_every ? "--preview-every"
                          : s->preview ? "--preview" : NULL;
    if (job_opt)
        return tp_error("serve: %s is an option of generate; a server takes prompts, seeds and images from its requests, "
                        "and streams previews with \"stream\": true, \"partial_images\": N (see tpgen serve --help)", job_opt);
    if (!s->model) return tp_error("serve: --model DIR is required (a FLUX.2 pipeline folder, diffusers layout)");
    return 0;
}

/* ---- the command ---- */

/* A connection is a file descriptor: raise the soft limit to the hard one
 * if need be, and serve fewer connections (with a warning) when even that
 * is too low, so that the limit answers 503 rather than accept() failing. */
static int fit_connections(int want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return want;
    rlim_t need = (rlim_t)want + 256;   /* MPI, the model's files, the sockets of the limit's margin */
    if (rl.rlim_cur < need && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max < need ? rl.rlim_max : need;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur >= need) return want;
    int fit = rl.rlim_cur > 512 ? (int)(rl.rlim_cur - 256) : 256;
    fprintf(stderr, "tpgen: warning: serve: --max-connections %d needs %llu file descriptors, and this process may "
            "open %llu (ulimit -n): serving %d connections at most\n", want, (unsigned long long)need,
            (unsigned long long)rl.rlim_cur, fit);
    return fit;
}

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
    image_set_max_pixels(o->max_ref_pixels, "--max-ref-pixels");   /* every rank decodes with this cap */
    if (dist_agree(d->world, dist_set_mesh(d, s->tp, s->sp > 1 ? s->sp : 1, s->cfg_parallel ? 2 : 1))) return -1;
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
                    .max_steps = 200, .max_pixels_m = 4, .max_upload_mb = 50, .max_ref_pixels = 16L << 20, .max_connections = 4096,
                    .max_connections_per_ip = 256, .header_timeout = 10, .keepalive_timeout = 5};
    run_spec spec;
    runspec_init(&spec);
    gen_setup g;
    memset(&g, 0, sizeof g);
    serve_queue queue;
    serve_metrics metrics;
    serve_http_config hc = {0};
    serve_http *http = NULL;
    char *api_key = NULL;
    tp_pipe *pipe = NULL;
    double t0 = MPI_Wtime();
    int queue_ok = 0;
    int rc = start(&d, &o, &spec, &g, argc, argv);
    /* the watchdog (core/dist/watchdog.h) watches loading and every render; idle waits for work are not
     * progress: there the heartbeat of cli/serve_ranks.c (same --watchdog bound, 60 s by default) watches */
    if (!rc) watchdog_start(d.world_rank, d.dp_rank, d.dp_rank * d.grp, d.grp, spec.watchdog);
    watchdog_phase_set(WD_STARTUP, "loading the model");
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
            hc.no_ui = o.no_ui;
            hc.max_body_bytes = 1 << 20;
            hc.max_upload_bytes = (size_t)(o.max_upload_mb * 1048576.0);
            hc.max_connections = fit_connections(o.max_connections);
            hc.max_connections_per_ip = o.max_connections_per_ip;
            hc.header_timeout_s = o.header_timeout;
            hc.keepalive_timeout_s = o.keepalive_timeout;
            hc.request_timeout_s = o.request_timeout;
            hc.stop = &g_stop;
            serve_limits_default(&hc.limits, base_name(spec.model));
            hc.limits.max_n = o.max_n;
            hc.limits.max_side = o.max_side;
            hc.limits.max_steps = o.max_steps;
            hc.limits.max_pixels = (int64_t)(o.max_pixels_m * 1048576.0);
            if ((int64_t)o.max_side * o.max_side < hc.limits.max_pixels)
                hc.limits.max_pixels = (int64_t)o.max_side * o.max_side;
            hc.queue = &queue;
            hc.metrics = &metrics;
            if (!mine && !(http = serve_http_start(&hc))) mine = -1;
            if (!mine) {
                char mesh[64] = "";   /* the axes beyond tp, when used (docs/parallel.md) */
                if (d.cfg > 1 || d.sp > 1) snprintf(mesh, sizeof mesh, "cfg %d x sp %d x ", d.cfg, d.sp);
                fprintf(stderr, "tpgen: serve: listening on %s (port %d), loading %s on %d rank%s (%stp %d x dp %d)\n",
                        o.listen, serve_http_port(http), spec.model, d.world_size, d.world_size == 1 ? "" : "s", mesh,
                        d.tp, d.dp);
            }
        }
        rc = dist_agree(d.world, mine);
    }
    serve_ctx sc = {.g = &g};
    if (!rc) {   /* edits need the VAE encoder: the group's first rank looks, the group follows */
        if (d.grp_rank == 0) {
            checkpoint *ck = NULL;
            if (!checkpoint_open(g.info.vae_dir, &ck)) {
                sc.has_encoder = checkpoint_find(ck, "encoder.conv_in.weight", NULL) != NULL;
                checkpoint_close(ck);
            }
        }
        MPI_Bcast(&sc.has_encoder, 1, MPI_INT, 0, d.grp_comm);
    }
    if (!rc) {
        tp_pipe_config cfg = {
            .model = spec.model, .backend = spec.backend, .precision = g.precision, .quantize_fp8 = g.quantize_fp8,
            .loras = spec.loras, .n_loras = spec.n_loras, .decoder = 1, .encoder = sc.has_encoder,
            .keep_text_encoder = o.keep_text_encoder, .prompt_cache_bytes = (size_t)(o.prompt_cache_mb * 1048576.0),
            .max_sequence_length = spec.max_sequence_length, .sp = d.sp, .cfg_parallel = d.cfg == 2,
        };
        rc = dist_agree(d.world, tp_pipe_open(&cfg, &g.info, d.grp_comm, d.local_rank, d.local_size, &pipe));
        if (!rc) rc = dist_agree(d.world, tp_pipe_load(pipe));
        if (!rc && o.keep_text_encoder) {   /* load it now, not on the first request */
            float *tmp = NULL;
            rc = dist_agree(d.world, tp_pipe_encode(pipe, spec.negative_prompt, &tmp, NULL, NULL));
            free(tmp);
        }
    }
    if (!rc) {
        uint64_t mine = tp_pipe_resident_bytes(pipe);
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
                          .metrics = d.world_rank == 0 ? &metrics : NULL, .render = serve_render, .ctx = &sc, .stop = &g_stop,
                          .watchdog_s = spec.watchdog};   /* the heartbeat of idle ranks follows --watchdog */
        sc.ranks = &sr;
        sc.pipe = pipe;
        watchdog_phase_set(WD_OFF, "waiting for requests");
        rc = dist_agree(d.world, serve_ranks_run(&sr));
        if (d.world_rank == 0 && !rc) fprintf(stderr, "tpgen: serve: stopped\n");
    }
    if (rc) dist_report_error(d.world);
    watchdog_stop();
    if (queue_ok) serve_queue_close(&queue);   /* anything still queued gets 503 */
    if (http) serve_http_stop(http);
    if (queue_ok) serve_queue_destroy(&queue);
    free(api_key);
    tp_pipe_free(pipe);
    gen_setup_free(&g);
    runspec_free(&spec);
    dist_finalize(&d);
    return rc ? 1 : 0;
}
