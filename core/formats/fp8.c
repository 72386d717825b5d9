/* fp8 checkpoints: classification of the ComfyUI scaled/mixed formats and
 * of raw fp8 files, their validation, and the per-rank scale slices (see
 * fp8.h). Everything here reads headers and small tensors only. */
#include "fp8.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include "name_index.h"
#include <jansson.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { AUX_NONE = 0, AUX_SCALE, AUX_INPUT_SCALE, AUX_COMFY_QUANT, AUX_MARKER } aux_kind;

static const struct { const char *suffix; aux_kind kind; } k_suffixes[] = {
    {".weight_scale", AUX_SCALE},      {".scale_weight", AUX_SCALE},         {".input_scale", AUX_INPUT_SCALE},
    {".scale_input", AUX_INPUT_SCALE}, {".comfy_quant", AUX_COMFY_QUANT},
};

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

/* kind of tensor `name`; *mlen = length of its module prefix */
static aux_kind classify(const char *name, size_t *mlen) {
    if (!strcmp(name, "scaled_fp8") || ends_with(name, ".scaled_fp8")) return *mlen = 0, AUX_MARKER;
    for (size_t i = 0; i < sizeof k_suffixes / sizeof k_suffixes[0]; i++)
        if (ends_with(name, k_suffixes[i].suffix)) {
            *mlen = strlen(name) - strlen(k_suffixes[i].suffix);
            return k_suffixes[i].kind;
        }
    return AUX_NONE;
}

/* ---- hints: module -> format / flags ---- */

typedef struct hint {
    char *module;
    char *format;           /* NULL when the hint has none */
    int flags;
    int from_meta, from_tensor;
} hint;

typedef struct hints {
    hint *h;
    int n, cap;             /* grown geometrically: realloc by one was quadratic too */
    name_index by_module;   /* module -> index in h (a file may hint 10^5 layers) */
} hints;

/* the hint of module[0:len), or NULL */
static hint *hint_find(hints *H, const char *module, size_t len) {
    int i = name_index_get(&H->by_module, module, len);
    return i < 0 ? NULL : &H->h[i];
}

static hint *hint_get(hints *H, const char *module, size_t len) {
    hint *found = hint_find(H, module, len);
    if (found) return found;
    name_index_put(&H->by_module, module, len, H->n);
    if (H->n == H->cap) {
        H->cap = H->cap ? 2 * H->cap : 16;
        H->h = xrealloc(H->h, (size_t)H->cap * sizeof *H->h);
    }
    hint *h = &H->h[H->n++];
    memset(h, 0, sizeof *h);
    h->module = xasprintf("%.*s", (int)len, module);
    return h;
}

static void hints_free(hints *H) {
    for (int i = 0; i < H->n; i++) free(H->h[i].module), free(H->h[i].format);
    free(H->h);
    name_index_free(&H->by_module);
}

/* One layer's hint object: {"format": "...", "full_precision_matrix_mult": bool, ...}. */
static int hint_parse(hint *h, json_t *o, const char *where) {
    if (!json_is_object(o)) return tp_error("%s: the quantisation hint of layer '%s' is not a JSON object", where, h->module);
    json_t *f = json_object_get(o, "format");
    if (f && !json_is_string(f))
        return tp_error("%s: layer '%s': \"format\" must be a string", where, h->module);
    if (f) {
        if (h->format && strcmp(h->format, json_string_value(f)))
            return tp_error("%s: layer '%s' is hinted as both '%s' and '%s'", where, h->module, h->format,
                            json_string_value(f));
        free(h->format);
        h->format = xstrdup(json_string_value(f));
    }
    if (json_is_true(json_object_get(o, "full_precision_matrix_mult"))) h->flags |= TQ_FULL_PRECISION_MM;
    return 0;
}

