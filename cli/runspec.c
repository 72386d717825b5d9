/* Run settings: one table of keys drives the YAML run spec, the flags and
 * --help, so the three never disagree (see runspec.h). */
#include "runspec.h"
#include "kernels/err.h"
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

typedef enum { K_STR, K_INT, K_FLOAT, K_BOOL, K_PROMPT, K_PROMPTS, K_SEED, K_SEEDS, K_SPEC, K_LORA, K_LORAS, K_IMAGE,
               K_IMAGES } key_kind;

typedef struct key_def {
    const char *name;            /* spec key; the flag is --name with '_' -> '-' */
    key_kind kind;
    size_t off;                  /* field in run_spec */
    double min, max;             /* K_INT / K_FLOAT range */
    const char *choices;         /* K_STR: "a|b" or NULL */
    const char *arg, *help;
    int spec_only, flag_only;
} key_def;

#define OFF(f) offsetof(run_spec, f)
static const key_def k_keys[] = {
    {"model", K_STR, OFF(model), 0, 0, NULL, "DIR", "pipeline folder (diffusers layout: model_index.json, transformer/, ...)", 0, 0},
    {"prompt", K_PROMPT, 0, 0, 0, NULL, "TEXT", "the prompt", 0, 0},
    {"prompts", K_PROMPTS, 0, 0, 0, NULL, "[TEXT, ...]", "several prompts (run spec only): each is rendered with every seed", 1, 0},
    {"prompt_embeds", K_STR, OFF(prompt_embeds), 0, 0, NULL, "FILE[:TENSOR]",
     "precomputed prompt embeddings [1, L, joint_attention_dim] from a safetensors file (tensor 'prompt_embeds' by default) instead of a prompt", 0, 0},
    {"negative_prompt_embeds", K_STR, OFF(negative_prompt_embeds), 0, 0, NULL, "FILE[:TENSOR]",
     "precomputed negative embeddings for CFG with --prompt-embeds (FLUX.3 base; tensor 'negative_prompt_embeds' by default)", 0, 0},
    {"negative_prompt", K_STR, OFF(negative_prompt), 0, 0, NULL, "TEXT", "negative prompt of CFG (klein base; default empty)", 0, 0},
    {"seed", K_SEED, 0, 0, 0, NULL, "S", "random seed of the initial noise (default 0); same seed and --tp -> the same file; another --tp moves f32 latents by ~1e-7 (relative) and bf16 images to ~40-50 dB PSNR (docs/generate.md)", 0, 0},
    {"seeds", K_SEEDS, 0, 0, 0, NULL, "[S, ...] | {from: S, count: N}", "several seeds (run spec only)", 1, 0},
    {"steps", K_INT, OFF(steps), 1, 10000, NULL, "N", "denoising steps (default: 50 for FLUX.2-dev, klein base and FLUX.3 base, 4 for klein distilled, 16 for FLUX.3 flow-map)", 0, 0},
    {"guidance", K_FLOAT, OFF(guidance), 0, 100, NULL, "G",
     "guidance scale (default 4.0, FLUX.3 base 3.5; embedded guidance for FLUX.2-dev, CFG for klein and FLUX.3 base, ignored by klein distilled and FLUX.3 flow-map)", 0, 0},
    {"width", K_INT, OFF(width), 16, 16384, NULL, "W", "image width in pixels, a multiple of 16 (default 1024)", 0, 0},
    {"height", K_INT, OFF(height), 16, 16384, NULL, "H", "image height in pixels, a multiple of 16 (default 1024)", 0, 0},
    {"output", K_STR, OFF(output), 0, 0, NULL, "PATH",
     "PNG path or pattern, e.g. out/{index:04}-{seed}.png (default tpgen.png; tpgen-{index:04}-{seed}.png for several jobs)", 0, 0},
    {"precision", K_STR, OFF(precision), 0, 0, "bf16|f32", "bf16|f32", "bf16 (default; weights stay bf16) or f32 (reference mode)", 0, 0},
    {"quantize", K_STR, OFF(quantize), 0, 0, "fp8", "fp8",
     "quantise the transformer's sharded linear weights to fp8 (E4M3, per-row scales) at load: half the resident "
     "weight bytes, about 2e-2 relative output error (docs/fp8.md)", 0, 0},
    {"backend", K_STR, OFF(backend), 0, 0, "cpu|cuda", "cpu|cuda", "compute backend (default: cuda when a GPU is visible, else cpu)", 0, 0},
    {"tp", K_INT, OFF(tp), 1, 65536, NULL, "N",
     "tensor-parallel degree (default: all ranks); smaller than the world size -> data parallel groups share the jobs", 0, 0},
    {"sp", K_INT, OFF(sp), 1, 65536, NULL, "S",
     "Ulysses sequence-parallel degree: the tokens split over S ranks of each job group, an all-to-all around "
     "attention; the group is cfg x sp x tp ranks (docs/parallel.md)", 0, 0},
    {"cfg_parallel", K_BOOL, OFF(cfg_parallel), 0, 0, NULL, NULL,
     "run the two CFG predictions of each step on two halves of the job group (klein base, FLUX.3 base, negative "
     "prompts): the same image as the serial CFG, twice the ranks; an error on a model without CFG", 0, 0},
    {"save_latents", K_STR, OFF(save_latents), 0, 0, NULL, "FILE",
     "also write the final packed latents [1, N, C] (safetensors tensor 'latents'); a pattern like --output", 0, 0},
    {"no_decode", K_BOOL, OFF(no_decode), 0, 0, NULL, NULL, "do not run the VAE (no PNG); use with --save-latents", 0, 0},
    {"json_metrics", K_STR, OFF(json_metrics), 0, 0, NULL, "FILE", "write timings, memory and load figures as JSON", 0, 0},
    {"max_sequence_length", K_INT, OFF(max_sequence_length), 1, 8192, NULL, "N", "text tokens per prompt (default 512; FLUX.3: the cap of each prompt's window, default 8192)", 0, 0},
    {"prompts_file", K_STR, OFF(prompts_file), 0, 0, NULL, "FILE",
     "prompts, one per line (UTF-8; blank lines skipped), instead of --prompt / prompts:", 0, 0},
    {"watchdog", K_FLOAT, OFF(watchdog), 0, 1e7, NULL, "S",
     "seconds without progress (a dead or silent rank) before the job ends (default: 10x the slowest step, at least 60; loading and the first step: 1800; 0: off)", 0, 0},
    {"skip_existing", K_BOOL, OFF(skip_existing), 0, 0, NULL, NULL,
     "do not render jobs whose outputs (PNG, and latents file with --save-latents) exist already: a re-queued batch "
     "renders only what is missing", 0, 0},
    {"spec", K_SPEC, 0, 0, 0, NULL, "RUN.yaml", "read settings from a YAML run spec (flags override it)", 0, 1},
    {"lora", K_LORA, 0, 0, 0, NULL, "FILE[:W]",
     "merge a LoRA adapter (safetensors: diffusers/PEFT, ai-toolkit or kohya) at weight W (default 1, negative "
     "allowed) into each rank's shard at load; repeatable; the adapters apply to the whole run", 0, 1},
    {"loras", K_LORAS, 0, 0, 0, NULL, "[{path: FILE, weight: W}, ...]", "LoRA adapters (run spec only)", 1, 0},
    {"image", K_IMAGE, 0, 0, 0, NULL, "FILE",
     "a reference image for editing (PNG or JPEG; repeat for several, in order); without --width/--height the "
     "output takes the first reference's size", 0, 1},
    {"images", K_IMAGES, 0, 0, 0, NULL, "[FILE, ...]", "reference images (run spec only; the --image flags)", 1, 0},
    /* last: y_scalar refers to k_keys[1] (prompt) and k_keys[5] (seed) by index */
    {"transformer", K_STR, OFF(transformer), 0, 0, NULL, "PATH",
     "the transformer: a checkpoint file (.safetensors in BFL names, fp8, or .gguf) or a folder, "
     "replacing the pipeline's transformer/ (ComfyUI's diffusion_models/ files)", 0, 0},
    {"text_encoder", K_STR, OFF(text_encoder), 0, 0, NULL, "PATH",
     "the text encoder: a checkpoint file (HF names, model./text_encoder. prefix optional) or a folder, replacing "
     "the pipeline's text_encoder/; without config.json its shape is derived for the family (docs/generate.md)", 0, 0},
    {"vae", K_STR, OFF(vae), 0, 0, NULL, "PATH",
     "the VAE: a checkpoint file (diffusers or BFL/LDM names, e.g. ComfyUI's flux2-vae.safetensors) or a folder, "
     "replacing the pipeline's vae/; without config.json it is FLUX.2's VAE", 0, 0},
    {"family", K_STR, OFF(family), 0, 0, "dev|klein|klein-base", "dev|klein|klein-base",
     "the model family when there is no model_index.json (a model from component files): FLUX.2-dev, klein "
     "(distilled) or klein base", 0, 0},
    {"rng", K_STR, OFF(rng), 0, 0, "torch2|torch1", "torch2|torch1",
     "whose CPU generator --seed follows for FLUX.2's bf16 noise: torch2 (default; torch 2.x, what pip install torch "
     "gives) or torch1 (torch 1.13, and tpgen before --rng existed: the old image of a seed); FLUX.3's f32 noise is the same in both",
     0, 0},
    {"preview_every", K_INT, OFF(preview_every), 1, 10000, NULL, "K",
     "write a preview after steps K, 2K, ...: the model's prediction of the clean image (x0 = x - sigma*v) "
     "decoded with the VAE, a PNG at --preview's path (4 steps with K = 2: after steps 2 and 4; the last one is the "
     "image)", 0, 0},
    {"preview", K_STR, OFF(preview), 0, 0, NULL, "PATTERN",
     "where --preview-every writes: a pattern with {step} and the --output placeholders ({index}, {seed}, ...), "
     "e.g. previews/{index:04}-{step:03}.png", 0, 0},
    {"cache", K_STR, OFF(cache), 0, 0, NULL, "SPEC",
     "block caching (cache-dit's DBCache/TaylorSeer, docs/cache.md): off (default), a preset (fast, balanced), or "
     "key=value pairs fn, bn, warmup, threshold, threshold_single, max_cached, max_continuous, taylorseer (e.g. "
     "fn=1,bn=0,warmup=8,threshold=0.08); in a run spec also a mapping of those keys", 0, 0},
    {"save_step_latents", K_BOOL, OFF(save_step_latents), 0, 0, NULL, NULL,
     "with --save-latents: also store the latents after every step (tensor 'step_latents' [steps, N, C]; checks)", 0, 0},
    {"initial_latents", K_STR, OFF(initial_latents), 0, 0, NULL, "FILE[:TENSOR]",
     "start denoising from this tensor [1, C, H/16, W/16] of a safetensors file (default tensor 'initial_latents', as "
     "diffusers' prepare_latents draws it) instead of seeded noise; several jobs: one tensor each, named with a "
     "placeholder, e.g. FILE:initial_latents_{index}", 0, 0},
};
#define N_KEYS ((int)(sizeof k_keys / sizeof k_keys[0]))

