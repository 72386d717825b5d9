/* The FLUX.3 transformer (diffusers 0.42.1 Flux3Transformer2DModel)
 * computed tensor-parallel, as docs/flux3.md describes.
 *
 * Three token modes share one joint sequence, laid out [text | image |
 * references]: each mode first runs its own "mode blocks" (self-attention
 * within the mode only), then all tokens run the joint single blocks, and
 * only the image tokens reach the output layer. Every block is a parallel
 * attention + SwiGLU feed-forward on one modulated LayerNorm, with
 * separate to_q/to_k/to_v/to_out and ff.linear_in/linear_out.
 *
 * Modulation is per token mode: the image tokens use the embedding of the
 * flow timestep, the text and the references that of timestep 0; a
 * flow-map model (flow_map: true) adds the embedding of target_timestep to
 * both.
 *
 * Tensor parallelism (plans/flux3_plan.c): Q/K/V and ff.linear_in are
 * colwise (this rank's heads and MLP columns), to_out and ff.linear_out
 * rowwise; the two row-split partial sums of a block are added and joined
 * by one comm_allreduce_sum per block. Everything else is replicated.
 * Precisions DT_F32 (weights upcast) and DT_BF16 (eager-bf16 roundings;
 * the QK norm and RoPE in fp32 with one rounding, and the QK-norm
 * weights f32, as diffusers keeps norm_q/norm_k in fp32).
 *
 * A model is used by one thread at a time; all ranks of the comm call
 * flux3_forward in lockstep with the same inputs. */
#ifndef TPGEN_FLUX3_H
#define TPGEN_FLUX3_H
#include "kernels/tensor.h"
#include "core/formats/weights.h"
#include "plans/plan.h"
#include <jansson.h>
#include <stdint.h>

struct backend;
struct comm;

#define FLUX3_MAX_AXES 4
#define FLUX3_CLASS_NAME "Flux3Transformer2DModel"

/* config.json fields and the derived sizes */
typedef struct flux3_config {
    int in_channels;           /* image token width (also the output width) */
    int cond_in_channels;      /* reference token width */
    int num_layers;            /* mode blocks per mode */
    int num_single_layers;     /* joint single blocks */
    int head_dim;              /* attention_head_dim */
    int heads;                 /* num_attention_heads */
    int joint_dim;             /* joint_attention_dim: text feature width */
    int time_channels;         /* timestep_channels: sinusoid width */
    double mlp_ratio;
    int n_axes;
    int axes_dims[FLUX3_MAX_AXES];
    double rope_theta;
    float eps;
    int flow_map;              /* has target_timestep_embedder; forward needs target_timestep */
    /* derived */
    int64_t D;                 /* heads * head_dim */
    int64_t M;                 /* int(D * mlp_ratio) */
} flux3_config;

/* Parse and check a config.json object. Missing fields take the diffusers
 * defaults (D 3072 = 24 x 128, 5 mode blocks, 28 single blocks, joint dim
 * 20480, theta 10000); a _class_name other than Flux3Transformer2DModel,
 * out-of-range or inconsistent values (axes not summing to head_dim) are
 * errors naming `where` and the field. */
int flux3_config_parse(const json_t *cfg, const char *where, flux3_config *out);
/* 1 when the transformer folder's config.json names Flux3Transformer2DModel,
 * or it has no config.json and holds a FLUX.3 checkpoint (BFL single file,
 * or a GGUF/safetensors file in either naming: flux3_checkpoint_names) (0 otherwise;
 * reports no error). */
int flux3_is_transformer_dir(const char *dir);

/* The tensor-parallel plan of a config: plans/flux3_plan.c's rule table
 * with the symbols D and M and the divisor num_attention_heads;
 * flux3_plan_bfl the same over plans/flux3_bfl_plan.c (BFL names). */
int flux3_plan(const flux3_config *c, plan *out);
int flux3_plan_bfl(const flux3_config *c, plan *out);

