/* `tpgen inspect --model DIR [--component transformer] [--tp N] [--json] [--summary]`:
 * the TP plan of one component without reading any weight byte: per
 * tensor its style and global/local shape, the validation result, and
 * per rank the bytes it holds (replicated + sharded, in the checkpoint's
 * dtype) and the largest host staging buffer it needs. One process
 * computes every rank of the requested tp. */
#include "commands.h"
#include "kernels/err.h"
#include "core/formats/fp8.h"
#include "core/formats/gguf.h"
#include "core/formats/weights.h"
#include "core/formats/lora.h"
#include "core/models/flux2/flux2.h"
#include "core/models/model_plan.h"
#include "core/tp_pipe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct inspect_args {
    const char *model, *component;
    const char *transformer, *text_encoder, *vae, *family;   /* single components (--components) */
    int tp, json, summary, scan, components;
    int sp, cfg_parallel;        /* the mesh around TP (docs/parallel.md): what each world rank of a group holds */
    lora_spec loras[LORA_MAX_ADAPTERS];
    int n_loras;
} inspect_args;

static int usage(FILE *f) {
    fprintf(f, "usage: tpgen inspect --model DIR [--component NAME] [--tp N] [--json] [--summary] [--scan-weights]\n"
               "                     [--lora FILE[:W]]... [--sp S] [--cfg-parallel]\n"
               "       tpgen inspect --model FILE.gguf [--summary]\n"
               "       tpgen inspect --components [--model DIR] [--transformer P] [--text-encoder P] [--vae P]\n"
               "                     [--family dev|klein|klein-base] [--json]\n\n"
               "Shows how NAME (default transformer) of the pipeline folder DIR is split over N ranks\n"
               "(default 1): each tensor's style and global/local shape, whether the split is valid,\n"
               "and per rank the weight bytes and the largest staging buffer (on a Flux2KleinKVPipeline\n"
               "folder also its KV cache of references per token and rank). Reads headers only.\n"
               "A .gguf file is listed: its metadata keys and tensors (type, shape, bytes); --summary: keys only.\n"
               "  --json     one JSON object: tp, valid, error, ranks[{rank, weight_bytes, ...}], tensors\n"
               "  --summary  leave out the per-tensor table (and the LoRA module list)\n"
               "  --lora F   also show what the LoRA adapter F does to the transformer: format, rank, scale,\n"
               "             the modules it targets and the bytes each rank reads from it (repeatable)\n"
               "  --components  what each part of the model is and where it came from: path, source\n"
               "             (pipeline folder, a file or folder given by flag, the family's default), naming\n"
               "             (diffusers / BFL / GGUF, the text encoder's prefix), dtypes and quant types, config\n"
               "  --transformer P, --text-encoder P, --vae P, --family F  the single components, as generate\n"
               "             takes them (--transformer P also with --component transformer)\n"
               "  --scan-weights  also read every float tensor and name each one holding NaN/Inf\n"
               "             (exit 1 if any; reads the whole component)\n");
    return 2;
}

static int parse(int argc, char **argv, inspect_args *a) {
    *a = (inspect_args){.component = "transformer", .tp = 1};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) return usage(stdout), 1;
        else if (!strcmp(k, "--json")) a->json = 1;
        else if (!strcmp(k, "--summary")) a->summary = 1;
        else if (!strcmp(k, "--scan-weights")) a->scan = 1;
        else if (!strcmp(k, "--components")) a->components = 1;
        else if (v && !strcmp(k, "--transformer")) a->transformer = v, i++;
        else if (v && !strcmp(k, "--text-encoder")) a->text_encoder = v, i++;
        else if (v && !strcmp(k, "--vae")) a->vae = v, i++;
        else if (v && !strcmp(k, "--family")) a->family = v, i++;
        else if (v && !strcmp(k, "--model")) a->model = v, i++;
        else if (v && !strcmp(k, "--component")) a->component = v, i++;
        else if (v && !strcmp(k, "--lora")) {
            if (a->n_loras == LORA_MAX_ADAPTERS) return tp_error("inspect: at most %d --lora flags", LORA_MAX_ADAPTERS);
            if (lora_spec_parse(v, &a->loras[a->n_loras])) return -1;
            a->n_loras++, i++;
        }
        else if (!strcmp(k, "--cfg-parallel")) a->cfg_parallel = 1;
        else if (v && (!strcmp(k, "--tp") || !strcmp(k, "--sp"))) {
            char *end;
            long t = strtol(v, &end, 10);
            if (*end || t < 1 || t > 4096) return tp_error("%s must be a positive integer (got '%s')", k, v);
            if (!strcmp(k, "--tp")) a->tp = (int)t;
            else a->sp = (int)t;
            i++;
        } else return tp_error("inspect: unknown or incomplete option '%s' (see tpgen inspect --help)", k);
    }
    if (a->components) return 0;
    if (!a->model && a->transformer && !strcmp(a->component, "transformer")) return 0;
    if (!a->model) return tp_error("inspect needs --model DIR (a diffusers pipeline folder), or --components");
    if (a->n_loras && strcmp(a->component, "transformer"))
        return tp_error("inspect: --lora applies to the transformer (adapters for %s are not supported)", a->component);
    return 0;
}