void runspec_init(run_spec *s) {
    memset(s, 0, sizeof *s);
    s->guidance = -1;
    s->watchdog = -1;
}

static void free_list(char **l, int n) {
    for (int i = 0; i < n; i++) free(l[i]);
    free(l);
}

static void free_prompt_images(run_spec *s) {
    if (s->prompt_images)
        for (int i = 0; i < s->n_prompts; i++) free_list(s->prompt_images[i], s->n_prompt_images[i]);
    free(s->prompt_images);
    free(s->n_prompt_images);
    s->prompt_images = NULL;
    s->n_prompt_images = NULL;
}

void runspec_free(run_spec *s) {
    char **strs[] = {&s->model, &s->transformer, &s->text_encoder, &s->vae, &s->family, &s->prompt_embeds, &s->negative_prompt_embeds, &s->negative_prompt, &s->output, &s->rng, &s->initial_latents, &s->cache, &s->precision, &s->quantize,
                     &s->backend, &s->save_latents, &s->json_metrics, &s->prompts_file, &s->spec_path, &s->preview};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) free(*strs[i]);
    free_prompt_images(s);
    free_list(s->prompts, s->n_prompts);
    free_list(s->images, s->n_images);
    free(s->seeds);
    lora_specs_free(s->loras, s->n_loras);
    memset(s, 0, sizeof *s);
}

