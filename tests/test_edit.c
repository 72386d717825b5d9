/* Reference-image editing against golden/klein-tiny-edit (diffusers
 * Flux2KleinPipeline.__call__(image=[...]) executed whole) and its resize/
 * set (PIL LANCZOS from diffusers' _resize_to_target_area): preprocessing,
 * the VAE encoder, the packed reference tokens and their ids. The whole
 * pipeline at tp 1, 2 and 4 is in tests/test_generate_edit.c. */
#include "test.h"
#include "kernels/err.h"
#include "core/image/image.h"
#include "core/refs.h"
#include "core/formats/safetensors.h"
#include "core/models/vae/vae.h"
#include "cli/runspec.h"
#include "kernels/ops.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static char *gpath(const char *rel) { return xasprintf("%s/klein-tiny-edit/%s", test_golden_dir(), rel); }

/* every (case, reference) of edit.json: the file and its index */
typedef struct ref_case {
    int c, j;
    char file[128];
} ref_case;

static int load_ref_cases(ref_case *out, int max) {
    char *p = gpath("edit.json");
    json_t *root = json_load_file(p, 0, NULL);
    free(p);
    if (!root) return -1;
    int n = 0;
    json_t *cases = json_object_get(root, "cases");
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *refs = json_object_get(json_array_get(cases, c), "refs");
        for (size_t j = 0; j < json_array_size(refs) && n < max; j++) {
            out[n].c = (int)c, out[n].j = (int)j;
            snprintf(out[n].file, sizeof out[n].file, "%s",
                     json_string_value(json_object_get(json_array_get(refs, j), "file")));
            n++;
        }
    }
    json_decref(root);
    return n;
}

TEST(edit_reference_pixels_match_golden) {
    ref_case rc[16];
    int n = load_ref_cases(rc, 16);
    REQUIRE(n > 0, "edit.json unreadable");
    char *gp = gpath("edit.safetensors");
    st_file *f = NULL;
    REQUIRE(st_open(gp, &f) == 0, "%s", tp_error_msg());
    free(gp);
    for (int i = 0; i < n; i++) {
        char *path = gpath(rc[i].file), key[64];
        snprintf(key, sizeof key, "case%d.ref%d.pixels", rc[i].c, rc[i].j);
        float *want = NULL, *got = NULL;
        const st_tensor_info *ti = NULL;
        int pw = 0, ph = 0;
        REQUIRE(st_read_f32(f, key, &want, &ti) == 0, "%s", tp_error_msg());
        REQUIRE(image_load_reference(path, &got, &pw, &ph) == 0, "%s", tp_error_msg());
        CHECK(ti->shape[2] == ph && ti->shape[3] == pw, "%s: processed size %dx%d, golden %lldx%lld", key, pw, ph,
              (long long)ti->shape[3], (long long)ti->shape[2]);
        if (ti->shape[2] == ph && ti->shape[3] == pw) {
            double d = max_abs_diff(got, want, (size_t)3 * pw * ph);
            printf("# %s (%s): %dx%d, max |diff| %g\n", key, rc[i].file, pw, ph, d);
            CHECK(d == 0, "%s: pixels differ by up to %g (the crop path must be exact)", key, d);
        }
        int iw, ih;
        CHECK(image_probe(path, &iw, &ih) == 0, "%s", tp_error_msg());
        int sw, sh;
        image_reference_size(iw, ih, &sw, &sh);
        CHECK(sw == pw && sh == ph, "image_reference_size %dx%d vs %dx%d", sw, sh, pw, ph);
        free(want), free(got), free(path);
    }
    st_close(f);
}

