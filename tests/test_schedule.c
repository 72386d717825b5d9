/* The FLUX.2 schedule against golden/schedules.json (diffusers'
 * compute_empirical_mu + FlowMatchEulerDiscreteScheduler.set_timesteps). */
#include "test.h"
#include "core/schedule.h"
#include "kernels/err.h"
#include <jansson.h>
#include <stdlib.h>

TEST(schedule_matches_diffusers) {
    char path[1024];
    snprintf(path, sizeof path, "%s/schedules.json", test_golden_dir());
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    REQUIRE(root && json_is_array(root), "%s: %s", path, je.text);
    REQUIRE(json_array_size(root) > 0, "no cases");
    size_t i;
    json_t *c;
    double worst_s = 0, worst_t = 0, worst_mu = 0;
    json_array_foreach(root, i, c) {
        long n = (long)json_integer_value(json_object_get(c, "image_seq_len"));
        int steps = (int)json_integer_value(json_object_get(c, "steps"));
        json_t *sig = json_object_get(c, "sigmas"), *ts = json_object_get(c, "timesteps");
        REQUIRE(json_array_size(sig) == (size_t)steps + 1 && json_array_size(ts) == (size_t)steps, "case %zu shape", i);
        float *s = malloc(sizeof(float) * (steps + 1)), *t = malloc(sizeof(float) * steps);
        for (int k = 0; k <= steps; k++) s[k] = NAN;
        for (int k = 0; k < steps; k++) t[k] = NAN;
        REQUIRE(schedule_flux2(n, steps, s, t) == 0, "%s", tp_error_msg());
        double dmu = fabs(schedule_mu(n, steps) - json_real_value(json_object_get(c, "mu")));
        if (!(dmu <= worst_mu)) worst_mu = dmu;
        for (int k = 0; k <= steps; k++) {
            double d = fabs(s[k] - json_number_value(json_array_get(sig, k)));
            if (!(d <= worst_s)) worst_s = d;
        }
        for (int k = 0; k < steps; k++) {
            double ref = json_number_value(json_array_get(ts, k));
            double d = fabs(t[k] - ref) / ref;
            if (!(d <= worst_t)) worst_t = d;
        }
        CHECK(s[steps] == 0.0f && s[0] == 1.0f, "case %zu: sigma ends %g..%g", i, s[0], s[steps]);
        free(s);
        free(t);
    }
    CHECK(worst_mu <= 1e-12, "mu differs by %g", worst_mu);
    CHECK(worst_s <= 1e-6, "sigmas differ by %g", worst_s);
    CHECK(worst_t <= 1e-6, "timesteps differ by %g (relative)", worst_t);
    json_decref(root);
}

TEST(schedule_rejects_bad_steps) {
    float s[2], t[1];
    CHECK(schedule_flux2(4096, 0, s, t) == -1, "0 steps accepted");
    CHECK(schedule_flux2(0, 4, s, t) == -1, "0 tokens accepted");
    CHECK(schedule_flux2(24, 1, s, t) == 0 && s[0] == 1.0f && s[1] == 0.0f, "one step: %g %g", s[0], s[1]);
}