static const key_def *find_key(const char *name, int from_flag) {
    for (int i = 0; i < N_KEYS; i++) {
        if (from_flag ? k_keys[i].spec_only : k_keys[i].flag_only) continue;
        if (!strcmp(k_keys[i].name, name)) return &k_keys[i];
    }
    return NULL;
}

/* ---- scalar values ---- */

static int parse_int(const char *v, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) return -1;
    *out = x;
    return 0;
}

static int parse_u64(const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    if (!isdigit((unsigned char)v[0])) return -1;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end) return -1;
    *out = x;
    return 0;
}

static int parse_bool(const char *v, int *out) {
    static const char *t[] = {"true", "yes", "on", "1"}, *f[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, t[i])) return *out = 1, 0;
        if (!strcasecmp(v, f[i])) return *out = 0, 0;
    }
    return -1;
}

static void set_prompts(run_spec *s, char **list, int n) {
    free_prompt_images(s);
    free_list(s->prompts, s->n_prompts);
    s->prompts = list, s->n_prompts = n;
}

static int add_image(run_spec *s, const char *v, const char *where) {
    if (!*v) return tp_error("%s: the file name is empty", where);
    if (s->n_images >= 64) return tp_error("%s: more than 64 reference images", where);
    s->images = xrealloc(s->images, (size_t)(s->n_images + 1) * sizeof *s->images);
    s->images[s->n_images++] = xstrdup(v);
    return 0;
}

static void set_seeds(run_spec *s, uint64_t *list, int n) {
    free(s->seeds);
    s->seeds = list, s->n_seeds = n;
}

/* Apply one scalar value; `where` prefixes errors ("run.yaml:3:8: steps" or "--steps"). */
static int apply_scalar(run_spec *s, const key_def *k, const char *v, const char *where) {
    char *base = (char *)s;
    switch (k->kind) {
    case K_STR: {
        if (k->choices) {
            char buf[64];
            snprintf(buf, sizeof buf, "|%s|", k->choices);
            char pat[80];
            snprintf(pat, sizeof pat, "|%s|", v);
            if (!*v || !strstr(buf, pat))
                return tp_error("%s: expected one of %s, got '%s'", where, k->choices, v);
        }
        char **f = (char **)(base + k->off);
        free(*f);
        *f = xstrdup(v);
        return 0;
    }
    case K_INT: {
        long long x;
        if (parse_int(v, &x)) return tp_error("%s: expected an integer, got '%s'", where, v);
        if (x < k->min || x > k->max)
            return tp_error("%s: %lld is out of range (%.0f to %.0f)", where, x, k->min, k->max);
        if ((k->off == OFF(width) || k->off == OFF(height)) && x % 16)
            return tp_error("%s: %lld is not a multiple of 16 (try %lld)", where, x, (x + 8) / 16 * 16);
        *(int *)(base + k->off) = (int)x;
        return 0;
    }
    case K_FLOAT: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x)) return tp_error("%s: expected a number, got '%s'", where, v);
        if (x < k->min || x > k->max)
            return tp_error("%s: %g is out of range (%g to %g)", where, x, k->min, k->max);
        *(double *)(base + k->off) = x;
        return 0;
    }
    case K_BOOL: {
        int b;
        if (parse_bool(v, &b)) return tp_error("%s: expected true or false, got '%s'", where, v);
        *(int *)(base + k->off) = b;
        return 0;
    }
    case K_PROMPT: {
        if (strlen(v) > RUNSPEC_MAX_PROMPT_BYTES)
            return tp_error("%s: the prompt is %zu bytes, more than the limit of %d", where, strlen(v),
                            RUNSPEC_MAX_PROMPT_BYTES);
        char **l = xmalloc(sizeof *l);
        l[0] = xstrdup(v);
        set_prompts(s, l, 1);
        return 0;
    }
    case K_IMAGE:
        return add_image(s, v, where);
    case K_SEED: {
        uint64_t x;
        if (parse_u64(v, &x))
            return tp_error("%s: expected a seed from 0 to 18446744073709551615, got '%s'", where, v);
        uint64_t *l = xmalloc(sizeof *l);
        l[0] = x;
        set_seeds(s, l, 1);
        return 0;
    }
    case K_LORA: {
        if (!s->loras_from_flags) {   /* flags override the spec's list */
            lora_specs_free(s->loras, s->n_loras);
            s->n_loras = 0;
            s->loras_from_flags = 1;
        }
        if (s->n_loras == LORA_MAX_ADAPTERS) return tp_error("%s: at most %d adapters", where, LORA_MAX_ADAPTERS);
        if (lora_spec_parse(v, &s->loras[s->n_loras])) return tp_error_context("%s", where);
        s->n_loras++;
        return 0;
    }
    default:
        return tp_error("%s: expects a list, not a single value", where);
    }
}

