/* End to end through the generate command's own code path (flags -> setup
 * -> seeded noise -> denoising loop -> latents file) on the golden tiny
 * FLUX.2 pipeline: the final latents must equal diffusers' within 1e-4
 * relative at every TP degree (run.sh runs this at np 1, 2 and 4). */
#include "test.h"
#include "cli/generate.h"
#include "kernels/err.h"
#include "core/formats/safetensors.h"
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "core/image/image.h"


static int setup_and_run(run_spec *s, dist *d, int argc, char **argv) {
    int rc = runspec_parse_args(s, argc, argv);
    if (!rc) rc = runspec_check(s);
    if (dist_agree(d->world, rc) || dist_agree(d->world, dist_set_tp(d, s->tp))) return -1;
    gen_setup g;
    if (dist_agree(d->world, gen_setup_init(&g, s, d))) return -1;
    gen_metrics m = {.t_start = gen_now()};
    rc = gen_run(&g, &m);
    gen_setup_free(&g);
    return rc;
}

static void shared_tmp(char *tmp, size_t n) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) snprintf(tmp, n, "%s", test_tmp_dir());
    MPI_Bcast(tmp, (int)n, MPI_CHAR, 0, MPI_COMM_WORLD);
}

static int run_generate(int argc, char **argv, int *world_size) {
    dist d;
    if (dist_init(NULL, NULL, &d)) return -1;
    run_spec s;
    runspec_init(&s);
    int rc = setup_and_run(&s, &d, argc, argv);
    *world_size = d.world_size;
    runspec_free(&s);
    MPI_Comm_free(&d.tp_comm);
    MPI_Comm_free(&d.dp_comm);
    MPI_Comm_free(&d.local_comm);
    return rc;
}

/* flux2-tiny-a's golden loop (seed 1, drawn by torch 1.13): from its stored
 * initial_latents through --initial-latents, or from --seed 1 --rng torch1
 * (torch 1.13's draw, which the default torch 2.x draw is not) */
static void denoise_loop_case(int torch1);
TEST_MPI(generate_reproduces_golden_denoise_loop) { denoise_loop_case(0); }
TEST_MPI(generate_rng_torch1_reproduces_golden_denoise_loop) { denoise_loop_case(1); }

static void denoise_loop_case(int torch1) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char *gd = test_golden_dir();
    char model[1024], embeds[1100], lat[1024], golden[1024];
    snprintf(model, sizeof model, "%s/flux2-tiny-a/model", gd);
    snprintf(golden, sizeof golden, "%s/flux2-tiny-a/denoise.safetensors", gd);
    snprintf(embeds, sizeof embeds, "%s:prompt_embeds", golden);
    /* every rank names the same file: rank 0's temporary folder */
    char tmp[512];
    if (rank == 0) snprintf(tmp, sizeof tmp, "%s", test_tmp_dir());
    MPI_Bcast(tmp, sizeof tmp, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(lat, sizeof lat, "%s/golden-a.safetensors", tmp);
    char *argv[] = {"generate", "--model", model, "--prompt-embeds", embeds, "--precision", "f32",
                    "--steps", "4", "--guidance", "4", "--width", "96", "--height", "64", "--save-latents", lat,
                    "--backend", "cpu", torch1 ? "--seed" : "--initial-latents", torch1 ? "1" : golden,
                    torch1 ? "--rng" : NULL, "torch1", NULL};
    dist d;
    REQUIRE(dist_init(NULL, NULL, &d) == 0, "%s", tp_error_msg());
    run_spec s;
    runspec_init(&s);
    int argc = 0;
    while (argv[argc]) argc++;
    int rc = setup_and_run(&s, &d, argc, argv);
    runspec_free(&s);
    MPI_Comm_free(&d.tp_comm);
    MPI_Comm_free(&d.dp_comm);
    MPI_Comm_free(&d.local_comm);
    REQUIRE(rc == 0, "generate failed: %s", tp_error_msg());
    if (rank != 0) return;
    st_file *ref = NULL, *got = NULL;
    REQUIRE(st_open(golden, &ref) == 0 && st_open(lat, &got) == 0, "%s", tp_error_msg());
    float *a = NULL, *b = NULL;
    const st_tensor_info *ta = NULL, *tb = NULL;
    REQUIRE(st_read_f32(got, "latents", &a, &ta) == 0 && st_read_f32(ref, "final_packed_latents", &b, &tb) == 0, "%s",
            tp_error_msg());
    REQUIRE(ta->ndim == 3 && ta->shape[0] == 1 && ta->shape[1] == 24 && ta->shape[2] == 32, "latents shape");
    CHECK(st_meta(got, "height") && !strcmp(st_meta(got, "height"), "64") && !strcmp(st_meta(got, "width"), "96"),
          "size metadata");
    double e = rel_l2(a, b, 24 * 32);
    printf("# generate golden flux2-tiny-a, f32, %s, world %d: final latents rel L2 %.3g\n",
           torch1 ? "--seed 1 --rng torch1" : "--initial-latents", d.world_size, e);
    CHECK(e < 1e-4, "final latents differ from diffusers: rel L2 %g", e);
    free(a);
    free(b);
    st_close(ref);
    st_close(got);
}

