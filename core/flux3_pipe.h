/* The FLUX.3 sampling pipeline (diffusers 0.42.1's Flux3ModularPipeline and
 * Flux3DistilledModularPipeline, modular_pipelines/flux3/), as the pieces
 * the family-neutral pipeline object (core/tp_pipe.c) runs for a FLUX.3
 * folder: defaults, seeded noise, position ids, reference ids, and the
 * denoising loop (CFG for base, the flow-map step with its target timestep).
 * The schedule is core/schedule.c's constant shift, the references go
 * through core/refs.c (VAE encoder), decoding is the FLUX.2 VAE's.
 *
 * Facts of the modular pipeline (docs/flux3.md, "Pipeline"):
 *  - scheduler FlowMatchEulerDiscreteScheduler, constant shift 6.93
 *    (use_dynamic_shifting false, no shift_terminal), sigmas linspace(1,
 *    1/n, n), terminal 0; 50 steps (base), 16 (flow-map);
 *  - noise torch.randn([1, C, H/16, W/16]) drawn in float32 (then cast: the
 *    pipeline notes a reduced-precision draw breaks seed compatibility),
 *    packed to tokens (y*w + x, C);
 *  - ids (t, h, w, l): image (0, y·s, x·s, 0), text (0, 0, 0, i),
 *    reference k (0, y·s, x·s, −(1+k)), s = image_rope_scale 0.5 (float ids;
 *    kept int here and scaled in flux3_forward);
 *  - base: ClassifierFreeGuidance 3.5 (off when the scale is 1), pred =
 *    uncond + g·(cond − uncond), two forwards per step; flow-map: one
 *    forward, target_timestep = the next timestep / 1000 (0 after the last);
 *  - the transformer gets t/1000 in the latents' dtype; Euler step
 *    x += (σ[i+1] − σ[i])·v; size default 1024², or the first reference's. */
#ifndef TPGEN_FLUX3_PIPE_H
#define TPGEN_FLUX3_PIPE_H
#include "core/models/flux3/flux3.h"
#include "pipeline.h"
#include "refs.h"
#include <stdint.h>

#define FLUX3_SHIFT 6.93
#define FLUX3_IMAGE_ROPE_SCALE 0.5f
#define FLUX3_GUIDANCE 3.5

int flux3_default_steps(int flow_map);          /* 16 flow-map, 50 base */
double flux3_default_guidance(int flow_map);    /* 3.5 base; 1 (none) flow-map */
/* base runs CFG unless the scale is 1 (diffusers: math.isclose(g, 1.0)) */
int flux3_uses_cfg(int flow_map, double guidance);

/* torch.randn([1, C, h, w], generator=manual_seed(seed), dtype=float32)
 * packed to tokens: x[(y*w + x)*C + c] (malloc'ed). */
float *flux3_noise_packed(uint64_t seed, int C, int h, int w);
/* ids of an h x w token grid (t 0, row, column, l), row-major (int: the
 * h and w axes are scaled by FLUX3_IMAGE_ROPE_SCALE in the forward) */
void flux3_image_ids(int64_t h, int64_t w, int32_t l, int32_t *ids);
/* FLUX.3's reference ids on a ref_set from refs_encode*: reference k's
 * tokens (0, y, x, −(1+k)) instead of FLUX.2's (10 + 10k, y, x, 0). */
void flux3_ref_ids(ref_set *rs);
/* A single reference ("fill", Flux3ImageProcessor): its canvas, the size
 * rounded up to 16 and clamped to [64, 4096], and the box the image takes
 * in it, centered (left = (cw - w) / 2, top likewise). */
void flux3_reference_canvas(int w, int h, int *cw, int *ch, int *left, int *top);
/* The size Flux3ImageProcessor._resize_if_canvas_exceeds_area gives a
 * single w x h reference: scale = min(1, sqrt(4 MP / (w h)), 4096 /
 * max(w, h)), sides round(side * scale) (half to even, at least 1), the
 * scale backed off by 0.995 until the canvas of that size is at most
 * 4 MP; (w, h) unchanged when it already fits. */