TEST(edit_resize_matches_pil_lanczos) {
    char *jp = gpath("resize/resize.json");
    json_t *root = json_load_file(jp, 0, NULL);
    free(jp);
    REQUIRE(root, "resize.json unreadable");
    json_t *cases = json_object_get(root, "cases");
    REQUIRE(json_array_size(cases) > 0, "no resize cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *file = json_string_value(json_object_get(c, "file"));
        int rw = (int)json_integer_value(json_object_get(c, "resized_width"));
        int rh = (int)json_integer_value(json_object_get(c, "resized_height"));
        char rel[256];
        snprintf(rel, sizeof rel, "resize/%s", file);
        char *src = gpath(rel);
        snprintf(rel, sizeof rel, "resize/resized/%s", strrchr(file, '/') + 1);
        char *ref = gpath(rel);
        uint8_t *a = NULL, *b = NULL;
        int w, h, bw, bh;
        REQUIRE(image_read_rgb(src, &a, &w, &h) == 0 && image_read_rgb(ref, &b, &bw, &bh) == 0, "%s", tp_error_msg());
        int ow, oh;
        image_target_area_size(w, h, &ow, &oh);
        CHECK(ow == rw && oh == rh && bw == rw && bh == rh, "%s: size %dx%d, diffusers %dx%d", file, ow, oh, rw, rh);
        if (ow == bw && oh == bh) {
            uint8_t *o = malloc((size_t)ow * oh * 3);
            image_resize_lanczos(a, w, h, o, ow, oh);
            size_t n = (size_t)ow * oh * 3, off = 0;
            int worst = 0;
            for (size_t k = 0; k < n; k++) {
                int d = abs((int)o[k] - (int)b[k]);
                off += d != 0;
                if (d > worst) worst = d;
            }
            printf("# resize %s %dx%d -> %dx%d: max diff %d, %zu of %zu samples differ\n", file, w, h, ow, oh, worst,
                   off, n);
            CHECK(worst <= 1, "%s: resized pixels differ from PIL by up to %d levels", file, worst);
            free(o);
        }
        /* the size that follows: floored to 16, centre-cropped */
        int pw, ph;
        image_reference_size(w, h, &pw, &ph);
        CHECK(pw == rw / 16 * 16 && ph == rh / 16 * 16, "%s: processed size %dx%d", file, pw, ph);
        float *px = NULL;
        int lw, lh;
        CHECK(image_load_reference(src, &px, &lw, &lh) == 0 && lw == pw && lh == ph, "%s: %s", file, tp_error_msg());
        if (px) {   /* the crop of the resized golden, normalised, against image_load_reference */
            int left = (rw - pw) / 2, top = (rh - ph) / 2, bad = 0;
            for (int y = 0; y < ph && !bad; y++)
                for (int x = 0; x < pw; x++)
                    for (int ch = 0; ch < 3; ch++) {
                        float u = b[((size_t)(top + y) * rw + left + x) * 3 + ch];
                        float want = 2.0f * (u / 255.0f) - 1.0f, got = px[(size_t)ch * pw * ph + (size_t)y * pw + x];
                        if (fabsf(got - want) > 2.0f / 255.0f + 1e-6f) bad++;
                    }
            CHECK(bad == 0, "%s: %d preprocessed pixels off by more than one level from the resized golden", file, bad);
        }
        free(px), free(a), free(b), free(src), free(ref);
    }
    json_decref(root);
}

/* the encoder on the golden pixels: mode and normalised latents */
static void encoder_case(dtype_t dt, double tol) {
    ref_case rc[16];
    int n = load_ref_cases(rc, 16);
    REQUIRE(n > 0, "edit.json unreadable");
    backend *be = backend_cpu_create(0);
    char *vdir = xasprintf("%s/klein-tiny/model/vae", test_golden_dir()), *gp = gpath("edit.safetensors");
    vae_model *v = NULL;
    st_file *f = NULL;
    if (vae_load_parts(vdir, be, dt, VAE_ENCODER, &v) || st_open(gp, &f)) {
        test_fail(__FILE__, __LINE__, "%s", tp_error_msg());
        goto out;
    }
    for (int i = 0; i < n; i++) {
        char k1[64], k2[64], k3[64];
        snprintf(k1, sizeof k1, "case%d.ref%d.pixels", rc[i].c, rc[i].j);
        snprintf(k2, sizeof k2, "case%d.ref%d.vae_latent_mode", rc[i].c, rc[i].j);
        snprintf(k3, sizeof k3, "case%d.ref%d.latents", rc[i].c, rc[i].j);
        float *px = NULL, *mode = NULL, *lat = NULL;
        const st_tensor_info *ti = NULL, *tm = NULL, *tl = NULL;
        if (st_read_f32(f, k1, &px, &ti) || st_read_f32(f, k2, &mode, &tm) || st_read_f32(f, k3, &lat, &tl)) {
            test_fail(__FILE__, __LINE__, "%s", tp_error_msg());
            free(px), free(mode), free(lat);
            break;
        }
        int H = (int)ti->shape[2], W = (int)ti->shape[3];
        size_t nm = (size_t)tm->shape[1] * tm->shape[2] * tm->shape[3], nl = (size_t)tl->shape[1] * tl->shape[2] * tl->shape[3];
        float *gm = malloc(nm * sizeof(float)), *gl = malloc(nl * sizeof(float));
        int rc2 = vae_encode_image(v, px, H, W, gm, gl, NULL);
        CHECK(rc2 == 0, "encode: %s", tp_error_msg());
        if (!rc2) {
            double em = rel_l2(gm, mode, nm), el = rel_l2(gl, lat, nl);
            printf("# vae encoder %s %s: mode rel L2 %.3g, latents rel L2 %.3g\n", dtype_name(dt), k1, em, el);
            CHECK(em < tol && el < tol, "%s: encoder differs from diffusers (mode %.3g, latents %.3g, tol %g)", k1, em,
                  el, tol);
        }
        free(gm), free(gl), free(px), free(mode), free(lat);
    }
out:
    st_close(f);
    vae_free(v);
    free(vdir), free(gp);
    backend_destroy(be);
}

TEST(edit_vae_encoder_matches_golden_f32) { encoder_case(DT_F32, 1e-4); }
TEST(edit_vae_encoder_bf16_close_to_golden) { encoder_case(DT_BF16, 3e-2); }

