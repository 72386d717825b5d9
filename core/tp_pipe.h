/* The generation pipeline as a library object, the same for every model
 * family (FLUX.2, FLUX.3: each a table, core/family.h), shared by the front
 * ends (`tpgen generate`, `tpgen serve`, benchmarks): a model folder is
 * probed (no weights), opened on a TP group, its weights loaded once, and
 * then any number of jobs rendered.
 *
 *   tp_pipe_probe     the folder: family, sizes, components (cheap)
 *   tp_pipe_open      backend and communicator of the TP group
 *   tp_pipe_encode    prompt -> embeddings (text encoder loaded on demand,
 *                     freed by tp_pipe_text_done unless kept resident;
 *                     an LRU cache skips repeated prompts); _many: several
 *                     prompts spread over the group's TP groups
 *   tp_pipe_load      transformer shard (LoRA, fp8) and the VAE parts
 *                     that are needed, on every rank (they run patch-parallel:
 *                     over the whole group where the backend is rows-invariant,
 *                     else over its first TP group; see tp_pipe_decode)
 *   tp_pipe_render    one job: seeded noise, references, denoising in
 *                     lockstep (the one loop, core/sampler.h) -> final
 *                     latents on every rank
 *   tp_pipe_decode    latents -> RGB, patch-parallel (as tp_pipe_load), the
 *                     image on the group's first rank
 *
 * Every call but probe is collective over the job group (the TP group, or
 * with CFG parallelism and sequence parallelism the mesh of them,
 * core/dist/dist.h) and returns the same status on every rank of it (errors
 * agreed inside the group), so a failed job leaves the group in lockstep. File names, output
 * patterns and PNG parameters belong to the front ends. */
#ifndef TPGEN_TP_PIPE_H
#define TPGEN_TP_PIPE_H
#include "core/formats/lora.h"
#include "core/models/llm/textenc.h"
#include "pipeline.h"
#include "kernels/tensor.h"
#include <jansson.h>
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    FAMILY_DEV = 0, FAMILY_KLEIN_DISTILLED, FAMILY_KLEIN_BASE, FAMILY_KLEIN_KV,
    FAMILY_FLUX3_BASE,           /* Flux3ModularPipeline: CFG (core/flux3_pipe.h) */
    FAMILY_FLUX3_FLOWMAP         /* flow_map transformer (Flux3DistilledModularPipeline): no CFG, target timestep */
} model_family;

/* What the family is decided from (core/model_family.c, one table). */
typedef struct family_input {
    const json_t *index;         /* model_index.json or modular_model_index.json (NULL: none) */
    const char *index_path;
    const char *transformer_class;  /* transformer config's _class_name (NULL: absent) */
    int guidance_embeds;         /* FLUX.2 transformer config */
    int flow_map;                /* FLUX.3 transformer config */
    const char *config_path;
} family_input;

/* The family of a pipeline folder: the index's _class_name when present,
 * else the transformer (Flux3Transformer2DModel + flow_map, or FLUX.2's
 * guidance_embeds). *name is the display name; a class that contradicts
 * the transformer leaves a warning (naming both) in warning. -1 + tp_error
 * for a class tpgen does not run, or one whose family (FLUX.2 / FLUX.3)
 * is not the transformer's. */
int model_family_resolve(const family_input *in, model_family *family, const char **name, char *warning,
                         size_t warning_len);
const char *model_family_name(model_family f);
int model_family_is_flux3(model_family f);

