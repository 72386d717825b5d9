/* The settings of a generation run, from a YAML run spec and/or command-line
 * flags. Each spec key is the flag's name with dashes turned into
 * underscores (--prompt-embeds -> prompt_embeds:); flags override the spec.
 *
 * A run is a batch of jobs: every prompt x every seed, in that order
 * (job index = prompt_index * n_seeds + seed_index). `output` is a path
 * pattern with placeholders (runspec_output_path) so that each job gets its
 * own file. */
#ifndef TPGEN_RUNSPEC_H
#define TPGEN_RUNSPEC_H
#include "core/formats/lora.h"
#include <stddef.h>
#include <stdint.h>

typedef struct run_spec {
    char *model;                 /* --model DIR */
    char *transformer;           /* --transformer PATH: replaces <model>/transformer (NULL: the pipeline's) */
    char *text_encoder, *vae;    /* --text-encoder PATH, --vae PATH: the same for those components */
    char *family;                /* --family dev|klein|klein-base: stands for model_index.json */
    char **prompts;              /* --prompt (one) or prompts: [..] */
    int n_prompts;
    char *prompt_embeds;         /* FILE[:TENSOR] instead of prompts */
    char *negative_prompt_embeds;  /* FILE[:TENSOR]: CFG's negative embeddings with prompt_embeds (FLUX.3 base) */
    char *negative_prompt;       /* CFG negative prompt ("" by default) */
    uint64_t *seeds;             /* --seed S, seeds: [..] or {from, count} */
    int n_seeds;
    char *rng;                   /* --rng torch2|torch1: whose bf16 draw the seed gives (NULL: torch2) */
    char *initial_latents;       /* --initial-latents FILE[:TENSOR]: start from these latents instead of seeded
                                  * noise; with several jobs TENSOR has a job placeholder ({index}, ...) */
    char *cache;                 /* --cache SPEC: block caching (core/models/block_cache.h); NULL: off */
    int save_step_latents;       /* with save_latents: also the latents after every step */
    int steps;                   /* 0: the model's default */
    double guidance;             /* < 0: the model's default */
    int width, height;           /* pixels, multiples of 16 */
    char *output;                /* path or pattern; NULL: default */
    char *precision;             /* "bf16" | "f32"; NULL: default (bf16) */
    char *backend;               /* "cpu" | "cuda"; NULL: default */
    char *quantize;              /* "fp8": quantise the transformer at load; NULL: as stored */
    int tp;                      /* 0: the whole world (what sp and cfg_parallel leave of it) */
    int sp;                      /* Ulysses sequence-parallel degree (0, 1: none) */
    int cfg_parallel;            /* the CFG branches on two halves of each job group */
    char *save_latents;          /* FILE or pattern */
    int no_decode;
    char *json_metrics;          /* FILE */
    int max_sequence_length;     /* 0: 512 */
    char *prompts_file;          /* one prompt per line, instead of prompts: */
    int skip_existing;           /* do not render jobs whose outputs all exist */
    double watchdog;             /* seconds without progress before a rank ends the job; < 0: automatic, 0: off */
    int preview_every;           /* K > 0: a preview PNG after steps K, 2K, ... (0: none) */
    char *preview;               /* its path pattern: the output placeholders and {step} */
    char *spec_path;             /* the spec file read, if any */
    lora_spec loras[LORA_MAX_ADAPTERS];  /* --lora FILE[:W] (repeatable) or loras: [{path, weight}] */
    int n_loras;
    int loras_from_flags;        /* the first --lora replaces the spec's list */
    /* reference images (editing): --image FILE (repeatable) / images: [..]
     * apply to every prompt without its own; a prompts: entry
     * {prompt: TEXT, images: [..]} carries its own (prompt_images[p],
     * NULL when it has none) */
    char **images;
    int n_images;
    char ***prompt_images;       /* [n_prompts] or NULL */
    int *n_prompt_images;        /* [n_prompts] */
} run_spec;

void runspec_init(run_spec *s);
void runspec_free(run_spec *s);

