/* End to end through the generate command's own code path (flags -> setup
 * -> seeded noise -> denoising loop -> latents file) on the golden tiny
 * FLUX.2 pipeline: the final latents must equal diffusers' within 1e-4
 * relative at every TP degree (run.sh runs this at np 1, 2 and 4). */
#include "test.h"
#include "../cli/generate.h"
#include "../core/err.h"
#include "../core/safetensors.h"
#include <stdlib.h>
#include <string.h>

#pragma weak st_open
#pragma weak st_close
#pragma weak st_read_f32
#pragma weak st_find
#pragma weak st_meta

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

TEST_MPI(generate_reproduces_golden_denoise_loop) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (!gen_have_transformer() || !st_open) {
        if (rank == 0) printf("# skip generate_reproduces_golden_denoise_loop: the FLUX.2 transformer or safetensors is not in this build\n");
        return;
    }
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
    char *argv[] = {"generate", "--model", model, "--prompt-embeds", embeds, "--precision", "f32", "--seed", "1",
                    "--steps", "4", "--guidance", "4", "--width", "96", "--height", "64", "--save-latents", lat,
                    "--backend", "cpu", NULL};
    dist d;
    REQUIRE(dist_init(NULL, NULL, &d) == 0, "%s", tp_error_msg());
    run_spec s;
    runspec_init(&s);
    int rc = setup_and_run(&s, &d, 21, argv);
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
    printf("# generate golden flux2-tiny-a, f32, world %d: final latents rel L2 %.3g\n", d.world_size, e);
    CHECK(e < 1e-4, "final latents differ from diffusers: rel L2 %g", e);
    free(a);
    free(b);
    st_close(ref);
    st_close(got);
}
