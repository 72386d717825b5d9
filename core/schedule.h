/* The FLUX.2 sigma schedule (docs/spec/flux2-transformer.md §6.3): diffusers'
 * FlowMatchEulerDiscreteScheduler with dynamic, exponential time shifting
 * and the empirical mu of the Flux2 pipelines. */
#ifndef TPGEN_SCHEDULE_H
#define TPGEN_SCHEDULE_H

/* compute_empirical_mu(image_seq_len, steps), in float64 */
double schedule_mu(long image_seq_len, int steps);

/* sigmas[0..steps] (the last one the terminal 0) and timesteps[0..steps-1]
 * (= sigma * 1000) for `steps` denoising steps over N image tokens.
 * Arrays are caller-provided: sigmas holds steps + 1, timesteps steps.
 * Returns -1 (tp_error) when steps < 1 or N < 1. */
int schedule_flux2(long image_seq_len, int steps, float *sigmas, float *timesteps);

/* FlowMatchEulerDiscreteScheduler with a constant shift (use_dynamic_shifting
 * false; FLUX.3's modular pipeline: shift 6.93): base = fl32(linspace(1,
 * 1/steps, steps)), sigma = shift·base / (1 + (shift − 1)·base) in fp32
 * (numpy promotes the Python float to the float32 array), timesteps =
 * fl32(sigma·1000), sigmas[steps] = 0. -1 (tp_error) when steps < 1 or the
 * shift is not a positive finite number. */
int schedule_constant_shift(int steps, double shift, float *sigmas, float *timesteps);

#endif
