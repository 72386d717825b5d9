/* The pipeline library on its own (core/tp_pipe.h), without generate's
 * front end: golden/klein-tiny case 0 (diffusers' Flux2KleinPipeline, f32)
 * rendered through probe / open / encode / load / render / decode at the
 * test's world size; the prompt cache (a hit gives the very same
 * embedding, agreed over the group); a render before the load fails on
 * every rank alike and the pipe still works afterwards; the negative
 * prompt's own length (issue 39) and the job checks. */
#include "test.h"
#include "kernels/err.h"
#include "core/tp_pipe.h"
#include "core/formats/safetensors.h"
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

TEST_MPI(tp_pipe_renders_golden_klein_and_caches_prompts) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char model[1024], golden[1024], e2e[1024];
    snprintf(model, sizeof model, "%s/klein-tiny/model", test_golden_dir());
    snprintf(golden, sizeof golden, "%s/klein-tiny/e2e.safetensors", test_golden_dir());
    snprintf(e2e, sizeof e2e, "%s/klein-tiny/e2e.json", test_golden_dir());
    json_t *j = json_load_file(e2e, 0, NULL);
    json_t *c0 = json_array_get(json_object_get(j, "cases"), 0);
    REQUIRE(c0, "%s: no case 0", e2e);
    char *prompt = strdup(json_string_value(json_object_get(c0, "prompt")));
    uint64_t seed = (uint64_t)json_integer_value(json_object_get(c0, "seed"));
    int W = (int)json_integer_value(json_object_get(c0, "width")), H = (int)json_integer_value(json_object_get(c0, "height"));
    int L = (int)json_integer_value(json_object_get(j, "max_sequence_length"));
    json_decref(j);

    tp_pipe_info info;
    char warn[256];
    REQUIRE(tp_pipe_probe(model, &info, warn, sizeof warn) == 0, "%s", tp_error_msg());
    CHECK(info.family == FAMILY_KLEIN_DISTILLED && info.has_vae && info.has_text_encoder && !warn[0],
          "probe: klein distilled with a VAE and a text encoder");
    tp_pipe_config cfg = {.model = model, .backend = "cpu", .precision = DT_F32, .decoder = 1,
                             .prompt_cache_bytes = 1 << 20, .max_sequence_length = L};
    tp_pipe *p = NULL;
    REQUIRE(tp_pipe_open(&cfg, &info, MPI_COMM_WORLD, rank, size, &p) == 0, "%s", tp_error_msg());

    size_t ne = (size_t)L * (size_t)info.joint_dim;
    float *e1 = NULL, *e2 = NULL;
    int hit1 = -1, hit2 = -1;
    int64_t L1 = 0, L2 = 0;
    int rc = tp_pipe_encode(p, prompt, &e1, &L1, &hit1);
    tp_pipe_text_done(p);   /* freed: a miss would load it again */
    if (!rc) rc = tp_pipe_encode(p, prompt, &e2, &L2, &hit2);
    REQUIRE(rc == 0, "%s", tp_error_msg());
    REQUIRE(L1 == L && L2 == L, "FLUX.2 embeds over max_sequence_length: %lld, %lld, want %d", (long long)L1,
            (long long)L2, L);
    CHECK(hit1 == 0 && hit2 == 1 && !memcmp(e1, e2, ne * sizeof(float)), "the second encode is a cache hit (%d, %d) "
          "with the same embedding", hit1, hit2);
    const tp_pipe_stats *st = tp_pipe_get_stats(p);
    CHECK(st->cache_hits == 1 && st->cache_misses == 1, "stats: %llu hits, %llu misses",
          (unsigned long long)st->cache_hits, (unsigned long long)st->cache_misses);

    size_t nl = (size_t)(H / 16) * (W / 16) * (size_t)info.in_channels;
    float *lat = malloc(nl * sizeof(float));
    /* the golden run's start (drawn by torch 1.13; --seed draws torch 2.x's: tests/test_rng.c) */
    st_file *gf = NULL;
    float *init = NULL;
    const st_tensor_info *ti = NULL;
    REQUIRE(st_open(golden, &gf) == 0 && st_read_f32(gf, "case0.initial_latents", &init, &ti) == 0, "%s", tp_error_msg());
    int shape_ok = ti->ndim == 4 && ti->shape[1] == info.in_channels && ti->shape[2] == H / 16 && ti->shape[3] == W / 16;
    st_close(gf);   /* ti belongs to gf */
    REQUIRE(shape_ok, "case0.initial_latents: shape");
    float *start = flux2_latents_pack(init, info.in_channels, H / 16, W / 16);
    free(init);
    tp_job job = {.seed = seed, .init_latents = start, .steps = 4, .guidance = 1.0, .width = W, .height = H,
                     .embeds = e1, .L = L};
    rc = tp_pipe_render(p, &job, lat);
    CHECK(rc == -1 && strstr(tp_error_msg(), "not loaded"), "render before load: an error on every rank (%s)",
          tp_error_msg());
    REQUIRE(tp_pipe_load(p) == 0, "%s", tp_error_msg());
    REQUIRE(tp_pipe_render(p, &job, lat) == 0, "%s", tp_error_msg());
    CHECK(st->steps == 4, "4 steps counted, got %d", st->steps);

    st_file *ref = NULL;
    REQUIRE(st_open(golden, &ref) == 0, "%s", tp_error_msg());
    float *want = NULL;
    const st_tensor_info *tw = NULL;
    REQUIRE(st_read_f32(ref, "case0.final_packed_latents", &want, &tw) == 0, "%s", tp_error_msg());
    REQUIRE((size_t)tw->shape[1] * (size_t)tw->shape[2] == nl, "latents size");
    double num = 0, den = 0;
    for (size_t i = 0; i < nl; i++) num += (lat[i] - want[i]) * (double)(lat[i] - want[i]), den += (double)want[i] * want[i];
    CHECK(sqrt(num / den) < 1e-4, "final latents differ from diffusers: rel L2 %g", sqrt(num / den));
    {   /* collective: each rank decodes a band, the image lands on the group's first rank */
        size_t np = (size_t)W * H * 3;
        uint8_t *rgb = rank == 0 ? malloc(np) : NULL, *img = malloc(np);
        REQUIRE(tp_pipe_decode(p, lat, W, H, rgb, NULL) == 0, "%s", tp_error_msg());
        const st_tensor_info *tu = st_find(ref, "case0.image_u8");
        REQUIRE(tu && st_read_raw(ref, tu, img) == 0, "case0.image_u8: %s", tp_error_msg());
        int worst = 0;
        for (size_t i = 0; rgb && i < np; i++) worst = abs(rgb[i] - img[i]) > worst ? abs(rgb[i] - img[i]) : worst;
        CHECK(worst <= 1, "decoded image differs from diffusers by up to %d levels", worst);
        free(rgb), free(img);
    }
    st_close(ref);
    {   /* issue 39: the negative prompt's length Ln is its buffer's (FLUX.2 read L tokens of it). CFG with the
         * prompt as its own negative is the plain velocity, bit for bit (vn + g (v - vn) = v in f32); a negative
         * of the prompt's first Ln < L tokens, in a buffer of exactly that size (an overread is
         * AddressSanitizer's in the sanitized run), gives other latents, all finite */
        int64_t Ln = L / 2;
        float *neg_full = malloc(ne * sizeof(float)), *neg_short = malloc((size_t)Ln * info.joint_dim * sizeof(float));
        memcpy(neg_full, e1, ne * sizeof(float));
        memcpy(neg_short, e1, (size_t)Ln * info.joint_dim * sizeof(float));
        float *plain = malloc(nl * sizeof(float)), *self = malloc(nl * sizeof(float)), *shrt = malloc(nl * sizeof(float));
        tp_job one = job;
        one.steps = 1;
        REQUIRE(tp_pipe_render(p, &one, plain) == 0, "%s", tp_error_msg());
        one.guidance = 2.0, one.neg_embeds = neg_full, one.Ln = L;
        REQUIRE(tp_pipe_render(p, &one, self) == 0, "%s", tp_error_msg());
        CHECK(!memcmp(plain, self, nl * sizeof(float)), "CFG against the prompt itself is the plain velocity");
        one.neg_embeds = neg_short, one.Ln = Ln;
        REQUIRE(tp_pipe_render(p, &one, shrt) == 0, "Ln %lld: %s", (long long)Ln, tp_error_msg());
        int finite = 1;
        for (size_t i = 0; i < nl; i++) finite &= isfinite(shrt[i]);
        CHECK(finite && memcmp(plain, shrt, nl * sizeof(float)), "a negative of Ln = %lld tokens is read as such",
              (long long)Ln);
        /* sizes that cannot be right are refused on every rank before anything is read */
        one.Ln = 3, one.neg_embeds = NULL;
        CHECK(tp_pipe_render(p, &one, shrt) == -1 && strstr(tp_error_msg(), "Ln = 3 needs negative embeddings"),
              "Ln without negative embeddings: %s", tp_error_msg());
        one.Ln = 0, one.width = W + 8;
        CHECK(tp_pipe_render(p, &one, shrt) == -1 && strstr(tp_error_msg(), "must be a multiple of 16"),
              "a width that is not a multiple of 16: %s", tp_error_msg());
        free(neg_full), free(neg_short), free(plain), free(self), free(shrt);
    }
    free(want), free(lat), free(start), free(e1), free(e2), free(prompt);
    tp_pipe_free(p);
    tp_pipe_info_free(&info);
}

