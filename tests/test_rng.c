/* The torch-compatible generator against values drawn by torch itself:
 * golden/randn.safetensors (torch 1.13: the f32 draw and --rng torch1's
 * bf16 draw) and golden/randn-torch2.safetensors (torch 2.15 from PyPI,
 * tests/tools/randn_torch2.py: the default bf16 draw and the f32 draw).
 * Every path (float64 below 16 elements, the vectorised f32 path, the bf16
 * paths, tails that are not a multiple of 16), several seeds (some of them
 * 2^32 and above). The aim is bit equality; the largest difference is
 * reported. Both files keep their large draws as sha256 digests of the raw
 * bytes (tests/data/golden/README.md). */
#include "test.h"
#include "core/rng.h"
#include "core/formats/safetensors.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>
#include <nettle/sha2.h>

/* the reader lives in core/formats/safetensors.c (loader area) */

static const char *k_shapes[] = {"7", "2x16x3", "1x3x5x5", "1x128x4x4"};
static const uint64_t k_seeds[] = {0, 42, 1234567};

static void check_one(st_file *f, uint64_t seed, const char *shape, int bf16, tp_rng_kind kind, double *worst) {
    char name[96];
    snprintf(name, sizeof name, "seed%llu.%s.%s", (unsigned long long)seed, shape, bf16 ? "bf16" : "f32");
    const st_tensor_info *t = st_find(f, name);
    REQUIRE(t, "golden tensor %s missing", name);
    size_t n = 1, es = bf16 ? 2 : 4;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    REQUIRE(t->end - t->begin == n * es, "%s: unexpected dtype", name);
    uint8_t *ref = malloc(n * es), *got = malloc(n * es);
    memset(got, 0xff, n * es);            /* poison */
    REQUIRE(st_read_raw(f, t, ref) == 0, "%s: %s", name, tp_error_msg());
    tp_rng g;
    rng_seed(&g, seed);
    if (bf16) rng_randn_bf16_as(&g, (uint16_t *)got, n, kind);
    else rng_randn_f32(&g, (float *)got, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(got + i * es, ref + i * es, es)) bad++;
        float a = bf16 ? bf16_to_f32(((uint16_t *)got)[i]) : ((float *)got)[i];
        float b = bf16 ? bf16_to_f32(((uint16_t *)ref)[i]) : ((float *)ref)[i];
        double d = fabs((double)a - (double)b);
        if (!(d <= *worst)) *worst = d;  /* NaN propagates */
    }
    CHECK(bad == 0, "%s (%s): %zu of %zu values differ from torch", name, rng_kind_name(kind), bad, n);
    free(ref);
    free(got);
}

/* The draws a file keeps as sha256 digests of their raw bytes only
 * (metadata sha256.seedS.SHAPE.DT): each must hash to its digest. Counts
 * the draws checked and those with a tail (not a multiple of 16 values). */
static void check_digests(const char *path, tp_rng_kind kind, int *checked, int *tails) {
    st_file *f = NULL;
    REQUIRE(st_open(path, &f) == 0, "%s", tp_error_msg());
    for (int i = 0; i < f->n_meta; i++) {
        const char *key = f->meta_keys[i];
        if (strncmp(key, "sha256.", 7)) continue;
        unsigned long long seed;
        char shape[64], dt[8];
        REQUIRE(sscanf(key + 7, "seed%llu.%63[0-9x].%7s", &seed, shape, dt) == 3, "%s: metadata key %s", path, key);
        size_t n = 1;
        for (char *p = shape; *p;) {
            n *= strtoull(p, &p, 10);
            if (*p == 'x') p++;
        }
        int bf = !strcmp(dt, "bf16");
        size_t es = bf ? 2 : 4;
        uint8_t *buf = malloc(n * es);
        tp_rng g;
        rng_seed(&g, seed);
        if (bf) rng_randn_bf16_as(&g, (uint16_t *)buf, n, kind);
        else rng_randn_f32(&g, (float *)buf, n);
        struct sha256_ctx ctx;
        uint8_t digest[SHA256_DIGEST_SIZE];
        sha256_init(&ctx);
        sha256_update(&ctx, n * es, buf);
        sha256_digest(&ctx, sizeof digest, digest);
        char hex[65];
        for (int k = 0; k < 32; k++) snprintf(hex + 2 * k, 3, "%02x", digest[k]);
        CHECK(!strcmp(hex, f->meta_values[i]), "%s: the draw of %zu values hashes to %s, torch's to %s (%s)", key + 7, n,
              hex, f->meta_values[i], path);
        (*checked)++, *tails += n % 16 != 0;
        free(buf);
    }
    st_close(f);
}

