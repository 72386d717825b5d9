/* What a model family brings to the pipeline object (core/tp_pipe.c):
 * one table per family, so the object itself holds no family branch. FLUX.2
 * (dev, klein, klein base, klein KV) is core/family_flux2.c, FLUX.3 (base,
 * flow-map) core/flux3_pipe.c. Each family's sampling runs the one shared
 * loop of core/sampler.h (CFG, Euler, bf16 rounding, the NaN/Inf check):
 * the table gives it the family's prediction, schedule and noise. */
#ifndef TPGEN_FAMILY_H
#define TPGEN_FAMILY_H
#include "tp_pipe.h"
#include "refs.h"

/* what loading a transformer needs besides its folder */
typedef struct family_load {
    struct backend *be;
    struct comm *c;
    struct comm *sp;             /* the Ulysses SP group (NULL: none) */
    dtype_t precision;
    int quantize_fp8;
    const lora_spec *loras;
    int n_loras;
    struct lora_set **lora_set_out;
} family_load;

/* The mesh a job runs on around the TP group that holds the model
 * (core/dist/dist.h): the CFG halves' host communicator (NULL: serial CFG),
 * and the job group, over which the sampling loop's prepare step is agreed
 * and its lockstep section runs (one SP rank or CFG half out of memory must
 * fail or end the whole group, not leave its peers in a collective). */
typedef struct family_mesh {
    struct comm *cfg;
    const MPI_Comm *group;
} family_mesh;

typedef struct pipe_family {
    const char *name;            /* "FLUX.2", "FLUX.3" (messages) */
    /* the transformer config's sizes into info (in_channels, joint_dim, cond_in_channels,
     * embedded_guidance) and *flow_map; -1 + tp_error naming path */
    int (*read_config)(const json_t *cfg, const char *path, tp_pipe_info *info, int *flow_map);
    /* diffusers' pipeline defaults */
    int (*default_steps)(model_family f);
    double (*default_guidance)(model_family f);
    int (*uses_cfg)(model_family f, double guidance);
    int default_max_sequence_length;
    /* the text encoder's recipe, for the embedding cache's key; own_window:
     * each prompt is embedded over its own window (its tokens rounded up to
     * pad_multiple, at most max_sequence_length), else over max_sequence_length */
    const char *text_recipe;
    int own_window, pad_multiple;
    /* the transformer shard of this rank (an opaque model) */
    int (*load)(const char *dir, const family_load *x, void **model, load_stats *st);
    void (*free_model)(void *model);
    /* references: the family's checks of a reference image (NULL: none
     * beyond decoding; n the number of references), its preprocessing for n
     * references, and its position ids (NULL: refs_encode's) */
    int (*check_reference)(const char *path, int w, int h, int n);
    refs_load_fn (*reference_loader)(int n);
    void (*reference_ids)(ref_set *rs);
    /* one job's sampling (noise, schedule, the shared loop): latents
     * [(H/16)*(W/16), in_channels] on every rank; collective */
    int (*denoise)(void *model, const tp_pipe_info *info, const tp_job *j, const ref_set *rs,
                   const family_mesh *mesh, denoise_step_fn on_step, void *ctx, float *latents);
    /* the largest KV cache of references the model has held on this rank, bytes and tokens (NULL: the
     * family caches none) */
    uint64_t (*kv_cache_bytes)(void *model, int64_t *tokens);
} pipe_family;

extern const pipe_family family_flux2, family_flux3;
const pipe_family *pipe_family_of(model_family f);

#endif