/* ---- YAML ---- */

typedef struct yctx {
    yaml_document_t *doc;
    const char *file;
    char where[512];
} yctx;

static const char *at(yctx *c, const yaml_node_t *n, const char *key) {
    snprintf(c->where, sizeof c->where, "%s:%zu:%zu: %s", c->file, n->start_mark.line + 1,
             n->start_mark.column + 1, key);
    return c->where;
}

static int is_null_scalar(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null");
}

static const char *node_kind(const yaml_node_t *n) {
    return n->type == YAML_SEQUENCE_NODE ? "a list" : n->type == YAML_MAPPING_NODE ? "a mapping" : "a value";
}

static int y_scalar(yctx *c, run_spec *s, const key_def *k, const yaml_node_t *n) {
    const char *where = at(c, n, k->name);
    if (n->type != YAML_SCALAR_NODE)
        return tp_error("%s: expected a single value, got %s", where, node_kind(n));
    if (is_null_scalar(n)) return tp_error("%s: has no value", where);
    const char *v = (const char *)n->data.scalar.value;
    int quoted = n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
    if (quoted && k->kind != K_STR && k->kind != K_PROMPT)
        return tp_error("%s: expected %s, got the string \"%s\" (remove the quotes)", where,
                        k->kind == K_BOOL ? "true or false" : "a number", v);
    return apply_scalar(s, k, v, where);
}

/* a list of file names (images:) into *list / *n; `key` names it in errors */
static int y_file_list(yctx *c, const yaml_node_t *n, const char *key, char ***list, int *cnt_out) {
    if (n->type != YAML_SEQUENCE_NODE) return tp_error("%s: expected a list of image files", at(c, n, key));
    int cnt = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (cnt == 0) return tp_error("%s: the list is empty", at(c, n, key));
    if (cnt > 64) return tp_error("%s: more than 64 reference images", at(c, n, key));
    char **l = xcalloc((size_t)cnt, sizeof *l);
    for (int i = 0; i < cnt; i++) {
        yaml_node_t *it = yaml_document_get_node(c->doc, n->data.sequence.items.start[i]);
        if (it->type != YAML_SCALAR_NODE || is_null_scalar(it) || !*(const char *)it->data.scalar.value) {
            free_list(l, i);
            return tp_error("%s: item %d must be a file name", at(c, it, key), i + 1);
        }
        l[i] = xstrdup((const char *)it->data.scalar.value);
    }
    *list = l;
    *cnt_out = cnt;
    return 0;
}

/* cache: a mapping {fn: 1, threshold: 0.08, ...} -> "fn=1,threshold=0.08"
 * (the keys and values are checked by bc_spec_parse, at setup) */
static int y_cache(yctx *c, run_spec *s, const key_def *k, const yaml_node_t *n) {
    if (n->type != YAML_MAPPING_NODE) return y_scalar(c, s, k, n);
    char *txt = xstrdup("");
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(c->doc, p->key), *vn = yaml_document_get_node(c->doc, p->value);
        if (kn->type != YAML_SCALAR_NODE || vn->type != YAML_SCALAR_NODE || is_null_scalar(vn)) {
            free(txt);
            return tp_error("%s: each entry is key: value (e.g. threshold: 0.08)", at(c, kn, k->name));
        }
        char *t = xasprintf("%s%s%s=%s", txt, *txt ? "," : "", (const char *)kn->data.scalar.value,
                            (const char *)vn->data.scalar.value);
        free(txt);
        txt = t;
    }
    free(s->cache);
    s->cache = txt;
    return 0;
}

static int y_images(yctx *c, run_spec *s, const key_def *k, const yaml_node_t *n) {
    char **l;
    int cnt;
    if (y_file_list(c, n, k->name, &l, &cnt)) return -1;
    free_list(s->images, s->n_images);
    s->images = l, s->n_images = cnt;
    return 0;
}