/* Read a YAML run spec into s (keys present in the file replace the values
 * in s). Errors name the file, the key, line and column:
 * unknown keys, wrong types, out-of-range values, unreadable/invalid YAML. */
int runspec_load_file(run_spec *s, const char *path);
/* The same from a string (name is used in messages). */
int runspec_load_string(run_spec *s, const char *yaml, const char *name);

/* Parse command-line flags (argv[0] is the command name). --spec FILE is
 * read first wherever it appears, then the other flags override it.
 * Returns 0 ok, 1 when --help was given (help printed), -1 on error. */
int runspec_parse_args(run_spec *s, int argc, char **argv);
void runspec_print_help(void);

/* --prompts-file: read the file named by s->prompts_file (if any) into
 * s->prompts. An error if prompts were also given (--prompt, prompts:), if
 * the file cannot be read or has no prompts. runspec_parse_args calls it
 * after the flags. */
int runspec_read_prompts_file(run_spec *s);
/* The parser behind it, on a buffer: one prompt per line, blank lines
 * skipped, CRLF and a UTF-8 byte-order mark accepted; errors (invalid
 * UTF-8, NUL bytes, lines over 64 KiB, no prompts) name `name`:LINE.
 * On success *prompts (malloc'ed, count entries) belongs to the caller. */
/* The longest prompt accepted, from any source (flag, run spec, prompts
 * file): a prompt is a few hundred tokens, so more is a binary or a file
 * without line breaks. */
#define RUNSPEC_MAX_PROMPT_BYTES (64 * 1024)
/* All prompts of a YAML run spec together, counting each use of an alias
 * (a 160 KB spec must not expand to gigabytes); --prompts-file for more. */
#define RUNSPEC_MAX_SPEC_PROMPT_BYTES (64u << 20)
/* The output paths the uniqueness check may build, in bytes (jobs x path
 * length) when the pattern does not make the paths distinct by itself. */
#define RUNSPEC_MAX_CHECK_BYTES (64u << 20)
int runspec_parse_prompt_lines(const char *text, size_t len, const char *name, char ***prompts, int *count);

/* Checks that need no files: the settings are consistent (prompt or
 * embeddings, size, steps, outputs...). Called after parsing. */
int runspec_check(const run_spec *s);

/* Number of jobs (prompts x seeds; embeddings count as one prompt). */
int runspec_n_jobs(const run_spec *s);
/* The job's prompt (NULL with prompt embeddings) and seed. */
const char *runspec_job_prompt(const run_spec *s, int job);
uint64_t runspec_job_seed(const run_spec *s, int job);

/* The job's reference images in order (its prompt's own, else the run's);
 * *n = 0 (and NULL) without references. */
char *const *runspec_job_images(const run_spec *s, int job, int *n);
/* The same by prompt index. */
char *const *runspec_prompt_images(const run_spec *s, int prompt, int *n);

/* Expand an output pattern for a job: {index}, {seed}, {prompt_index},
 * {seed_index} (each optionally with a zero-padded width, {index:04}),
 * {prompt} (a file-name-safe slug of the prompt, at most 48 characters)
 * and {{ / }} for literal braces. malloc'ed result; NULL + tp_error on a
 * malformed pattern. */
char *runspec_output_path(const run_spec *s, const char *pattern, int job);
/* The same for a preview (--preview): also {step} (1-based, optionally
 * zero-padded: {step:03}). */
char *runspec_preview_path(const run_spec *s, const char *pattern, int job, int step);
/* Error unless the pattern gives each of the n jobs its own path
 * (name: the flag, for the message). */
int runspec_check_unique_paths(const run_spec *s, const char *pattern, const char *name, int n);
/* Whether a pattern varies with the job (has a job placeholder). */
int runspec_pattern_varies(const char *pattern);

/* Data parallelism: the jobs of TP group `group` out of `groups`
 * (round-robin: job j belongs to group j % groups). Returns how many were
 * written to jobs (room for runspec_n_jobs). */
int runspec_group_jobs(int n_jobs, int groups, int group, int *jobs);

#endif
