/* The one sampling loop (core/sampler.c) on a synthetic model whose
 * velocity is known (v = a·x + b per element, the negative pass a
 * different one): the final latents against the loop written out here in
 * double-checked plain C (f32), the bf16 rounding against bf16r applied by
 * hand, and the NaN/Inf check stopping at the first bad step (issue 39:
 * FLUX.3's own loop had lost it). */
#include "test.h"
#include "core/sampler.h"
#include "kernels/err.h"
#include "kernels/tensor.h"
#include <math.h>
#include <string.h>

typedef struct toy {
    float a, b, an, bn;      /* v = a x + b; negative pass v = an x + bn */
    int nan_step;            /* the step whose prediction holds a NaN (-1: none) */
    int inf_step;
    int calls;
    int n;                   /* elements (0: 6) */
} toy;

static int toy_predict(void *ctx, int step, int neg, const float *x, float *v) {
    toy *t = ctx;
    t->calls++;
    for (int i = 0; i < (t->n ? t->n : 6); i++) v[i] = neg ? t->an * x[i] + t->bn : t->a * x[i] + t->b;
    if (step == t->nan_step) v[4] = NAN;
    if (step == t->inf_step) v[1] = INFINITY;
    return 0;
}

static int count_steps(int step, int steps, double s, const float *v, const float *x, float sigma, void *ctx) {
    (*(int *)ctx)++;
    return 0;
}

/* the loop written out: f32 or with bf16 rounding after each op */
static void expected(const float *x0, const float *sig, int steps, const toy *t, int cfg, float gs, int bf16, float *x) {
    for (int i = 0; i < 6; i++) x[i] = bf16 ? bf16r(x0[i]) : x0[i];
    for (int s = 0; s < steps; s++) {
        float dt = sig[s + 1] - sig[s];
        for (int i = 0; i < 6; i++) {
            float v = t->a * x[i] + t->b, vn = t->an * x[i] + t->bn;
            if (cfg) v = bf16 ? bf16r(vn + bf16r(gs * bf16r(v - vn))) : vn + gs * (v - vn);
            x[i] = bf16 ? bf16r(x[i] + bf16r(dt * v)) : x[i] + dt * v;
        }
    }
}

TEST(sampler_matches_the_written_out_loop) {
    const float x0[6] = {0.3f, -1.25f, 2.0f, 0.0071f, -0.5f, 1.0f / 3.0f}, sig[4] = {1.0f, 0.7f, 0.33f, 0.0f};
    for (int cfg = 0; cfg < 2; cfg++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            toy t = {.a = -0.9f, .b = 0.125f, .an = 0.4f, .bn = -0.3f, .nan_step = -1, .inf_step = -1};
            int steps_seen = 0;
            float out[6], want[6];
            sampler_params p = {.latents = x0, .N = 3, .C = 2, .sigmas = sig, .steps = 3, .cfg = cfg, .cfg_scale = 3.5f,
                                .bf16 = bf16, .predict = toy_predict, .model = &t, .on_step = count_steps,
                                .ctx = &steps_seen};
            REQUIRE(sampler_run(&p, out) == 0, "%s", tp_error_msg());
            expected(x0, sig, 3, &t, cfg, 3.5f, bf16, want);
            CHECK(!memcmp(out, want, sizeof out), "cfg %d bf16 %d: the latents differ from the written-out loop", cfg,
                  bf16);
            CHECK(t.calls == 3 * (1 + cfg) && steps_seen == 3, "cfg %d: %d predictions, %d steps reported", cfg,
                  t.calls, steps_seen);
        }
}

TEST(sampler_stops_at_the_first_non_finite_step) {
    const float x0[6] = {1, 2, 3, 4, 5, 6}, sig[5] = {1.0f, 0.75f, 0.5f, 0.25f, 0.0f};
    float out[6] = {0};
    for (int cfg = 0; cfg < 2; cfg++) {
        toy t = {.a = 0.5f, .b = 0.0f, .an = 0.25f, .bn = 0.0f, .nan_step = 2, .inf_step = -1};
        int steps_seen = 0;
        sampler_params p = {.latents = x0, .N = 3, .C = 2, .sigmas = sig, .steps = 4, .cfg = cfg, .cfg_scale = 2.0f,
                            .predict = toy_predict, .model = &t, .on_step = count_steps, .ctx = &steps_seen};
        CHECK(sampler_run(&p, out) == -1 &&
                  strstr(tp_error_msg(), "denoising step 3 of 4: the latents became NaN at token 2, channel 0"),
              "cfg %d: a NaN velocity at step 3: %s", cfg, tp_error_msg());
        CHECK(steps_seen == 2 && out[0] == 0, "cfg %d: stopped before reporting step 3 (%d reported), out untouched",
              cfg, steps_seen);
    }
    toy t = {.a = 0.5f, .nan_step = -1, .inf_step = 0};
    sampler_params p = {.latents = x0, .N = 3, .C = 2, .sigmas = sig, .steps = 4, .bf16 = 1, .predict = toy_predict,
                        .model = &t};
    CHECK(sampler_run(&p, out) == -1 &&
              strstr(tp_error_msg(), "denoising step 1 of 4: the latents became infinite at token 0, channel 1"),
          "an infinite velocity at step 1: %s", tp_error_msg());
}