/* tp_pipe_encode_many over a job group of `size` TP groups of one rank
 * (--sp size): the prompts the cache does not hold are dealt out (the k-th
 * to TP group k mod size), each rank gets every embedding, bit for bit the
 * one a rank alone encodes; a repeated prompt is encoded once and counts as
 * a hit, as a second tp_pipe_encode would; a second call's cached prompt is
 * a hit and only its new prompt is encoded. */
TEST_MPI(tp_pipe_encode_many_spreads_prompts_over_tp_groups) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char model[1024];
    snprintf(model, sizeof model, "%s/klein-tiny/model", test_golden_dir());
    tp_pipe_info info;
    char warn[256];
    REQUIRE(tp_pipe_probe(model, &info, warn, sizeof warn) == 0, "%s", tp_error_msg());
    int L = 16;
    tp_pipe_config cfg = {.model = model, .backend = "cpu", .precision = DT_F32, .prompt_cache_bytes = 1 << 22,
                          .max_sequence_length = L, .sp = size};
    tp_pipe_config alone_cfg = cfg;
    alone_cfg.sp = 1, alone_cfg.prompt_cache_bytes = 0;
    tp_pipe *p = NULL, *alone = NULL;
    REQUIRE(tp_pipe_open(&cfg, &info, MPI_COMM_WORLD, rank, size, &p) == 0, "%s", tp_error_msg());
    REQUIRE(tp_pipe_open(&alone_cfg, &info, MPI_COMM_SELF, 0, 1, &alone) == 0, "%s", tp_error_msg());
    const char *prompts[] = {"a fox", "a red boat", "a fox", "a tree at dusk", "a cat"};
    enum { N = 5 };
    float *out[N];
    int64_t lens[N];
    int hit[N];
    REQUIRE(tp_pipe_encode_many(p, 4, prompts, out, lens, hit) == 0, "%s", tp_error_msg());
    int same = 1;
    size_t ne = (size_t)L * (size_t)info.joint_dim;
    for (int i = 0; i < 4; i++) {
        float *want = NULL;
        int64_t wl = 0;
        REQUIRE(tp_pipe_encode(alone, prompts[i], &want, &wl, NULL) == 0, "%s", tp_error_msg());
        same &= wl == L && lens[i] == L && !memcmp(want, out[i], ne * sizeof(float));
        free(want);
    }
    CHECK(same, "rank %d: every embedding of the spread encode = the prompt encoded by one rank alone, bit for bit",
          rank);
    const tp_pipe_stats *st = tp_pipe_get_stats(p);
    /* 3 distinct prompts, the k-th on TP group k mod size */
    int want_mine = 0;
    for (int k = 0; k < 3; k++) want_mine += k % size == rank;
    CHECK(st->cache_misses == 3 && st->cache_hits == 1 && !hit[0] && !hit[1] && hit[2] && !hit[3],
          "3 misses and the repeated prompt a hit (%llu, %llu)", (unsigned long long)st->cache_misses,
          (unsigned long long)st->cache_hits);
    CHECK(st->prompts_encoded == want_mine, "rank %d encoded %d prompts, want %d", rank, st->prompts_encoded,
          want_mine);
    for (int i = 0; i < 4; i++) free(out[i]);
    /* a cached prompt and a new one: only the new one is encoded, on TP group 0 */
    REQUIRE(tp_pipe_encode_many(p, 2, prompts + 3, out, lens, hit) == 0, "%s", tp_error_msg());
    CHECK(hit[0] && !hit[1] && st->cache_hits == 2 && st->cache_misses == 4 &&
              st->prompts_encoded == want_mine + (rank == 0),
          "second call: a hit and a miss (%d, %d), %d encoded here", hit[0], hit[1], st->prompts_encoded);
    CHECK(tp_pipe_prefetch_many(p, 2, prompts) == 0 && st->prefetched == 0 && st->cache_hits == 2,
          "prefetching cached prompts encodes nothing and counts nothing");
    free(out[0]), free(out[1]);
    tp_pipe_free(alone);
    tp_pipe_free(p);
    tp_pipe_info_free(&info);
}
