/* `tpgen generate`, figures: per-step progress, the final summary (time of
 * each phase, peak RSS of every rank, bytes loaded and GB/s) on world rank
 * 0, and the same as JSON for scripts (--json-metrics). Phase times are the
 * maximum over ranks (the slowest rank is what the user waits for). */
#include "generate.h"
#include "commands.h"
#include "kernels/err.h"
#include "core/image/png.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

double gen_now(void) { return MPI_Wtime(); }

void gen_progress(const gen_setup *g, int job_pos, int step, int steps, double seconds) {
    if (g->d->world_rank != 0) return;
    fprintf(stderr, "tpgen: image %d/%d  step %d/%d  %.3f s/it\n", job_pos + 1, g->n_my_jobs, step + 1, steps, seconds);
    fflush(stderr);
}

static double peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0;   /* Linux reports KiB */
}

enum { PH_TE_LOAD, PH_ENCODE, PH_LOAD, PH_REFS, PH_DENOISE, PH_DECODE, PH_WRITE, PH_TOTAL, N_PH };
/* "text_encoder_load": loading the text encoder (not part of "encode");
 * "load": the transformer and the VAE; "refs": reading, preprocessing and
 * VAE-encoding the reference images */
static const char *k_phase[N_PH] = {"text_encoder_load", "encode", "load", "refs", "denoise", "decode", "write",
                                    "total"};
static const char *k_label[N_PH] = {"te load", "encode", "load", "refs", "denoise", "decode", "write", "total"};

typedef struct summary {
    double phase[N_PH];      /* max over ranks */
    double bytes_loaded;     /* transformer: sum over ranks */
    double load_seconds;     /* transformer: reading, max over ranks */
    double te_bytes_loaded, te_load_seconds;   /* text encoder: the same */
    double steps, step_seconds, images, latents;  /* sums (steps: over TP-group leads) */
    double rendered, skipped;    /* jobs, summed over TP-group leads */
    double refs_encoded;         /* reference images encoded, summed */
    double previews, t_preview;  /* --preview-every: PNGs written (sum), decoding them (max over ranks) */
    double *rss;             /* per world rank */
    double cache_steps[2][2];    /* --cache: [group][computed, cached], summed over TP-group leads */
    json_t *cache;           /* --cache, world rank 0: cache_decisions, one object per rendered job in job order */
    double *comm;            /* per world rank: bytes sent in collectives per denoising step */
    double *kv;              /* per world rank: [bytes, reference tokens] of the largest KV cache held */
    int has_kv;
    double *prompts;         /* per world rank: prompts it ran the text encoder on */
    double *bands;           /* per world rank: decodes in which it decoded a row band */
} summary;

/* Every group's first rank holds its jobs' decisions (JSON text, one line
 * each); world rank 0 collects them and orders them by job. Collective. */
static json_t *gather_cache(const gen_setup *g) {
    MPI_Comm w = g->d->world;
    char *mine = xstrdup("");
    for (int j = 0; j < g->n_jobs; j++) {
        if (!g->cache_json[j]) continue;
        char *t = xasprintf("%s%s\n", mine, g->cache_json[j]);
        free(mine);
        mine = t;
    }
    int len = (int)strlen(mine), size = g->d->world_size, root = g->d->world_rank == 0;
    int *lens = root ? xcalloc((size_t)size, sizeof *lens) : NULL, *offs = root ? xcalloc((size_t)size, sizeof *offs) : NULL;
    MPI_Gather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, w);
    int total = 0;
    for (int r = 0; root && r < size; r++) offs[r] = total, total += lens[r];
    char *all = root ? xcalloc((size_t)total + 1, 1) : NULL;
    MPI_Gatherv(mine, len, MPI_CHAR, all, lens, offs, MPI_CHAR, 0, w);
    free(mine), free(lens), free(offs);
    if (!root) return NULL;
    json_t **byjob = xcalloc((size_t)g->n_jobs + 1, sizeof *byjob), *arr = json_array();
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        json_int_t j = o ? json_integer_value(json_object_get(o, "job")) : -1;
        if (j >= 0 && j < g->n_jobs && !byjob[j]) byjob[j] = o;
        else json_decref(o);
    }
    for (int j = 0; j < g->n_jobs; j++)
        if (byjob[j]) json_array_append_new(arr, byjob[j]);
    free(byjob), free(all);
    return arr;
}