/* The whole klein pipeline from a text prompt: tokenizer, Qwen3 text
 * encoder, transformer, VAE, PNG, against diffusers' Flux2KleinPipeline run
 * (golden/klein-tiny cases 0-2, f32 reference; case 2 is the empty prompt). f32: latents within 1e-4 and
 * the 8-bit image within one level. bf16 (the default precision): latents
 * within 5e-2 (the golden README expects about 3e-2) and the image above
 * 35 dB PSNR. */
static void klein_case(int k, const char *precision, double max_rel, int max_level, double min_psnr) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char model[1024], golden[1024], e2e[1024], tmp[512], lat[700], png[700];
    snprintf(model, sizeof model, "%s/klein-tiny/model", test_golden_dir());
    snprintf(golden, sizeof golden, "%s/klein-tiny/e2e.safetensors", test_golden_dir());
    snprintf(e2e, sizeof e2e, "%s/klein-tiny/e2e.json", test_golden_dir());
    json_t *j = json_load_file(e2e, 0, NULL);
    json_t *c0 = json_array_get(json_object_get(j, "cases"), (size_t)k);
    REQUIRE(c0, "%s: no case %d", e2e, k);
    char prompt[512], width[16], height[16], maxlen[16];
    snprintf(prompt, sizeof prompt, "%s", json_string_value(json_object_get(c0, "prompt")));
    snprintf(width, sizeof width, "%lld", (long long)json_integer_value(json_object_get(c0, "width")));
    snprintf(height, sizeof height, "%lld", (long long)json_integer_value(json_object_get(c0, "height")));
    snprintf(maxlen, sizeof maxlen, "%lld", (long long)json_integer_value(json_object_get(j, "max_sequence_length")));
    json_decref(j);
    shared_tmp(tmp, sizeof tmp);
    snprintf(lat, sizeof lat, "%s/klein-%d-%s.safetensors", tmp, k, precision);
    snprintf(png, sizeof png, "%s/klein-%d-%s.png", tmp, k, precision);
    char init[1100];   /* the golden run's start (torch 1.13's draw of the case's seed) */
    snprintf(init, sizeof init, "%s:case%d.initial_latents", golden, k);
    char *argv[] = {"generate", "--model", model, "--prompt", prompt, "--initial-latents", init, "--width", width, "--height", height,
                    "--max-sequence-length", maxlen, "--precision", (char *)precision, "--save-latents", lat, "--output", png,
                    "--backend", "cpu", NULL};
    int world = 0;
    REQUIRE(run_generate((int)(sizeof argv / sizeof *argv) - 1, argv, &world) == 0, "generate failed: %s", tp_error_msg());
    if (rank != 0) return;
    st_file *ref = NULL, *got = NULL;
    REQUIRE(st_open(golden, &ref) == 0 && st_open(lat, &got) == 0, "%s", tp_error_msg());
    float *a = NULL, *b = NULL;
    const st_tensor_info *ta = NULL, *tb = NULL;
    char name[64];
    snprintf(name, sizeof name, "case%d.final_packed_latents", k);
    REQUIRE(st_read_f32(got, "latents", &a, &ta) == 0 && st_read_f32(ref, name, &b, &tb) == 0, "%s", tp_error_msg());
    size_t n = (size_t)tb->shape[1] * (size_t)tb->shape[2];
    REQUIRE(ta->ndim == 3 && ta->shape[1] == tb->shape[1] && ta->shape[2] == tb->shape[2], "latents shape");
    double e = rel_l2(a, b, n);
    CHECK(e < max_rel, "%s: final latents differ from diffusers: rel L2 %g", precision, e);
    snprintf(name, sizeof name, "case%d.image_u8", k);
    const st_tensor_info *tu = st_find(ref, name);
    REQUIRE(tu && tu->ndim == 3, "%s missing", name);
    size_t np = (size_t)tu->shape[0] * (size_t)tu->shape[1] * 3;
    uint8_t *want = malloc(np);
    REQUIRE(st_read_raw(ref, tu, want) == 0, "%s", tp_error_msg());
    int w, h;
    uint8_t *px = NULL;
    REQUIRE(image_read_rgb(png, &px, &w, &h) == 0, "cannot decode %s: %s", png, tp_error_msg());
    REQUIRE(h == tu->shape[0] && w == tu->shape[1], "image %dx%d", w, h);
    int worst = 0;
    size_t off = 0;
    double se = 0;
    for (size_t i = 0; i < np; i++) {
        int d = abs((int)px[i] - (int)want[i]);
        if (d > worst) worst = d;
        off += d != 0;
        se += (double)d * d;
    }
    double psnr = se > 0 ? 10.0 * log10(255.0 * 255.0 / (se / (double)np)) : INFINITY;
    printf("# generate golden klein-tiny case %d, %s, world %d: latents rel L2 %.3g, image max diff %d "
           "(%zu of %zu samples differ), PSNR %.1f dB\n", k, precision, world, e, worst, off, np, psnr);
    if (max_level >= 0) CHECK(worst <= max_level, "the 8-bit image differs from diffusers by up to %d levels", worst);
    CHECK(psnr >= min_psnr, "%s: image PSNR %.1f dB against diffusers", precision, psnr);
    free(px);
    free(want);
    free(a);
    free(b);
    st_close(ref);
    st_close(got);
}

TEST_MPI(generate_reproduces_golden_klein_pipeline) {
    for (int k = 0; k < 3 && !test_failed(); k++) klein_case(k, "f32", 1e-4, 1, 0);
}
TEST_MPI(generate_bf16_close_to_golden_klein_pipeline) { klein_case(0, "bf16", 5e-2, -1, 35.0); }