/* a prompts: entry {prompt: TEXT, images: [FILE, ...]} */
static int y_prompt_entry(yctx *c, const yaml_node_t *it, int i, char **prompt, char ***imgs, int *nimg) {
    *prompt = NULL, *imgs = NULL, *nimg = 0;
    for (yaml_node_pair_t *p = it->data.mapping.pairs.start; p < it->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(c->doc, p->key), *vn = yaml_document_get_node(c->doc, p->value);
        const char *kname = kn->type == YAML_SCALAR_NODE ? (const char *)kn->data.scalar.value : "?";
        int rc = 0;
        if (!strcmp(kname, "prompt")) {
            if (*prompt) rc = tp_error("%s: the key is given twice", at(c, kn, "prompts.prompt"));
            else if (vn->type != YAML_SCALAR_NODE || is_null_scalar(vn))
                rc = tp_error("%s: item %d: 'prompt' must be a string", at(c, vn, "prompts"), i + 1);
            else *prompt = xstrdup((const char *)vn->data.scalar.value);
        } else if (!strcmp(kname, "images")) {
            if (*imgs) rc = tp_error("%s: the key is given twice", at(c, kn, "prompts.images"));
            else rc = y_file_list(c, vn, "prompts.images", imgs, nimg);
        } else {
            rc = tp_error("%s: unknown key '%s' in prompt entry %d (an entry has 'prompt' and 'images')",
                          at(c, kn, "prompts"), kname, i + 1);
        }
        if (rc) {
            free(*prompt), free_list(*imgs, *nimg);
            *prompt = NULL, *imgs = NULL, *nimg = 0;
            return -1;
        }
    }
    if (!*prompt) {
        free_list(*imgs, *nimg);
        *imgs = NULL, *nimg = 0;
        return tp_error("%s: prompt entry %d has no 'prompt'", at(c, it, "prompts"), i + 1);
    }
    return 0;
}

static int y_prompts(yctx *c, run_spec *s, const key_def *k, const yaml_node_t *n) {
    if (n->type == YAML_SCALAR_NODE) return y_scalar(c, s, &k_keys[1] /* prompt */, n);
    if (n->type != YAML_SEQUENCE_NODE) return tp_error("%s: expected a list of prompts", at(c, n, k->name));
    int cnt = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (cnt == 0) return tp_error("%s: the list is empty", at(c, n, k->name));
    /* libyaml resolves an alias to the node it names, so each use of an
     * alias here is one more copy: the total is capped, not the file size */
    size_t total = 0;
    char **l = xcalloc((size_t)cnt, sizeof *l);
    char ***pi = xcalloc((size_t)cnt, sizeof *pi);
    int *npi = xcalloc((size_t)cnt, sizeof *npi), any = 0;
    for (int i = 0; i < cnt; i++) {
        yaml_node_t *it = yaml_document_get_node(c->doc, n->data.sequence.items.start[i]);
        int bad = 0;
        if (it->type == YAML_MAPPING_NODE) {
            bad = y_prompt_entry(c, it, i, &l[i], &pi[i], &npi[i]);
            any |= pi[i] != NULL;
        } else if (it->type != YAML_SCALAR_NODE || is_null_scalar(it)) {
            bad = tp_error("%s: item %d must be a prompt string or {prompt: TEXT, images: [FILE, ...]}",
                           at(c, it, k->name), i + 1);
        } else if (it->data.scalar.length > RUNSPEC_MAX_PROMPT_BYTES) {
            bad = tp_error("%s: item %d is %zu bytes, more than the limit of %d for one prompt", at(c, it, k->name),
                           i + 1, it->data.scalar.length, RUNSPEC_MAX_PROMPT_BYTES);
        } else {
            l[i] = xstrdup((const char *)it->data.scalar.value);
        }
        if (!bad && l[i] && strlen(l[i]) > RUNSPEC_MAX_PROMPT_BYTES)
            bad = tp_error("%s: item %d is %zu bytes, more than the limit of %d for one prompt", at(c, it, k->name),
                           i + 1, strlen(l[i]), RUNSPEC_MAX_PROMPT_BYTES);
        if (!bad && l[i] && (total += strlen(l[i]) + 1) > RUNSPEC_MAX_SPEC_PROMPT_BYTES)
            bad = tp_error("%s: the prompts add up to more than %u MB at item %d (each use of an alias counts); "
                           "put them in a --prompts-file", at(c, n, k->name), RUNSPEC_MAX_SPEC_PROMPT_BYTES >> 20,
                           i + 1);
        if (bad) {
            for (int j = 0; j < i; j++) free_list(pi[j], npi[j]);
            free_list(pi[i], npi[i]);
            free(pi), free(npi);
            free_list(l, i + 1);
            return -1;
        }
    }
    set_prompts(s, l, cnt);
    if (any) {
        s->prompt_images = pi;
        s->n_prompt_images = npi;
    } else {
        free(pi), free(npi);
    }
    return 0;
}

static int y_u64(yctx *c, const yaml_node_t *n, const char *name, uint64_t *out) {
    const char *where = at(c, n, name);
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE ||
        parse_u64((const char *)n->data.scalar.value, out))
        return tp_error("%s: expected a seed (an integer from 0 to 18446744073709551615)%s%s%s", where,
                        n->type == YAML_SCALAR_NODE ? ", got '" : "",
                        n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : "",
                        n->type == YAML_SCALAR_NODE ? "'" : "");
    return 0;
}

#define MAX_SEEDS 1000000

