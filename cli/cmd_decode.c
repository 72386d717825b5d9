/* `tpgen decode`: re-decode saved packed latents [1, N, 4·lc] (what
 * --save-latents writes: tensor `latents`, metadata height/width) to a PNG
 * with the model's VAE. Rank 0 does the work; other ranks (under mpirun)
 * only agree on the outcome, and never read the VAE file. */
#include "commands.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "core/image/png.h"
#include "core/formats/safetensors.h"
#include "core/models/vae/vae.h"
#include "kernels/ops.h"
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


typedef struct decode_opts {
    const char *model, *vae, *latents, *output, *backend;
    int width, height;          /* 0: from the latents metadata */
    dtype_t precision;
} decode_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: tpgen decode --model DIR --latents FILE[:TENSOR] --output OUT.png [OPTIONS]\n\n"
            "Decodes packed latents [1, N, 4*latent_channels] (tensor 'latents' unless :TENSOR is given,\n"
            "as written by --save-latents) with the VAE in DIR/vae/ and writes an 8-bit RGB PNG.\n"
            "Runs on rank 0; under mpirun the other ranks wait.\n\n"
            "  --model DIR          pipeline folder with vae/config.json and its safetensors\n"
            "  --vae PATH           the VAE instead: a file (diffusers or BFL/LDM names, e.g. ComfyUI's\n"
            "                       flux2-vae.safetensors; config.json beside it, else FLUX.2's) or a folder\n"
            "  --latents FILE[:T]   safetensors file with the packed latents (tensor T, default 'latents')\n"
            "  --output OUT.png     written atomically (temporary name, then rename)\n"
            "  --width W --height H image size in pixels (multiples of 16); default: the file's\n"
            "                       'width'/'height' metadata\n"
            "  --precision P        f32 or bf16 (default bf16: weights and activations in bf16)\n"
            "  --backend B          cpu, cuda or auto (default auto)\n");
}

/* the largest image side accepted, from a flag or the metadata */
#define DECODE_MAX_SIDE (1 << 20)

static int parse_int(const char *flag, const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end || v <= 0 || v > DECODE_MAX_SIDE) return tp_error("%s expects a positive integer, got '%s'", flag, s);
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, decode_opts *o, int *help) {
    memset(o, 0, sizeof *o);
    o->precision = DT_BF16;
    o->backend = "auto";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { *help = 1; return 0; }
        const char *val;
        char key[64];
        if (cli_flag(argc, argv, &i, "decode", key, &val)) return -1;
        if (!strcmp(key, "--model")) o->model = val;
        else if (!strcmp(key, "--vae")) o->vae = val;
        else if (!strcmp(key, "--latents")) o->latents = val;
        else if (!strcmp(key, "--output")) o->output = val;
        else if (!strcmp(key, "--backend")) o->backend = val;
        else if (!strcmp(key, "--width")) { if (parse_int(key, val, &o->width)) return -1; }
        else if (!strcmp(key, "--height")) { if (parse_int(key, val, &o->height)) return -1; }
        else if (!strcmp(key, "--precision")) {
            if (!strcmp(val, "f32") || !strcmp(val, "fp32")) o->precision = DT_F32;
            else if (!strcmp(val, "bf16")) o->precision = DT_BF16;
            else return tp_error("--precision must be f32 or bf16, not '%s'", val);
        } else return tp_error("decode: unknown option '%s' (see tpgen decode --help)", key);
    }
    if ((!o->model && !o->vae) || !o->latents || !o->output)
        return tp_error("decode needs --model DIR (or --vae PATH), --latents FILE[:TENSOR] and --output OUT.png (see "
                        "tpgen decode --help)");
    return 0;
}

/* FILE[:TENSOR]: the whole argument names the file when it exists. */
static void split_latents_arg(const char *arg, char **file, char **tensor) {
    const char *colon = strrchr(arg, ':');
    if (access(arg, F_OK) == 0 || !colon || strchr(colon, '/')) {
        *file = xstrdup(arg);
        *tensor = xstrdup("latents");
    } else {
        *file = xasprintf("%.*s", (int)(colon - arg), arg);
        *tensor = xstrdup(colon + 1);
    }
}


