/* The FLUX.2 transformer (Flux2Transformer2DModel, docs/spec/flux2-transformer.md
 * §1-§5) computed tensor-parallel: each rank holds its shard of the weights
 * (plan_flux2), computes its local heads and MLP columns, and the partial
 * sums of the row-split projections are joined by comm_allreduce_sum. Every
 * rank ends a forward with the same full output.
 *
 * The forward is written once against kernels/ops.h. Two precisions:
 *   DT_F32  weights upcast at load, f32 activations (the reference mode);
 *   DT_BF16 weights stay bf16, activations bf16 between ops, rounded where
 *           eager PyTorch in bf16 rounds (docs/spec/flux2-transformer.md §3).
 *
 * Threading: a model is used by one thread at a time. All TP ranks of the
 * group must call flux2_forward in lockstep with the same inputs. */
#ifndef TPGEN_FLUX2_H
#define TPGEN_FLUX2_H
#include "kernels/tensor.h"
#include "core/formats/weights.h"
#include <jansson.h>
#include <stdint.h>

struct backend;
struct comm;

#define FLUX2_MAX_AXES 4

/* config.json fields (§1.1) and the derived sizes (§1.2). */
typedef struct flux2_config {
    int patch_size;
    int in_channels;
    int out_channels;          /* null in config.json -> in_channels */
    int num_layers;            /* double-stream blocks */
    int num_single_layers;
    int head_dim;              /* attention_head_dim */
    int heads;                 /* num_attention_heads */
    int joint_dim;             /* joint_attention_dim Jt */
    int time_channels;         /* timestep_guidance_channels Ct */
    double mlp_ratio;
    int n_axes;
    int axes_dims[FLUX2_MAX_AXES];
    double rope_theta;
    float eps;
    int guidance_embeds;
    /* derived */
    int64_t D;                 /* heads * head_dim */
    int64_t M;                 /* int(D * mlp_ratio) */
    int64_t out_dim;           /* patch_size^2 * out_channels */
} flux2_config;

/* Parse and check a config.json object. Missing fields take the diffusers
 * defaults; inconsistent values (axes not summing to head_dim, odd axis
 * dims, non-positive sizes) are errors naming the field. */
int flux2_config_parse(const json_t *cfg, const char *where, flux2_config *out);

/* The config of a Black Forest Labs single-file checkpoint (BFL names, no
 * config.json), derived from tensor shapes as a diffusers-style config.json
 * object: D and in_channels from img_in, joint_attention_dim from txt_in,
 * timestep channels from time_in, head_dim from the QK-norm scale (heads =
 * D / head_dim), block counts, the MLP ratio from the MLP input,
 * guidance_embeds from guidance_in; patch 1, four equal RoPE axes, theta
 * 2000 and eps 1e-6 as every FLUX.2 model has. NULL + tp_error when a
 * tensor it needs is missing or the shapes disagree. Free with json_decref. */
struct checkpoint;
json_t *flux2_config_from_bfl(const struct checkpoint *c);
/* The same for a diffusers-named checkpoint without its config.json (a
 * lone diffusion_pytorch_model.safetensors or a diffusers-named GGUF):
 * x_embedder, context_embedder, the timestep embedder, proj_out,
 * transformer_blocks.N / single_transformer_blocks.N, norm_q, ff.linear_in
 * or to_qkv_mlp_proj, the guidance embedder. */
int flux2_checkpoint_is_diffusers(const struct checkpoint *c);
json_t *flux2_config_from_diffusers(const struct checkpoint *c);
/* The config of a transformer folder: <dir>/config.json when present, else
 * for a BFL or diffusers-named checkpoint the one derived from its shapes. NULL + tp_error when
 * neither; *where (optional, malloc'ed) says where it came from. */
json_t *flux2_transformer_config(const char *dir, char **where);

typedef struct flux2_model flux2_model;

/* Load <transformer_dir>/config.json and the checkpoint in that folder
 * (diffusers names, or a BFL single file whose config may be derived:
 * flux2_transformer_config);
 * this rank reads only its shard (rank c->rank of c->size). precision is
 * DT_F32 or DT_BF16. Shapes are checked against the config. On failure
 * returns -1 with tp_error set (the caller agrees on errors with
 * dist_agree over c->mpi). st may be NULL. */