static int y_seed_range(yctx *c, run_spec *s, const yaml_node_t *n) {
    uint64_t from = 0, count = 0;
    int have_from = 0, have_count = 0;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(c->doc, p->key), *vn = yaml_document_get_node(c->doc, p->value);
        const char *kname = kn->type == YAML_SCALAR_NODE ? (const char *)kn->data.scalar.value : "?";
        if (!strcmp(kname, "from")) {
            if (y_u64(c, vn, "seeds.from", &from)) return -1;
            have_from = 1;
        } else if (!strcmp(kname, "count")) {
            if (y_u64(c, vn, "seeds.count", &count)) return -1;
            if (count < 1 || count > MAX_SEEDS)
                return tp_error("%s: %llu is out of range (1 to %d)", at(c, vn, "seeds.count"),
                                (unsigned long long)count, MAX_SEEDS);
            have_count = 1;
        } else {
            return tp_error("%s: unknown key '%s' (a seed range has 'from' and 'count')", at(c, kn, "seeds"), kname);
        }
    }
    if (!have_from || !have_count)
        return tp_error("%s: a seed range needs both 'from' and 'count', e.g. {from: 0, count: 100}",
                        at(c, n, "seeds"));
    if (from + (count - 1) < from) return tp_error("%s: the range passes 2^64", at(c, n, "seeds"));
    uint64_t *l = xmalloc(count * sizeof *l);
    for (uint64_t i = 0; i < count; i++) l[i] = from + i;
    set_seeds(s, l, (int)count);
    return 0;
}

static int y_seeds(yctx *c, run_spec *s, const key_def *k, const yaml_node_t *n) {
    if (n->type == YAML_SCALAR_NODE) return y_scalar(c, s, &k_keys[5] /* seed */, n);
    if (n->type == YAML_MAPPING_NODE) return y_seed_range(c, s, n);
    int cnt = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (cnt == 0) return tp_error("%s: the list is empty", at(c, n, k->name));
    uint64_t *l = xmalloc((size_t)cnt * sizeof *l);
    for (int i = 0; i < cnt; i++)
        if (y_u64(c, yaml_document_get_node(c->doc, n->data.sequence.items.start[i]), "seeds", &l[i])) {
            free(l);
            return -1;
        }
    set_seeds(s, l, cnt);
    return 0;
}

/* loras: [{path: FILE, weight: W}, ...]; an item may also be "FILE[:W]" */
static int y_loras(yctx *c, run_spec *s, const key_def *k, const yaml_node_t *n) {
    if (n->type != YAML_SEQUENCE_NODE)
        return tp_error("%s: expected a list of adapters, e.g. [{path: style.safetensors, weight: 0.8}]",
                        at(c, n, k->name));
    int cnt = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (cnt > LORA_MAX_ADAPTERS) return tp_error("%s: at most %d adapters", at(c, n, k->name), LORA_MAX_ADAPTERS);
    lora_specs_free(s->loras, s->n_loras);
    s->n_loras = 0;
    for (int i = 0; i < cnt; i++) {
        yaml_node_t *it = yaml_document_get_node(c->doc, n->data.sequence.items.start[i]);
        lora_spec *ls = &s->loras[s->n_loras];
        if (it->type == YAML_SCALAR_NODE && !is_null_scalar(it)) {
            if (lora_spec_parse((const char *)it->data.scalar.value, ls)) return tp_error_context("%s", at(c, it, "loras"));
            s->n_loras++;
            continue;
        }
        if (it->type != YAML_MAPPING_NODE)
            return tp_error("%s: item %d must be {path: FILE, weight: W}", at(c, it, "loras"), i + 1);
        const char *path = NULL;
        double w = 1.0;
        for (yaml_node_pair_t *p = it->data.mapping.pairs.start; p < it->data.mapping.pairs.top; p++) {
            yaml_node_t *kn = yaml_document_get_node(c->doc, p->key), *vn = yaml_document_get_node(c->doc, p->value);
            const char *kname = kn->type == YAML_SCALAR_NODE ? (const char *)kn->data.scalar.value : "?";
            int plain = vn->type == YAML_SCALAR_NODE && !is_null_scalar(vn);
            if (!strcmp(kname, "path")) {
                if (!plain || !*(const char *)vn->data.scalar.value)
                    return tp_error("%s: expected a file name", at(c, vn, "loras.path"));
                path = (const char *)vn->data.scalar.value;
            } else if (!strcmp(kname, "weight")) {
                char *end;
                const char *v = plain ? (const char *)vn->data.scalar.value : "";
                w = strtod(v, &end);
                if (!plain || vn->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || end == v || *end || !isfinite(w))
                    return tp_error("%s: expected a number, got '%s'", at(c, vn, "loras.weight"), v);
            } else {
                return tp_error("%s: unknown key '%s' (an adapter has 'path' and 'weight')", at(c, kn, "loras"), kname);
            }
        }
        if (!path) return tp_error("%s: item %d has no 'path'", at(c, it, "loras"), i + 1);
        ls->path = xstrdup(path);
        ls->weight = w;
        s->n_loras++;
    }
    return 0;
}

