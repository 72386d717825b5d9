/* Model folders (diffusers layout) and component checkpoints: one
 * *.safetensors file, or shards listed by a *.safetensors.index.json. */
#include "checkpoint.h"
#include "kernels/err.h"
#include "fp8.h"
#include "gguf_shard.h"
#include "kernels/quant.h"
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int path_is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int path_is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static json_t *load_json(const char *path, const char *what) {
    json_error_t e;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!j) {
        if (access(path, F_OK)) tp_error("%s missing: %s (is this a diffusers model folder?)", what, path);
        else tp_error("%s: malformed JSON at line %d, column %d: %s", path, e.line, e.column, e.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        tp_error("%s: expected a JSON object", path);
        json_decref(j);
        return NULL;
    }
    return j;
}

int model_dir_open(const char *root, model_dir **out) {
    *out = NULL;
    if (!path_is_dir(root))
        return tp_error("model folder %s does not exist or is not a folder (pass --model DIR, the folder with "
                        "model_index.json and transformer/)", root);
    model_dir *m = xcalloc(1, sizeof *m);
    m->root = xstrdup(root);
    char *idx = xasprintf("%s/model_index.json", root);
    if (access(idx, F_OK) == 0 && !(m->index = load_json(idx, "model_index.json"))) {
        free(idx);
        model_dir_close(m);
        return -1;
    }
    free(idx);
    *out = m;
    return 0;
}

void model_dir_close(model_dir *m) {
    if (!m) return;
    json_decref(m->index);
    free(m->root);
    free(m);
}

char *model_dir_path(const model_dir *m, const char *component) { return xasprintf("%s/%s", m->root, component); }

int model_dir_has(const model_dir *m, const char *component) {
    char *p = model_dir_path(m, component);
    int r = path_is_dir(p);
    free(p);
    return r;
}

json_t *model_dir_config(const model_dir *m, const char *component) {
    char *p = xasprintf("%s/%s/config.json", m->root, component);
    json_t *j = load_json(p, "component config");
    free(p);
    return j;
}

int model_dir_flag(const model_dir *m, const char *key, int def) {
    json_t *v = m->index ? json_object_get(m->index, key) : NULL;
    return json_is_boolean(v) ? json_is_true(v) : def;
}

/* ---- checkpoints ---- */

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* The file of dir ending in `suffix`: the only one, or when there are
 * several the one named after a known component (diffusers / transformers
 * names). *name NULL when there is none. */
static int pick_file(const char *dir, const char *suffix, char **name) {
    static const char *preferred[] = {"diffusion_pytorch_model", "model"};
    *name = NULL;
    DIR *d = opendir(dir);
    if (!d) return tp_error("cannot open checkpoint folder %s: %s", dir, strerror(errno));
    int count = 0;
    char *first = NULL, *pref = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!ends_with(e->d_name, suffix)) continue;
        if (!strcmp(suffix, ".safetensors") && strstr(e->d_name, ".tmp.")) continue;
        count++;
        if (!first) first = xstrdup(e->d_name);
        for (int i = 0; i < 2; i++) {
            char *want = xasprintf("%s%s", preferred[i], suffix);
            if (!strcmp(want, e->d_name) && (!pref || i == 0)) free(pref), pref = xstrdup(e->d_name);
            free(want);
        }
    }
    closedir(d);
    if (count > 1 && !pref) {
        free(first);
        return tp_error("%s holds %d *%s files and none is named diffusion_pytorch_model%s or model%s; "
                        "keep only one checkpoint in the folder", dir, count, suffix, suffix, suffix);
    }
    *name = pref ? pref : first;
    if (pref) free(first);
    return 0;
}

/* qsort_r (glibc): the checkpoint is the comparison's context, not a global */
static int cmp_idx(const void *a, const void *b, void *ctx) {
    const checkpoint *c = ctx;
    return strcmp(c->infos[*(const int *)a]->name, c->infos[*(const int *)b]->name);
}

/* Sort infos (and file_of alongside) by name. */
static void sort_tensors(checkpoint *c) {
    int *ord = xmalloc((size_t)c->n * sizeof *ord);
    for (int i = 0; i < c->n; i++) ord[i] = i;
    qsort_r(ord, (size_t)c->n, sizeof *ord, cmp_idx, c);
    const st_tensor_info **infos = xmalloc((size_t)c->n * sizeof *infos);
    int *fo = xmalloc((size_t)c->n * sizeof *fo);
    for (int i = 0; i < c->n; i++) infos[i] = c->infos[ord[i]], fo[i] = c->file_of[ord[i]];
    free(c->infos), free(c->file_of), free(ord);
    c->infos = infos, c->file_of = fo;
}

