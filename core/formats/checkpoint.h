/* A model folder in the diffusers layout, and one component's checkpoint:
 * a single *.safetensors file or a sharded set with a
 * *.safetensors.index.json weight_map. */
#ifndef TPGEN_CHECKPOINT_H
#define TPGEN_CHECKPOINT_H
#include "safetensors.h"
#include "plans/plan.h"
#include <jansson.h>

typedef struct model_dir {
    char *root;
    json_t *index;            /* model_index.json (NULL when the folder has none) */
} model_dir;

/* Open a pipeline folder: it must exist; model_index.json is read when present. */
int model_dir_open(const char *root, model_dir **out);
void model_dir_close(model_dir *m);
/* 1 when the component subfolder exists (e.g. "vae", "text_encoder"). */
int model_dir_has(const model_dir *m, const char *component);
/* Path of a component folder (malloc'ed). */
char *model_dir_path(const model_dir *m, const char *component);
/* Parse <root>/<component>/config.json; NULL + tp_error when missing or malformed. */
json_t *model_dir_config(const model_dir *m, const char *component);
/* Boolean key of model_index.json (e.g. "is_distilled"); def when absent. */
int model_dir_flag(const model_dir *m, const char *key, int def);

/* The tensors of one component across its files. */
typedef struct checkpoint {
    char *dir;                     /* the folder, or the file when is_file */
    int is_file;                   /* opened from one file path (not a folder) */
    int n_files;
    st_file **files;
    int n;                         /* tensors in total */
    const st_tensor_info **infos;  /* sorted by name */
    int *file_of;                  /* index into files for each info */
    struct fp8_info *fp8;          /* fp8 layers and scales (core/formats/fp8.h); NULL when none */
    const char *prefix;            /* CHECKPOINT_DM_PREFIX when the names were read behind it, else NULL */
    int n_other;                   /* tensors outside that prefix, left out of the list */
} checkpoint;

/* ComfyUI saves a diffusion model, and stable-diffusion.cpp's `convert` writes one, with every name behind
 * this prefix (a whole ComfyUI checkpoint also holds the VAE, first_stage_model.*, and text encoders). */
#define CHECKPOINT_DM_PREFIX "model.diffusion_model."

/* Open every safetensors file of a component folder. With an index, every
 * tensor of its weight_map must exist in the named file (and the file must
 * exist); without one, the folder must hold exactly one *.safetensors file
 * (when it has several, the one named like the component, e.g.
 * diffusion_pytorch_model.safetensors or model.safetensors), or, with no
 * safetensors at all, one *.gguf file (its block-type tensors are DT_GGML
 * entries: core/formats/gguf_shard.h). `dir` may also be one such file
 * (.safetensors, .sft or .gguf): then that file alone is the checkpoint.
 * A checkpoint with names behind CHECKPOINT_DM_PREFIX is read as that
 * diffusion model, as ComfyUI-GGUF's loader reads it: those tensors under
 * the names without the prefix, the others left out (n_other). */
int checkpoint_open(const char *dir, checkpoint **out);
void checkpoint_close(checkpoint *c);
/* Look a tensor up: NULL when absent; *file set when found. */
/* Read every float and fp8 tensor and look for NaN/Inf (in chunks, any size).
 * Returns how many tensors hold one (each printed to stderr when verbose,
 * else only the first; tp_error names the first), or -1 on a read error. */
int checkpoint_scan_finite(const checkpoint *c, int verbose);
const st_tensor_info *checkpoint_find(const checkpoint *c, const char *name, const st_file **file);

/* Rename the checkpoint's tensors in place (a model-specific name map, e.g.
 * llama.cpp's GGUF names -> the HF names a loader binds: core/models/llm/llm_gguf.c).
 * fn writes the new name of `name` into out (cap bytes) and returns 1, or
 * returns 0 to keep the name, or -1 (+ tp_error) to refuse the tensor.
 * Two tensors ending with one name are refused naming both. Lookups
 * (checkpoint_find, st_find on its files) see the new names. */
typedef int (*checkpoint_rename_fn)(const char *name, char *out, size_t cap, void *ctx);
int checkpoint_rename(checkpoint *c, checkpoint_rename_fn fn, void *ctx);

/* A tensor as the plan engine sees it (name and shape). */
static inline plan_tensor st_plan_tensor(const st_tensor_info *t) { return (plan_tensor){t->name, t->ndim, t->shape}; }
/* plan_validate over every tensor of the checkpoint (p NULL: all replicated). */
int checkpoint_validate_plan(const checkpoint *c, const plan *p, int tp);
/* 1 when the checkpoint is a Black Forest Labs single-file FLUX.2
 * transformer: it names its image embedder img_in (diffusers: x_embedder). */
int checkpoint_is_bfl(const checkpoint *c);

/* Whether a path is a directory / a regular file (following links). */
int path_is_dir(const char *p);
int path_is_file(const char *p);

#endif