/* What a model folder is, read from its JSON files (no weights). */
typedef struct tp_pipe_info {
    model_family family;         /* FAMILY_KLEIN_KV is resolved to distilled/base with kv_refs set */
    const char *family_name;
    int embedded_guidance;       /* FLUX.2-dev: guidance goes into the model */
    int kv_refs;                 /* Flux2KleinKVPipeline: reference K/V cached after step 0 */
    int in_channels, joint_dim;
    int heads;                   /* num_attention_heads: tp x sp must divide it */
    int cond_in_channels;        /* reference token width (FLUX.3's cond_in_channels; FLUX.2: in_channels) */
    int n_blocks[2];             /* the block groups of --cache: FLUX.2 double and single blocks; FLUX.3 mode
                                  * blocks and single blocks */
    int has_vae, has_text_encoder;
    char *transformer_dir, *vae_dir;   /* a folder or one checkpoint file each */
    char *te_path;               /* text encoder folder or file (NULL: none) */
    char *model_root;            /* --model, or NULL for a model assembled from components */
    /* where each part came from, for messages and inspect: "pipeline folder", "--vae file", ... */
    const char *transformer_src, *te_src, *vae_src, *family_src;
} tp_pipe_info;

/* The parts of a model: a pipeline folder and/or single components, each a
 * file (.safetensors / .gguf) or a folder, replacing the folder's own
 * (ComfyUI's diffusion_models/, text_encoders/, vae/ files). family ("dev",
 * "klein", "klein-base") stands for model_index.json; without either, a
 * model built from components is refused with the choices. */
typedef struct flux2_components {
    const char *model;           /* pipeline folder, or NULL */
    const char *transformer, *text_encoder, *vae;
    const char *family;
} flux2_components;
int tp_pipe_probe_components(const flux2_components *c, tp_pipe_info *info, char *warning, size_t warning_len);
/* Each part of a probed model (core/flux2_components.c), headers only: a JSON array of
 * {component, path, from, naming, format, files, tensors, dtypes, config, ...}. */
json_t *flux2_components_describe(const tp_pipe_info *info);

/* Probe a pipeline folder (diffusers layout). A contradiction between
 * model_index.json and the transformer config leaves a warning in warning.
 * -1 + tp_error naming the file on a missing or malformed folder. */
int tp_pipe_probe(const char *root, tp_pipe_info *info, char *warning, size_t warning_len);
/* The same with the transformer taken from the folder `transformer`
 * (--transformer DIR: any checkpoint folder tpgen reads, e.g. one holding a
 * GGUF file) instead of <root>/transformer; NULL: the pipeline's own. */
int tp_pipe_probe_with(const char *root, const char *transformer, tp_pipe_info *info, char *warning,
                          size_t warning_len);
void tp_pipe_info_free(tp_pipe_info *info);
/* The text encoder of a probed model, for textenc_load_from. */
textenc_source tp_pipe_text_source(const tp_pipe_info *info);
/* The model's defaults (diffusers' pipelines): klein distilled 4 steps and
 * no guidance, the others 50 steps and guidance 4; FLUX.3 (core/flux3_pipe.h)
 * base 50 steps and CFG 3.5, flow-map 16 steps and no guidance. */
int tp_default_steps(const tp_pipe_info *info);
double tp_default_guidance(const tp_pipe_info *info);
/* klein base with guidance > 1 and FLUX.3 base with guidance != 1 run
 * classifier-free guidance (two passes). */
int tp_uses_cfg(const tp_pipe_info *info, double guidance);
/* Tokens per prompt when none is asked for: FLUX.2 512 (every prompt padded
 * to it); FLUX.3 8192, the cap of each prompt's own window. */
int tp_default_max_sequence_length(const tp_pipe_info *info);

typedef struct tp_pipe_config {
    const char *model;           /* the folder (as the user named it) */
    const char *backend;         /* "cpu" | "cuda" | NULL (default) */
    dtype_t precision;
    int quantize_fp8;            /* quantise the transformer's weights at load */
    const lora_spec *loras;
    int n_loras;
    int decoder, encoder;        /* VAE halves to load (on every rank of the group) */
    int keep_text_encoder;       /* keep the text encoder resident between encodes */
    size_t prompt_cache_bytes;   /* LRU cache of embeddings (0: none) */
    int max_sequence_length;     /* L: tokens per prompt */
    /* the mesh of the job group (core/dist/dist.h): tp = group size / (sp x cfg halves) */
    int sp;                      /* Ulysses sequence-parallel degree (0, 1: none) */
    int cfg_parallel;            /* the CFG branches on two halves of the group */
} tp_pipe_config;

