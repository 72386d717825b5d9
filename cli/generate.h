/* Internals of `tpgen generate`, split by phase:
 *   generate_setup.c    model defaults, every check that needs no heavy work
 *   generate_run.c      the jobs on the pipeline library (core/tp_pipe.h):
 *                       chunks of prompts, rendering, the files of each job
 *   generate_metrics.c  timings, peak RSS per rank, summary and JSON
 *   generate_jobs.c     the batch: jobs, output patterns, DP split (runspec.h)
 *   cmd_generate.c      the command: MPI, parsing, error agreement */
#ifndef TPGEN_GENERATE_H
#define TPGEN_GENERATE_H
#include "runspec.h"
#include "core/dist/dist.h"
#include "kernels/tensor.h"
#include "core/tp_pipe.h"
#include <stdint.h>

typedef struct gen_lora gen_lora;   /* cli/generate_lora.c */
struct lora_set;

typedef struct gen_setup {
    run_spec *spec;              /* defaults filled in (steps, guidance, size, output) */
    dist *d;
    tp_pipe_info info;        /* the model folder: family, sizes, components */
    int use_cfg;                 /* klein base with guidance > 1: two passes per step */
    int write_png;               /* VAE present and not --no-decode */
    dtype_t precision;
    int quantize_fp8;            /* --quantize fp8 */
    /* --prompt-embeds, read at setup (small) */
    float *embeds;
    int64_t embeds_len;
    char *embeds_desc;           /* "FILE:TENSOR" for the PNG parameters */
    float *neg_embeds;           /* --negative-prompt-embeds (CFG with --prompt-embeds) */
    int64_t neg_embeds_len;
    char *neg_embeds_desc;
    int rng;                     /* --rng: tp_rng_kind (core/rng.h) */
    /* --initial-latents, read and checked at setup on every rank: per job,
     * the packed start [(H/16)*(W/16), C] and "FILE:TENSOR"; NULL without */
    float **init_latents;
    char **init_desc;
    char init_sha256[65];        /* the file's */
    /* reference images (editing): every distinct file, checked at setup */
    int has_refs;                /* some job has references: the VAE encoder is loaded */
    int n_ref_files;
    char **ref_files;            /* distinct paths, in order of first use */
    char (*ref_sha256)[65];      /* their sha256 */
    int *ref_w, *ref_h;          /* their processed size (what the encoder sees) */
    int *ref_ow, *ref_oh;        /* their size as read */
    int *prompt_w, *prompt_h;    /* output size per prompt index: --width/--height, else the first reference's */
    int (*prompt_crop)[4];       /* FLUX.3, one padded reference, no size given: the PNG is cropped back to
                                  * (left, top, w, h) of the canvas (w = 0: no crop) */
    int n_jobs;
    int *my_jobs, n_my_jobs;     /* jobs of this rank's TP group (to render) */
    int n_skipped;               /* --skip-existing: this group's jobs left out */
    int n_todo_world;            /* jobs to render, all groups */
    gen_lora *lora;              /* --lora adapters: formats, sha256, bytes read (NULL: none) */
    bc_spec cache;               /* --cache, parsed and checked against the transformer's blocks at setup */
    char **cache_json;           /* [n_jobs]: each rendered job's decisions as JSON text, on its group's first
                                  * rank (NULL elsewhere and without a cache) */
} gen_setup;

/* Fill defaults from the model folder and check everything that can be
 * checked cheaply: the folder and its components, sizes, prompt
 * embeddings (shape against the transformer), output directories. Runs on
 * every rank (same answer everywhere); -1 + tp_error on bad input. */
int gen_setup_init(gen_setup *g, run_spec *spec, dist *d);
void gen_setup_free(gen_setup *g);

/* --skip-existing: drop from this group's jobs those whose outputs all
 * exist (outputs are written atomically, so an existing file is complete).
 * The group's first rank looks, the group follows its answer (no two ranks
 * of a group can disagree and hang a collective); then the world learns how
 * many jobs are left (n_todo_world). Collective over the world; call after
 * gen_setup_init succeeded everywhere. */
int gen_skip_existing(gen_setup *g);

typedef struct gen_metrics {
    double t_start;
    double t_encode, t_te_load, t_load, t_denoise, t_decode, t_write;   /* t_encode without t_te_load */
    double t_preview;            /* --preview-every: decoding the previews (inside t_denoise) */
    int previews;                /* preview PNGs written by this rank */
    double t_refs;               /* reference images: read, preprocess, VAE-encode, broadcast */
    int refs_encoded;            /* references this rank encoded */
    int prompts_encoded;         /* prompts this rank ran the text encoder on (with its TP group) */
    int decode_bands;            /* decodes (images, previews) in which this rank decoded a row band */
    uint64_t bytes_loaded;       /* this rank: the transformer */
    double load_seconds;         /* time spent in the transformer's loader (this rank) */
    uint64_t te_bytes_loaded;    /* this rank: the text encoder */
    double te_load_seconds;      /* time spent in the text encoder's loader */
    int steps_total;
    double step_seconds;         /* summed over steps */
    double comm_bytes;           /* this rank: sent in collectives while denoising (tp_pipe_stats) */
    double kv_cache_bytes, kv_cache_tokens;   /* this rank: the largest KV cache of references held (tp_pipe_stats) */
    int images, latents;         /* files written by this rank */
    int jobs_done;               /* jobs of this rank's group */
    int cache_steps[2][2];       /* --cache, this group's first rank: [group][0 computed, 1 cached] block-group
                                  * steps, all jobs and CFG branches */
} gen_metrics;

/* Run this rank's jobs. Collective within the TP group; returns -1 after
 * agreeing on the error inside the group. */
int gen_run(gen_setup *g, gen_metrics *m);

/* Gather the figures of every rank and print the summary on world rank 0
 * (and write --json-metrics). Collective over the world. */
int gen_report(const gen_setup *g, const gen_metrics *m, int status);

/* A step's progress line on world rank 0. */
void gen_progress(const gen_setup *g, int job_pos, int step, int steps, double seconds);

/* The text stored in each PNG's `parameters` chunk (malloc'ed). */
char *gen_parameters_text(const gen_setup *g, int job);

double gen_now(void);

/* LoRA adapters (cli/generate_lora.c): validated against the transformer
 * checkpoint at setup and hashed on the TP-group leads; the bytes each rank
 * read are recorded after the load; the PNG parameters line; the metrics
 * entries (collective over the world; the array on world rank 0). */
int gen_lora_setup(gen_setup *g);
void gen_lora_loaded(gen_setup *g, const uint64_t *bytes);
void gen_lora_free(gen_setup *g);
char *gen_lora_parameters(const gen_setup *g);
struct json_t;
struct json_t *gen_lora_gather(const gen_setup *g);
/* The job's image size in pixels (per prompt: references can set it). */
void gen_job_size(const gen_setup *g, int job, int *w, int *h);
/* The crop box of a job's PNG (gen_setup.prompt_crop): 1 and box set, else 0. */
int gen_job_crop(const gen_setup *g, int job, int box[4]);
/* Index in g->ref_files of a reference path (-1 if unknown). */
int gen_ref_index(const gen_setup *g, const char *path);

#endif
