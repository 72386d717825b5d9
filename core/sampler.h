/* The one sampling loop of every model family: each step asks the family
 * for a velocity (one prediction, two with classifier-free guidance),
 * combines them (CFG), takes the flow-match Euler step, checks the latents
 * are finite, and reports the step. The family supplies only the
 * prediction (its forward, its timestep, its references) and the schedule;
 * the arithmetic between the forwards, its bf16 rounding and the NaN/Inf
 * check are here, once, so FLUX.2 and FLUX.3 cannot drift apart (issue 39).
 *
 * Every rank of a TP group runs the loop in lockstep on identical inputs and
 * gets the same predictions, so every decision here (a failed forward, a
 * non-finite latent, the step callback's answer) is the same on every rank. */
#ifndef TPGEN_SAMPLER_H
#define TPGEN_SAMPLER_H
#include <stdint.h>

/* Called after each step on every rank: v is the velocity used in this step
 * [N, C] (after CFG), x the latents after the step [N, C], sigma the noise
 * level after the step (σ[i+1]; 0 after the last), so that x − sigma·v is
 * the prediction of the clean latents (x0 = x_before − σ[i]·v in exact
 * arithmetic; in bf16 mode x holds its rounding, < 2^-8 relative). Return non-zero
 * to stop the loop (it then fails with "stopped"); the return value must be
 * the same on every rank of the group (the ranks must stay in lockstep), so
 * decide on rank-independent data or agree first. */
typedef int (*denoise_step_fn)(int step, int steps, double step_seconds, const float *v,
                               const float *x, float sigma, void *ctx);

/* One velocity prediction of the family's model: v [N, C] for the latents x
 * [N, C] at step `step` (0-based); neg selects the negative prompt (the
 * second pass of CFG). Collective; -1 + tp_error on failure. */
typedef int (*sampler_predict_fn)(void *model, int step, int neg, const float *x, float *v);

typedef struct sampler_params {
    const float *latents;          /* [N, C] initial latents (rounded to bf16 here in bf16 mode) */
    int64_t N;
    int C;
    const float *sigmas;           /* [steps + 1]: the Euler step is x += (σ[i+1] − σ[i])·v */
    int steps;
    int cfg;                       /* two passes per step: v = vn + cfg_scale·(v − vn) */
    float cfg_scale;
    int bf16;                      /* reproduce eager PyTorch's bf16 rounding (below) */
    sampler_predict_fn predict;
    void *model;                   /* the family's state, passed to predict */
    denoise_step_fn on_step;       /* NULL ok */
    void *ctx;
    /* CFG parallelism (NULL: serial CFG): a host-memory communicator over
     * the two halves of the job group. With cfg set, half 0 predicts the
     * conditional velocity and half 1 the unconditional one, the halves
     * all-gather the two once a step and both mix them as the serial loop
     * does, so the latents are the serial run's bit for bit. Without cfg
     * (a job that needs one prediction) both halves predict it. */
    struct comm *cfg_comm;
} sampler_params;

/* Run the loop; out [N, C] receives the final latents (on every rank). In
 * bf16 mode the latents are bf16, CFG rounds after each op, and bf16(dt·v)
 * is added to the sample and the sum rounded (spec flux2-transformer.md
 * §6.4; FLUX.3's modular pipeline does the same); f32 is plain fp32. A step
 * whose latents hold NaN/Inf fails there, naming the step. */
int sampler_run(const sampler_params *p, float *out);

#endif