static int meta_hints(const checkpoint *c, hints *H) {
    for (int fi = 0; fi < c->n_files; fi++) {
        const char *txt = st_meta(c->files[fi], "_quantization_metadata");
        if (!txt) continue;
        json_error_t e;
        json_t *root = json_loads(txt, 0, &e);
        const char *path = c->files[fi]->path;
        if (!root) return tp_error("%s: __metadata__ _quantization_metadata is not valid JSON (%s, column %d)", path,
                                   e.text, e.column);
        json_t *layers = json_object_get(root, "layers");
        int rc = 0;
        if (!json_is_object(layers))
            rc = tp_error("%s: _quantization_metadata has no \"layers\" object", path);
        const char *k;
        json_t *v;
        /* a file read behind the diffusion-model prefix (checkpoint.h) may name its layers with it; with
         * tensors outside the prefix (a whole ComfyUI checkpoint), a layer without it is another part's */
        size_t pl = c->prefix ? strlen(c->prefix) : 0;
        json_object_foreach(layers, k, v) {
            if (rc) break;
            int behind = pl && !strncmp(k, c->prefix, pl);
            if (pl && !behind && c->n_other) continue;
            const char *m = behind ? k + pl : k;
            hint *h = hint_get(H, m, strlen(m));
            h->from_meta = 1;
            rc = hint_parse(h, v, path);
        }
        json_decref(root);
        if (rc) return -1;
    }
    return 0;
}

static int read_small(const checkpoint *c, int k, void **out) {
    const st_tensor_info *t = c->infos[k];
    size_t n = (size_t)(t->end - t->begin);
    *out = xmalloc(n + 1);
    if (st_read_raw(c->files[c->file_of[k]], t, *out)) return free(*out), *out = NULL, -1;
    ((char *)*out)[n] = 0;
    return 0;
}

static int comfy_quant_hint(const checkpoint *c, int k, size_t mlen, hints *H) {
    const st_tensor_info *t = c->infos[k];
    const char *path = c->files[c->file_of[k]]->path;
    if (t->dtype != DT_U8 && t->dtype != DT_I8)
        return tp_error("%s: tensor '%s' is %s; a .comfy_quant tensor holds JSON text as U8", path, t->name,
                        dtype_name(t->dtype));
    if (t->end - t->begin > (1u << 20)) return tp_error("%s: tensor '%s' is too large for a .comfy_quant hint", path, t->name);
    void *txt;
    if (read_small(c, k, &txt)) return -1;
    json_error_t e;
    json_t *o = json_loadb(txt, (size_t)(t->end - t->begin), 0, &e);
    free(txt);
    if (!o) return tp_error("%s: tensor '%s' is not valid JSON (%s)", path, t->name, e.text);
    hint *h = hint_get(H, t->name, mlen);
    h->from_tensor = 1;
    int rc = hint_parse(h, o, path);
    json_decref(o);
    return rc;
}

/* "float8_e4m3fn" -> DT_F8_E4M3; -1 for a format tpgen cannot use */
static int hint_dtype(const char *fmt) {
    if (!strcmp(fmt, "float8_e4m3fn") || !strcmp(fmt, "float8_e4m3")) return DT_F8_E4M3;
    if (!strcmp(fmt, "float8_e5m2")) return DT_F8_E5M2;
    return -1;
}

/* ---- scales ---- */

static int read_scalar_like(const checkpoint *c, int k, float **vals, int64_t *n) {
    const st_tensor_info *t = c->infos[k];
    const char *path = c->files[c->file_of[k]]->path;
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
        return tp_error("%s: scale tensor '%s' is %s; fp8 scales must be F32 (or BF16/F16)", path, t->name,
                        dtype_name(t->dtype));
    *n = st_numel(t);
    if (st_read_f32(c->files[c->file_of[k]], t->name, vals, NULL)) return -1;
    for (int64_t i = 0; i < *n; i++) {
        if (isfinite((*vals)[i])) continue;
        tp_error("%s: scale tensor '%s' has a non-finite value (%g at element %lld); the checkpoint is corrupt "
                 "(re-download or re-quantise it)", path, t->name, (double)(*vals)[i], (long long)i);
        free(*vals);
        *vals = NULL;
        return -1;
    }
    return 0;
}

/* A weight scale multiplies every decoded code: it must be positive (0
 * silently zeroes the layer, a negative one flips its sign) and small
 * enough that the largest code times it stays finite in f32 (and so in
 * bf16, which has f32's range). */