/* Black Forest Labs single files (names: the inverse of diffusers 0.42.1's
 * convert_flux3_transformer_checkpoint_to_diffusers). flux3_bfl_prefix:
 * "" when the checkpoint is a FLUX.3 BFL one
 * (early_stream_modulations.image.lin.weight; a file with names behind
 * model.diffusion_model. is read without it by checkpoint_open), else
 * NULL. flux3_config_from_bfl: a config.json object derived from its
 * shapes (RoPE: four equal axes, theta 10000, eps 1e-6, the class
 * defaults; flow_map when ref_time_in is present); NULL + tp_error naming
 * the file and the tensor when it cannot be derived. */
struct checkpoint;
const char *flux3_bfl_prefix(const struct checkpoint *ck);
json_t *flux3_config_from_bfl(const struct checkpoint *ck);
/* Any FLUX.3 checkpoint without config.json (docs/flux3.md "GGUF"): 1 when
 * ck has FLUX.3 names, BFL (*bfl = the prefix, as flux3_bfl_prefix) or
 * diffusers (*bfl = NULL: early_stream_modulations.image.linear.weight, as
 * a `tpgen quantize --names keep` GGUF has), else 0. flux3_config_from_shapes:
 * the config derived from the shapes under either naming (as
 * flux3_config_from_bfl). flux3_bfl_name: the BFL name (behind pfx) of the
 * diffusers tensor name d, into out[n] (the converter's inverse; used by the
 * loader, the config derivation and `tpgen quantize --names bfl`). */
int flux3_checkpoint_names(const struct checkpoint *ck, const char **bfl);
json_t *flux3_config_from_shapes(const struct checkpoint *ck);
void flux3_bfl_name(const char *d, const char *pfx, char *out, size_t n);
/* A folder holding a FLUX.3 BFL single file (or, without config.json, any
 * FLUX.3-named checkpoint, e.g. a GGUF): *is_flux3 = 1 and its derived
 * config (NULL + tp_error when underivable); otherwise *is_flux3 = 0 and
 * NULL (the error, if any, is not about FLUX.3). */
json_t *flux3_bfl_dir_config(const char *dir, int *is_flux3);

typedef struct flux3_model flux3_model;

/* Load <dir>/config.json and the checkpoint in that folder; this rank
 * reads only its shard (rank c->rank of c->size). precision is DT_F32 or
 * DT_BF16. Every tensor name and shape is checked against the config
 * before a weight byte is read, and a checkpoint with tensors the config
 * does not explain is refused. Returns -1 with tp_error naming the folder
 * on failure (the caller agrees on errors across ranks). st may be NULL. */
int flux3_load(const char *dir, struct backend *be, struct comm *c, dtype_t precision, flux3_model **out,
               load_stats *st);
/* flux3_load with load-time options: quantize_fp8 (--quantize fp8) makes
 * the sharded linears (the block projections and MLPs, plans/flux3_plan.c's
 * colwise/rowwise weights) E4M3 with per-row absmax scales as FLUX.2 does
 * (core/formats/fp8.h); embedders, modulations, norm_out and the QK norms
 * keep their dtype. fp8 checkpoints load with or without it. loras: LoRA
 * adapters (diffusers/PEFT `transformer.<module>` names, core/formats/lora.h)
 * validated against the checkpoint before a weight byte is read, then merged
 * into each rank's shard (lora_merge_shard as the load transform; on fp8
 * weights low-rank terms); *lora_set_out, if given, gets the set (bytes read
 * per adapter; free with lora_set_free). x may be NULL. */
struct lora_spec;
struct lora_set;
typedef struct flux3_load_extras {
    int quantize_fp8;
    const struct lora_spec *loras;
    int n_loras;
    struct lora_set **lora_set_out;
} flux3_load_extras;
int flux3_load_ex(const char *dir, struct backend *be, struct comm *c, dtype_t precision,
                  const flux3_load_extras *x, flux3_model **out, load_stats *st);
/* A model with random weights of the given config, made in memory
 * (benchmarks; no file): each rank fills its local shard from (seed, rank,
 * tensor name), linears ~ U(+-sqrt(3/in)) so activations stay O(1). */
int flux3_init_random(const flux3_config *cfg, struct backend *be, struct comm *c, dtype_t precision, uint64_t seed,
                      flux3_model **out);
void flux3_free(flux3_model *m);

const flux3_config *flux3_get_config(const flux3_model *m);
dtype_t flux3_precision(const flux3_model *m);