int flux2_load(const char *transformer_dir, struct backend *be, struct comm *c, dtype_t precision,
               flux2_model **out, load_stats *st);
/* flux2_load with load-time transformations of each rank's shard:
 * LoRA adapters merged in (core/formats/lora.h; every adapter is validated against
 * the checkpoint before any weight is read; *lora_set_out, if given,
 * receives the opened set with the bytes each adapter gave this rank, free
 * with lora_set_free), then --quantize fp8 (the sharded linears become E4M3
 * with per-row absmax scales, core/formats/fp8.h). x may be NULL. */
struct lora_spec;
struct lora_set;
typedef struct flux2_load_extras {
    const struct lora_spec *loras;
    int n_loras;
    int quantize_fp8;
    struct lora_set **lora_set_out;
} flux2_load_extras;
int flux2_load_ex(const char *transformer_dir, struct backend *be, struct comm *c, dtype_t precision,
                  const flux2_load_extras *x, flux2_model **out, load_stats *st);

/* A model with random weights of the given config, generated in memory
 * (benchmarks; no file). Each rank fills its local shard from `seed` and
 * its rank. Weights ~ N(0, 1/in_features) so activations stay O(1). */
int flux2_init_random(const flux2_config *cfg, struct backend *be, struct comm *c, dtype_t precision,
                      uint64_t seed, flux2_model **out);

void flux2_free(flux2_model *m);

const flux2_config *flux2_get_config(const flux2_model *m);
dtype_t flux2_precision(const flux2_model *m);
struct comm *flux2_comm(const flux2_model *m);
/* The SP group set by flux2_set_sp (NULL: none). */
struct comm *flux2_sp_comm(const flux2_model *m);
/* Ulysses sequence parallelism over the group of `sp` (NULL or one rank:
 * none): each forward then runs this rank's slices of the text and image
 * tokens (core/dist/ulysses.h) and gathers the output; every rank of the
 * group must hold the same TP shard. The local heads must split over it.
 * The result is the one-rank forward's, bit for bit. */
int flux2_set_sp(flux2_model *m, struct comm *sp);
struct backend *flux2_backend(const flux2_model *m);
/* The block cache the next forwards run their block groups through
 * (core/models/block_cache.h; NULL: none). Not owned. */
struct block_cache;
void flux2_set_block_cache(flux2_model *m, struct block_cache *bc);

/* One forward pass (batch 1). Host f32 in/out; in bf16 mode inputs are
 * rounded to bf16 on upload.
 *   x        [N, in_channels]   packed image tokens (noise, then references)
 *   img_ids  [N, 4]             (T, H, W, L) per image token
 *   txt      [L, joint_dim]     prompt embeddings
 *   txt_ids  [L, 4]
 *   timestep the value the pipeline passes (sigma-like, t/1000); the model
 *            multiplies by 1000 itself (bf16-rounded in bf16 mode)
 *   guidance NULL, or the embedded guidance (models with guidance_embeds;
 *            ignored by models without it)
 *   out      [N, out_dim], written on every rank
 * The context projection of txt is cached (two most recent prompts), so the
 * same embeddings across steps cost one projection. Collective over the
 * model's comm. Returns -1 with tp_error on bad arguments or comm failure. */
int flux2_forward(flux2_model *m, const float *x, int64_t N, const int32_t *img_ids,
                  const float *txt, int64_t L, const int32_t *txt_ids,
                  float timestep, const float *guidance, float *out);

/* The prepare step of a denoising loop: what the forwards over N image
 * rows (ids img_ids; the first R of them the references of a KV extract
 * pass, else R = 0) and the prompt txt [L] allocate, made now and kept for
 * them: the activations, the context projections of txt and of txt2 [L2]
 * (the negative prompt, or NULL), and the RoPE tables (when img_ids is not
 * NULL). Running out of memory is then an error the ranks can agree on
 * before the first collective. Per rank, no collective. */
