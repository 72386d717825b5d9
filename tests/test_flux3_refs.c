/* FLUX.3's reference preprocessing against diffusers 0.42.1's
 * Flux3ImageProcessor (tests/data/flux3-refs, tests/tools/flux3_refs_golden.py):
 * the size a single reference is downscaled to (40 sizes: the 4 MP area
 * with its 0.995 back-off, the 4096 side), the preprocessed canvas bit for
 * bit (sha256 of its uint8 pixels) for "fill" (one reference: LANCZOS +
 * reflect padding) and "crop" (several: under 1 MP, centre crop, no FLUX.2
 * checks), the crop-back box, and the reference tokens the VAE makes of
 * the long (4500x40) and the two-reference cases, at tp = np. The images
 * are made here from the integer formula of tests/tools/flux3_refs_images.py
 * (their sha256 is checked against refs.json). The whole runs are
 * tests/sh/flux3_refs.sh. */
#include "test.h"
#include "core/flux3_pipe.h"
#include "core/formats/safetensors.h"
#include "core/models/vae/vae.h"
#include "core/refs.h"
#include "core/image/png.h"
#include "kernels/ops.h"
#include <unistd.h>
#include "kernels/err.h"
#include <jansson.h>
#include <math.h>
#include <mpi.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DATA "tests/data/flux3-refs/"

static json_t *refs_json(void) { return json_load_file(DATA "refs.json", 0, NULL); }

/* tests/tools/flux3_refs_images.py's pattern() */
static uint8_t flux3_refs_pattern(int x, int y, int c) {
    uint64_t b = ((uint64_t)(x / 48) * 73856093u ^ (uint64_t)(y / 48) * 19349663u ^ (uint64_t)(c + 1) * 83492791u) &
                 0xFFFFFFFFu;
    return (uint8_t)((b % 160 + (uint64_t)(x * 3 + y * 2 + c * 5) % 64 + 16) & 255);
}

static uint8_t *make_image(int w, int h) {
    uint8_t *rgb = xmalloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) rgb[((size_t)y * w + x) * 3 + c] = flux3_refs_pattern(x, y, c);
    return rgb;
}

static void sha_hex(const uint8_t *d, size_t n, char hex[65]) {
    struct sha256_ctx ctx;
    uint8_t dg[SHA256_DIGEST_SIZE];
    sha256_init(&ctx);
    sha256_update(&ctx, n, d);
    sha256_digest(&ctx, sizeof dg, dg);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(hex + 2 * i, 3, "%02x", dg[i]);
}