/* files -> packed image_latents and image_latent_ids of every case */
TEST(edit_reference_tokens_match_golden) {
    char *jp = gpath("edit.json");
    json_t *root = json_load_file(jp, 0, NULL);
    free(jp);
    REQUIRE(root, "edit.json unreadable");
    backend *be = backend_cpu_create(0);
    char *vdir = xasprintf("%s/klein-tiny/model/vae", test_golden_dir()), *gp = gpath("edit.safetensors");
    vae_model *v = NULL;
    st_file *f = NULL;
    if (vae_load_parts(vdir, be, DT_F32, VAE_ENCODER, &v) || st_open(gp, &f)) {
        test_fail(__FILE__, __LINE__, "%s", tp_error_msg());
        goto out;
    }
    json_t *cases = json_object_get(root, "cases");
    for (size_t c = 0; c < json_array_size(cases) && !test_failed(); c++) {
        json_t *files = json_object_get(json_array_get(cases, c), "ref_files");
        int n = (int)json_array_size(files);
        char *paths[8];
        for (int k = 0; k < n && k < 8; k++) paths[k] = gpath(json_string_value(json_array_get(files, k)));
        ref_set rs;
        int rc = refs_encode(v, paths, n, &rs);
        CHECK(rc == 0, "refs_encode: %s", tp_error_msg());
        char key[64];
        float *want = NULL;
        int64_t *ids = NULL;
        const st_tensor_info *ti = NULL, *tid = NULL;
        snprintf(key, sizeof key, "case%zu.image_latents", c);
        int ok = !rc && !st_read_f32(f, key, &want, &ti);
        snprintf(key, sizeof key, "case%zu.image_latent_ids", c);
        ok = ok && !st_read_i64(f, key, &ids, &tid);
        if (ok && (ti->shape[1] != rs.R || ti->shape[2] != rs.C)) {
            test_fail(__FILE__, __LINE__, "case%zu: %lld reference tokens of %d channels, golden [%lld, %lld]", c,
                      (long long)rs.R, rs.C, (long long)ti->shape[1], (long long)ti->shape[2]);
            ok = 0;
        }
        if (ok) {
            double e = rel_l2(rs.tokens, want, (size_t)rs.R * rs.C);
            int bad = 0;
            for (int64_t t = 0; t < rs.R * 4; t++) bad += rs.ids[t] != ids[t];
            printf("# case%zu: %d references, %lld tokens, image_latents rel L2 %.3g, ids wrong %d\n", c, n,
                   (long long)rs.R, e, bad);
            CHECK(e < 1e-4, "case%zu image_latents rel L2 %g", c, e);
            CHECK(bad == 0, "case%zu: %d image_latent_ids differ", c, bad);
        }
        free(want), free(ids);
        if (!rc) refs_free(&rs);
        for (int k = 0; k < n && k < 8; k++) free(paths[k]);
    }
out:
    json_decref(root);
    st_close(f);
    vae_free(v);
    free(vdir), free(gp);
    backend_destroy(be);
}

/* run spec: images:, --image (replacing the spec's list), per-prompt entries */
TEST(edit_runspec_images) {
    run_spec s;
    runspec_init(&s);
    const char *y = "model: m\nimages: [a.png, b.png]\nprompts:\n  - {prompt: one, images: [c.png]}\n  - two\n"
                    "seeds: [1, 2]\n";
    REQUIRE(runspec_load_string(&s, y, "t.yaml") == 0, "%s", tp_error_msg());
    int n = 0;
    char *const *im = runspec_job_images(&s, 0, &n);   /* prompt 0, seed 1 */
    CHECK(n == 1 && !strcmp(im[0], "c.png"), "prompt 0: %d images", n);
    im = runspec_job_images(&s, 3, &n);                /* prompt 1, seed 2 */
    CHECK(n == 2 && !strcmp(im[0], "a.png") && !strcmp(im[1], "b.png"), "prompt 1: %d images", n);
    char *argv[] = {"generate", "--image", "x.png", "--image", "y.png", NULL};
    REQUIRE(runspec_parse_args(&s, 5, argv) == 0, "%s", tp_error_msg());
    im = runspec_job_images(&s, 2, &n);
    CHECK(n == 2 && !strcmp(im[0], "x.png") && !strcmp(im[1], "y.png"), "--image replaces images: (%d)", n);
    im = runspec_job_images(&s, 0, &n);
    CHECK(n == 1 && !strcmp(im[0], "c.png"), "a prompt's own images stay");
    runspec_free(&s);
    const char *bad[] = {"model: m\nimages: a.png\n", "model: m\nimages: []\n",
                         "model: m\nprompts:\n  - {prompt: a, images: [x.png], seed: 1}\n",
                         "model: m\nprompts:\n  - {images: [x.png]}\n", "model: m\nprompts:\n  - {prompt: a, images: [[x]]}\n"};
    const char *want[] = {"t.yaml:2:9: images: expected a list", "the list is empty", "unknown key 'seed' in prompt entry 1",
                          "prompt entry 1 has no 'prompt'", "item 1 must be a file name"};
    for (int i = 0; i < 5; i++) {
        runspec_init(&s);
        int rc = runspec_load_string(&s, bad[i], "t.yaml");
        CHECK(rc != 0 && strstr(tp_error_msg(), want[i]), "bad spec %d: rc %d, '%s'", i, rc, tp_error_msg());
        runspec_free(&s);
    }
}