/* Local shape in the file's dimensions: the split dim divided by tp. */
static void local_shape(const st_tensor_info *t, const shard_info *si, int tp, int64_t *out) {
    for (int d = 0; d < t->ndim; d++) out[d] = t->shape[d];
    if (si->style == STYLE_REPLICATED) return;
    int dim = si->style == STYLE_COLWISE || si->style == STYLE_PACKED_COLWISE ? 0 : 1;
    out[dim] /= tp;
}

static json_t *shape_json(const int64_t *s, int n) {
    json_t *a = json_array();
    for (int d = 0; d < n; d++) json_array_append_new(a, json_integer(s[d]));
    return a;
}

static void shape_str(char *buf, size_t n, const int64_t *s, int nd) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < nd && k < n; d++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)s[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* one line on the fp8 layout ("" when there is none) */
static const char *fp8_summary(const checkpoint *c) {
    static char buf[256];
    if (!c->fp8) return "";
    snprintf(buf, sizeof buf, "fp8: %d fp8 weights (%d with scales), %d scale/hint/marker tensors (%llu bytes) not "
             "counted as weights%s\n", c->fp8->n_fp8, c->fp8->n_scaled, c->fp8->n_aux,
             (unsigned long long)c->fp8->aux_bytes, c->fp8->marker == 2 ? ", scaled_fp8 marker: full-precision matmul"
                                                   : c->fp8->marker ? ", scaled_fp8 marker" : "");
    return buf;
}

/* a ComfyUI / stable-diffusion.cpp diffusion model (checkpoint.h CHECKPOINT_DM_PREFIX) */
static const char *prefix_summary(const checkpoint *c) {
    static char buf[256];
    if (!c->prefix) return "";
    snprintf(buf, sizeof buf, "names behind '%s' (a ComfyUI / stable-diffusion.cpp diffusion model), read without "
             "it; %d tensor(s) outside it ignored\n", c->prefix, c->n_other);
    return buf;
}

static json_t *tensor_table(const checkpoint *c, const component_plan *cp, int tp, int print) {
    const plan *p = &cp->p;
    json_t *arr = json_array();
    if (print) printf("%-58s %-26s %-18s %s\n", "tensor", "style", "global", "local");
    for (int k = 0; k < c->n; k++) {
        shard_info si;
        /* a tensor that this tp cannot split gets no local shape */
        const st_tensor_info *t = c->infos[k];
        int ok = plan_shard(p, st_plan_tensor(t), tp, &si) == 0 || (plan_shard(p, st_plan_tensor(t), 1, &si), 0);
        int64_t loc[ST_MAX_DIMS];
        local_shape(t, &si, tp, loc);
        const char *blocks = si.rule >= 0 ? p->rules[si.rule].blocks : NULL;
        int loaded = !cp->want || cp->want(t->name, cp->want_ctx);
        char style[64], g[64], l[64];
        snprintf(style, sizeof style, "%s%s%s%s", loaded ? shard_style_name(si.style) : "not loaded",
                 blocks ? "(" : "", blocks ? blocks : "", blocks ? ")" : "");
        shape_str(g, sizeof g, t->shape, t->ndim);
        if (!loaded) snprintf(l, sizeof l, "-");
        else if (ok) shape_str(l, sizeof l, loc, t->ndim);
        else snprintf(l, sizeof l, "(not divisible)");
        /* fp8 weights: their scale (per tensor, or per output channel: this
         * rank's rows for a row split) and the hints */
        const fp8_layer *q = fp8_layer_of(c, k);
        char qs[160] = "";
        json_t *qj = NULL;
        if (q) {
            int64_t nloc = q->per_row && ok ? (int64_t)(fp8_scale_bytes(c, k, &si, tp) / sizeof(float)) : q->n_scale;
            const char *kind = !q->scale ? "none" : q->per_row ? "per_channel" : "per_tensor";
            snprintf(qs, sizeof qs, " scale %s%s%s%s", !q->scale ? "none (raw fp8, 1)" : q->per_row ? "per-channel" : "per-tensor",
                     q->per_row ? "" : "", q->input_scale ? " +input_scale" : "",
                     q->flags & TQ_FULL_PRECISION_MM ? " full-precision-mm" : "");
            if (q->per_row) snprintf(qs + strlen(qs), sizeof qs - strlen(qs), " [%lld local]", (long long)nloc);
            qj = json_pack("{s:s,s:s?,s:I,s:I,s:f,s:b,s:s?}", "scale", kind, "scale_tensor", q->scale ? q->scale->name : NULL,
                           "scales", (json_int_t)q->n_scale, "local_scales", (json_int_t)nloc, "input_scale",
                           (double)q->input_scale, "full_precision_matrix_mult", (q->flags & TQ_FULL_PRECISION_MM) != 0,
                           "hint", q->hint);
        }
        /* a GGUF block tensor shows its ggml type (Q4_K), held as stored */
        const char *dtn = t->dtype == DT_GGML ? quant_type_name(t->qtype) : dtype_name(t->dtype);
        if (print) printf("%-58s %-26s %-18s %s %s%s\n", t->name, style, g, l, dtn, qs);
        json_t *row = json_pack("{s:s,s:s,s:s?,s:s,s:b,s:o,s:o}", "name", t->name, "style", shard_style_name(si.style),
                                "blocks", blocks, "dtype", dtn, "loaded", loaded, "global",
                                shape_json(t->shape, t->ndim), "local", ok && loaded ? shape_json(loc, t->ndim) : json_null());
        if (qj) json_object_set_new(row, "fp8", qj);
        json_array_append_new(arr, row);
    }
    return arr;
}

static json_t *rank_table(const checkpoint *c, const component_plan *cp, int tp, int print) {
    json_t *arr = json_array();
    if (print) printf("\n%4s %15s %15s %15s %10s %14s\n", "rank", "replicated", "sharded", "weight bytes", "GB",
                      "staging MB");
    for (int r = 0; r < tp; r++) {
        load_estimate e;
        if (weights_estimate_want(c, &cp->p, tp, r, cp->want, cp->want_ctx, &e)) break;
        uint64_t total = e.bytes_replicated + e.bytes_sharded;
        if (print)
            printf("%4d %15llu %15llu %15llu %10.2f %14.1f\n", r, (unsigned long long)e.bytes_replicated,
                   (unsigned long long)e.bytes_sharded, (unsigned long long)total, total / 1e9, e.max_staging / 1e6);
        json_array_append_new(arr, json_pack("{s:i,s:I,s:I,s:I,s:I,s:I}", "rank", r, "weight_bytes", (json_int_t)total,
                                             "replicated_bytes", (json_int_t)e.bytes_replicated, "sharded_bytes",
                                             (json_int_t)e.bytes_sharded, "max_local_tensor_bytes",
                                             (json_int_t)e.max_local_tensor, "max_staging_bytes",
                                             (json_int_t)e.max_staging));
    }
    return arr;
}

static int open_component(const inspect_args *a, model_dir **m, json_t **cfg, checkpoint **c) {
    if (a->transformer && !strcmp(a->component, "transformer")) {   /* --transformer FILE|DIR */
        if (!(*cfg = flux2_transformer_config(a->transformer, NULL))) return -1;
        return checkpoint_open(a->transformer, c);
    }
    if (model_dir_open(a->model, m)) return -1;
    if (!model_dir_has(*m, a->component))
        return tp_error("%s has no '%s' folder (is --model the pipeline folder?)", a->model, a->component);
    char *dir = model_dir_path(*m, a->component);
    /* the transformer of a BFL single-file checkpoint may have no config.json */
    *cfg = strcmp(a->component, "transformer") ? model_dir_config(*m, a->component) : flux2_transformer_config(dir, NULL);
    if (!*cfg) return free(dir), -1;
    int rc = checkpoint_open(dir, c);
    free(dir);
    return rc;
}

/* A Flux2KleinKVPipeline folder's transformer: the bytes each rank's KV
 * cache of references takes per reference token in bf16 (K and V of every
 * block, this rank's heads: D / (tp x sp)); 0 for other folders */
static int64_t kv_bytes_per_token(const inspect_args *a, const model_dir *m, const json_t *cfg) {
    const char *cls = m && m->index ? json_string_value(json_object_get(m->index, "_class_name")) : NULL;
    if (!cls || strcmp(cls, "Flux2KleinKVPipeline") || strcmp(a->component, "transformer")) return 0;
    json_int_t heads = json_integer_value(json_object_get(cfg, "num_attention_heads")),
               hd = json_integer_value(json_object_get(cfg, "attention_head_dim")),
               blocks = json_integer_value(json_object_get(cfg, "num_layers")) +
                        json_integer_value(json_object_get(cfg, "num_single_layers"));
    int64_t split = (int64_t)a->tp * (a->sp > 1 ? a->sp : 1);
    return heads > 0 && hd > 0 && blocks > 0 ? 2 * blocks * heads * hd / split * 2 : 0;
}

/* --components: each part of the model, where it came from (core/flux2_components.c) */
static int inspect_components(const inspect_args *a) {
    flux2_components c = {.model = a->model, .transformer = a->transformer, .text_encoder = a->text_encoder,
                          .vae = a->vae, .family = a->family};
    tp_pipe_info info;
    char warning[1024];
    if (tp_pipe_probe_components(&c, &info, warning, sizeof warning)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    if (warning[0]) fprintf(stderr, "tpgen: warning: %s\n", warning);
    json_t *parts = flux2_components_describe(&info);
    int bad = 0;
    if (a->json) {
        char *s = json_dumps(parts, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
    }
    size_t i;
    json_t *p;
    json_array_foreach(parts, i, p) {
        const char *err = json_string_value(json_object_get(p, "error"));
        if (err) bad = 1, fprintf(stderr, "tpgen: error: %s: %s\n", json_string_value(json_object_get(p, "component")), err);
        if (a->json) continue;
        printf("%s:\n", json_string_value(json_object_get(p, "component")));
        const char *k;
        json_t *v;
        json_object_foreach(p, k, v) {
            if (!strcmp(k, "component") || !strcmp(k, "error")) continue;
            if (json_is_object(v)) {   /* dtypes: NAME xN */
                printf("  %-12s", k);
                const char *dk;
                json_t *dv;
                json_object_foreach(v, dk, dv) printf(" %s x%lld", dk, (long long)json_integer_value(dv));
                printf("\n");
            } else if (json_is_integer(v)) printf("  %-12s %lld\n", k, (long long)json_integer_value(v));
            else if (json_is_string(v)) printf("  %-12s %s\n", k, json_string_value(v));
        }
    }
    json_decref(parts);
    tp_pipe_info_free(&info);
    return bad;
}

/* inspect is one process; started under mpirun/srun anyway, every process
 * computes the same answer and only the first one prints it. */
static void quiet_unless_first_process(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
    for (int i = 0; i < 4; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) != 0) {
            (void)!freopen("/dev/null", "w", stdout);
            (void)!freopen("/dev/null", "w", stderr);
            return;
        }
    }
}

int cmd_inspect(int argc, char **argv) {
    quiet_unless_first_process();
    inspect_args a;
    int rc = parse(argc, argv, &a);
    if (rc > 0) return 0;
    if (rc < 0) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 2;
    }
    if (a.components) return inspect_components(&a);
    if (a.model && gguf_is_gguf(a.model)) return inspect_gguf(a.model, a.summary);
    model_dir *m = NULL;
    json_t *cfg = NULL, *tensors = NULL, *ranks = NULL;
    checkpoint *c = NULL;
    component_plan cp = {0};
    int opened = open_component(&a, &m, &cfg, &c) == 0;
    int planned = opened && plan_for_component(a.component, cfg, c, a.tp, &cp) >= 0;
    int valid = planned && checkpoint_validate_plan(c, &cp.p, a.tp) == 0;
    /* --scan-weights: the shapes may be valid and the values not */
    int n_bad = valid && a.scan ? checkpoint_scan_finite(c, 1) : 0;
    if (n_bad) valid = 0;
    if (n_bad > 0 && !a.json) fprintf(stderr, "tpgen: %d tensor(s) of %s hold NaN/Inf\n", n_bad, a.component);
    if (valid && a.scan && !a.json) printf("scan: all %d tensors of %s are finite\n", c->n, a.component);
    char *err = valid ? NULL : xstrdup(tp_error_msg());
    const plan *p = &cp.p;
    int64_t kv_per_token = opened ? kv_bytes_per_token(&a, m, cfg) : 0;
    if (opened && !a.json)
        printf("model %s, component %s, plan %s, tp %d, %d tensors in %d file(s)\n%s%s\n",
               a.transformer && !strcmp(a.component, "transformer") ? a.transformer : a.model, a.component,
               p->rules ? p->model : "none (all replicated)", a.tp, c->n, c->n_files, prefix_summary(c), fp8_summary(c));
    if (planned) tensors = tensor_table(c, &cp, a.tp, !a.json && !a.summary);
    if (valid || n_bad) ranks = rank_table(c, &cp, a.tp, !a.json);
    json_t *loras = NULL;
    if (valid && a.n_loras && !(loras = inspect_loras(a.loras, a.n_loras, c, p, a.tp, !a.json, !a.summary))) {
        valid = 0;
        err = xstrdup(tp_error_msg());
    }
    if (a.json) {
        json_t *o = json_pack("{s:s?,s:s,s:i,s:b,s:s?,s:o,s:o}", "model", a.model ? a.model : a.transformer, "component", a.component, "tp", a.tp,
                              "valid", valid, "error", err, "ranks", ranks ? ranks : json_array(), "tensors",
                              tensors ? tensors : json_array());
        json_object_set_new(o, "plan", p->rules ? json_string(p->model) : json_null());
        json_object_set_new(o, "sp", json_integer(a.sp > 1 ? a.sp : 1));
        json_object_set_new(o, "cfg_parallel", json_boolean(a.cfg_parallel));
        json_object_set_new(o, "group_ranks", json_integer((json_int_t)a.tp * (a.sp > 1 ? a.sp : 1) * (a.cfg_parallel ? 2 : 1)));
        if (kv_per_token) json_object_set_new(o, "kv_cache_bytes_per_reference_token", json_integer(kv_per_token));
        if (a.n_loras) json_object_set_new(o, "loras", loras ? loras : json_array());
        if (opened && c->prefix)
            json_object_set_new(o, "name_prefix", json_pack("{s:s,s:i}", "prefix", c->prefix, "tensors_outside_ignored",
                                                            c->n_other));
        if (opened && c->fp8)
            json_object_set_new(o, "fp8", json_pack("{s:i,s:i,s:i,s:i}", "fp8_weights", c->fp8->n_fp8, "scaled",
                                                    c->fp8->n_scaled, "non_weight_tensors", c->fp8->n_aux, "marker",
                                                    c->fp8->marker));
        char *s = json_dumps(o, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        json_decref(tensors), json_decref(ranks), json_decref(loras);
        if (valid) printf("\nvalid: tp %d splits %s evenly\n", a.tp, a.component);
        int rep = (a.sp > 1 ? a.sp : 1) * (a.cfg_parallel ? 2 : 1);
        if (valid && rep > 1)   /* SP and CFG parallelism replicate the TP shards (docs/parallel.md) */
            printf("mesh: %s--sp %d x --tp %d: a job group of %d ranks; group rank g holds the row of TP rank g %% %d "
                   "above, each shard on %d ranks\n", a.cfg_parallel ? "--cfg-parallel (2) x " : "",
                   a.sp > 1 ? a.sp : 1, a.tp, rep * a.tp, a.tp, rep);
        if (valid && kv_per_token)   /* KV-cached references: what the cache adds per rank (docs/editing.md) */
            printf("KV-cached references: each rank's cache holds %lld bytes per reference token in bf16 (K and V "
                   "of every block, D / (tp x sp) of each); a 1024x1024 reference (4096 tokens): %.1f MB\n",
                   (long long)kv_per_token, 4096.0 * (double)kv_per_token / 1e6);
    }
    if (!valid) fprintf(stderr, "tpgen: error: %s\n", err);
    free(err);
    lora_specs_free(a.loras, a.n_loras);
    component_plan_free(&cp);
    checkpoint_close(c);
    json_decref(cfg);
    model_dir_close(m);
    return valid ? 0 : 1;
}
