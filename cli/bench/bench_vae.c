/* `tpgen bench vae`: decoder time, arithmetic rate and peak memory on the
 * real FLUX.2 VAE shapes (block_out_channels [128,256,512,512], 32 latent
 * channels, 2 layers per block, 32 groups, mid attention) with random
 * weights in memory: no checkpoint is needed. Under mpirun -np N the
 * decoder runs patch-parallel over the N ranks (vae_decode_packed_group),
 * as generate decodes at --tp N; the figures are rank 0's time and the
 * largest per-rank peak. */
#include "core/dist/dist.h"
#include "core/models/vae/vae.h"
#include "kernels/err.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Multiply-adds x2 of the convolutions, projections and attention. */
static double resnet_flops(int cin, int cout, double hw) {
    return 2.0 * hw * (9.0 * cin * cout + 9.0 * cout * cout + (cin != cout ? (double)cin * cout : 0));
}

/* the encoder at H x W pixels: conv_in, layers_per_block ResNets per down
 * block with a stride-2 conv after all but the last, mid block, conv_out,
 * quant_conv */
static double encoder_flops(const vae_config *c, int H, int W) {
    double hw = (double)H * W, f = 2.0 * hw * 27.0 * c->enc_block_out[0];
    int prev = c->enc_block_out[0], nb = c->enc_n_blocks, top = c->enc_block_out[nb - 1], lc = c->latent_channels;
    for (int i = 0; i < nb; i++) {
        int co = c->enc_block_out[i];
        for (int j = 0; j < c->layers_per_block; j++) f += resnet_flops(j ? co : prev, co, hw);
        if (i < nb - 1) {
            hw /= 4;
            f += 2.0 * hw * 9.0 * co * co;
        }
        prev = co;
    }
    f += 2 * resnet_flops(top, top, hw);
    if (c->mid_attention) f += 8.0 * hw * top * top + 4.0 * hw * hw * top;
    return f + 2.0 * hw * 9.0 * top * 2 * lc + 2.0 * hw * 4.0 * lc * lc;
}

static double decoder_flops(const vae_config *c, int h, int w) {
    double hw = (double)h * w, f = 0;
    int top = c->block_out[c->n_blocks - 1], lc = c->latent_channels;
    if (c->post_quant_conv) f += 2.0 * hw * lc * lc;
    f += 2.0 * hw * 9.0 * lc * top;
    f += 2 * resnet_flops(top, top, hw);
    if (c->mid_attention) f += 8.0 * hw * top * top + 4.0 * hw * hw * top;
    int prev = top;
    for (int i = 0; i < c->n_blocks; i++) {
        int co = c->block_out[c->n_blocks - 1 - i];
        for (int j = 0; j <= c->layers_per_block; j++) f += resnet_flops(j ? co : prev, co, hw);
        if (i < c->n_blocks - 1) {
            hw *= 4;
            f += 2.0 * hw * 9.0 * co * co;
        }
        prev = co;
    }
    return f + 2.0 * hw * 9.0 * c->block_out[0] * c->out_channels;
}

static int g_profile;

/* CPU seconds of the whole process (every thread): robust to time-slicing by other jobs */
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* one timed run: wall and CPU seconds, the best wall time so far */
typedef struct { double wall, cpu; } run_timer;
static run_timer timer_start(void) { return (run_timer){omp_get_wtime(), cpu_now()}; }
static void timer_stop(const run_timer *t, backend *be, double *wall, double *cpu, double *best) {
    be_sync(be);
    *wall = omp_get_wtime() - t->wall;
    *cpu = cpu_now() - t->cpu;
    if (*wall < *best) *best = *wall;
}

static double median(double *t, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: a handful of repeats */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) { double x = t[j]; t[j] = t[j - 1]; t[j - 1] = x; }
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* seconds per op kind, averaged over the repeats, and their share of the median time */
static void print_profile(const double *prof, int repeat, double total) {
    static const char *names[VAE_PROF_N] = {"conv 3x3", "conv 1x1", "conv 3x3 stride 2", "group norm (+SiLU)",
                                            "attention (norm, qkv/out GEMMs, softmax)", "upsample x2",
                                            "add / copy"};
    double sum = 0;
    for (int i = 0; i < VAE_PROF_N; i++) sum += prof[i] / repeat;
    for (int i = 0; i < VAE_PROF_N; i++)
        if (prof[i] > 0) printf("#   %-42s %8.3f s %5.1f %%\n", names[i], prof[i] / repeat, 100 * prof[i] / repeat / total);
    printf("#   %-42s %8.3f s %5.1f %%\n", "rest (host tail, pool, uploads)", total - sum, 100 * (total - sum) / total);
}