static int check_weight_scales(const checkpoint *c, int k, const st_tensor_info *w, const float *v, int64_t n) {
    double lim = (double)FLT_MAX / fp8_max(w->dtype);
    for (int64_t i = 0; i < n; i++) {
        if (v[i] > 0 && (double)v[i] <= lim) continue;
        return tp_error("%s: scale tensor '%s' of fp8 weight '%s' is %g at element %lld; a weight scale must be "
                        "above 0 and at most %.3g (larger ones overflow: %s codes reach %g); the checkpoint is "
                        "corrupt (re-download or re-quantise it)", c->files[c->file_of[k]]->path, c->infos[k]->name, w->name,
                        (double)v[i], (long long)i, lim, dtype_name(w->dtype), (double)fp8_max(w->dtype));
    }
    return 0;
}

static void shape_str(const st_tensor_info *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && k < n; d++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* the scale's layout against its weight: per tensor or per output row */
static int scale_layout(const checkpoint *c, int ks, const st_tensor_info *w, fp8_layer *L) {
    const st_tensor_info *s = c->infos[ks];
    int64_t rows = w->ndim >= 2 ? w->shape[0] : 1;
    int scalar = s->ndim == 0 || (s->ndim == 1 && s->shape[0] == 1) || (s->ndim == 2 && s->shape[0] == 1 && s->shape[1] == 1);
    int per_row = w->ndim >= 2 && ((s->ndim == 1 && s->shape[0] == rows) ||
                                   (s->ndim == 2 && s->shape[0] == rows && s->shape[1] == 1));
    if (!scalar && !per_row) {
        char ss[96], ws[96];
        shape_str(s, ss, sizeof ss), shape_str(w, ws, sizeof ws);
        return tp_error("%s: scale tensor '%s' has shape %s, an unknown layout for weight '%s' of shape %s (expected "
                        "[] or [1] per tensor, [%lld] or [%lld, 1] per output channel)",
                        c->files[c->file_of[ks]]->path, s->name, ss, w->name, ws, (long long)rows, (long long)rows);
    }
    L->per_row = per_row && !scalar;
    L->n_scale = L->per_row ? rows : 1;
    return 0;
}

/* ---- the scan ---- */

typedef struct scan {
    checkpoint *c;
    aux_kind *kind;
    size_t *mlen;
    hints H;
    fp8_info *info;
    fp8_layer **layer;          /* per original index */
} scan;

/* index of `<module><suffix>` in c (original order), -1 when absent */
static int find_index(const checkpoint *c, const char *module, size_t mlen, const char *suffix) {
    char name[600];
    if (mlen + strlen(suffix) >= sizeof name) return -1;
    memcpy(name, module, mlen);
    strcpy(name + mlen, suffix);
    int lo = 0, hi = c->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, r = strcmp(name, c->infos[mid]->name);
        if (!r) return mid;
        if (r < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

static const char *path_of(const checkpoint *c, int k) { return c->files[c->file_of[k]]->path; }

/* the weight of module m: its fp8 layer (or an error for a stray scale) */
static int scan_weight(scan *S, int kw) {
    checkpoint *c = S->c;
    const st_tensor_info *w = c->infos[kw];
    size_t mlen = strlen(w->name) - strlen(".weight");
    int ks1 = find_index(c, w->name, mlen, ".weight_scale"), ks2 = find_index(c, w->name, mlen, ".scale_weight");
    int ki1 = find_index(c, w->name, mlen, ".input_scale"), ki2 = find_index(c, w->name, mlen, ".scale_input");
    hint *h = hint_find(&S->H, w->name, mlen);
    int fp8 = dtype_is_fp8(w->dtype);
    if (ks1 >= 0 && ks2 >= 0)
        return tp_error("%s: weight '%s' has both '%s' and '%s'; a checkpoint may hold one scale per weight",
                        path_of(c, kw), w->name, c->infos[ks1]->name, c->infos[ks2]->name);
    int ks = ks1 >= 0 ? ks1 : ks2, ki = ki1 >= 0 ? ki1 : ki2;
    if (!fp8 && (ks >= 0 || ki >= 0))
        return tp_error("%s: tensor '%s' is a scale but weight '%s' is %s, not fp8 (F8_E4M3/F8_E5M2); the checkpoint "
                        "mixes up its layers", path_of(c, ks >= 0 ? ks : ki), c->infos[ks >= 0 ? ks : ki]->name, w->name,
                        dtype_name(w->dtype));
    if (h && h->format) {
        int hd = hint_dtype(h->format);
        if (hd < 0)
            return tp_error("%s: layer '%s' is hinted as format '%s' (%s), which tpgen does not support (fp8 formats: "
                            "float8_e4m3fn, float8_e5m2)", path_of(c, kw), h->module, h->format,
                            h->from_tensor ? "comfy_quant" : "_quantization_metadata");
        if ((int)w->dtype != hd)
            return tp_error("%s: layer '%s' is hinted as '%s' but its weight '%s' is stored %s; the hints do not "
                            "match the tensors", path_of(c, kw), h->module, h->format, w->name, dtype_name(w->dtype));
    }
    if (!fp8) return 0;
    fp8_layer *L = xcalloc(1, sizeof *L);
    S->layer[kw] = L;
    S->info->n_fp8++;
    L->n_scale = 1;
    if (h) {
        L->flags |= h->flags;
        L->hint = h->from_meta && h->from_tensor ? "comfy_quant + _quantization_metadata"
                  : h->from_tensor ? "comfy_quant" : "_quantization_metadata";
    }
    if (S->info->marker == 2) L->flags |= TQ_FULL_PRECISION_MM;
    if (ks < 0 && (h || S->info->marker))
        return tp_error("%s: fp8 weight '%s' has no scale ('%.*s.weight_scale' or '.scale_weight') although %s marks "
                        "the file as scaled fp8; without it every value would be off by the scale (a white image): "
                        "the file is truncated or was converted wrongly", path_of(c, kw), w->name, (int)mlen, w->name,
                        h ? (h->from_tensor ? "its comfy_quant hint" : "_quantization_metadata") : "the scaled_fp8 marker");
    if (ks >= 0) {
        if (scale_layout(c, ks, w, L)) return -1;
        int64_t n;
        if (read_scalar_like(c, ks, &L->values, &n)) return -1;
        if (check_weight_scales(c, ks, w, L->values, n)) return -1;
        L->scale = c->infos[ks];
        S->info->n_scaled++;
    } else {
        L->values = xmalloc(sizeof(float));
        L->values[0] = 1.0f;
    }
    if (ki >= 0) {
        float *v;
        int64_t n;
        if (read_scalar_like(c, ki, &v, &n)) return -1;
        if (n != 1) {
            free(v);
            return tp_error("%s: input scale '%s' has %lld values; an activation scale is one number", path_of(c, ki),
                            c->infos[ki]->name, (long long)n);
        }
        L->input_scale = v[0];
        free(v);
    }
    return 0;
}

static void layer_free(fp8_layer *L) {
    if (L) free(L->values), free(L);
}

void fp8_info_free(fp8_info *f) {
    if (!f) return;
    free(f->layer);   /* the layers are freed by the scan or by checkpoint_close below */
    free(f);
}

static int do_scan(scan *S) {
    checkpoint *c = S->c;
    if (meta_hints(c, &S->H)) return -1;
    for (int k = 0; k < c->n; k++) {
        S->kind[k] = classify(c->infos[k]->name, &S->mlen[k]);
        if (S->kind[k] != AUX_NONE) S->info->n_aux++, S->info->aux_bytes += c->infos[k]->end - c->infos[k]->begin;
        if (S->kind[k] == AUX_MARKER) S->info->marker = st_numel(c->infos[k]) == 2 ? 2 : 1;
        if (S->kind[k] == AUX_COMFY_QUANT && comfy_quant_hint(c, k, S->mlen[k], &S->H)) return -1;
    }
    /* every scale / hint belongs to a weight */
    for (int k = 0; k < c->n; k++) {
        if (S->kind[k] == AUX_NONE || S->kind[k] == AUX_MARKER) continue;
        if (find_index(c, c->infos[k]->name, S->mlen[k], ".weight") < 0)
            return tp_error("%s: tensor '%s' belongs to no weight ('%.*s.weight' is missing)", path_of(c, k),
                            c->infos[k]->name, (int)S->mlen[k], c->infos[k]->name);
    }
    for (int i = 0; i < S->H.n; i++)
        if (find_index(c, S->H.h[i].module, strlen(S->H.h[i].module), ".weight") < 0)
            return tp_error("%s: _quantization_metadata names layer '%s', which has no weight in the checkpoint",
                            c->dir, S->H.h[i].module);
    for (int k = 0; k < c->n; k++) {
        if (S->kind[k] != AUX_NONE) continue;
        if (ends_with(c->infos[k]->name, ".weight")) {
            if (scan_weight(S, k)) return -1;
        } else if (dtype_is_fp8(c->infos[k]->dtype)) {
            fp8_layer *L = xcalloc(1, sizeof *L);
            L->n_scale = 1;
            L->values = xmalloc(sizeof(float));
            L->values[0] = 1.0f;
            S->layer[k] = L;
            S->info->n_fp8++;
        }
    }
    return 0;
}

int fp8_scan(checkpoint *c) {
    c->fp8 = NULL;
    scan S = {.c = c};
    S.kind = xcalloc((size_t)(c->n ? c->n : 1), sizeof *S.kind);
    S.mlen = xcalloc((size_t)(c->n ? c->n : 1), sizeof *S.mlen);
    S.layer = xcalloc((size_t)(c->n ? c->n : 1), sizeof *S.layer);
    S.info = xcalloc(1, sizeof *S.info);
    int rc = do_scan(&S);
    if (!rc && (S.info->n_fp8 || S.info->n_aux)) {
        /* take the aux tensors out, keeping the sorted order */
        int m = 0;
        S.info->layer = xcalloc((size_t)(c->n ? c->n : 1), sizeof *S.info->layer);
        for (int k = 0; k < c->n; k++) {
            if (S.kind[k] != AUX_NONE) continue;
            c->infos[m] = c->infos[k];
            c->file_of[m] = c->file_of[k];
            S.info->layer[m++] = S.layer[k];
        }
        c->n = m;
        c->fp8 = S.info;
        S.info = NULL;
    } else {
        for (int k = 0; k < c->n; k++) layer_free(S.layer[k]);
    }
    if (S.info) free(S.info);
    hints_free(&S.H);
    free(S.kind), free(S.mlen), free(S.layer);
    return rc ? tp_error_context("reading the fp8 layout of %s", c->dir) : 0;
}

void fp8_checkpoint_free(checkpoint *c) {
    if (!c->fp8) return;
    for (int k = 0; k < c->n; k++) layer_free(c->fp8->layer[k]);
    fp8_info_free(c->fp8);
    c->fp8 = NULL;
}

const fp8_layer *fp8_layer_of(const checkpoint *c, int k) {
    return c->fp8 && k >= 0 && k < c->n ? c->fp8->layer[k] : NULL;
}

/* ---- per-rank scales ---- */

static int splits_rows(const shard_info *si) {
    return si->style == STYLE_COLWISE || si->style == STYLE_PACKED_COLWISE;
}

uint64_t fp8_scale_bytes(const checkpoint *c, int k, const shard_info *si, int tp) {
    const fp8_layer *L = fp8_layer_of(c, k);
    if (!L || !L->scale) return 0;
    if (!L->per_row) return sizeof(float);
    return (uint64_t)(splits_rows(si) ? si->local_rows : si->global_rows) * sizeof(float);
}

int fp8_attach_scale(const checkpoint *c, int k, const shard_info *si, int tp, int rank, tensor *t, uint64_t *bytes) {
    *bytes = 0;
    const fp8_layer *L = fp8_layer_of(c, k);
    if (!L) return 0;
    t->quant_flags = L->flags;
    if (!L->scale) return 0;   /* raw fp8: s = 1 */
    int64_t n = L->per_row ? t->rows : 1;
    float *host = xmalloc((size_t)n * sizeof(float));
    if (!L->per_row) {
        host[0] = L->values[0];
    } else if (splits_rows(si)) {
        /* the rows of each piece: contiguous runs of whole rows */
        shard_piece pc[PLAN_MAX_PIECES];
        int np = plan_shard_pieces(si, tp, rank, pc);
        int64_t cols = si->global_cols;
        for (int i = 0; i < np; i++)
            memcpy(host + pc[i].dst_off / cols, L->values + pc[i].src_off / cols,
                   (size_t)(pc[i].width / cols) * sizeof(float));
    } else {
        memcpy(host, L->values, (size_t)n * sizeof(float));   /* rowwise / replicated: every row */
    }
    backend *be = t->be;
    t->scale = be_alloc(be, (size_t)n * sizeof(float));
    int rc = t->scale ? be_upload(be, t->scale, host, (size_t)n * sizeof(float)) : -1;
    t->scale_per_row = L->per_row;
    free(host);
    if (rc) return tp_error_context("scales of '%s'", c->infos[k]->name);
    if (be_sync(be)) return -1;
    *bytes = (uint64_t)n * sizeof(float);
    return 0;
}

/* ---- --quantize fp8 ---- */

int fp8_quantize_eligible(const st_tensor_info *t, const shard_info *si) {
    const char *n = t->name;
    return si->rule >= 0 && t->ndim == 2 && ends_with(n, ".weight") && !strstr(n, "embed") &&
           (t->dtype == DT_BF16 || t->dtype == DT_F16 || t->dtype == DT_F32);
}

int fp8_quantize_tensor(tensor *t, const char *name) {
    if (!tensor_contiguous(t)) return tp_error("quantising '%s': not a contiguous tensor", name);
    backend *be = t->be;
    int64_t R = t->rows, C = t->cols;
    int64_t chunk = C ? (int64_t)((16u << 20) / ((size_t)C * 4)) : R;
    if (chunk < 1) chunk = 1;
    uint8_t *codes = be_alloc(be, R * C > 0 ? (size_t)(R * C) : 1);
    float *scale = be_alloc(be, (size_t)(R ? R : 1) * sizeof(float));
    if (!codes || !scale) {
        if (codes) be_free(be, codes);
        if (scale) be_free(be, scale);
        return tp_error_context("quantising '%s' to fp8", name);
    }
    float *f = xmalloc((size_t)((chunk < R ? chunk : R) * C + 1) * sizeof(float));
    uint8_t *q = xmalloc((size_t)((chunk < R ? chunk : R) * C + 1));
    float *s = xmalloc((size_t)(chunk + 1) * sizeof(float));
    int rc = 0;
    for (int64_t r0 = 0; r0 < R && !rc; r0 += chunk) {
        int64_t nr = R - r0 < chunk ? R - r0 : chunk;
        tensor v = tensor_rows(t, r0, nr);
        if ((rc = tensor_download_f32(&v, f))) break;
        for (int64_t r = 0; r < nr; r++) {
            float amax = 0;
            for (int64_t j = 0; j < C; j++) amax = fmaxf(amax, fabsf(f[r * C + j]));
            if (!isfinite(amax)) {
                rc = tp_error("quantising '%s': row %lld has a non-finite value", name, (long long)(r0 + r));
                break;
            }
            float sc = amax > 0 ? amax / 448.0f : 1.0f;
            s[r] = sc;
            for (int64_t j = 0; j < C; j++) {
                float x = f[r * C + j] / sc;
                x = x > 448.0f ? 448.0f : x < -448.0f ? -448.0f : x;
                q[r * C + j] = f32_to_fp8(DT_F8_E4M3, x);
            }
        }
        if (!rc) rc = be_upload(be, codes + r0 * C, q, (size_t)(nr * C));
        if (!rc) rc = be_upload(be, scale + r0, s, (size_t)nr * sizeof(float));
        if (!rc) rc = be_sync(be);
    }
    free(f), free(q), free(s);
    if (rc) {
        be_free(be, codes), be_free(be, scale);
        return tp_error_context("quantising '%s' to fp8", name);
    }
    if (t->owner && t->data) be_free(be, t->data);
    if (t->owner && t->scale) be_free(be, t->scale);
    t->data = codes;
    t->scale = scale;
    t->scale_per_row = 1;
    t->dtype = DT_F8_E4M3;
    t->ld = C;
    t->owner = 1;
    return 0;
}