static int add_file(checkpoint *c, const char *name) {
    if (!name) {   /* c->dir is the file itself */
        st_file *f;
        if (ends_with(c->dir, ".gguf") ? gguf_st_open(c->dir, &f) : st_open(c->dir, &f)) return -1;
        c->files = xrealloc(c->files, sizeof *c->files);
        c->files[0] = f;
        return c->n_files++;
    }
    for (int i = 0; i < c->n_files; i++)
        if (!strcmp(c->files[i]->path + strlen(c->dir) + 1, name)) return i;
    if (strchr(name, '/'))
        return tp_error("%s: shard name '%s' must be a file name inside the folder", c->dir, name);
    char *p = xasprintf("%s/%s", c->dir, name);
    st_file *f;
    int rc = ends_with(name, ".gguf") ? gguf_st_open(p, &f) : st_open(p, &f);
    free(p);
    if (rc) return -1;
    c->files = xrealloc(c->files, (size_t)(c->n_files + 1) * sizeof *c->files);
    c->files[c->n_files] = f;
    return c->n_files++;
}

static int open_indexed(checkpoint *c, const char *index_name) {
    char *ip = xasprintf("%s/%s", c->dir, index_name);
    json_t *j = load_json(ip, "checkpoint index");
    int rc = 0;
    json_t *wm = j ? json_object_get(j, "weight_map") : NULL;
    if (!j) rc = -1;
    else if (!json_is_object(wm)) rc = tp_error("%s: no \"weight_map\" object", ip);
    if (!rc) {
        c->infos = xcalloc(json_object_size(wm), sizeof *c->infos);
        c->file_of = xcalloc(json_object_size(wm), sizeof *c->file_of);
    }
    const char *k;
    json_t *v;
    if (!rc) json_object_foreach(wm, k, v) {
        if (!json_is_string(v)) { rc = tp_error("%s: weight_map entry '%s' is not a file name", ip, k); break; }
        int fi = add_file(c, json_string_value(v));
        if (fi < 0) { rc = tp_error_context("%s names shard %s for tensor '%s'", ip, json_string_value(v), k); break; }
        const st_tensor_info *t = st_find(c->files[fi], k);
        if (!t) {
            rc = tp_error("tensor '%s' is listed in %s but missing from %s (incomplete or mismatched download)", k,
                          ip, c->files[fi]->path);
            break;
        }
        c->infos[c->n] = t;
        c->file_of[c->n++] = fi;
    }
    json_decref(j);
    free(ip);
    return rc;
}

static int open_single(checkpoint *c, const char *name) {
    int fi = add_file(c, name);
    if (fi < 0) return -1;
    st_file *f = c->files[fi];
    c->infos = xcalloc((size_t)f->n, sizeof *c->infos);
    c->file_of = xcalloc((size_t)f->n, sizeof *c->file_of);
    for (int i = 0; i < f->n; i++) c->infos[i] = &f->tensors[i], c->file_of[i] = fi;
    c->n = f->n;
    return 0;
}

/* A single checkpoint file: c->dir is the file's own path (messages name it). */
static int open_file_path(checkpoint *c) {
    if (!ends_with(c->dir, ".safetensors") && !ends_with(c->dir, ".gguf") && !ends_with(c->dir, ".sft"))
        return tp_error("%s: a checkpoint file must be a .safetensors (or .sft) or a .gguf file", c->dir);
    return open_single(c, NULL);
}

static int strip_dm_prefix(checkpoint *c);

int checkpoint_open(const char *dir, checkpoint **out) {
    *out = NULL;
    int is_file = path_is_file(dir);
    if (!is_file && !path_is_dir(dir)) return tp_error("checkpoint %s does not exist (a folder or a .safetensors/.gguf file)", dir);
    checkpoint *c = xcalloc(1, sizeof *c);
    c->dir = xstrdup(dir);
    c->is_file = is_file;
    char *idx = NULL, *single = NULL;
    int rc = is_file ? open_file_path(c) : pick_file(dir, ".safetensors.index.json", &idx);
    if (is_file) {
    } else if (!rc && idx) rc = open_indexed(c, idx);
    else if (!rc) {
        rc = pick_file(dir, ".safetensors", &single);
        /* no safetensors: a GGUF file (core/formats/gguf_shard.h) */
        if (!rc && !single) rc = pick_file(dir, ".gguf", &single);
        if (!rc && !single)
            rc = tp_error("%s has no *.safetensors file, no *.safetensors.index.json and no *.gguf file", dir);
        if (!rc) rc = open_single(c, single);
    }
    free(idx), free(single);
    if (rc) { checkpoint_close(c); return -1; }
    sort_tensors(c);
    /* a ComfyUI / stable-diffusion.cpp diffusion model: read behind its prefix; then the fp8 scales and hints,
     * which are not weights: fp8_scan takes them out of the list */
    if (strip_dm_prefix(c) || fp8_scan(c)) { checkpoint_close(c); return -1; }
    *out = c;
    return 0;
}