TEST(rng_matches_torch_randn) {
    char path[1024];
    snprintf(path, sizeof path, "%s/randn.safetensors", test_golden_dir());
    st_file *f = NULL;
    REQUIRE(st_open(path, &f) == 0, "%s", tp_error_msg());
    double worst = 0;
    int checked = 0;
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 4; k++)
            for (int bf = 0; bf < 2; bf++, checked++) check_one(f, k_seeds[s], k_shapes[k], bf, TP_RNG_TORCH1, &worst);
    st_close(f);
    /* the large shape (seed 0, f32 and bf16) as sha256 digests of torch 1.13's bytes */
    int digests = 0, tails = 0;
    check_digests(path, TP_RNG_TORCH1, &digests, &tails);
    printf("# rng: largest difference from torch 1.13's torch.randn (--rng torch1) over %d golden tensors: %g; %d large "
           "draws hash to torch 1.13's sha256\n", checked, worst, digests);
    CHECK(worst == 0, "largest difference %g", worst);
    CHECK(checked == 24 && digests == 2, "%d tensors and %d digests checked", checked, digests);
}

/* torch 2.15 (the default): every tensor of randn-torch2.safetensors, found
 * by listing the file, so that a tensor added by the generator is checked
 * too; the torch version recorded in the file is printed. */
TEST(rng_matches_torch2_randn) {
    char path[1024];
    snprintf(path, sizeof path, "%s/randn-torch2.safetensors", test_golden_dir());
    st_file *f = NULL;
    REQUIRE(st_open(path, &f) == 0, "%s", tp_error_msg());
    const char *ver = st_meta(f, "torch");
    REQUIRE(ver && !strncmp(ver, "2.", 2), "%s: no torch 2.x version in the metadata", path);
    double worst = 0;
    int checked = 0, bf16s = 0, tails = 0, small = 0, big_seeds = 0;
    for (int i = 0; i < f->n; i++) {
        const st_tensor_info *t = &f->tensors[i];
        unsigned long long seed;
        char shape[64], dt[8];
        REQUIRE(sscanf(t->name, "seed%llu.%63[0-9x].%7s", &seed, shape, dt) == 3, "%s: tensor name %s", path, t->name);
        int bf = !strcmp(dt, "bf16");
        REQUIRE(bf || !strcmp(dt, "f32"), "%s: dtype of %s", path, t->name);
        check_one(f, seed, shape, bf, TP_RNG_TORCH2, &worst);
        size_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        checked++, bf16s += bf, tails += bf && n > 16 && n % 16, small += n < 16, big_seeds += seed >> 32 != 0;
    }
    printf("# rng: largest difference from torch %s's torch.randn over %d tensors (%d bf16, %d bf16 tails, %d under "
           "16 values, %d seeds >= 2^32): %g\n", ver, checked, bf16s, tails, small, big_seeds, worst);
    CHECK(worst == 0, "largest difference %g", worst);
    CHECK(checked >= 100 && tails >= 10 && small >= 10 && big_seeds >= 20, "too few tensors checked (%d)", checked);
    st_close(f);
}

/* torch 2.x's bf16 draw is the f32 draw rounded when the size is a multiple
 * of 16, and not for a tail (it draws 16 fewer uniforms before the tail):
 * an independent check of the structure, next to the bit comparisons */