static int stop_at_2(int step, int steps, double s, const float *v, const float *x, float sigma, void *ctx) { return step == 1; }
static int fail_predict(void *ctx, int step, int neg, const float *x, float *v) {
    return step == 1 && neg ? tp_error("the forward failed") : 0;
}

TEST(sampler_reports_the_step_of_a_failure) {
    const float x0[2] = {1, 2}, sig[4] = {1.0f, 0.5f, 0.25f, 0.0f};
    float out[2];
    sampler_params p = {.latents = x0, .N = 1, .C = 2, .sigmas = sig, .steps = 3, .cfg = 1, .cfg_scale = 2.0f,
                        .predict = fail_predict};
    CHECK(sampler_run(&p, out) == -1 && strstr(tp_error_msg(), "denoising step 2 of 3") &&
              strstr(tp_error_msg(), "the forward failed"),
          "a failed negative pass names its step: %s", tp_error_msg());
    toy t = {.nan_step = -1, .inf_step = -1, .n = 2};
    p.cfg = 0, p.predict = toy_predict, p.model = &t, p.on_step = stop_at_2;
    CHECK(sampler_run(&p, out) == -1 && strstr(tp_error_msg(), "denoising stopped at step 2 of 3"),
          "the step callback stops it: %s", tp_error_msg());
    const float bad[4] = {1.0f, NAN, 0.5f, 0.0f};
    p.sigmas = bad;
    CHECK(sampler_run(&p, out) == -1 && strstr(tp_error_msg(), "sigma[1] is NaN"), "NaN sigma: %s", tp_error_msg());
    p.sigmas = sig, p.steps = 0;
    CHECK(sampler_run(&p, out) == -1 && strstr(tp_error_msg(), "steps must be at least 1"), "0 steps: %s",
          tp_error_msg());
}

/* The step callback's sigma is σ[i+1], so x − σ·v (after the step) is the
 * clean-image prediction x_before − σ[i]·v that previews decode: checked
 * against the previous step's latents, written out here (f32: to rounding;
 * bf16: within the rounding of x, 2^-8 relative). */
typedef struct x0_log { float prev[6]; float sig[8]; int steps; double worst[2]; int bf16; } x0_log;

static int check_x0(int step, int steps, double s, const float *v, const float *x, float sigma, void *ctx) {
    (void)steps, (void)s;
    x0_log *l = ctx;
    l->sig[step] = sigma;
    for (int i = 0; i < 6; i++) {
        double want = (double)l->prev[i] - (double)l->sig[7] * v[i];   /* sig[7]: σ[i], set before the step */
        double got = (double)x[i] - (double)sigma * v[i];
        double err = fabs(got - want) / (fabs(want) + fabs(x[i]) + 1e-3);
        if (err > l->worst[l->bf16]) l->worst[l->bf16] = err;
        l->prev[i] = x[i];
    }
    l->sig[7] = sigma;
    l->steps++;
    return 0;
}

TEST(sampler_step_sigma_gives_the_clean_prediction) {
    const float x0[6] = {0.3f, -1.25f, 2.0f, 0.0071f, -0.5f, 1.0f / 3.0f}, sig[4] = {1.0f, 0.7f, 0.33f, 0.0f};
    x0_log l = {0};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        toy t = {.a = -0.9f, .b = 0.125f, .nan_step = -1, .inf_step = -1};
        float out[6];
        l.bf16 = bf16, l.steps = 0, l.sig[7] = sig[0];
        for (int i = 0; i < 6; i++) l.prev[i] = bf16 ? bf16r(x0[i]) : x0[i];
        sampler_params p = {.latents = x0, .N = 3, .C = 2, .sigmas = sig, .steps = 3, .bf16 = bf16,
                            .predict = toy_predict, .model = &t, .on_step = check_x0, .ctx = &l};
        REQUIRE(sampler_run(&p, out) == 0, "%s", tp_error_msg());
        CHECK(l.steps == 3 && l.sig[0] == sig[1] && l.sig[1] == sig[2] && l.sig[2] == 0.0f,
              "bf16 %d: the callback's sigma is σ[i+1] (got %g %g %g)", bf16, l.sig[0], l.sig[1], l.sig[2]);
    }
    CHECK(l.worst[0] < 1e-6, "f32: x − σ[i+1]·v equals x_before − σ[i]·v to rounding (worst %.3g)", l.worst[0]);
    CHECK(l.worst[1] < 1.0 / 128, "bf16: within the rounding of x (worst %.3g)", l.worst[1]);
}
