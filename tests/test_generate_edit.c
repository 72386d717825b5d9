/* Reference-image editing end to end against golden/klein-tiny-edit
 * (diffusers Flux2KleinPipeline.__call__(image=[...]), f32), at every TP
 * degree run.sh uses (np 1, 2, 4):
 *  - through the generate command's code path (flags -> setup -> references
 *    encoded on the group's first rank and broadcast -> denoising -> VAE ->
 *    PNG): final latents within 1e-4, the 8-bit image within one level, the
 *    size taken from the reference when --width/--height are not given;
 *  - through the library (refs_encode + flux2_denoise): the noise,
 *    noise_pred_step0 and every step's latents within 1e-4;
 *  - bf16 (the default precision) within the project's bf16 tolerance. */
#include "test.h"
#include "cli/generate.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/pipeline.h"
#include "core/refs.h"
#include "core/formats/safetensors.h"
#include "core/schedule.h"
#include "core/rng.h"
#include "kernels/ops.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/image/image.h"

static int world_rank(void) {
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

static int run_generate(int argc, char **argv, int *world_size) {
    dist d;
    if (dist_init(NULL, NULL, &d)) return -1;
    run_spec s;
    runspec_init(&s);
    int rc = runspec_parse_args(&s, argc, argv);
    if (!rc) rc = runspec_check(&s);
    if (!dist_agree(d.world, rc) && !dist_agree(d.world, dist_set_tp(&d, s.tp))) {
        gen_setup g;
        rc = dist_agree(d.world, gen_setup_init(&g, &s, &d));
        if (!rc) {
            gen_metrics m = {.t_start = gen_now()};
            rc = gen_run(&g, &m);
        }
        gen_setup_free(&g);
    } else {
        rc = -1;
    }
    *world_size = d.world_size;
    runspec_free(&s);
    MPI_Comm_free(&d.tp_comm);
    MPI_Comm_free(&d.dp_comm);
    MPI_Comm_free(&d.local_comm);
    return rc;
}

static json_t *edit_case(int k, json_t **root) {
    char p[1024];
    snprintf(p, sizeof p, "%s/klein-tiny-edit/edit.json", test_golden_dir());
    *root = json_load_file(p, 0, NULL);
    return *root ? json_array_get(json_object_get(*root, "cases"), (size_t)k) : NULL;
}

static double png_compare(const char *png, const st_file *ref, int k, int *worst, size_t *off, size_t *np) {
    char name[64];
    snprintf(name, sizeof name, "case%d.image_u8", k);
    const st_tensor_info *tu = st_find(ref, name);
    *worst = 999;
    if (!tu) return -1;
    *np = (size_t)tu->shape[0] * (size_t)tu->shape[1] * 3;
    uint8_t *want = malloc(*np);
    int w = 0, h = 0;
    uint8_t *px = NULL;
    if (image_read_rgb(png, &px, &w, &h)) px = NULL;
    double se = 0;
    if (px && st_read_raw(ref, tu, want) == 0 && h == tu->shape[0] && w == tu->shape[1]) {
        *worst = 0, *off = 0;
        for (size_t i = 0; i < *np; i++) {
            int d = abs((int)px[i] - (int)want[i]);
            if (d > *worst) *worst = d;
            *off += d != 0;
            se += (double)d * d;
        }
    }
    free(px);
    free(want);
    return se > 0 ? 10.0 * log10(255.0 * 255.0 / (se / (double)*np)) : INFINITY;
}

/* case k through the generate command; bf16: latents within max_rel and PSNR */
static void generate_case(int k, const char *precision, double max_rel, int max_level, double min_psnr) {
    int rank = world_rank();
    json_t *root = NULL, *c = edit_case(k, &root);
    REQUIRE(c, "edit.json: no case %d", k);
    const char *gd = test_golden_dir();
    char model[1024], golden[1024], embeds[1100], tmp[512], lat[700], png[700], w[16], h[16];
    snprintf(model, sizeof model, "%s/klein-tiny/model", gd);
    snprintf(golden, sizeof golden, "%s/klein-tiny-edit/edit.safetensors", gd);
    snprintf(embeds, sizeof embeds, "%s:case%d.prompt_embeds", golden, k);
    if (rank == 0) snprintf(tmp, sizeof tmp, "%s", test_tmp_dir());
    MPI_Bcast(tmp, sizeof tmp, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(lat, sizeof lat, "%s/edit-%d-%s.safetensors", tmp, k, precision);
    snprintf(png, sizeof png, "%s/edit-%d-%s.png", tmp, k, precision);
    snprintf(w, sizeof w, "%lld", (long long)json_integer_value(json_object_get(c, "width")));
    snprintf(h, sizeof h, "%lld", (long long)json_integer_value(json_object_get(c, "height")));
    int passed = json_is_true(json_object_get(c, "height_width_passed"));
    char *argv[40];
    char refs[8][1024];
    int argc = 0;
    char init[1100];   /* the golden run's start: torch 1.13's draw of the case's seed */
    snprintf(init, sizeof init, "%s:case%d.initial_latents", golden, k);
    const char *fixed[] = {"generate", "--model", model, "--prompt-embeds", embeds, "--initial-latents", init, "--steps", "4",
                           "--precision", precision, "--save-latents", lat, "--output", png, "--backend", "cpu"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) argv[argc++] = (char *)fixed[i];
    if (passed) {
        argv[argc++] = "--width", argv[argc++] = w;
        argv[argc++] = "--height", argv[argc++] = h;
    }
    json_t *files = json_object_get(c, "ref_files");
    for (size_t i = 0; i < json_array_size(files) && i < 8; i++) {
        snprintf(refs[i], sizeof refs[i], "%s/klein-tiny-edit/%s", gd, json_string_value(json_array_get(files, i)));
        argv[argc++] = "--image", argv[argc++] = refs[i];
    }
    argv[argc] = NULL;
    size_t nrefs = json_array_size(files);
    int world = 0, rc = run_generate(argc, argv, &world);
    json_decref(root);
    REQUIRE(rc == 0, "generate failed: %s", tp_error_msg());
    if (rank != 0) return;
    st_file *ref = NULL, *got = NULL;
    REQUIRE(st_open(golden, &ref) == 0, "%s", tp_error_msg());
    if (st_open(lat, &got)) { st_close(ref); REQUIRE(0, "%s", tp_error_msg()); }
    float *a = NULL, *b = NULL;
    const st_tensor_info *ta = NULL, *tb = NULL;
    char name[64];
    snprintf(name, sizeof name, "case%d.final_packed_latents", k);
    if (!st_read_f32(got, "latents", &a, &ta) && !st_read_f32(ref, name, &b, &tb) && ta->shape[1] == tb->shape[1] &&
        ta->shape[2] == tb->shape[2]) {
        CHECK(!strcmp(st_meta(got, "width"), w) && !strcmp(st_meta(got, "height"), h), "case%d: size %sx%s, want %sx%s",
              k, st_meta(got, "width"), st_meta(got, "height"), w, h);
        double e = rel_l2(a, b, (size_t)tb->shape[1] * tb->shape[2]);
        int worst;
        size_t off = 0, np = 0;
        double psnr = png_compare(png, ref, k, &worst, &off, &np);
        printf("# edit golden case %d (%zu refs%s), %s, world %d: final latents rel L2 %.3g, image max diff %d (%zu of "
               "%zu samples differ), PSNR %.1f dB\n", k, nrefs, passed ? "" : ", size from the reference",
               precision, world, e, worst, off, np, psnr);
        CHECK(e < max_rel, "case%d %s: final latents differ from diffusers: rel L2 %g", k, precision, e);
        if (max_level >= 0) CHECK(worst <= max_level, "case%d: the image differs by up to %d levels", k, worst);
        CHECK(psnr >= min_psnr, "case%d %s: PSNR %.1f dB", k, precision, psnr);
    } else {
        test_fail(__FILE__, __LINE__, "case%d: latents unreadable or of the wrong shape: %s", k, tp_error_msg());
    }
    free(a), free(b);
    st_close(ref);
    st_close(got);
}

TEST_MPI(generate_edit_reproduces_golden) {
    for (int k = 0; k < 3 && !test_failed(); k++) generate_case(k, "f32", 1e-4, 1, 0);
}
TEST_MPI(generate_edit_bf16_close_to_golden) { generate_case(1, "bf16", 5e-2, -1, 35.0); }

/* ---- the loop through the library, step by step ---- */

typedef struct step_rec {
    float *v0, *x[8];
    size_t n;
    int calls;
} step_rec;

static int record_step(int step, int steps, double sec, const float *v, const float *x, float sigma, void *ctx) {
    step_rec *r = ctx;
    if (step == 0) memcpy(r->v0, v, r->n * sizeof(float));
    if (step < 8) memcpy(r->x[step], x, r->n * sizeof(float));
    r->calls++;
    return 0;
}

static double golden_rel(const st_file *f, const char *key, const float *got, size_t n) {
    float *want = NULL;
    const st_tensor_info *ti = NULL;
    if (st_read_f32(f, key, &want, &ti)) return INFINITY;
    size_t m = 1;
    for (int i = 0; i < ti->ndim; i++) m *= (size_t)ti->shape[i];
    double e = m == n ? rel_l2(got, want, n) : INFINITY;
    free(want);
    return e;
}

TEST_MPI(edit_denoise_steps_match_golden) {
    const char *gd = test_golden_dir();
    char tdir[1024], vdir[1024], gpath[1024];
    snprintf(tdir, sizeof tdir, "%s/klein-tiny/model/transformer", gd);
    snprintf(vdir, sizeof vdir, "%s/klein-tiny/model/vae", gd);
    snprintf(gpath, sizeof gpath, "%s/klein-tiny-edit/edit.safetensors", gd);
    backend *be = backend_cpu_create(1);
    comm *cm = comm_create_mpi(MPI_COMM_WORLD, be);
    flux2_model *m = NULL;
    vae_model *v = NULL;
    st_file *f = NULL;
    int ok = !flux2_load(tdir, be, cm, DT_F32, &m, NULL) && !vae_load_parts(vdir, be, DT_F32, VAE_ENCODER, &v) &&
             !st_open(gpath, &f);
    if (!ok) test_fail(__FILE__, __LINE__, "%s", tp_error_msg());
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    for (int k = 0; k < 3 && ok && !test_failed(); k++) {
        json_t *root = NULL, *c = edit_case(k, &root);
        int W = (int)json_integer_value(json_object_get(c, "width")), H = (int)json_integer_value(json_object_get(c, "height"));
        uint64_t seed = (uint64_t)json_integer_value(json_object_get(c, "seed"));
        json_t *files = json_object_get(c, "ref_files");
        int nr = (int)json_array_size(files);
        char *paths[8];
        for (int i = 0; i < nr && i < 8; i++) paths[i] = xasprintf("%s/klein-tiny-edit/%s", gd, json_string_value(json_array_get(files, i)));
        json_decref(root);
        ref_set rs;
        int rc = refs_encode(v, paths, nr, &rs);
        for (int i = 0; i < nr && i < 8; i++) free(paths[i]);
        REQUIRE(rc == 0, "refs: %s", tp_error_msg());
        int h = H / 16, w = W / 16, C = 32;
        int64_t N = (int64_t)h * w;
        size_t n = (size_t)N * C;
        /* the seeded noise with --rng torch1 is diffusers' initial_latents (bf16 torch.randn on torch 1.13),
         * packed (torch 2.15's draws of these seeds: tests/test_rng.c) */
        float *noise = flux2_noise_packed_as(seed, C, h, w, TP_RNG_TORCH1), *init = NULL;
        char key[64];
        snprintf(key, sizeof key, "case%d.initial_latents", k);
        REQUIRE(st_read_f32(f, key, &init, NULL) == 0, "%s", tp_error_msg());
        int bad = 0;
        for (int ch = 0; ch < C; ch++)
            for (int64_t t = 0; t < N; t++) bad += noise[t * C + ch] != init[(size_t)ch * N + t];
        CHECK(bad == 0, "case%d: %d noise values differ from initial_latents", k, bad);
        free(init);
        float *sig = malloc(sizeof(float) * 5), *ts = malloc(sizeof(float) * 4), *emb = NULL, *out = malloc(n * 4);
        int32_t *iid = malloc(sizeof(int32_t) * 4 * (size_t)N), *tid = malloc(sizeof(int32_t) * 4 * 32);
        flux2_image_ids(h, w, 0, iid);
        flux2_text_ids(32, tid);
        snprintf(key, sizeof key, "case%d.prompt_embeds", k);
        REQUIRE(st_read_f32(f, key, &emb, NULL) == 0 && schedule_flux2(N, 4, sig, ts) == 0, "%s", tp_error_msg());
        step_rec rec = {.v0 = malloc(n * 4), .n = n};
        for (int i = 0; i < 4; i++) rec.x[i] = malloc(n * 4);
        denoise_params p = {.latents = noise, .N = N, .img_ids = iid, .prompt_embeds = emb, .L = 32, .txt_ids = tid,
                            .sigmas = sig, .steps = 4, .on_step = record_step, .ctx = &rec,
                            .ref_tokens = rs.tokens, .R = rs.R, .ref_ids = rs.ids};
        rc = flux2_denoise(m, &p, out);
        CHECK(rc == 0 && rec.calls == 4, "denoise: %s", tp_error_msg());
        snprintf(key, sizeof key, "case%d.noise_pred_step0", k);
        double e0 = golden_rel(f, key, rec.v0, n), worst = e0;
        for (int i = 0; i < 3; i++) {
            snprintf(key, sizeof key, "case%d.latents_step%d", k, i);
            double e = golden_rel(f, key, rec.x[i], n);
            if (e > worst || e != e) worst = e;
        }
        snprintf(key, sizeof key, "case%d.final_packed_latents", k);
        double ef = golden_rel(f, key, out, n);
        if (world_rank() == 0)
            printf("# edit loop case%d, world %d: %lld noise + %lld reference tokens; noise_pred_step0 %.3g, worst step "
                   "latents %.3g, final %.3g (rel L2)\n", k, world, (long long)N, (long long)rs.R, e0, worst, ef);
        CHECK(e0 < 1e-4 && worst < 1e-4 && ef < 1e-4, "case%d: step0 %.3g, steps %.3g, final %.3g", k, e0, worst, ef);
        free(rec.v0);
        for (int i = 0; i < 4; i++) free(rec.x[i]);
        free(noise), free(sig), free(ts), free(emb), free(out), free(iid), free(tid);
        refs_free(&rs);
    }
    st_close(f);
    vae_free(v);
    flux2_free(m);
    comm_destroy(cm);
    backend_destroy(be);
}