static void gather(const gen_setup *g, const gen_metrics *m, summary *s) {
    MPI_Comm w = g->d->world;
    double ph[N_PH] = {m->t_te_load, m->t_encode, m->t_load, m->t_refs, m->t_denoise, m->t_decode, m->t_write,
                       gen_now() - m->t_start};
    MPI_Reduce(ph, s->phase, N_PH, MPI_DOUBLE, MPI_MAX, 0, w);
    int lead = g->d->grp_rank == 0;
    double sums[8] = {(double)m->bytes_loaded, lead ? m->steps_total : 0, lead ? m->step_seconds : 0,
                      m->images, m->latents, lead ? m->jobs_done : 0, lead ? g->n_skipped : 0,
                      (double)m->te_bytes_loaded};
    double tot[8];
    MPI_Reduce(sums, tot, 8, MPI_DOUBLE, MPI_SUM, 0, w);
    s->bytes_loaded = tot[0], s->steps = tot[1], s->step_seconds = tot[2], s->images = tot[3], s->latents = tot[4];
    s->rendered = tot[5], s->skipped = tot[6], s->te_bytes_loaded = tot[7];
    double secs[2] = {m->load_seconds, m->te_load_seconds}, mx[2];
    MPI_Reduce(secs, mx, 2, MPI_DOUBLE, MPI_MAX, 0, w);
    s->load_seconds = mx[0], s->te_load_seconds = mx[1];
    double re[2] = {m->refs_encoded, m->previews}, re_sum[2];
    MPI_Reduce(re, re_sum, 2, MPI_DOUBLE, MPI_SUM, 0, w);
    s->refs_encoded = re_sum[0], s->previews = re_sum[1];
    MPI_Reduce(&m->t_preview, &s->t_preview, 1, MPI_DOUBLE, MPI_MAX, 0, w);
    double cs[4] = {m->cache_steps[0][0], m->cache_steps[0][1], m->cache_steps[1][0], m->cache_steps[1][1]}, ct[4];
    MPI_Reduce(cs, ct, 4, MPI_DOUBLE, MPI_SUM, 0, w);
    s->cache_steps[0][0] = ct[0], s->cache_steps[0][1] = ct[1], s->cache_steps[1][0] = ct[2], s->cache_steps[1][1] = ct[3];
    if (g->cache.on) s->cache = gather_cache(g);
    double rss = peak_rss_bytes();
    s->rss = g->d->world_rank == 0 ? xmalloc(sizeof(double) * (size_t)g->d->world_size) : NULL;
    MPI_Gather(&rss, 1, MPI_DOUBLE, s->rss, 1, MPI_DOUBLE, 0, w);
    double per_step = m->steps_total > 0 ? m->comm_bytes / m->steps_total : 0;
    s->comm = g->d->world_rank == 0 ? xmalloc(sizeof(double) * (size_t)g->d->world_size) : NULL;
    MPI_Gather(&per_step, 1, MPI_DOUBLE, s->comm, 1, MPI_DOUBLE, 0, w);
    double kv[2] = {m->kv_cache_bytes, m->kv_cache_tokens};
    s->kv = g->d->world_rank == 0 ? xmalloc(sizeof(double) * 2 * (size_t)g->d->world_size) : NULL;
    MPI_Gather(kv, 2, MPI_DOUBLE, s->kv, 2, MPI_DOUBLE, 0, w);
    for (int r = 0; s->kv && r < g->d->world_size; r++) s->has_kv |= s->kv[2 * r] > 0;
    double prompts = m->prompts_encoded, bands = m->decode_bands;
    s->prompts = g->d->world_rank == 0 ? xmalloc(sizeof(double) * (size_t)g->d->world_size) : NULL;
    s->bands = g->d->world_rank == 0 ? xmalloc(sizeof(double) * (size_t)g->d->world_size) : NULL;
    MPI_Gather(&prompts, 1, MPI_DOUBLE, s->prompts, 1, MPI_DOUBLE, 0, w);
    MPI_Gather(&bands, 1, MPI_DOUBLE, s->bands, 1, MPI_DOUBLE, 0, w);
}