void checkpoint_close(checkpoint *c) {
    if (!c) return;
    fp8_checkpoint_free(c);
    for (int i = 0; i < c->n_files; i++) st_close(c->files[i]);
    free(c->files), free(c->infos), free(c->file_of), free(c->dir);
    free(c);
}

const st_tensor_info *checkpoint_find(const checkpoint *c, const char *name, const st_file **file) {
    int lo = 0, hi = c->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, r = strcmp(name, c->infos[mid]->name);
        if (!r) {
            if (file) *file = c->files[c->file_of[mid]];
            return c->infos[mid];
        }
        if (r < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

/* ---- renaming ---- */

static int cmp_file_idx(const void *a, const void *b, void *ctx) {
    const st_file *f = ctx;
    return strcmp(f->tensors[*(const int *)a].name, f->tensors[*(const int *)b].name);
}

int checkpoint_rename(checkpoint *c, checkpoint_rename_fn fn, void *ctx) {
    if (c->fp8) return tp_error("%s: an fp8 checkpoint cannot be renamed", c->dir);
    char buf[512];
    for (int fi = 0; fi < c->n_files; fi++) {
        st_file *f = c->files[fi];
        for (int i = 0; i < f->n; i++) {
            int r = fn(f->tensors[i].name, buf, sizeof buf, ctx);
            if (r < 0) return -1;
            if (r > 0) free(f->tensors[i].name), f->tensors[i].name = xstrdup(buf);
        }
    }
    /* each file's tensors stay sorted by name (st_find); the infos follow them */
    for (int fi = 0; fi < c->n_files; fi++) {
        st_file *f = c->files[fi];
        int *ord = xmalloc((size_t)(f->n ? f->n : 1) * sizeof *ord), *inv = xmalloc((size_t)(f->n ? f->n : 1) * sizeof *inv);
        for (int i = 0; i < f->n; i++) ord[i] = i;
        qsort_r(ord, (size_t)f->n, sizeof *ord, cmp_file_idx, f);
        st_tensor_info *ts = xcalloc((size_t)(f->n ? f->n : 1), sizeof *ts);
        for (int i = 0; i < f->n; i++) ts[i] = f->tensors[ord[i]], inv[ord[i]] = i;
        for (int k = 0; k < c->n; k++)
            if (c->file_of[k] == fi) c->infos[k] = &ts[inv[c->infos[k] - f->tensors]];
        free(f->tensors);
        f->tensors = ts;
        free(ord), free(inv);
    }
    sort_tensors(c);
    for (int k = 1; k < c->n; k++)
        if (!strcmp(c->infos[k - 1]->name, c->infos[k]->name))
            return tp_error("%s: two tensors are both named '%s' after renaming; the checkpoint holds a tensor twice "
                            "under different names", c->dir, c->infos[k]->name);
    return 0;
}

/* ---- the diffusion-model prefix (checkpoint.h CHECKPOINT_DM_PREFIX) ---- */

enum { DM_LEN = sizeof CHECKPOINT_DM_PREFIX - 1 };

static int dm_strip(const char *name, char *out, size_t cap, void *ctx) {
    if (strncmp(name, CHECKPOINT_DM_PREFIX, DM_LEN)) return 0;
    if (!name[DM_LEN]) return tp_error("%s: a tensor is named just '%s'", ((const checkpoint *)ctx)->dir, name);
    snprintf(out, cap, "%s", name + DM_LEN);
    return 1;
}

/* Before fp8_scan (checkpoint_rename refuses fp8 checkpoints: their scales are paired by name). The tensors
 * outside the prefix leave the list first, so only the model's own names are renamed and checked for
 * duplicates; one of them whose name equals a stripped one is refused (a lookup in its file would be
 * ambiguous). */
static int strip_dm_prefix(checkpoint *c) {
    int n_dm = 0;
    for (int k = 0; k < c->n; k++) n_dm += !strncmp(c->infos[k]->name, CHECKPOINT_DM_PREFIX, DM_LEN);
    if (!n_dm) return 0;
    char **other = xcalloc((size_t)(c->n - n_dm + 1), sizeof *other);
    int n = 0, n_other = 0;
    for (int k = 0; k < c->n; k++) {
        if (strncmp(c->infos[k]->name, CHECKPOINT_DM_PREFIX, DM_LEN)) {
            other[n_other++] = xstrdup(c->infos[k]->name);
            continue;
        }
        c->infos[n] = c->infos[k], c->file_of[n] = c->file_of[k], n++;
    }
    c->n = n;
    int rc = checkpoint_rename(c, dm_strip, c);
    for (int i = 0; i < n_other && !rc; i++)
        if (checkpoint_find(c, other[i], NULL))
            rc = tp_error("%s: holds tensor '%s' both under that name and behind '%s'; the file is not one model: "
                          "extract the diffusion model", c->dir, other[i], CHECKPOINT_DM_PREFIX);
    for (int i = 0; i < n_other; i++) free(other[i]);
    free(other);
    if (rc) return -1;
    c->prefix = CHECKPOINT_DM_PREFIX, c->n_other = n_other;
    return 0;
}

/* ---- finiteness of the weights (tpgen inspect --scan-weights, tpgen check): float
 * tensors and fp8 codes ---- */

int checkpoint_scan_finite(const checkpoint *c, int verbose) {
    const size_t chunk = 1u << 22;   /* elements per read: bounded memory for any tensor size */
    float *f = xmalloc(chunk * sizeof *f);
    void *raw = xmalloc(chunk * 8);
    int n_bad = 0;
    for (int k = 0; k < c->n; k++) {
        const st_tensor_info *t = c->infos[k];
        int fp8 = dtype_is_fp8(t->dtype);
        if (t->dtype == DT_GGML) {   /* GGUF blocks: decoded (an f16 scale may be Inf/NaN) */
            int64_t first, count;
            if (gguf_scan_finite(c->files[c->file_of[k]], t, &first, &count)) { free(f), free(raw); return -1; }
            if (count) {
                const char *path = c->files[c->file_of[k]]->path;
                if (verbose || n_bad == 0)
                    fprintf(stderr, "tpgen: non-finite weight: %s: tensor '%s' (%s blocks): %lld NaN/Inf values, the "
                            "first at element %lld\n", path, t->name, quant_type_name(t->qtype), (long long)count,
                            (long long)first);
                if (n_bad++ == 0)
                    tp_error("%s: tensor '%s' holds %lld NaN/Inf values (the first at element %lld); the checkpoint is "
                             "corrupt: download it again", path, t->name, (long long)count, (long long)first);
            }
            continue;
        }
        if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16 && t->dtype != DT_F64 && !fp8) continue;
        const st_file *file = c->files[c->file_of[k]];
        size_t es = dtype_size(t->dtype), n = (size_t)(t->end - t->begin) / es;
        int64_t first = -1, count = 0;
        for (size_t o = 0; o < n; o += chunk) {
            size_t m = n - o < chunk ? n - o : chunk;
            if (st_read_range(file, t->begin + o * es, raw, m * es) || (!fp8 && convert_to_f32(f, raw, t->dtype, m))) {
                free(f), free(raw);
                return -1;
            }
            if (fp8) {   /* decode the codes: E4M3 NaN is S.1111.111, E5M2 has Inf and NaN as IEEE */
                const float *tab = fp8_table(t->dtype);
                for (size_t i = 0; i < m; i++) f[i] = tab[((const uint8_t *)raw)[i]];
            }
            for (int64_t i = first_nonfinite_f32(f, m); i >= 0 && (size_t)i < m; i++) {
                if ((((const uint32_t *)(const void *)f)[i] & 0x7f800000u) != 0x7f800000u) continue;
                if (first < 0) first = (int64_t)o + i;
                count++;
            }
        }
        if (count) {
            if (verbose || n_bad == 0)
                fprintf(stderr, "tpgen: non-finite weight: %s: tensor '%s' (%s): %lld NaN/Inf values, the first at "
                        "element %lld\n", file->path, t->name, dtype_name(t->dtype), (long long)count,
                        (long long)first);
            if (n_bad++ == 0)
                tp_error("%s: tensor '%s' holds %lld NaN/Inf values (the first at element %lld); the checkpoint is "
                         "corrupt: download it again", file->path, t->name, (long long)count, (long long)first);
        }
    }
    free(f), free(raw);
    return n_bad;
}

int checkpoint_validate_plan(const checkpoint *c, const plan *p, int tp) {
    plan_tensor *ts = xcalloc((size_t)(c->n ? c->n : 1), sizeof *ts);
    for (int k = 0; k < c->n; k++) ts[k] = st_plan_tensor(c->infos[k]);
    int rc = plan_validate(p, ts, c->n, c->dir, tp);
    free(ts);
    return rc;
}

int checkpoint_is_bfl(const checkpoint *c) { return c && checkpoint_find(c, "img_in.weight", NULL) != NULL; }