static int y_document(yctx *c, run_spec *s) {
    yaml_node_t *root = yaml_document_get_root_node(c->doc);
    if (!root) return tp_error("%s: the run spec is empty", c->file);
    if (root->type != YAML_MAPPING_NODE)
        return tp_error("%s: the run spec must be a mapping of keys (e.g. 'steps: 4'), not %s", at(c, root, "top level"),
                        node_kind(root));
    int seen[N_KEYS] = {0};
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(c->doc, p->key), *vn = yaml_document_get_node(c->doc, p->value);
        if (kn->type != YAML_SCALAR_NODE) return tp_error("%s: keys must be names", at(c, kn, "key"));
        const char *name = (const char *)kn->data.scalar.value;
        const key_def *k = find_key(name, 0);
        if (!k) {
            const char *hint = strchr(name, '-') ? " (spec keys use underscores: prompt_embeds, not prompt-embeds)" : "";
            return tp_error("%s: unknown key '%s'%s; see 'tpgen generate --help' for the settings", at(c, kn, name), name, hint);
        }
        int idx = (int)(k - k_keys);
        if (seen[idx]++) return tp_error("%s: the key is given twice", at(c, kn, name));
        int rc = k->kind == K_PROMPTS  ? y_prompts(c, s, k, vn)
                 : k->kind == K_SEEDS  ? y_seeds(c, s, k, vn)
                 : k->kind == K_LORAS  ? y_loras(c, s, k, vn)
                 : k->kind == K_IMAGES ? y_images(c, s, k, vn)
                 : k->off == OFF(cache) && k->kind == K_STR ? y_cache(c, s, k, vn)
                                       : y_scalar(c, s, k, vn);
        if (rc) return -1;
    }
    if (seen[1] && seen[2]) return tp_error("%s: give either 'prompt' or 'prompts', not both", c->file);
    if (seen[5] && seen[6]) return tp_error("%s: give either 'seed' or 'seeds', not both", c->file);
    const key_def *pf = find_key("prompts_file", 0);
    if (seen[pf - k_keys] && (seen[1] || seen[2]))
        return tp_error("%s: give either 'prompts_file' or '%s', not both", c->file, seen[1] ? "prompt" : "prompts");
    return 0;
}

int runspec_load_string(run_spec *s, const char *yaml, const char *name) {
    yaml_parser_t p;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&p)) return tp_error("%s: cannot initialise the YAML parser", name);
    yaml_parser_set_input_string(&p, (const unsigned char *)yaml, strlen(yaml));
    if (!yaml_parser_load(&p, &doc)) {
        int rc = tp_error("%s:%zu:%zu: invalid YAML: %s%s%s", name, p.problem_mark.line + 1,
                          p.problem_mark.column + 1, p.problem ? p.problem : "syntax error",
                          p.context ? " " : "", p.context ? p.context : "");
        yaml_parser_delete(&p);
        return rc;
    }
    yctx c = {.doc = &doc, .file = name};
    int rc = y_document(&c, s);
    yaml_document_delete(&doc);
    yaml_parser_delete(&p);
    return rc;
}

int runspec_load_file(run_spec *s, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return tp_error("cannot read the run spec %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0, k;
    char *buf = xmalloc(cap);
    while ((k = fread(buf + n, 1, cap - n - 1, f)) > 0)
        if ((n += k) == cap - 1) buf = xrealloc(buf, cap *= 2);
    int bad = ferror(f);
    fclose(f);
    buf[n] = 0;
    if (bad || strlen(buf) != n) {
        size_t at = strlen(buf);
        free(buf);
        if (bad) return tp_error("cannot read the run spec %s: read error", path);
        return tp_error("the run spec %s has a NUL byte at byte offset %zu; a run spec is UTF-8 text", path, at);
    }
    int rc = runspec_load_string(s, buf, path);
    free(buf);
    if (!rc) {
        free(s->spec_path);
        s->spec_path = xstrdup(path);
    }
    return rc;
}

/* ---- flags ---- */

static void flag_name(const key_def *k, char *buf, size_t n) {
    snprintf(buf, n, "--%s", k->name);
    for (char *p = buf; *p; p++)
        if (*p == '_') *p = '-';
}

static const key_def *find_flag(const char *arg, const char **inline_val, size_t *len) {
    const char *eq = strchr(arg, '=');
    *len = eq ? (size_t)(eq - arg) : strlen(arg);
    *inline_val = eq ? eq + 1 : NULL;
    for (int i = 0; i < N_KEYS; i++) {
        if (k_keys[i].spec_only) continue;
        char f[64];
        flag_name(&k_keys[i], f, sizeof f);
        if (strlen(f) == *len && !strncmp(arg, f, *len)) return &k_keys[i];
    }
    return NULL;
}

void runspec_print_help(void) {
    printf("usage: mpirun -np N tpgen [generate] --model DIR (--prompt TEXT | --prompt-embeds FILE[:TENSOR]) [OPTIONS]\n\n"
           "Render images with a FLUX.2 model split across the ranks (tensor parallel).\n\noptions:\n");
    for (int i = 0; i < N_KEYS; i++) {
        const key_def *k = &k_keys[i];
        if (k->spec_only) continue;
        char f[64], left[128];
        flag_name(k, f, sizeof f);
        snprintf(left, sizeof left, "%s%s%s", f, k->arg ? " " : "", k->arg ? k->arg : "");
        printf("  %-32s %s\n", left, k->help);
    }
    printf("  %-32s %s\n", "--help", "show this help");
    printf("\nrun spec keys (YAML): every option above with '-' turned into '_' (prompt_embeds:),\n"
           "plus prompts: [TEXT, ...] (or prompts_file: FILE), seeds: [S, ...] or {from: S, count: N},\n"
           "loras: [{path: FILE, weight: W}, ...] (for --lora) and images: [FILE, ...] (the --image references; a\n"
           "prompts: entry {prompt: TEXT, images: [FILE, ...]} has its own). The batch is every\n"
           "prompt x every seed; output/save_latents placeholders: {index} {seed} {prompt_index}\n"
           "{seed_index} (with a zero-padded width: {index:04}), {prompt} (file-name-safe), {{ }}.\n");
}

int runspec_parse_args(run_spec *s, int argc, char **argv) {
    /* --help and --spec first: the spec is the base the other flags override */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            runspec_print_help();
            return 1;
        }
        if (!strncmp(argv[i], "--spec", 6) && (argv[i][6] == 0 || argv[i][6] == '=')) {
            const char *v = argv[i][6] == '=' ? argv[i] + 7 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return tp_error("--spec: expects a file name");
            if (runspec_load_file(s, v)) return -1;
        }
    }
    int flag_images = 0;   /* the first --image replaces the spec's images: */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        size_t len;
        if (a[0] != '-' || a[1] != '-')
            return tp_error("unexpected argument '%s' (options start with --; quote a prompt: --prompt \"...\")", a);
        const key_def *k = find_flag(a, &val, &len);
        if (!k) return tp_error("unknown option '%.*s'; see 'tpgen generate --help'", (int)len, a);
        char where[64];
        flag_name(k, where, sizeof where);
        if (k->kind == K_BOOL && !val) {
            *(int *)((char *)s + k->off) = 1;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) return tp_error("%s: expects a value (%s)", where, k->arg);
            val = argv[++i];
        }
        if (k->kind == K_SPEC) continue;   /* already read */
        if (k->kind == K_IMAGE && !flag_images++) {
            free_list(s->images, s->n_images);
            s->images = NULL, s->n_images = 0;
        }
        if (apply_scalar(s, k, val, where)) return -1;
    }
    return runspec_read_prompts_file(s);
}