static void print_summary(const gen_setup *g, const summary *s) {
    const run_spec *sp = g->spec;
    char mesh[64] = "";
    if (g->d->cfg > 1 || g->d->sp > 1) snprintf(mesh, sizeof mesh, "cfg %d x sp %d x ", g->d->cfg, g->d->sp);
    printf("tpgen: %d job%s (%s, %dx%d, %d steps, %s, %stp %d x dp %d) in %.2f s: %.0f PNG, %.0f latents file%s\n",
           g->n_jobs, g->n_jobs == 1 ? "" : "s", g->info.family_name, sp->width, sp->height, sp->steps,
           g->precision == DT_F32 ? "f32" : "bf16", mesh, g->d->tp, g->d->dp, s->phase[PH_TOTAL], s->images,
           s->latents, s->latents == 1 ? "" : "s");
    if (g->d->cfg > 1 || g->d->sp > 1)   /* what each rank holds (docs/parallel.md) */
        printf("  mesh: cfg %d x sp %d x tp %d x dp %d: each rank holds its TP rank's 1/%d of the transformer "
               "(%.4g GB read per rank), the same shard as the other %d rank%s of its TP position in the group\n",
               g->d->cfg, g->d->sp, g->d->tp, g->d->dp, g->d->tp, s->bytes_loaded / 1e9 / g->d->world_size,
               g->d->cfg * g->d->sp - 1, g->d->cfg * g->d->sp == 2 ? "" : "s");
    if (sp->skip_existing)
        printf("  --skip-existing: %.0f job%s rendered, %.0f skipped (outputs exist)\n", s->rendered,
               s->rendered == 1 ? "" : "s", s->skipped);
    for (int i = 0; i < PH_TOTAL; i++) {
        if (i == PH_REFS && !g->has_refs) continue;
        if (i == PH_TE_LOAD && s->te_bytes_loaded == 0) continue;
        printf("  %-8s %9.3f s", k_label[i], s->phase[i]);
        if (i == PH_REFS) printf("   %.0f reference image%s encoded", s->refs_encoded, s->refs_encoded == 1 ? "" : "s");
        /* GB/s over the reading time (the slowest rank's), printed beside it so that the line adds up */
        if (i == PH_TE_LOAD && s->te_load_seconds > 0)
            printf("   text encoder: %.4g GB read by %d ranks in %.4g s, %.3g GB/s", s->te_bytes_loaded / 1e9,
                   g->d->world_size, s->te_load_seconds, s->te_bytes_loaded / 1e9 / s->te_load_seconds);
        if (i == PH_LOAD && s->load_seconds > 0)
            printf("   transformer: %.4g GB read by %d ranks in %.4g s, %.3g GB/s", s->bytes_loaded / 1e9,
                   g->d->world_size, s->load_seconds, s->bytes_loaded / 1e9 / s->load_seconds);
        if (i == PH_DENOISE && s->steps > 0) printf("   %.0f steps, %.3f s/it", s->steps, s->step_seconds / s->steps);
        if (i == PH_DENOISE && s->previews > 0)
            printf("; %.0f preview%s, %.3f s each to decode", s->previews, s->previews == 1 ? "" : "s",
                   s->t_preview / s->previews * (g->d->dp > 1 ? g->d->dp : 1));
        printf("\n");
    }
    if (g->cache.on) {   /* what the block cache skipped: block-group steps, all jobs and CFG branches */
        const char *names[2][2] = {{"double blocks", "single blocks"}, {"mode blocks", "single blocks"}};
        int f3 = model_family_is_flux3(g->info.family);
        printf("  cache    ");
        for (int k = 0; k < 2; k++)
            printf("%s%s %.0f computed, %.0f cached", k ? "; " : "", names[f3][k], s->cache_steps[k][0],
                   s->cache_steps[k][1]);
        printf("\n");
    }
    printf("  peak RSS per rank:");
    for (int r = 0; r < g->d->world_size; r++) printf(" r%d %.1f MB", r, s->rss[r] / 1e6);
    printf("\n");
    if (g->d->world_size > 1 && s->steps > 0) {   /* the ring formulas' bytes (kernels/comm.h) */
        printf("  sent per step per rank:");
        for (int r = 0; r < g->d->world_size; r++) printf(" r%d %.4g MB", r, s->comm[r] / 1e6);
        printf("\n");
    }
    if (s->has_kv) {   /* KV-cached references: what each rank held (its heads: 1/(tp x sp) of them) */
        printf("  KV cache of references per rank:");
        for (int r = 0; r < g->d->world_size; r++)
            printf(" r%d %.4g MB (%.0f tokens)", r, s->kv[2 * r] / 1e6, s->kv[2 * r + 1]);
        printf("\n");
    }
    fflush(stdout);
}

static double gb_per_s(double bytes, double seconds) { return seconds > 0 ? bytes / 1e9 / seconds : 0.0; }