static int meta_int(const st_file *f, const char *key, int *out) {
    const char *s = st_meta(f, key);
    if (!s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    /* range-checked before the int: 4294967360 must not become 64 */
    if (end == s || *end || errno || v <= 0 || v > DECODE_MAX_SIDE)
        return tp_error("%s: metadata %s='%s' is not an image size from 1 to %d pixels; give the size with "
                        "--width W --height H", f->path, key, s, DECODE_MAX_SIDE);
    *out = (int)v;
    return 0;
}

/* The PNG's "parameters" text says where the image came from, with the
 * seed and steps of the latents file when it records them. */
/* start_key: "seed" or "initial_latents" (a run from --initial-latents), start its value (NULL: none) */
static char *parameters_text(const decode_opts *o, const char *start_key, const char *start, const char *steps) {
    return xasprintf("tpgen %s decode; latents: %s%s%s%s%s%s%s; precision: %s", TPGEN_VERSION, o->latents,
                     start ? "; " : "", start ? start_key : "", start ? ": " : "", start ? start : "",
                     steps ? "; steps: " : "", steps ? steps : "",
                     o->precision == DT_F32 ? "f32" : "bf16");
}

/* Read the latents and work out the token grid; every mismatch is an error
 * that names the file, the tensor and what was expected. */
static int read_latents(const decode_opts *o, const vae_config *cfg, float **lat, int *hl, int *wl, int *H, int *W,
                        char **params) {
    char *file, *name;
    split_latents_arg(o->latents, &file, &name);
    st_file *f = NULL;
    const st_tensor_info *ti = NULL;
    int rc = st_open(file, &f), ppt = vae_pixels_per_token(cfg), C = 4 * cfg->latent_channels;
    if (!rc && !(ti = st_find(f, name)))
        rc = tp_error("%s has no tensor '%s'; name it with --latents %s:TENSOR", file, name, file);
    int64_t n = 0, c = 0;
    if (!rc) {
        int ok = ti->ndim == 3 ? ti->shape[0] == 1 : ti->ndim == 2;
        if (ok) {
            n = ti->shape[ti->ndim - 2];
            c = ti->shape[ti->ndim - 1];
        }
        if (!ok || c != C)
            rc = tp_error("%s: tensor '%s' must be packed latents [1, N, %d] (4 x latent_channels %d of this VAE), "
                          "but has %d dims with last dim %lld", file, name, C, cfg->latent_channels, ti->ndim,
                          (long long)(ti->ndim ? ti->shape[ti->ndim - 1] : 0));
    }
    *H = o->height;
    *W = o->width;
    if (!rc && !*H) rc = meta_int(f, "height", H);
    if (!rc && !*W) rc = meta_int(f, "width", W);
    if (!rc && (!*H || !*W))
        rc = tp_error("%s has no height/width metadata; give the image size with --width W --height H", file);
    if (!rc && (*H % ppt || *W % ppt))
        rc = tp_error("image size %dx%d is not a multiple of %d (pixels per latent token)", *W, *H, ppt);
    if (!rc) {
        *hl = *H / ppt;
        *wl = *W / ppt;
        if ((int64_t)*hl * *wl != n)
            rc = tp_error("%s: tensor '%s' holds %lld tokens, but a %dx%d image needs %d x %d = %lld; "
                          "check --width/--height", file, name, (long long)n, *W, *H, *wl, *hl, (long long)*hl * *wl);
    }
    if (!rc) rc = st_read_f32(f, name, lat, NULL);
    int64_t bad = rc ? -1 : first_nonfinite_f32(*lat, (size_t)n * (size_t)C);
    if (bad >= 0)   /* they would decode to a black image */
        rc = tp_error("%s: tensor '%s' is not finite (%s at token %lld, channel %lld); the run that wrote it went "
                      "wrong, render it again", file, name, (*lat)[bad] != (*lat)[bad] ? "NaN" : "Inf",
                      (long long)(bad / C), (long long)(bad % C));
    if (!rc) {   /* a run from --initial-latents records its start instead of a seed */
        const char *seed = st_meta(f, "seed"), *init = st_meta(f, "initial_latents");
        *params = seed || !init ? parameters_text(o, "seed", seed, st_meta(f, "steps"))
                                : parameters_text(o, "initial_latents", init, st_meta(f, "steps"));
    }
    st_close(f);
    free(file);
    free(name);
    return rc;
}

static int decode_run(const decode_opts *o, const dist *d) {
    char *vae_dir = o->vae ? xstrdup(o->vae) : xasprintf("%s/vae", o->model);
    struct stat sb;
    int rc = 0;
    if (o->vae && stat(vae_dir, &sb))
        rc = tp_error("--vae %s does not exist (a VAE checkpoint file or folder)", o->vae);
    else if (!o->vae && (stat(vae_dir, &sb) || !S_ISDIR(sb.st_mode)))
        rc = tp_error("%s has no vae/ folder; --model must be a FLUX.2 pipeline folder (diffusers layout)", o->model);
    backend *be = NULL;
    vae_model *v = NULL;
    float *lat = NULL;
    uint8_t *rgb = NULL;
    char *params = NULL;
    int hl = 0, wl = 0, H = 0, W = 0;
    double t0 = omp_get_wtime(), t_load = 0, t_dec = 0;
    if (!rc) rc = backend_select(o->backend, d->local_rank, d->local_size, &be);
    if (!rc) rc = vae_load(vae_dir, be, o->precision, &v);
    if (!rc) {
        t_load = omp_get_wtime() - t0;
        rc = read_latents(o, vae_get_config(v), &lat, &hl, &wl, &H, &W, &params);
    }
    if (!rc) {
        rgb = xmalloc((size_t)H * (size_t)W * 3);
        double t1 = omp_get_wtime();
        rc = vae_decode_packed(v, lat, hl, wl, NULL, rgb);
        t_dec = omp_get_wtime() - t1;
    }
    if (!rc) rc = png_write_rgb(o->output, rgb, W, H, "parameters", params);
    if (!rc)
        printf("decode: wrote %s (%dx%d) | load %.2f s, decode %.2f s on %s (%s), peak backend memory %.1f MB\n",
               o->output, W, H, t_load, t_dec, be->vt->name, dtype_name(o->precision), be->peak_bytes / 1e6);
    free(params);
    free(rgb);
    free(lat);
    vae_free(v);
    if (be) backend_destroy(be);
    free(vae_dir);
    return rc;
}

int cmd_decode(int argc, char **argv) {
    dist d;
    if (dist_init(&argc, &argv, &d)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    decode_opts o;
    int help = 0, rc = parse_args(argc, argv, &o, &help);
    if (help) {
        if (d.world_rank == 0) usage(stdout);
        dist_finalize(&d);
        return 0;
    }
    if (!rc && d.world_rank == 0) rc = decode_run(&o, &d);   /* other ranks never touch the VAE */
    if (dist_agree(d.world, rc)) {
        dist_report_error(d.world);
        dist_finalize(&d);
        return 1;
    }
    dist_finalize(&d);
    return 0;
}