/* Cumulative figures of this rank. */
typedef struct tp_pipe_stats {
    double t_encode;             /* encoding prompts, without loading the text encoder */
    double t_te_load;            /* loading the text encoder (wall time) */
    double t_load, t_refs, t_denoise;   /* t_load: the transformer and the VAE */
    double load_seconds;         /* transformer: inside the loader (disk + transfer) */
    uint64_t bytes_loaded;       /* transformer, this rank */
    double te_load_seconds;      /* text encoder: inside the loader */
    uint64_t te_bytes_loaded;    /* text encoder, this rank */
    int refs_encoded;            /* reference images this rank encoded */
    int decode_bands;            /* decodes (images and previews) in which this rank decoded a row band */
    int prompts_encoded;         /* prompts this rank's TP group ran the text encoder on (not cache hits, not
                                  * the other TP groups' prompts it received) */
    int steps;
    double step_seconds;
    double comm_bytes;           /* sent in collectives while denoising (ring formulas, kernels/comm.h) */
    uint64_t kv_cache_bytes;     /* the largest KV cache of references held (Flux2KleinKVPipeline), else 0 */
    int64_t kv_cache_tokens;     /* its reference tokens */
    uint64_t cache_hits, cache_misses;
    uint64_t prefetched;         /* prompts encoded ahead into the cache */
    uint64_t lora_bytes[LORA_MAX_ADAPTERS];  /* read from each adapter at the last load */
} tp_pipe_stats;

typedef struct tp_pipe tp_pipe;

/* Select the backend (device local_rank of local_size), split the job
 * group into its mesh (cfg->sp, cfg->cfg_parallel; the rest is TP, tp
 * innermost) and create the TP group's communicator; info must outlive the
 * pipe. Collective over group (with sp = 1 and no CFG parallelism: the TP
 * group itself). */
int tp_pipe_open(const tp_pipe_config *cfg, const tp_pipe_info *info, MPI_Comm group, int local_rank,
                    int local_size, tp_pipe **out);
void tp_pipe_free(tp_pipe *p);

/* The embedding of a prompt: *out = [*L, joint_dim] floats (malloc'ed; L
 * may be NULL). FLUX.2: L = max_sequence_length; FLUX.3: the prompt's
 * window (its tokens rounded up to 80, at most max_sequence_length). *hit
 * (may be NULL) is 1 when the cache answered. Loads the text encoder when
 * needed. */
int tp_pipe_encode(tp_pipe *p, const char *prompt, float **out, int64_t *L, int *hit);
/* The embeddings of n prompts at once: out[i], L[i] (and hit[i], may be
 * NULL) as tp_pipe_encode gives them for prompts[i]. The prompts the cache
 * does not answer are dealt out to the job group's TP groups (cfg x sp of
 * them: the k-th on TP group k mod G), which encode theirs at the same
 * time, each the same TP computation as tp_pipe_encode (the same bits);
 * each result is then broadcast from its TP group's first rank to the
 * group. Only TP groups with a prompt to encode load the text encoder
 * (all of them with keep_text_encoder). A prompt given twice is encoded
 * once; the hit and miss counts are those of n tp_pipe_encode calls. */
int tp_pipe_encode_many(tp_pipe *p, int n, const char *const *prompts, float **out, int64_t *L, int *hit);
/* Encode a prompt into the cache only, for a prompt that will be asked for
 * soon, while the encoder is loaded; not counted as a hit or a miss. No-op
 * without a cache. _many: n prompts, spread as tp_pipe_encode_many. */
int tp_pipe_prefetch(tp_pipe *p, const char *prompt);
int tp_pipe_prefetch_many(tp_pipe *p, int n, const char *const *prompts);
/* Done with prompts for now: the text encoder is freed (its memory goes
 * back to the transformer) unless keep_text_encoder. */