/* bf16 mode only: embed timestep·1000 unrounded instead of the bf16-rounded
 * value eager PyTorch embeds (default off); for comparing a bf16 run with
 * f32 reference outputs (see flux2_set_exact_timestep). */
void flux3_set_exact_timestep(flux3_model *m, int on);

/* One forward (batch 1). Host f32 in/out (rounded to bf16 on upload in
 * bf16 mode). Ids are (t, h, w, l) per token. */
typedef struct flux3_inputs {
    const float *x;            /* [N, in_channels] noisy image tokens */
    const int32_t *img_ids;    /* [N, 4] */
    int64_t N;
    const float *txt;          /* [L, joint_dim] text features */
    const int32_t *txt_ids;    /* [L, 4] */
    int64_t L;
    const float *cond;         /* [R, cond_in_channels] reference tokens, or NULL with R = 0 */
    const int32_t *cond_ids;   /* [R, 4] */
    int64_t R;
    float timestep;            /* flow timestep in [0, 1]; the model multiplies by 1000 */
    const float *target_timestep;  /* flow-map models: the step's target timestep; else NULL */
    float image_rope_scale;    /* the h and w ids of image and reference tokens are multiplied by this (in f32)
                                * before RoPE, as the pipeline's float ids are (0.5); 0 means 1 */
} flux3_inputs;

/* out [N, in_channels] (the image tokens' prediction), written on every
 * rank. Collective over the model's comm. -1 + tp_error on bad arguments
 * (a missing or unexpected target_timestep, references without ids) or a
 * communication failure. */
int flux3_forward(flux3_model *m, const flux3_inputs *in, float *out);

/* The prepare step of a denoising loop: allocate the activations of a
 * forward over L text, N image and R reference tokens now (kept for the
 * forwards of that shape), so that running out of memory is an error the
 * ranks can agree on before the first collective. Per rank, no collective. */
int flux3_prepare(flux3_model *m, int64_t L, int64_t N, int64_t R);
/* The model's comm (NULL when it has none). */
struct comm *flux3_comm(const flux3_model *m);
/* The SP group set by flux3_set_sp (NULL: none). */
struct comm *flux3_sp_comm(const flux3_model *m);
/* The block cache the next forwards run their two block groups (mode
 * blocks, single blocks) through (core/models/block_cache.h; NULL: none).
 * Not owned. */
struct block_cache;
void flux3_set_block_cache(flux3_model *m, struct block_cache *bc);
/* Ulysses sequence parallelism over the group of `sp` (NULL or one rank:
 * none), as flux2_set_sp: each rank runs its slices of every mode's tokens,
 * the mode blocks' attention within a mode and the single blocks' over the
 * joint sequence go through the all-to-all; the result is the one-rank
 * forward's, bit for bit. */
int flux3_set_sp(flux3_model *m, struct comm *sp);

/* Per-forward counters, accumulated until flux3_reset_stats. The
 * all-reduce time includes waiting for the slowest rank. */
typedef struct flux3_stats {
    long forwards;
    double seconds;            /* wall time inside flux3_forward */
    long allreduces;
    uint64_t allreduce_bytes;
    double allreduce_seconds;
    double gemm_flops;         /* FLOPs of the GEMMs this rank ran */
    double attention_flops;    /* 4 * Sq * Sk * head_dim * local heads per attention */
} flux3_stats;
void flux3_get_stats(const flux3_model *m, flux3_stats *st);
void flux3_reset_stats(flux3_model *m);

/* RoPE tables for n tokens with ids [n, 4]: cos/sin [n, head_dim], angles
 * id·theta^(-2k/d_axis) in float64 rounded to f32, each frequency repeated
 * for both members of its interleaved pair (exposed for tests). */
void flux3_rope_table(const flux3_config *cfg, const int32_t *ids, int64_t n, float *cos_out, float *sin_out);
/* The same with the h and w ids (axes 1, 2) taken as fl32(id · hw_scale). */
void flux3_rope_table_scaled(const flux3_config *cfg, const int32_t *ids, int64_t n, float hw_scale, float *cos_out,
                             float *sin_out);

#endif