/* [3, ph, pw] in [-1, 1] -> HWC uint8 round((x + 1) * 127.5), as the golden hashes them */
static void pixels_sha(const float *px, int pw, int ph, char hex[65]) {
    size_t np = (size_t)pw * ph;
    uint8_t *u = xmalloc(np * 3);
    for (size_t i = 0; i < np; i++)
        for (int c = 0; c < 3; c++) {
            double v = round(((double)px[(size_t)c * np + i] + 1.0) * 127.5);
            u[i * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    sha_hex(u, np * 3, hex);
    free(u);
}

static int jint(json_t *o, const char *k) { return (int)json_integer_value(json_object_get(o, k)); }

TEST(flux3_refs_downscale_sizes_match_diffusers) {
    json_t *root = refs_json();
    REQUIRE(root, DATA "refs.json unreadable");
    json_t *sizes = json_object_get(root, "sizes");
    REQUIRE(json_array_size(sizes) >= 30, "refs.json: sizes");
    int bad = 0, resized = 0;
    for (size_t i = 0; i < json_array_size(sizes); i++) {
        json_t *s = json_array_get(sizes, i);
        int v[6];
        for (int k = 0; k < 6; k++) v[k] = (int)json_integer_value(json_array_get(s, k));
        int rw, rh, cw, ch, l, t, pw, ph;
        flux3_reference_resized_size(v[0], v[1], &rw, &rh);
        flux3_reference_canvas(rw, rh, &cw, &ch, &l, &t);
        flux3_reference_size(v[0], v[1], 1, &pw, &ph);
        resized += rw != v[0] || rh != v[1];
        if (rw != v[2] || rh != v[3] || cw != v[4] || ch != v[5] || pw != cw || ph != ch) {
            bad++;
            test_fail(__FILE__, __LINE__, "%dx%d: resized %dx%d canvas %dx%d, diffusers %dx%d canvas %dx%d", v[0], v[1],
                      rw, rh, cw, ch, v[2], v[3], v[4], v[5]);
        }
    }
    printf("# %zu sizes (%d downscaled): %d differ from Flux3ImageProcessor\n", json_array_size(sizes), resized, bad);
    CHECK(resized >= 20, "the table must exercise the downscale (%d sizes downscaled)", resized);
    json_decref(root);
}

TEST(flux3_refs_pixels_match_diffusers) {
    json_t *root = refs_json();
    REQUIRE(root, DATA "refs.json unreadable");
    json_t *images = json_object_get(root, "images"), *pixels = json_object_get(root, "pixels");
    const char *name;
    json_t *im;
    int n = 0;
    json_object_foreach(images, name, im) {
        int w = jint(im, "width"), h = jint(im, "height");
        uint8_t *rgb = make_image(w, h);
        char hex[65];
        sha_hex(rgb, (size_t)w * h * 3, hex);
        CHECK(!strcmp(hex, json_string_value(json_object_get(im, "sha256"))),
              "%s: the pattern's bytes differ from flux3_refs_images.py's", name);
        for (int mode = 0; mode < 2; mode++) {
            json_t *g = json_object_get(json_object_get(pixels, name), mode ? "crop" : "fill");
            uint8_t *copy = xmalloc((size_t)w * h * 3);
            memcpy(copy, rgb, (size_t)w * h * 3);
            float *px = NULL;
            int pw = 0, ph = 0;
            int rc = mode ? flux3_crop_reference_from_rgb(copy, w, h, name, &px, &pw, &ph)
                          : flux3_reference_from_rgb(copy, w, h, name, &px, &pw, &ph);
            CHECK(rc == 0, "%s: %s", name, tp_error_msg());
            if (rc) continue;
            CHECK(pw == jint(g, "width") && ph == jint(g, "height"), "%s %s: %dx%d, diffusers %dx%d", name,
                  mode ? "crop" : "fill", pw, ph, jint(g, "width"), jint(g, "height"));
            pixels_sha(px, pw, ph, hex);
            int same = !strcmp(hex, json_string_value(json_object_get(g, "sha256")));
            printf("# %s %dx%d %s: %dx%d, pixels %s\n", name, w, h, mode ? "crop" : "fill", pw, ph,
                   same ? "bit-equal to diffusers" : "DIFFER");
            CHECK(same, "%s %s: the preprocessed pixels differ from diffusers'", name, mode ? "crop" : "fill");
            if (!mode) {   /* the crop-back box (left, top, right, bottom) */
                json_t *b = json_object_get(g, "reference_crop");
                int box[4], need = flux3_reference_crop_box(w, h, box), gb[4];
                for (int k = 0; k < 4; k++) gb[k] = (int)json_integer_value(json_array_get(b, k));
                CHECK(box[0] == gb[0] && box[1] == gb[1] && box[0] + box[2] == gb[2] && box[1] + box[3] == gb[3],
                      "%s: crop box %d,%d +%dx%d, diffusers (%d, %d, %d, %d)", name, box[0], box[1], box[2], box[3],
                      gb[0], gb[1], gb[2], gb[3]);
                CHECK(need == (gb[0] || gb[1] || gb[2] != pw || gb[3] != ph), "%s: crop needed %d", name, need);
            }
            free(px);
            n++;
        }
        free(rgb);
    }
    CHECK(n == 8, "%d preprocessings compared, want 8", n);
    json_decref(root);
}

TEST(flux3_refs_checks) {
    CHECK(flux3_check_reference("r.png", 3000, 9000, 1) == 0 && flux3_check_reference("r.png", 5, 5, 1) == 0,
          "a single reference of any size is taken");
    CHECK(flux3_check_reference("r.png", 40, 200, 2) == 0, "40x200 of several: FLUX.2's 64-pixel check does not apply");
    CHECK(flux3_check_reference("r.png", 15, 300, 2) != 0 && strstr(tp_error_msg(), "r.png is 15x300") &&
              strstr(tp_error_msg(), "16 pixels"),
          "a 15-pixel side of several: %s", tp_error_msg());
    uint8_t *rgb = make_image(15, 300);
    float *px = (float *)1;
    int pw, ph;
    CHECK(flux3_crop_reference_from_rgb(rgb, 15, 300, "r.png", &px, &pw, &ph) != 0 && px == NULL, "crop of 15x300");
}

/* the reference tokens of a golden case (its references made here and written to TMPDIR as PNG) at tp = np */
static void tokens_case(const char *cname, const char *const *names, int n) {
    int rank, np;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    json_t *root = refs_json();
    REQUIRE(root, DATA "refs.json unreadable");
    char *paths[4];
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    for (int k = 0; k < n; k++) {
        json_t *im = json_object_get(json_object_get(root, "images"), names[k]);
        int w = jint(im, "width"), h = jint(im, "height");
        paths[k] = xasprintf("%s/flux3-refs-%d-%s-r%d.png", tmp, (int)getpid(), names[k], rank);
        uint8_t *rgb = make_image(w, h);
        CHECK(png_write_rgb(paths[k], rgb, w, h, NULL, NULL) == 0, "%s", tp_error_msg());
        free(rgb);
    }
    backend *be = backend_cpu_create(0);
    char *vdir = xasprintf("%s/vae-tiny/model/vae", test_golden_dir()), *gp = xasprintf(DATA "%s.safetensors", cname);
    vae_model *v = NULL;
    st_file *f = NULL;
    float *want = NULL, *wid = NULL;
    const st_tensor_info *ti = NULL, *tid = NULL;
    if (vae_load_parts(vdir, be, DT_F32, VAE_ENCODER, &v) || st_open(gp, &f) ||
        st_read_f32(f, "image_cond", &want, &ti) || st_read_f32(f, "image_cond_ids", &wid, &tid)) {
        test_fail(__FILE__, __LINE__, "%s", tp_error_msg());
        goto out;
    }
    ref_set rs;
    int rc = refs_encode_group_with(v, MPI_COMM_WORLD, paths, n, n == 1 ? flux3_load_reference : flux3_load_reference_crop,
                                    &rs);
    CHECK(rc == 0, "refs_encode_group_with: %s", tp_error_msg());
    if (!rc && rank == 0) {
        flux3_ref_ids(&rs);
        if (rs.R != ti->shape[1] || rs.C != ti->shape[2]) {
            test_fail(__FILE__, __LINE__, "%s: %lld tokens of %d, golden [%lld, %lld]", cname, (long long)rs.R, rs.C,
                      (long long)ti->shape[1], (long long)ti->shape[2]);
        } else {
            double e = rel_l2(rs.tokens, want, (size_t)rs.R * rs.C);
            int bad = 0;   /* the golden ids are (t, h*0.5, w*0.5, l) floats; ours (t, h, w, l) */
            for (int64_t t = 0; t < rs.R; t++)
                for (int a = 0; a < 4; a++) {
                    float g = wid[t * 4 + a], o = (float)rs.ids[t * 4 + a] * (a == 1 || a == 2 ? 0.5f : 1.0f);
                    bad += g != o;
                }
            printf("# %s tp=%d: %d reference(s), %lld tokens, image latents rel L2 %.3g, ids wrong %d\n", cname, np, n,
                   (long long)rs.R, e, bad);
            CHECK(e < 1e-4, "%s: reference tokens rel L2 %g", cname, e);
            CHECK(bad == 0, "%s: %d id values differ", cname, bad);
        }
    }
    if (!rc) refs_free(&rs);
out:
    for (int k = 0; k < n; k++) remove(paths[k]), free(paths[k]);
    free(want), free(wid);
    st_close(f);
    vae_free(v);
    free(vdir), free(gp);
    backend_destroy(be);
    json_decref(root);
}

TEST_MPI(flux3_refs_tokens_long_match_diffusers) {
    static const char *const names[] = {"long"};
    tokens_case("long", names, 1);
}
TEST_MPI(flux3_refs_tokens_multi_match_diffusers) {
    static const char *const names[] = {"tall", "small"};
    tokens_case("multi", names, 2);
}