static void usage(void) {
    printf("usage: tpgen bench vae [--sizes 512,1024] [--precision f32,bf16] [--backend cpu|cuda|auto]\n"
           "                      [--repeat N] [--band-mb MB] [--encoder] [--profile]\n"
           "Decodes random latents with a randomly initialised FLUX.2-shaped VAE decoder and reports time,\n"
           "GFLOP/s and peak backend memory (weights + activations). --encoder: the encoder instead\n"
           "(a reference image of size x size pixels, as editing encodes it). time_s is the best of --repeat\n"
           "runs, median_s their median, cpu_s the median CPU seconds of the process (all threads). Under mpirun -np N the\n"
           "decoder runs patch-parallel over the N ranks (a row band each, as generate --tp N decodes); peak_act_MB\n"
           "is then the largest rank's. --profile adds the seconds per op kind (the backend synced around\n"
           "each op), averaged over the runs.\n");
}

static int bench_encoder_one(backend *be, const vae_config *cfg, dtype_t dt, int size, int repeat) {
    if (size <= 0 || size % 16) return tp_error("bench vae: size %d is not a positive multiple of 16", size);
    size_t base = be->bytes_in_use;
    vae_model *v = NULL;
    if (vae_create_random_parts(cfg, be, dt, 1, VAE_ENCODER, &v)) return -1;
    size_t np = (size_t)size * size, weights = be->bytes_in_use - base;
    float *px = xmalloc(3 * np * sizeof(float)), *tok = xmalloc(np / 256 * 4 * (size_t)cfg->latent_channels * sizeof(float));
    uint64_t s = 777;
    for (size_t i = 0; i < 3 * np; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        px[i] = (float)((s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
    double best = 1e30, times[64], cpus[64], prof[VAE_PROF_N] = {0};
    int rc = 0;
    if (g_profile) vae_set_profile(v, prof);
    be->peak_bytes = be->bytes_in_use;
    for (int r = 0; r < repeat && !rc; r++) {
        run_timer t = timer_start();
        rc = vae_encode_image(v, px, size, size, NULL, NULL, tok);
        timer_stop(&t, be, &times[r], &cpus[r], &best);
    }
    if (!rc) {
        double gf = encoder_flops(cfg, size, size) / 1e9, med = median(times, repeat);
        printf("%6d  %-5s %9.2f %9.2f %9.0f %9.1f %12.0f %10.0f %8.2f  encoder\n", size, dt == DT_F32 ? "f32" : "bf16",
               best, med, gf, gf / best, (be->peak_bytes - base - weights) / 1e6, weights / 1e6, median(cpus, repeat));
        if (g_profile) print_profile(prof, repeat, med);
        fflush(stdout);
    }
    free(px), free(tok);
    vae_free(v);
    return rc;
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    char *copy = xstrdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save)) out[n++] = atoi(t);
    free(copy);
    return n;
}

static int bench_one(backend *be, const vae_config *cfg, dtype_t dt, int size, int repeat, size_t band) {
    int ppt = vae_pixels_per_token(cfg);
    if (size <= 0 || size % ppt) return tp_error("bench vae: size %d is not a positive multiple of %d", size, ppt);
    size_t base = be->bytes_in_use;
    vae_model *v = NULL;
    if (vae_create_random(cfg, be, dt, 1, &v)) return -1;
    if (band) vae_set_band_bytes(v, band);
    int hl = size / ppt;
    size_t n = (size_t)hl * hl * 4 * (size_t)cfg->latent_channels;
    float *lat = xmalloc(n * sizeof(float));
    uint64_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        lat[i] = (float)((s >> 40) * (1.0 / 16777216.0)) * 4.0f - 2.0f;
    }
    uint8_t *rgb = xmalloc((size_t)size * size * 3);
    double best = 1e30, times[64], cpus[64], prof[VAE_PROF_N] = {0};
    int rc = 0;
    size_t weights = be->bytes_in_use - base;
    if (g_profile) vae_set_profile(v, prof);
    be->peak_bytes = be->bytes_in_use;
    int rank, np;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    for (int r = 0; r < repeat && !rc; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        run_timer t = timer_start();
        rc = vae_decode_packed_group(v, MPI_COMM_WORLD, lat, hl, hl, NULL, rgb);
        timer_stop(&t, be, &times[r], &cpus[r], &best);
    }
    double act = (double)(be->peak_bytes - base - weights), act_max = act;
    MPI_Allreduce(&act, &act_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (!rc && rank == 0) {
        double gf = decoder_flops(cfg, 2 * hl, 2 * hl) / 1e9, med = median(times, repeat);
        printf("%6d  %-5s %9.2f %9.2f %9.0f %9.1f %12.0f %10.0f %8.2f  tp %d\n", size, dt == DT_F32 ? "f32" : "bf16", best,
               med, gf, gf / best, act_max / 1e6, weights / 1e6, median(cpus, repeat), np);
        if (g_profile) print_profile(prof, repeat, med);
        fflush(stdout);
    }
    free(lat);
    free(rgb);
    vae_free(v);
    return rc;
}

static int bench_vae_run(int argc, char **argv, const dist *d);

int bench_vae(int argc, char **argv) {
    dist d;
    if (dist_init(&argc, &argv, &d)) { fprintf(stderr, "tpgen: error: %s\n", tp_error_msg()); return 1; }
    int rc = bench_vae_run(argc, argv, &d);
    dist_finalize(&d);
    return rc;
}

static int bench_vae_run(int argc, char **argv, const dist *d) {
    const char *sizes_s = "512,1024", *prec_s = "f32,bf16", *backend_s = "cpu";
    int repeat = 1, encoder = 0;
    size_t band = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        if (!strcmp(a, "--encoder")) { encoder = 1; continue; }
        if (!strcmp(a, "--profile")) { g_profile = 1; continue; }
        if (!val) { fprintf(stderr, "tpgen: error: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--sizes")) sizes_s = val;
        else if (!strcmp(a, "--precision")) prec_s = val;
        else if (!strcmp(a, "--backend")) backend_s = val;
        else if (!strcmp(a, "--repeat")) repeat = atoi(val) > 0 ? (atoi(val) < 64 ? atoi(val) : 64) : 1;
        else if (!strcmp(a, "--band-mb")) band = (size_t)atoi(val) << 20;
        else { fprintf(stderr, "tpgen: error: unknown option %s (see tpgen bench vae --help)\n", a); return 2; }
        i++;
    }
    int sizes[8], ns = parse_list(sizes_s, sizes, 8);
    backend *be = NULL;
    if (encoder && d->world_size > 1) {
        if (d->world_rank == 0) fprintf(stderr, "tpgen: error: bench vae --encoder runs on one rank (no mpirun)\n");
        return 2;
    }
    if (backend_select(backend_s, d->local_rank, d->local_size, &be)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    vae_config cfg;
    vae_flux2_config(&cfg);
    if (d->world_rank == 0) {
        printf("# VAE %s, FLUX.2 shapes [128,256,512,512], random weights, backend %s, %d ranks x %d threads, best and "
               "median of %d\n", encoder ? "encoder" : "decoder", be->vt->name, d->world_size, be->threads, repeat);
        printf("%6s  %-5s %9s %9s %9s %9s %12s %10s %8s\n", "size", "prec", "time_s", "median_s", "GFLOP", "GFLOP/s",
           "peak_act_MB", "weights_MB", "cpu_s");
    }
    int rc = 0;
    for (int i = 0; i < ns && !rc; i++) {
        char *copy = xstrdup(prec_s), *save = NULL;
        for (char *p = strtok_r(copy, ",", &save); p && !rc; p = strtok_r(NULL, ",", &save)) {
            dtype_t dt = !strcmp(p, "bf16") ? DT_BF16 : DT_F32;
            if (strcmp(p, "bf16") && strcmp(p, "f32")) rc = tp_error("--precision: '%s' is not f32 or bf16", p);
            else rc = encoder ? bench_encoder_one(be, &cfg, dt, sizes[i], repeat) : bench_one(be, &cfg, dt, sizes[i], repeat, band);
        }
        free(copy);
    }
    if (rc && d->world_rank == 0) fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
    backend_destroy(be);
    return rc ? 1 : 0;
}