static int write_json(const gen_setup *g, const summary *s, json_t *loras) {
    const run_spec *sp = g->spec;
    json_t *ph = json_object(), *rss = json_array();
    for (int i = 0; i < N_PH; i++) json_object_set_new(ph, k_phase[i], json_real(s->phase[i]));
    for (int r = 0; r < g->d->world_size; r++) json_array_append_new(rss, json_integer((json_int_t)s->rss[r]));
    json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:s, s:s, s:i, s:i, s:i, s:i, s:f, s:o, s:f, s:I, s:f, s:i, s:i, s:i, s:i, s:o}",
                          "tpgen", TPGEN_VERSION, "model", sp->model, "family", g->info.family_name, "world_size",
                          g->d->world_size, "tp", g->d->tp, "dp", g->d->dp, "precision",
                          g->precision == DT_F32 ? "f32" : "bf16", "backend", sp->backend ? sp->backend : "auto",
                          "jobs", g->n_jobs, "width", sp->width, "height", sp->height, "steps", sp->steps,
                          "guidance", sp->guidance, "seconds", ph,
                          "seconds_per_step", s->steps > 0 ? s->step_seconds / s->steps : 0.0,
                          "bytes_loaded", (json_int_t)s->bytes_loaded,
                          "load_gb_per_s", gb_per_s(s->bytes_loaded, s->load_seconds),
                          "images", (int)s->images, "latents_files", (int)s->latents, "jobs_rendered",
                          (int)s->rendered, "jobs_skipped", (int)s->skipped, "peak_rss_bytes", rss);
    /* each load's bytes (all ranks), reading seconds (slowest rank) and their ratio */
    json_object_set_new(j, "load_read_seconds", json_real(s->load_seconds));
    json_object_set_new(j, "sp", json_integer(g->d->sp));
    json_object_set_new(j, "cfg_parallel", json_boolean(g->d->cfg == 2));
    json_t *comm = json_array();   /* bytes each world rank sends in collectives per denoising step */
    for (int r = 0; r < g->d->world_size; r++) json_array_append_new(comm, json_real(s->comm[r]));
    json_object_set_new(j, "comm_bytes_per_step", comm);
    if (s->has_kv) {   /* per world rank: the largest KV cache of references it held */
        json_t *kv = json_array();
        for (int r = 0; r < g->d->world_size; r++) json_array_append_new(kv, json_integer((json_int_t)s->kv[2 * r]));
        json_object_set_new(j, "kv_cache_bytes", kv);
    }
    json_t *enc = json_array();   /* prompts each world rank ran the text encoder on (its TP group's share) */
    for (int r = 0; r < g->d->world_size; r++) json_array_append_new(enc, json_integer((json_int_t)s->prompts[r]));
    json_object_set_new(j, "prompts_encoded", enc);
    json_t *bands = json_array();   /* decodes in which each world rank decoded a row band */
    for (int r = 0; r < g->d->world_size; r++) json_array_append_new(bands, json_integer((json_int_t)s->bands[r]));
    json_object_set_new(j, "decode_bands", bands);
    json_object_set_new(j, "text_encoder_bytes_loaded", json_integer((json_int_t)s->te_bytes_loaded));
    json_object_set_new(j, "text_encoder_read_seconds", json_real(s->te_load_seconds));
    json_object_set_new(j, "text_encoder_gb_per_s", json_real(gb_per_s(s->te_bytes_loaded, s->te_load_seconds)));
    json_object_set_new(j, "loras", loras ? loras : json_array());
    /* the reference images: every distinct file with its sha256 and processed size */
    json_t *refs = json_array();
    for (int i = 0; i < g->n_ref_files; i++)
        json_array_append_new(refs, json_pack("{s:s, s:s, s:i, s:i}", "path", g->ref_files[i], "sha256",
                                              g->ref_sha256[i], "width", g->ref_w[i], "height", g->ref_h[i]));
    json_object_set_new(j, "references", refs);
    json_object_set_new(j, "references_encoded", json_integer((json_int_t)s->refs_encoded));
    json_object_set_new(j, "previews", json_integer((json_int_t)s->previews));
    json_object_set_new(j, "preview_decode_seconds", json_real(s->t_preview));
    if (g->cache.on) {
        char *spec = bc_spec_format(&g->cache);
        json_object_set_new(j, "cache", json_string(spec));
        free(spec);
        json_object_set_new(j, "cache_decisions", json_incref(s->cache));
    }
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(g->cache.on ? 10 : 6));
    json_decref(j);
    int rc = file_write_atomic(sp->json_metrics, text, strlen(text));
    free(text);
    return rc;
}

int gen_report(const gen_setup *g, const gen_metrics *m, int status) {
    summary s = {0};
    gather(g, m, &s);
    json_t *loras = gen_lora_gather(g);   /* collective */
    int rc = 0;
    if (g->d->world_rank == 0) {
        print_summary(g, &s);
        if (g->spec->json_metrics) rc = write_json(g, &s, json_incref(loras));
    }
    json_decref(loras);
    json_decref(s.cache);
    free(s.rss);
    free(s.comm);
    free(s.kv);
    free(s.prompts);
    free(s.bands);
    return dist_agree(g->d->world, rc);
}