void tp_pipe_text_done(tp_pipe *p);

/* Load the transformer shard (and, the first time, the VAE): no-op when
 * loaded. tp_pipe_unload frees the transformer only. */
int tp_pipe_load(tp_pipe *p);
void tp_pipe_unload(tp_pipe *p);

typedef struct tp_job {
    uint64_t seed;
    int rng;                     /* tp_rng_kind (core/rng.h) of the seeded draw: 0 torch 2.x, 1 torch 1.13 */
    const float *init_latents;   /* NULL: seeded noise; else the starting latents, packed
                                  * [(H/16)*(W/16), in_channels] (flux2_latents_pack), used as given */
    int steps;
    double guidance;             /* embedded (dev) or CFG scale (klein base) */
    int width, height;           /* pixels, multiples of 16 */
    const float *embeds;         /* [L, joint_dim] */
    int64_t L;
    const float *neg_embeds;     /* CFG (tp_uses_cfg): the negative prompt's, else NULL */
    int64_t Ln;                  /* its length in tokens, the buffer's (0: L); both families honour it */
    char *const *images;         /* reference images in order (read on the group's first rank) */
    int n_images;
    denoise_step_fn on_step;     /* NULL ok; called on every rank after each step */
    void *ctx;
    const bc_spec *cache;        /* block caching (NULL or off: none); state is fresh for every job */
    bc_log *cache_log;           /* NULL ok: what was computed and cached (filled with a cache) */
} tp_job;

/* Render a job: latents [(H/16)*(W/16), in_channels] on every rank. A job
 * whose sizes cannot be right (width or height not a positive multiple of
 * 16, no embeddings, Ln without negative embeddings) is refused on every
 * rank before anything is read. */
int tp_pipe_render(tp_pipe *p, const tp_job *job, float *latents);
/* Latents (the same on every rank) -> RGB [H, W, 3] on the group's first
 * rank (rgb may be NULL elsewhere), each rank decoding one row band: every
 * rank of the job group where the backend is rows-invariant
 * (op_rows_invariant, agreed over the group: the image is the same bytes
 * for any band count), else the ranks of its first TP group (the serial
 * run's bands at this tp). Collective over the group; the status is agreed. */
int tp_pipe_decode(tp_pipe *p, const float *latents, int width, int height, uint8_t *rgb, double *seconds);

/* A preview from inside a job's step callback (every rank, in lockstep):
 * the prediction of the clean latents x0 = x − sigma·v (the callback's x,
 * v and sigma, core/sampler.h) decoded with the resident VAE as
 * tp_pipe_decode does. Collective over the TP group. */
int tp_pipe_decode_x0(tp_pipe *p, const float *x, const float *v, float sigma, int width, int height, uint8_t *rgb,
                      double *seconds);

const tp_pipe_stats *tp_pipe_get_stats(const tp_pipe *p);
/* Bytes the backend holds now (weights and buffers), this rank. */
uint64_t tp_pipe_resident_bytes(const tp_pipe *p);

/* The initial noise of a job, as the bf16 diffusers pipeline draws it:
 * torch.randn([1, C, h, w], generator=manual_seed(seed), dtype=bf16),
 * packed to tokens: x[(y*w + x)*C + c] (malloc'ed, f32 values of bf16).
 * flux2_noise_packed draws as torch 2.x does; _as picks the torch
 * (tp_rng_kind, core/rng.h). */
float *flux2_noise_packed(uint64_t seed, int C, int h, int w);
float *flux2_noise_packed_as(uint64_t seed, int C, int h, int w, int rng_kind);
/* [1, C, h, w] (row-major, as diffusers' prepare_latents draws it) -> the
 * packed tokens [h*w, C] (malloc'ed). */
float *flux2_latents_pack(const float *nchw, int C, int h, int w);

#endif