/* ---- consistency ---- */

/* job indices are ints and every job's paths are checked up front */
#define MAX_JOBS 10000000

char *const *runspec_prompt_images(const run_spec *s, int prompt, int *n) {
    if (s->prompt_images && prompt >= 0 && prompt < s->n_prompts && s->prompt_images[prompt]) {
        *n = s->n_prompt_images[prompt];
        return s->prompt_images[prompt];
    }
    *n = s->n_images;
    return s->n_images ? s->images : NULL;
}

char *const *runspec_job_images(const run_spec *s, int job, int *n) {
    return runspec_prompt_images(s, job / (s->n_seeds ? s->n_seeds : 1), n);
}

/* --preview-every K with --preview PATTERN: each job and each step its
 * own file */
static int check_preview(const run_spec *s, int n) {
    if (!s->preview_every != !s->preview)
        return tp_error(s->preview ? "--preview %s needs --preview-every K (a preview after steps K, 2K, ...)"
                                   : "--preview-every needs --preview PATTERN, e.g. previews/{index:04}-{step:03}.png%s",
                        s->preview ? s->preview : "");
    if (!s->preview) return 0;
    char *a = runspec_preview_path(s, s->preview, 0, 1), *b = a ? runspec_preview_path(s, s->preview, 0, 2) : NULL;
    char *c = b && n > 1 ? runspec_preview_path(s, s->preview, 1, 1) : NULL;
    int rc = 0;
    if (!a || !b || (n > 1 && !c)) rc = tp_error_context("--preview");
    else if (!strcmp(a, b)) rc = tp_error("--preview %s: every step would write '%s'; put {step} in it", s->preview, a);
    else if (n > 1 && !strcmp(a, c))
        rc = tp_error("--preview %s: %d jobs would write the same previews; put {index} or {seed} in it", s->preview, n);
    free(a), free(b), free(c);
    return rc;
}

int runspec_check(const run_spec *s) {
    if (!s->model && !s->transformer)
        return tp_error("no model: give --model DIR (a FLUX.2 pipeline folder) or 'model:' in the run spec, or the "
                        "components --transformer PATH (with --text-encoder, --vae and --family)");
    if (s->negative_prompt_embeds && !s->prompt_embeds)
        return tp_error("--negative-prompt-embeds goes with --prompt-embeds (with a prompt, the negative prompt is "
                        "--negative-prompt)");
    if (s->prompt_embeds && s->n_prompts)
        return tp_error("give either a prompt (--prompt, --prompts-file, prompts:) or --prompt-embeds, not both");
    if (!s->prompt_embeds && !s->n_prompts)
        return tp_error("nothing to render: give --prompt TEXT, --prompts-file FILE (or 'prompts:' in a run spec) or "
                        "--prompt-embeds FILE");
    long long jobs = (long long)(s->prompt_embeds ? 1 : s->n_prompts) * (s->n_seeds ? s->n_seeds : 1);
    if (jobs > MAX_JOBS)
        return tp_error("%lld jobs (prompts x seeds) is more than one run takes (%d); split the batch", jobs, MAX_JOBS);
    if (s->no_decode && !s->save_latents)
        return tp_error("--no-decode without --save-latents would produce nothing; add --save-latents FILE");
    int n = runspec_n_jobs(s);
    if (check_preview(s, n)) return -1;
    const char *pats[2] = {s->output, s->save_latents};
    const char *names[2] = {"--output", "--save-latents"};
    for (int i = 0; i < 2; i++) {
        if (!pats[i]) continue;
        if (!*pats[i]) return tp_error("%s: the path is empty", names[i]);
        char *p = runspec_output_path(s, pats[i], 0);
        if (!p) return tp_error_context("%s", names[i]);
        free(p);
        if (n > 1 && !runspec_pattern_varies(pats[i]))
            return tp_error("%s: %d jobs would all write '%s'; use a pattern such as out/{index:04}-{seed}.png",
                            names[i], n, pats[i]);
        if (n > 1 && runspec_check_unique_paths(s, pats[i], names[i], n)) return -1;
    }
    return 0;
}

