/* The FLUX.3 pipeline's pieces against diffusers 0.42.1's modular pipelines
 * (tests/data/flux3-pipe, made by tests/tools/flux3_pipe_golden.py): the
 * constant-shift schedule, the seeded f32 noise (bit for bit), the ids of
 * image, text and reference tokens (the float ids the pipeline makes, as
 * our int ids scaled by the image RoPE scale), the CFG switch, the
 * defaults and the single-reference canvas. The whole runs (tp 1, 2, 3) are tests/sh/flux3_pipe.sh. */
#include "test.h"
#include "core/flux3_pipe.h"
#include "core/formats/safetensors.h"
#include "core/schedule.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

#define DATA "tests/data/flux3-pipe/"
static const char *cases[] = {"base_t2i", "base_ref", "flowmap_t2i", "flowmap_ref"};

static float *read(st_file *f, const char *name, int64_t *n) {
    float *x = NULL;
    const st_tensor_info *t = NULL;
    if (st_read_f32(f, name, &x, &t)) return NULL;
    if (n) {
        *n = 1;
        for (int i = 0; i < t->ndim; i++) *n *= t->shape[i];
    }
    return x;
}

TEST(flux3_schedule_matches_the_modular_pipeline) {
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *path = xasprintf(DATA "%s.safetensors", cases[k]);
        st_file *f = NULL;
        REQUIRE(st_open(path, &f) == 0, "%s: %s", path, tp_error_msg());
        int64_t ns = 0, nt = 0;
        float *gs = read(f, "sigmas", &ns), *gt = read(f, "timesteps", &nt);
        REQUIRE(gs && gt && ns == nt + 1, "%s: sigmas/timesteps", path);
        int steps = (int)nt;
        float *s = xmalloc(sizeof(float) * (size_t)(steps + 1)), *t = xmalloc(sizeof(float) * (size_t)steps);
        CHECK(schedule_constant_shift(steps, FLUX3_SHIFT, s, t) == 0, "schedule");
        int exact = 1;
        double worst = 0;
        for (int i = 0; i <= steps; i++) {
            exact &= s[i] == gs[i];
            double d = fabs((double)s[i] - gs[i]);
            worst = d > worst ? d : worst;
            if (i < steps) exact &= t[i] == gt[i], worst = fmax(worst, fabs((double)t[i] - gt[i]) / 1000.0);
        }
        CHECK(worst <= 1e-6, "%s: schedule differs by %.3g", cases[k], worst);
        CHECK(exact, "%s: schedule not bit-exact (max %.3g)", cases[k], worst);
        free(s), free(t), free(gs), free(gt), free(path);
        st_close(f);
    }
    float s[3], t[2];
    CHECK(schedule_constant_shift(0, 6.93, s, t) != 0 && strstr(tp_error_msg(), "steps"), "0 steps refused");
    CHECK(schedule_constant_shift(2, -1, s, t) != 0 && strstr(tp_error_msg(), "shift"), "negative shift refused");
}