void flux3_reference_resized_size(int w, int h, int *rw, int *rh);
/* The crop-back box of a single reference (w x h as read) inside its
 * canvas: left, top, width, height of the resized reference; 1 when the
 * canvas is larger than it (the generated image is cropped back when no
 * size was given), 0 when they are equal. */
int flux3_reference_crop_box(int w, int h, int box[4]);
/* The output size a prompt's references give when no size is asked for
 * (Flux3ImageCondInputStep): one reference, the canvas of its resized size
 * (the decoded image is then cropped back to the resized reference);
 * several, the first one's size under 1 MP floored to 16 ("crop"). */
void flux3_reference_size(int w, int h, int n_refs, int *pw, int *ph);
/* FLUX.3 has none of FLUX.2's reference checks (sides >= 64, aspect <= 8).
 * A single reference always works; one of several (n > 1) must keep at
 * least 16 pixels per side after the 1 MP fit (else it gives no token,
 * and diffusers fails): -1 + tp_error naming path otherwise. */
int flux3_check_reference(const char *path, int w, int h, int n);
/* refs_load_fn of a single FLUX.3 reference ("fill"): read, downscaled
 * with PIL's LANCZOS to flux3_reference_resized_size, reflect-padded to
 * the canvas (numpy.pad "reflect", or "symmetric" when a side of the
 * resized image is 16 pixels or less), pixels [3, ch, cw] in [-1, 1].
 * The _from_rgb form takes decoded RGB (consumed; name for messages). */
int flux3_load_reference(const char *path, float **pixels, int *pw, int *ph);
int flux3_reference_from_rgb(uint8_t *rgb, int w, int h, const char *name, float **pixels, int *pw, int *ph);
/* refs_load_fn of each of several FLUX.3 references ("crop"): FLUX.2's
 * preprocessing (image_load_reference: LANCZOS under 1 MP, sides floored
 * to 16, centre crop) without FLUX.2's checks, flux3_check_reference's
 * instead. */
int flux3_load_reference_crop(const char *path, float **pixels, int *pw, int *ph);
int flux3_crop_reference_from_rgb(uint8_t *rgb, int w, int h, const char *name, float **pixels, int *pw, int *ph);

typedef struct flux3_job {
    uint64_t seed;               /* the f32 draw: the same in torch 1.13 and 2.x */
    const float *init_latents;   /* NULL: seeded noise; else the start, packed [h*w, in_channels] */
    int steps;
    double guidance;             /* CFG scale (base); ignored by flow-map */
    int h, w;                    /* token grid (pixels / 16) */
    const float *embeds;         /* [L, joint_dim] */
    int64_t L;
    const float *neg_embeds;     /* CFG: [Ln, joint_dim]; NULL: no CFG */
    int64_t Ln;
    const ref_set *refs;         /* NULL or R = 0: text-to-image; ids as flux3_ref_ids makes them */
    denoise_step_fn on_step;     /* NULL ok; v after CFG */
    void *ctx;
    const bc_spec *cache;        /* block caching (NULL or off: none); fresh state for the job */
    bc_log *cache_log;           /* NULL ok */
    struct comm *cfg_comm;       /* CFG parallelism (sampler_params.cfg_comm); NULL: serial */
    const MPI_Comm *group;       /* the job group of a mesh (lockstep over it); NULL: the model's TP group */
} flux3_job;

/* The whole denoising loop, collective over the model's comm (every rank in
 * lockstep with the same inputs): out [h*w, in_channels], the final latents,
 * on every rank: FLUX.3's prediction in the shared loop of core/sampler.h
 * (CFG, Euler step, rounding, NaN/Inf check, as FLUX.2). f32: plain fp32 as
 * the golden; bf16: latents bf16, the model timestep bf16(t/1000), bf16(dt·v)
 * added and rounded. */
int flux3_denoise(flux3_model *m, const flux3_job *j, float *out);

#endif