TEST(rng_torch2_bf16_is_rounded_f32_for_whole_blocks) {
    for (size_t n = 16; n <= 80; n++) {
        tp_rng a, b;
        rng_seed(&a, 123);
        rng_seed(&b, 123);
        float *f = malloc(n * sizeof *f);
        uint16_t *h = malloc(n * sizeof *h);
        rng_randn_f32(&a, f, n);
        rng_randn_bf16_as(&b, h, n, TP_RNG_TORCH2);
        size_t diff = 0;
        for (size_t i = 0; i < n; i++) diff += f32_to_bf16(f[i]) != h[i];
        if (n % 16 == 0) CHECK(diff == 0, "n %zu: %zu values differ from the rounded f32 draw", n, diff);
        else CHECK(diff > 0, "n %zu: the tail equals the rounded f32 draw", n);
        /* the bf16 draw took n 32-bit draws for whole blocks, else n rounded down to 16, plus 16 */
        tp_rng c;
        rng_seed(&c, 123);
        size_t used = n % 16 ? n / 16 * 16 + 16 : n;
        for (size_t i = 0; i < used; i++) rng_u32(&c);
        CHECK(rng_u32(&b) == rng_u32(&c), "n %zu: the bf16 draw did not take %zu uniforms", n, used);
        free(f);
        free(h);
    }
}

/* The generator state carries across draws exactly like torch's: two
 * consecutive small draws use the cached Box-Muller spare, so drawing 3 + 4
 * values equals drawing 7 at once. */
TEST(rng_small_draws_share_the_spare) {
    tp_rng a, b;
    float x[7], y[7];
    rng_seed(&a, 5);
    rng_seed(&b, 5);
    rng_randn_f32(&a, x, 7);
    rng_randn_f32(&b, y, 3);
    rng_randn_f32(&b, y + 3, 4);
    CHECK(!memcmp(x, y, sizeof x), "split draws differ from one draw");
}

/* random64 is two 32-bit draws, the first one the high word */
TEST(rng_u64_is_two_u32) {
    tp_rng a, b;
    rng_seed(&a, 77);
    rng_seed(&b, 77);
    for (int i = 0; i < 1000; i++) {
        uint64_t hi = rng_u32(&b), lo = rng_u32(&b);
        REQUIRE(rng_u64(&a) == (hi << 32 | lo), "draw %d", i);
    }
}

/* The pipeline's initial noise with --rng torch1 (cli/generate_run.c) is
 * what diffusers drew on torch 1.13 for the golden runs: flux2-tiny-a
 * (seed 1) and the three klein-tiny cases. */
#include "core/tp_pipe.h"
#include <jansson.h>

static void check_noise(const char *file, const char *latents_key, const char *seed_key, uint64_t seed_default) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", test_golden_dir(), file);
    st_file *f = NULL;
    REQUIRE(st_open(path, &f) == 0, "%s", tp_error_msg());
    uint64_t seed = seed_default;
    if (seed_key) {
        int64_t *sv = NULL;
        REQUIRE(st_read_i64(f, seed_key, &sv, NULL) == 0, "%s", tp_error_msg());
        seed = (uint64_t)sv[0];
        free(sv);
    }
    float *ref = NULL;
    const st_tensor_info *t = NULL;
    REQUIRE(st_read_f32(f, latents_key, &ref, &t) == 0, "%s", tp_error_msg());
    REQUIRE(t->ndim == 4 && t->shape[0] == 1, "%s: shape", latents_key);
    int C = (int)t->shape[1], h = (int)t->shape[2], w = (int)t->shape[3];
    float *x = flux2_noise_packed_as(seed, C, h, w, TP_RNG_TORCH1);
    size_t bad = 0;
    for (int c = 0; c < C; c++)
        for (int y = 0; y < h; y++)
            for (int xx = 0; xx < w; xx++)
                bad += x[(size_t)(y * w + xx) * C + c] != ref[((size_t)c * h + y) * w + xx];
    CHECK(bad == 0, "%s %s (seed %llu): %zu of %d noise values differ", file, latents_key, (unsigned long long)seed, bad,
          C * h * w);
    free(x);
    free(ref);
    st_close(f);
}


TEST(rng_pipeline_noise_matches_golden_runs) {
    check_noise("flux2-tiny-a/denoise.safetensors", "initial_latents", "seed", 0);
    char path[1024];
    snprintf(path, sizeof path, "%s/klein-tiny/e2e.json", test_golden_dir());
    json_t *e2e = json_load_file(path, 0, NULL);
    json_t *cases = json_object_get(e2e, "cases");
    REQUIRE(json_array_size(cases) > 0, "%s: no cases", path);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        char key[64];
        snprintf(key, sizeof key, "case%zu.initial_latents", i);
        json_int_t seed = json_integer_value(json_object_get(json_array_get(cases, i), "seed"));
        check_noise("klein-tiny/e2e.safetensors", key, NULL, (uint64_t)seed);
    }
    json_decref(e2e);
}