TEST(flux3_noise_and_ids_match_the_modular_pipeline) {
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *path = xasprintf(DATA "%s.safetensors", cases[k]);
        st_file *f = NULL;
        REQUIRE(st_open(path, &f) == 0, "%s: %s", path, tp_error_msg());
        const st_tensor_info *ni = st_find(f, "noise");
        REQUIRE(ni && ni->ndim == 4, "%s: noise", path);
        int C = (int)ni->shape[1], h = (int)ni->shape[2], w = (int)ni->shape[3];
        uint64_t seed = strstr(cases[k], "base_t2i") ? 42 : strstr(cases[k], "base_ref") ? 7
                        : strstr(cases[k], "flowmap_t2i") ? 123 : 5;
        int64_t n = 0;
        float *lat0 = read(f, "latents0", &n), *ii = read(f, "img_ids", NULL), *ti = NULL;
        int64_t L = 0;
        ti = read(f, "txt_ids", &L);
        L /= 4;
        REQUIRE(lat0 && ii && ti && n == (int64_t)C * h * w, "%s: tensors", path);
        float *x = flux3_noise_packed(seed, C, h, w);
        CHECK(!memcmp(x, lat0, sizeof(float) * (size_t)n), "%s: packed noise not bit-exact", cases[k]);
        /* image ids: ours are int, scaled in the forward as fl32(id * 0.5) */
        int32_t *ids = xmalloc(sizeof(int32_t) * 4 * (size_t)(h * w));
        flux3_image_ids(h, w, 0, ids);
        int bad = 0;
        for (int64_t t = 0; t < (int64_t)h * w; t++)
            for (int a = 0; a < 4; a++) {
                float v = a == 1 || a == 2 ? (float)ids[t * 4 + a] * FLUX3_IMAGE_ROPE_SCALE : (float)ids[t * 4 + a];
                bad += v != ii[t * 4 + a];
            }
        CHECK(!bad, "%s: %d image id values differ", cases[k], bad);
        int32_t *tids = xmalloc(sizeof(int32_t) * 4 * (size_t)L);
        flux2_text_ids(L, tids);
        bad = 0;
        for (int64_t t = 0; t < 4 * L; t++) bad += (float)tids[t] != ti[t];
        CHECK(!bad, "%s: %d text id values differ", cases[k], bad);
        if (st_find(f, "image_cond_ids")) {
            int64_t R = 0;
            float *ci = read(f, "image_cond_ids", &R);
            R /= 4;
            /* one reference of the same grid as the output here */
            ref_set rs = {.n = 1, .R = R, .C = C, .ids = xcalloc((size_t)R * 4, sizeof(int32_t)),
                          .grid = xcalloc(2, sizeof(int))};
            rs.grid[0] = h, rs.grid[1] = w;
            REQUIRE(R == (int64_t)h * w, "%s: reference grid", cases[k]);
            flux3_ref_ids(&rs);
            bad = 0;
            for (int64_t t = 0; t < R; t++)
                for (int a = 0; a < 4; a++) {
                    float v = a == 1 || a == 2 ? (float)rs.ids[t * 4 + a] * FLUX3_IMAGE_ROPE_SCALE : (float)rs.ids[t * 4 + a];
                    bad += v != ci[t * 4 + a];
                }
            CHECK(!bad && rs.ids[3] == -1, "%s: %d reference id values differ", cases[k], bad);
            free(rs.ids), free(rs.grid), free(ci);
        }
        free(x), free(lat0), free(ii), free(ti), free(ids), free(tids), free(path);
        st_close(f);
    }
}

TEST(flux3_defaults_and_cfg_switch) {
    CHECK(flux3_default_steps(0) == 50 && flux3_default_steps(1) == 16, "steps 50 / 16");
    CHECK(flux3_default_guidance(0) == 3.5, "guidance 3.5");
    CHECK(flux3_uses_cfg(0, 3.5) && flux3_uses_cfg(0, 0.5) && !flux3_uses_cfg(0, 1.0) && !flux3_uses_cfg(1, 3.5),
          "CFG unless the scale is 1 (diffusers' guider), never on flow-map");
    int cw, ch, l, t, pw, ph;
    flux3_reference_canvas(70, 56, &cw, &ch, &l, &t);
    CHECK(cw == 80 && ch == 64 && l == 5 && t == 4, "70x56 -> canvas 80x64 at (5, 4): %dx%d (%d, %d)", cw, ch, l, t);
    flux3_reference_canvas(20, 5000, &cw, &ch, &l, &t);
    CHECK(cw == 64 && ch == 4096, "sides clamped to [64, 4096]: %dx%d", cw, ch);
    flux3_reference_size(70, 56, 1, &pw, &ph);
    CHECK(pw == 80 && ph == 64, "one reference: its canvas");
    flux3_reference_size(70, 90, 2, &pw, &ph);
    CHECK(pw == 64 && ph == 80, "several: cropped to the grid as FLUX.2 (%dx%d)", pw, ph);
    flux3_reference_size(2100, 2100, 1, &pw, &ph);   /* downscaled to 2048x2048 (tests/test_flux3_refs.c) */
    CHECK(pw == 2048 && ph == 2048, "one reference over 4 MP: the canvas of its downscaled size (%dx%d)", pw, ph);
    CHECK(flux3_check_reference("r.png", 2100, 2100, 1) == 0 && flux3_check_reference("r.png", 70, 56, 1) == 0 &&
              flux3_check_reference("r.png", 3000, 3000, 2) == 0,
          "any single reference (downscaled, padded), or several (crop)");
}
