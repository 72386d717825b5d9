/* The FLUX.2 denoising loop (docs/spec/flux2-transformer.md §6.4), run by every
 * rank of a TP group in lockstep: each step is one transformer forward
 * (two with CFG) and a flow-match Euler step, FLUX.2's prediction in the
 * shared loop of core/sampler.h. The schedule itself (sigmas) comes from
 * core/schedule.c. */
#ifndef TPGEN_PIPELINE_H
#define TPGEN_PIPELINE_H
#include "core/models/flux2/flux2.h"
#include "sampler.h"
#include "core/models/block_cache.h"
#include <mpi.h>
#include <stdint.h>

typedef struct denoise_params {
    const float *latents;          /* [N, C] packed initial latents (noise) */
    int64_t N;                     /* image tokens */
    const int32_t *img_ids;        /* [N, 4] */
    const float *prompt_embeds;    /* [L, Jt] */
    int64_t L;
    const int32_t *txt_ids;        /* [L, 4] */
    /* optional CFG (klein base): two passes per step, v = vn + gs (v - vn) */
    const float *neg_embeds;       /* [Ln, Jt] or NULL (no CFG) */
    int64_t Ln;
    const int32_t *neg_txt_ids;    /* [Ln, 4] */
    float cfg_scale;
    /* optional reference-image tokens (editing): appended after the noise
     * tokens in every forward, with their own ids (T = 10, 20, ...); only
     * the first N outputs are the velocity */
    const float *ref_tokens;       /* [R, C] or NULL */
    int64_t R;
    const int32_t *ref_ids;        /* [R, 4] */
    /* KV-cached references (Flux2KleinKVPipeline): step 0 runs the
     * references first ([refs; noise]) in the transformer's "extract" mode
     * (their modulation from ref_timestep, self-attention only, K/V kept),
     * later steps the noise alone in "cached" mode (flux2_forward_kv) */
    int kv_refs;
    float ref_timestep;            /* the pipeline's ref_fixed_timestep (0) */
    const float *sigmas;           /* [steps + 1], ending with 0 */
    int steps;
    const float *guidance;         /* embedded guidance (dev) or NULL */
    denoise_step_fn on_step;       /* NULL ok */
    void *ctx;
    /* block caching (core/models/block_cache.h): NULL or off = none; the
     * record of what was cached goes to cache_log (NULL ok) */
    const bc_spec *cache;
    bc_log *cache_log;
    struct comm *cfg_comm;         /* CFG parallelism (sampler_params.cfg_comm); NULL: serial */
    const MPI_Comm *group;         /* the job group of a mesh (lockstep over it); NULL: the model's TP group */
} denoise_params;

/* Run the loop; out [N, C] receives the final latents (on every rank).
 * In bf16 mode the rounding of §6.4 is reproduced (timestep quantisation,
 * bf16 latents, bf16(dt·v)); in f32 mode everything is plain fp32. */
int flux2_denoise(flux2_model *m, const denoise_params *p, float *out);

/* Position ids of an h x w token grid, row-major: token (y, x) gets
 * (t, y, x, 0). ids has room for h*w*4 values. */
void flux2_image_ids(int64_t h, int64_t w, int32_t t, int32_t *ids);
/* Text ids: token l gets (0, 0, 0, l). */
void flux2_text_ids(int64_t L, int32_t *ids);

#endif