/* --seed itself against torch 2.15, for the seeds and sizes of every FLUX.2
 * golden run (their stored initial_latents were drawn by torch 1.13 and
 * are fed to the end-to-end tests through --initial-latents): dev
 * (flux2-tiny-a, seed 1), klein (klein-tiny's cases) and edit
 * (klein-tiny-edit's cases): the pipeline's noise equals torch 2.15's bf16
 * draw stored in randn-torch2.safetensors. FLUX.3's f32 draw is checked by
 * rng_matches_torch2_randn and its golden runs (made on torch 2.15). */
static void check_noise_torch2(st_file *r2, const char *what, uint64_t seed, int H, int W, int *checked) {
    int C = 32, h = H / 16, w = W / 16;
    char name[96];
    snprintf(name, sizeof name, "seed%llu.1x%dx%dx%d.bf16", (unsigned long long)seed, C, h, w);
    const st_tensor_info *t = st_find(r2, name);
    REQUIRE(t && t->end - t->begin == (uint64_t)C * h * w * 2, "randn-torch2.safetensors: no %s (%s)", name, what);
    uint16_t *ref = malloc((size_t)C * h * w * 2);
    REQUIRE(st_read_raw(r2, t, ref) == 0, "%s", tp_error_msg());
    float *x = flux2_noise_packed(seed, C, h, w);
    size_t bad = 0;
    for (int c = 0; c < C; c++)
        for (int tk = 0; tk < h * w; tk++) bad += x[(size_t)tk * C + c] != bf16_to_f32(ref[(size_t)c * h * w + tk]);
    CHECK(bad == 0, "%s (seed %llu, %dx%d): %zu of %d noise values differ from torch 2.15", what,
          (unsigned long long)seed, W, H, bad, C * h * w);
    (*checked)++;
    free(x);
    free(ref);
}

TEST(rng_golden_runs_seeds_match_torch2) {
    char path[1024];
    snprintf(path, sizeof path, "%s/randn-torch2.safetensors", test_golden_dir());
    st_file *r2 = NULL;
    REQUIRE(st_open(path, &r2) == 0, "%s", tp_error_msg());
    int checked = 0;
    check_noise_torch2(r2, "dev: flux2-tiny-a", 1, 64, 96, &checked);
    const char *sets[2][2] = {{"klein-tiny/e2e.json", "klein"}, {"klein-tiny-edit/edit.json", "edit"}};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", test_golden_dir(), sets[k][0]);
        json_t *root = json_load_file(path, 0, NULL);
        json_t *cases = json_object_get(root, "cases");
        REQUIRE(json_array_size(cases) == 3, "%s: 3 cases expected", path);
        for (size_t i = 0; i < 3; i++) {
            json_t *c = json_array_get(cases, i);
            char what[64];
            snprintf(what, sizeof what, "%s case %zu", sets[k][1], i);
            check_noise_torch2(r2, what, (uint64_t)json_integer_value(json_object_get(c, "seed")),
                               (int)json_integer_value(json_object_get(c, "height")),
                               (int)json_integer_value(json_object_get(c, "width")), &checked);
        }
        json_decref(root);
    }
    CHECK(checked == 7, "%d golden runs checked", checked);
    st_close(r2);
}

/* Large draws (FLUX.2's real noise [1, 128, 64, 64] of a 1024x1024 image,
 * [1, 128, 96, 80], and 332667 values with a tail), kept in the file as
 * torch 2.15's sha256 of the raw bytes only: the draw's bytes must hash to
 * it. */
TEST(rng_large_draws_match_torch2_digests) {
    char path[1024];
    snprintf(path, sizeof path, "%s/randn-torch2.safetensors", test_golden_dir());
    int checked = 0, tails = 0;
    check_digests(path, TP_RNG_TORCH2, &checked, &tails);
    printf("# rng: %d large draws (%d with a tail) hash to torch 2.15's sha256\n", checked, tails);
    CHECK(checked >= 18 && tails >= 6, "%d digests checked", checked);
}