int flux2_prepare(flux2_model *m, int64_t N, int64_t R, const int32_t *img_ids, const float *txt, int64_t L,
                  const int32_t *txt_ids, const float *txt2, int64_t L2);

/* ---- KV-cached references (Flux2KleinKVPipeline; diffusers
 * transformer_flux2.py kv_cache_mode "extract" / "cached") ----
 * extract: x holds R reference tokens FIRST, then the N noise tokens (and
 *   img_ids likewise); the reference rows are modulated with the embedding
 *   of ref_timestep (the pipeline's ref_fixed_timestep, 0) instead of the
 *   step's, they attend only to each other (text and noise queries attend
 *   to everything), and their K/V of every block (after QK norm and RoPE)
 *   are stored in kv. out [N, out_dim] receives the noise tokens only.
 * cached: x holds the N noise tokens only; the stored reference K/V are
 *   injected between the text and image keys of every attention.
 * Collective like flux2_forward. With sequence parallelism (flux2_set_sp)
 * the cache holds what the rank attends for after the all-to-all: all R
 * reference tokens of its heads/sp (docs/parallel.md). */
enum { FLUX2_KV_NONE = 0, FLUX2_KV_EXTRACT = 1, FLUX2_KV_CACHED = 2 };
typedef struct flux2_kv_cache flux2_kv_cache;
flux2_kv_cache *flux2_kv_new(void);
void flux2_kv_free(flux2_kv_cache *kv);
int flux2_forward_kv(flux2_model *m, int mode, flux2_kv_cache *kv, const float *x, int64_t N, int64_t R,
                     const int32_t *img_ids, const float *txt, int64_t L, const int32_t *txt_ids, float timestep,
                     const float *guidance, float ref_timestep, float *out);

/* Fuse the image and text partials of a sub-layer into one all-reduce
 * (default on): 2 all-reduces per double block instead of 4. */
void flux2_set_fused_allreduce(flux2_model *m, int on);
/* Synchronise the backend around attention and all-reduces so that the
 * timers below measure them (default off on GPUs, where it costs overlap;
 * on the CPU backend ops are synchronous anyway). */
void flux2_set_profiling(flux2_model *m, int on);

/* bf16 mode only: embed timestep·1000 and guidance·1000 unrounded instead
 * of the bf16-rounded values eager PyTorch embeds (default off). The
 * rounding moves e.g. 613.7 to 614, which a random tiny model amplifies;
 * `tpgen check` turns this on when it compares a bf16 run with f32
 * reference outputs, so that it measures the compute path, not the input
 * quantisation. Generation keeps the rounding (parity with diffusers). */
void flux2_set_exact_timestep(flux2_model *m, int on);

/* Per-forward counters, accumulated over calls until flux2_reset_stats. */
typedef struct flux2_stats {
    long forwards;
    double seconds;            /* wall time inside flux2_forward */
    double allreduce_seconds;
    long allreduces;
    uint64_t allreduce_bytes;
    double attention_seconds;  /* valid with profiling on or on the CPU backend */
    long txt_cache_hits, txt_cache_misses;
    double gemm_seconds;       /* valid with profiling on or on the CPU backend */
    double gemm_flops;         /* FLOPs of the GEMMs this rank ran */
    double attention_flops;    /* 4 * S^2 * hd * local heads per attention */
    uint64_t kv_cache_bytes;   /* the largest KV cache of references this rank held (K and V of every block) */
    int64_t kv_cache_tokens;   /* its reference tokens */
} flux2_stats;

void flux2_get_stats(const flux2_model *m, flux2_stats *st);
void flux2_reset_stats(flux2_model *m);

/* ---- host-side pieces, exposed for tests ---- */

/* Sinusoidal embedding of a scalar value (§4.2): width `channels`, cos
 * first, then sin; max period 10000; fp32 math. */
void flux2_sinusoid(float value, int channels, float *out);
/* RoPE tables for n tokens with ids [n, 4] (§4.5): cos/sin [n, head_dim],
 * float64 angles rounded to f32, each frequency repeated twice. */
void flux2_rope_table(const flux2_config *cfg, const int32_t *ids, int64_t n, float *cos_out,
                      float *sin_out);

#endif
