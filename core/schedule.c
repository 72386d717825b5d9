/* FLUX.2 schedule (see schedule.h). The rounding points follow diffusers:
 * linspace and mu in float64, each base sigma rounded to fp32, then the
 * exponential time shift evaluated in fp32 with E = fl32(exp(mu)). */
#include "schedule.h"
#include "kernels/err.h"
#include <math.h>

double schedule_mu(long n, int steps) {
    const double a1 = 8.73809524e-05, b1 = 1.89833333;
    const double a2 = 0.00016927, b2 = 0.45666666;
    if (n > 4300) return a2 * (double)n + b2;
    double m_200 = a2 * (double)n + b2;
    double m_10 = a1 * (double)n + b1;
    double a = (m_200 - m_10) / 190.0;
    double b = m_200 - 200.0 * a;
    return a * (double)steps + b;
}

/* numpy.linspace(1, 1/steps, steps)[i]: start + i*step, end point exact */
static double linspace_point(int i, int steps) {
    double last = 1.0 / steps;
    if (steps == 1 || i == 0) return 1.0;
    if (i == steps - 1) return last;
    return 1.0 + (double)i * ((last - 1.0) / (double)(steps - 1));
}

int schedule_constant_shift(int steps, double shift, float *sigmas, float *timesteps) {
    if (steps < 1) return tp_error("the number of steps must be at least 1 (got %d)", steps);
    if (!(shift > 0) || !isfinite(shift)) return tp_error("the schedule's shift must be a positive number (got %g)", shift);
    float a = (float)shift, b = (float)(shift - 1.0);
    for (int i = 0; i < steps; i++) {
        float base = (float)linspace_point(i, steps);
        float s = (a * base) / (1.0f + b * base);
        sigmas[i] = s;
        timesteps[i] = s * 1000.0f;
    }
    sigmas[steps] = 0.0f;
    return 0;
}

int schedule_flux2(long n, int steps, float *sigmas, float *timesteps) {
    if (steps < 1) return tp_error("the number of steps must be at least 1 (got %d)", steps);
    if (n < 1) return tp_error("the image must have at least one latent token (got %ld)", n);
    float e = (float)exp(schedule_mu(n, steps));
    double last = 1.0 / steps;
    for (int i = 0; i < steps; i++) {
        /* numpy.linspace(1, 1/steps, steps): start + i*step, end point exact */
        double t = steps == 1 ? 1.0 : 1.0 + (double)i * ((last - 1.0) / (double)(steps - 1));
        if (i == steps - 1) t = last;
        float base = (float)t;
        float s = e / (e + (1.0f / base - 1.0f));
        sigmas[i] = s;
        timesteps[i] = s * 1000.0f;
    }
    sigmas[steps] = 0.0f;
    return 0;
}
