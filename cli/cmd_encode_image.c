/* `tpgen encode-image`: one reference image through the editing
 * preprocessing (core/image/image.h) and the VAE encoder (vae_encode_image), for
 * inspection and tests: writes the preprocessed `pixels` [1, 3, h, w] and
 * the reference `latents` [1, 4·lc, h/16, w/16] (after patchify and the
 * BatchNorm normalisation; what the transformer receives, packed). Rank 0
 * does the work; other ranks only agree on the outcome. */
#include "commands.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "core/image/sha256.h"
#include "core/image/image.h"
#include "core/formats/safetensors.h"
#include "core/models/vae/vae.h"
#include "kernels/ops.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct enc_opts {
    const char *model, *image, *output, *backend;
    dtype_t precision;
} enc_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: tpgen encode-image --model DIR --image FILE --output OUT.safetensors [OPTIONS]\n\n"
            "Preprocesses a reference image as FLUX.2 editing does (area resize over 1024x1024 px with\n"
            "PIL's LANCZOS, sides floored to multiples of 16, centre crop, [-1, 1]) and encodes it with\n"
            "the VAE encoder in DIR/vae/. Writes tensors 'pixels' [1, 3, h, w] and 'latents'\n"
            "[1, 4*latent_channels, h/16, w/16] (patchified and BatchNorm-normalised), and the image's\n"
            "sha256 and sizes as metadata. Runs on rank 0.\n\n"
            "  --model DIR          pipeline folder with vae/ (encoder tensors included)\n"
            "  --image FILE         PNG or JPEG reference image\n"
            "  --output OUT         safetensors file, written atomically\n"
            "  --precision P        f32 or bf16 (default bf16)\n"
            "  --backend B          cpu, cuda or auto (default auto)\n");
}

static int parse_args(int argc, char **argv, enc_opts *o, int *help) {
    memset(o, 0, sizeof *o);
    o->precision = DT_BF16;
    o->backend = "auto";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { *help = 1; return 0; }
        const char *val;
        char key[64];
        if (cli_flag(argc, argv, &i, "encode-image", key, &val)) return -1;
        if (!strcmp(key, "--model")) o->model = val;
        else if (!strcmp(key, "--image")) o->image = val;
        else if (!strcmp(key, "--output")) o->output = val;
        else if (!strcmp(key, "--backend")) o->backend = val;
        else if (!strcmp(key, "--precision")) {
            if (!strcmp(val, "f32") || !strcmp(val, "fp32")) o->precision = DT_F32;
            else if (!strcmp(val, "bf16")) o->precision = DT_BF16;
            else return tp_error("--precision must be f32 or bf16, not '%s'", val);
        } else return tp_error("encode-image: unknown option '%s' (see tpgen encode-image --help)", key);
    }
    if (!o->model || !o->image || !o->output)
        return tp_error("encode-image needs --model DIR, --image FILE and --output OUT.safetensors (see --help)");
    return 0;
}

static int run(const enc_opts *o, const dist *d) {
    char *vae_dir = xasprintf("%s/vae", o->model), sha[65];
    float *px = NULL, *lat = NULL;
    int pw = 0, ph = 0, w0 = 0, h0 = 0;
    backend *be = NULL;
    vae_model *v = NULL;
    /* the image first: a bad file fails before any weight is read */
    int rc = image_probe(o->image, &w0, &h0);
    if (!rc) rc = image_load_reference(o->image, &px, &pw, &ph);
    if (!rc) rc = file_sha256(o->image, sha);
    if (!rc) rc = backend_select(o->backend, d->local_rank, d->local_size, &be);
    if (!rc) rc = vae_load_parts(vae_dir, be, o->precision, VAE_ENCODER, &v);
    double t = 0;
    int c4 = 0;
    if (!rc) {
        c4 = 4 * vae_get_config(v)->latent_channels;
        lat = xmalloc(sizeof(float) * (size_t)c4 * (size_t)(ph / 16) * (size_t)(pw / 16));
        double t0 = omp_get_wtime();
        rc = vae_encode_image(v, px, ph, pw, NULL, lat, NULL);
        t = omp_get_wtime() - t0;
    }
    if (!rc) {
        st_write_tensor ts[2] = {
            {.name = "pixels", .dtype = DT_F32, .ndim = 4, .shape = {1, 3, ph, pw}, .data = px},
            {.name = "latents", .dtype = DT_F32, .ndim = 4, .shape = {1, c4, ph / 16, pw / 16}, .data = lat},
        };
        char ow[16], oh[16], w[16], h[16];
        snprintf(ow, sizeof ow, "%d", w0), snprintf(oh, sizeof oh, "%d", h0);
        snprintf(w, sizeof w, "%d", pw), snprintf(h, sizeof h, "%d", ph);
        const char *meta[] = {"image", o->image, "sha256", sha, "original_width", ow, "original_height", oh,
                              "width", w, "height", h, "precision", o->precision == DT_F32 ? "f32" : "bf16", NULL};
        rc = st_write(o->output, ts, 2, meta);
    }
    if (!rc)
        printf("encode-image: %s %dx%d -> %dx%d, %d x %d tokens of %d channels -> %s | encoder %.3f s on %s (%s), "
               "peak backend memory %.1f MB\n", o->image, w0, h0, pw, ph, ph / 16, pw / 16, c4, o->output, t,
               be->vt->name, dtype_name(o->precision), be->peak_bytes / 1e6);
    free(px), free(lat), free(vae_dir);
    vae_free(v);
    if (be) backend_destroy(be);
    return rc;
}

int cmd_encode_image(int argc, char **argv) {
    dist d;
    if (dist_init(&argc, &argv, &d)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    enc_opts o;
    int help = 0, rc = parse_args(argc, argv, &o, &help);
    if (help) {
        if (d.world_rank == 0) usage(stdout);
        dist_finalize(&d);
        return 0;
    }
    if (!rc && d.world_rank == 0) rc = run(&o, &d);
    if (dist_agree(d.world, rc)) {
        dist_report_error(d.world);
        dist_finalize(&d);
        return 1;
    }
    dist_finalize(&d);
    return 0;
}
