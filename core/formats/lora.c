/* LoRA adapters: formats, names and validation (core/formats/lora.h). Everything
 * here reads headers and alpha scalars only; the merge itself is in
 * core/formats/lora_merge.c. The name rules follow diffusers' FLUX.2 converters
 * (lora_state_dict, _convert_non_diffusers_flux2_lora_to_diffusers,
 * _convert_kohya_flux2_lora_to_diffusers), with two differences documented
 * in docs/lora.md: diffusion_model.*.lora_down/up files are read as
 * ai-toolkit files (diffusers takes them for kohya and drops every key), and
 * the BFL final layer's (shift, scale) halves are swapped onto norm_out. FLUX.3
 * checkpoints (diffusers names) take a module as its same-named tensor, and
 * ai-toolkit BFL FLUX.3 names renamed as diffusers' FLUX.3 converter does. */
#include "lora.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include "name_index.h"
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *lora_format_name(lora_format f) {
    static const char *n[] = {"peft", "peft_prefix", "aitk", "kohya", "bare", "lycoris"};
    return f <= LORA_FMT_LYCORIS ? n[f] : "?";
}

const char *lora_kind_name(lora_kind k) {
    static const char *n[] = {"LoRA", "LoKr", "LoHa", "diff"};
    return k <= LORA_KIND_DIFF ? n[k] : "?";
}

int lora_spec_parse(const char *arg, lora_spec *out) {
    memset(out, 0, sizeof *out);
    if (!arg || !*arg) return tp_error("--lora needs FILE[:WEIGHT]");
    const char *colon = strrchr(arg, ':');
    out->weight = 1.0;
    if (colon && colon[1]) {
        char *end;
        double w = strtod(colon + 1, &end);
        if (!*end) {
            if (!isfinite(w) || fabs(w) > LORA_MAX_SCALE)
                return tp_error("--lora %s: the weight must be a finite number of magnitude at most %g", arg,
                                LORA_MAX_SCALE);
            out->weight = w;
            out->path = xasprintf("%.*s", (int)(colon - arg), arg);
        }
    }
    if (!out->path) out->path = xstrdup(arg);
    if (!*out->path) return free(out->path), out->path = NULL, tp_error("--lora %s: empty file name", arg);
    return 0;
}

void lora_specs_free(lora_spec *s, int n) {
    for (int i = 0; s && i < n; i++) free(s[i].path);
}

/* ---- FLUX.2 module names in both layouts ----
 * dif: diffusers module; bfl: BFL module; a fused BFL tensor holds
 * `parts` diffusers modules stacked by rows (qkv: q, k, v); `swap`: the
 * BFL final layer emits (shift, scale), diffusers' norm_out (scale, shift). */
typedef struct name_pair {
    const char *dif, *bfl;
    int part, parts, swap;
} name_pair;

static const name_pair k_names[] = {
    {"transformer_blocks.%d.attn.to_q", "double_blocks.%d.img_attn.qkv", 0, 3, 0},
    {"transformer_blocks.%d.attn.to_k", "double_blocks.%d.img_attn.qkv", 1, 3, 0},
    {"transformer_blocks.%d.attn.to_v", "double_blocks.%d.img_attn.qkv", 2, 3, 0},
    {"transformer_blocks.%d.attn.add_q_proj", "double_blocks.%d.txt_attn.qkv", 0, 3, 0},
    {"transformer_blocks.%d.attn.add_k_proj", "double_blocks.%d.txt_attn.qkv", 1, 3, 0},
    {"transformer_blocks.%d.attn.add_v_proj", "double_blocks.%d.txt_attn.qkv", 2, 3, 0},
    {"transformer_blocks.%d.attn.to_out.0", "double_blocks.%d.img_attn.proj", 0, 1, 0},
    {"transformer_blocks.%d.attn.to_add_out", "double_blocks.%d.txt_attn.proj", 0, 1, 0},
    {"transformer_blocks.%d.ff.linear_in", "double_blocks.%d.img_mlp.0", 0, 1, 0},
    {"transformer_blocks.%d.ff.linear_out", "double_blocks.%d.img_mlp.2", 0, 1, 0},
    {"transformer_blocks.%d.ff_context.linear_in", "double_blocks.%d.txt_mlp.0", 0, 1, 0},
    {"transformer_blocks.%d.ff_context.linear_out", "double_blocks.%d.txt_mlp.2", 0, 1, 0},
    {"single_transformer_blocks.%d.attn.to_qkv_mlp_proj", "single_blocks.%d.linear1", 0, 1, 0},
    {"single_transformer_blocks.%d.attn.to_out", "single_blocks.%d.linear2", 0, 1, 0},
    {"x_embedder", "img_in", 0, 1, 0},
    {"context_embedder", "txt_in", 0, 1, 0},
    {"time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer", 0, 1, 0},
    {"time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer", 0, 1, 0},
    {"time_guidance_embed.guidance_embedder.linear_1", "guidance_in.in_layer", 0, 1, 0},
    {"time_guidance_embed.guidance_embedder.linear_2", "guidance_in.out_layer", 0, 1, 0},
    {"double_stream_modulation_img.linear", "double_stream_modulation_img.lin", 0, 1, 0},
    {"double_stream_modulation_txt.linear", "double_stream_modulation_txt.lin", 0, 1, 0},
    {"single_stream_modulation.linear", "single_stream_modulation.lin", 0, 1, 0},
    {"norm_out.linear", "final_layer.adaLN_modulation.1", 0, 1, 1},
    {"proj_out", "final_layer.linear", 0, 1, 0},
};
#define N_NAMES ((int)(sizeof k_names / sizeof k_names[0]))

/* Match name against a pattern with at most one %d (one or more digits);
 * `under`: compare '.' in the pattern with '_' in the name (kohya).
 * *idx gets the block index (-1 when the pattern has none). */
static int pat_match(const char *pat, const char *name, int under, int *idx) {
    *idx = -1;
    for (; *pat; pat++, name++) {
        if (pat[0] == '%' && pat[1] == 'd') {
            if (!isdigit((unsigned char)*name)) return 0;
            long v = 0;
            for (; isdigit((unsigned char)*name) && v < 100000; name++) v = v * 10 + (*name - '0');
            *idx = (int)v;
            pat++, name--;
            continue;
        }
        char want = under && *pat == '.' ? '_' : *pat;
        if (*name != want) return 0;
    }
    return *name == 0;
}

static char *pat_fill(const char *pat, int idx) {
    return idx >= 0 ? xasprintf(pat, idx) : xstrdup(pat);
}

/* ---- mapping an adapter module onto checkpoint tensors ---- */

typedef struct target {
    char *tensor;               /* checkpoint tensor name */
    int64_t row0, nrows, brow0; /* rows [row0, row0+nrows) of the tensor get B rows from brow0 */
} target;

static int add_target(target *t, int n, char *tensor, int64_t row0, int64_t nrows, int64_t brow0) {
    t[n] = (target){tensor, row0, nrows, brow0};
    return n + 1;
}

/* The checkpoint tensor `module`.weight, 2-D, or NULL. */
static const st_tensor_info *ck_weight(const checkpoint *ck, const char *module, char **tname) {
    *tname = xasprintf("%s.weight", module);
    const st_tensor_info *ti = checkpoint_find(ck, *tname, NULL);
    if (!ti || ti->ndim != 2) { free(*tname); *tname = NULL; return NULL; }
    return ti;
}

/* A FLUX.3 module with BFL names (ai-toolkit `diffusion_model.` files) in
 * diffusers names, as diffusers' _convert_non_diffusers_flux3_lora_to_diffusers
 * rewrites them (content_mode_blocks -> mode_blocks, single_blocks ->
 * single_transformer_blocks, q/k/v_proj -> attn.to_q/k/v, attn_out ->
 * attn.to_out.0, mlp_in/out -> ff.linear_in/out; the rest unchanged).
 * NULL when nothing changes. */
static char *flux3_bfl_to_diffusers(const char *m) {
    static const char *rep[][2] = {
        {"content_mode_blocks.", "mode_blocks."}, {"single_blocks.", "single_transformer_blocks."},
        {".q_proj.", ".attn.to_q."}, {".k_proj.", ".attn.to_k."}, {".v_proj.", ".attn.to_v."},
        {".attn_out.", ".attn.to_out.0."}, {".mlp_in.", ".ff.linear_in."}, {".mlp_out.", ".ff.linear_out."},
    };
    char *s = xasprintf("%s.", m);   /* the converter sees keys: ".q_proj." matches at the module's end */
    int changed = 0;
    for (size_t i = 0; i < sizeof rep / sizeof rep[0]; i++) {
        char *at;
        while ((at = strstr(s, rep[i][0]))) {
            char *t = xasprintf("%.*s%s%s", (int)(at - s), s, rep[i][1], at + strlen(rep[i][0]));
            free(s);
            s = t;
            changed = 1;
        }
    }
    s[strlen(s) - 1] = 0;
    if (!changed) { free(s); return NULL; }
    return s;
}

/* Targets of module `m` in namespace ns (0: diffusers names, 1: BFL
 * names, 2: kohya's BFL names spelled with '_') on a checkpoint with BFL
 * (ck_bfl) or diffusers names. *b_rows: the rows lora_B must have.
 * Returns the number of targets (0: the name maps to nothing). */
static int map_module(const checkpoint *ck, int ck_bfl, const char *m, int ns, target out[3], int64_t *b_rows) {
    char *tn;
    const st_tensor_info *ti;
    /* same layout, a plain name: the module is the tensor */
    if (ns != 2 && ns == ck_bfl && (ti = ck_weight(ck, m, &tn))) {
        *b_rows = ti->shape[0];
        return add_target(out, 0, tn, 0, ti->shape[0], 0);
    }
    int n = 0;
    *b_rows = 0;
    for (int i = 0; i < N_NAMES; i++) {
        const name_pair *p = &k_names[i];
        int idx;
        if (!pat_match(ns == 0 ? p->dif : p->bfl, m, ns == 2, &idx)) continue;
        if (ns != 0 && ck_bfl && p->part != 0) continue;   /* a BFL name on a BFL tensor: once */
        char *mod = pat_fill(ck_bfl ? p->bfl : p->dif, idx);
        ti = ck_weight(ck, mod, &tn);
        free(mod);
        if (!ti) {
            for (int j = 0; j < n; j++) free(out[j].tensor);
            return 0;
        }
        int64_t rows = ti->shape[0], h = rows / 2;
        int cross = (ns == 0) == ck_bfl;   /* diffusers name on BFL tensors or the reverse */
        if (cross && p->swap) {            /* (scale, shift) <-> (shift, scale): rows [0,h) <-> [h,2h) */
            n = add_target(out, n, tn, h, h, 0);
            n = add_target(out, n, xstrdup(tn), 0, h, h);
            *b_rows = rows;
            return n;
        }
        if (cross && ns == 0 && p->parts > 1) {   /* q, k or v: its third of the BFL qkv */
            *b_rows = rows / p->parts;
            return add_target(out, n, tn, p->part * (rows / p->parts), rows / p->parts, 0);
        }
        if (cross && ns != 0 && p->parts > 1) {   /* a fused qkv LoRA: B's rows split over q, k, v */
            n = add_target(out, n, tn, 0, rows, *b_rows);
            *b_rows += rows;
            continue;
        }
        *b_rows = rows;
        return add_target(out, n, tn, 0, rows, 0);
    }
    /* FLUX.3 BFL names on a diffusers-named checkpoint: the renamed module is the tensor */
    char *f3;
    if (!n && ns == 1 && !ck_bfl && (f3 = flux3_bfl_to_diffusers(m))) {
        ti = ck_weight(ck, f3, &tn);
        free(f3);
        if (ti) {
            *b_rows = ti->shape[0];
            return add_target(out, 0, tn, 0, ti->shape[0], 0);
        }
    }
    return n;
}

/* What a key that maps to nothing looks like, for the message. */
static const char *family_hint(const char *key) {
    static const struct { const char *needle, *family; } k[] = {
        {"img_mod.", "FLUX.1 (BFL names: double_blocks.N.img_mod)"},
        {"img_mod_", "FLUX.1 (kohya names: img_mod)"},
        {"modulation.lin", "FLUX.1 (single_blocks.N.modulation)"},
        {"modulation_lin", "FLUX.1 (single_blocks_N_modulation)"},
        {"proj_mlp", "FLUX.1 (diffusers single blocks have proj_mlp)"},
        {"norm1.linear", "FLUX.1 (diffusers norm1.linear)"},
        {"norm1_context", "FLUX.1 (diffusers norm1_context)"},
        {"joint_transformer_blocks", "Stable Diffusion 3"},
        {"joint_blocks", "Stable Diffusion 3"},
        {"down_blocks", "a Stable Diffusion / SDXL UNet"},
        {"up_blocks", "a Stable Diffusion / SDXL UNet"},
        {"input_blocks", "a Stable Diffusion / SDXL UNet"},
        {"mid_block", "a Stable Diffusion / SDXL UNet"},
        {"self_attn", "a video / LLM-style transformer (Wan, HunyuanVideo, ...)"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strstr(key, k[i].needle)) return k[i].family;
    return NULL;
}

static int is_text_encoder_key(const char *key) {
    static const char *p[] = {"text_encoder.", "text_encoders.", "lora_te_", "lora_te1_", "lora_te2_",
                              "lora_te3_", "te_", "te1.", "te2."};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (!strncmp(key, p[i], strlen(p[i]))) return 1;
    return 0;
}

/* ---- one adapter file ---- */

typedef enum {
    PART_A, PART_B, PART_ALPHA, PART_DORA,
    PART_W1, PART_W1A, PART_W1B, PART_W2, PART_W2A, PART_W2B,   /* LoKr: lokr_*; LoHa: hada_w1_a.. in W1A.. */
    PART_H1A, PART_H1B, PART_H2A, PART_H2B, PART_DIFF, PART_DIFF_B, PART_TUCKER, PART_N, PART_OTHER = PART_N
} key_part;

/* Split a key into (prefix namespace, module, part). */
typedef struct parsed_key {
    char *module;
    key_part part;
} parsed_key;

static key_part key_suffix(const char *key, size_t *module_len) {
    static const struct { const char *s; key_part p; } k[] = {
        {".lora_A.weight", PART_A},    {".lora_B.weight", PART_B},  {".lora_down.weight", PART_A},
        {".lora_up.weight", PART_B},   {".alpha", PART_ALPHA},      {".dora_scale", PART_DORA},
        {".lokr_w1", PART_W1},         {".lokr_w1_a", PART_W1A},    {".lokr_w1_b", PART_W1B},
        {".lokr_w2", PART_W2},         {".lokr_w2_a", PART_W2A},    {".lokr_w2_b", PART_W2B},
        {".hada_w1_a", PART_H1A},      {".hada_w1_b", PART_H1B},    {".hada_w2_a", PART_H2A},
        {".hada_w2_b", PART_H2B},      {".diff", PART_DIFF},        {".diff_b", PART_DIFF_B},
        {".lokr_t2", PART_TUCKER},     {".hada_t1", PART_TUCKER},   {".hada_t2", PART_TUCKER},
    };
    size_t n = strlen(key);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        size_t l = strlen(k[i].s);
        if (n > l && !strcmp(key + n - l, k[i].s)) { *module_len = n - l; return k[i].p; }
    }
    *module_len = n;
    return PART_OTHER;
}

typedef struct module_rec {
    char *name;                 /* key without prefix and suffix */
    const st_tensor_info *a, *b, *alpha;
    const st_tensor_info *p[PART_N];   /* every part by key_part (a, b, alpha alias p[PART_A..]) */
} module_rec;


/* The format, from the keys (diffusers' lora_state_dict order: kohya names
 * lora_unet_*, ai-toolkit diffusion_model.*, PEFT base_model.model.*,
 * diffusers transformer.*). */
static lora_format detect_format(const st_file *f, const char **prefix) {
    int unet = 0, dm = 0, bm = 0, tr = 0;
    for (int i = 0; i < f->n; i++) {
        const char *k = f->tensors[i].name;
        unet |= !strncmp(k, "lora_unet_", 10);
        dm |= !strncmp(k, "diffusion_model.", 16);
        bm |= !strncmp(k, "base_model.model.", 17);
        tr |= !strncmp(k, "transformer.", 12);
    }
    int ly = 0;
    for (int i = 0; i < f->n; i++) ly |= !strncmp(f->tensors[i].name, "lycoris_", 8);
    if (ly) { *prefix = "lycoris_"; return LORA_FMT_LYCORIS; }
    if (unet) { *prefix = "lora_unet_"; return LORA_FMT_KOHYA; }
    if (dm) { *prefix = "diffusion_model."; return LORA_FMT_AITK; }
    if (bm) { *prefix = "base_model.model."; return LORA_FMT_PEFT_PREFIX; }
    if (tr) { *prefix = "transformer."; return LORA_FMT_PEFT; }
    *prefix = "";
    return LORA_FMT_BARE;
}

/* PEFT's scale from the file's lora_adapter_metadata (diffusers writes the
 * LoraConfig there with keys "transformer.<field>"): lora_alpha / r, or
 * lora_alpha / sqrt(r) with use_rslora; alpha_pattern / rank_pattern
 * entries override per module (a pattern matches a module equal to it or
 * ending in "." + it). No metadata: scale 1 (diffusers takes r = alpha). */
typedef struct peft_cfg {
    int have;
    double r, alpha;
    int rslora;
    json_t *meta, *rank_pat, *alpha_pat;
} peft_cfg;

static json_t *meta_field(json_t *m, const char *field) {
    char k[128];
    snprintf(k, sizeof k, "transformer.%s", field);
    json_t *v = json_object_get(m, k);
    return v ? v : json_object_get(m, field);
}

static int peft_cfg_read(const st_file *f, peft_cfg *c) {
    memset(c, 0, sizeof *c);
    const char *s = st_meta(f, "lora_adapter_metadata");
    if (!s) return 0;
    json_error_t je;
    if (!(c->meta = json_loads(s, 0, &je)) || !json_is_object(c->meta))
        return tp_error("%s: metadata lora_adapter_metadata is not a JSON object (%s)", f->path, je.text);
    json_t *r = meta_field(c->meta, "r"), *a = meta_field(c->meta, "lora_alpha");
    if (!json_is_number(r) || !(json_number_value(r) >= 1) || !isfinite(json_number_value(r)))
        return tp_error("%s: lora_adapter_metadata: 'r' must be a number of at least 1 (the rank)", f->path);
    c->have = 1;
    c->r = json_number_value(r);
    c->alpha = json_is_number(a) ? json_number_value(a) : c->r;
    if (!isfinite(c->alpha)) return tp_error("%s: lora_adapter_metadata: 'lora_alpha' is not finite", f->path);
    c->rslora = json_is_true(meta_field(c->meta, "use_rslora"));
    if (json_is_true(meta_field(c->meta, "use_dora")))
        return tp_error("%s: lora_adapter_metadata says use_dora: DoRA adapters are not supported (only plain "
                        "LoRA is merged)", f->path);
    c->rank_pat = meta_field(c->meta, "rank_pattern");
    c->alpha_pat = meta_field(c->meta, "alpha_pattern");
    return 0;
}

static json_t *pattern_lookup(json_t *pat, const char *module) {
    const char *k;
    json_t *v;
    size_t n = strlen(module);
    if (!json_is_object(pat)) return NULL;
    json_object_foreach(pat, k, v) {
        size_t l = strlen(k);
        if (!strcmp(module, k) || (n > l && module[n - l - 1] == '.' && !strcmp(module + n - l, k))) return v;
    }
    return NULL;
}

static int peft_scale(const peft_cfg *c, const lora_adapter *ad, const char *module, double *out) {
    *out = 1.0;
    if (!c->have) return 0;
    json_t *rv = pattern_lookup(c->rank_pat, module), *av = pattern_lookup(c->alpha_pat, module);
    if (rv && !json_is_number(rv)) return tp_error("%s: module %s: its rank_pattern entry is not a number", ad->path, module);
    if (av && !json_is_number(av)) return tp_error("%s: module %s: its alpha_pattern entry is not a number", ad->path, module);
    double r = rv ? json_number_value(rv) : c->r;
    double a = av ? json_number_value(av) : c->alpha;
    if (!(r >= 1) || !isfinite(r))
        return tp_error("%s: module %s: rank %g (%s); a rank is at least 1", ad->path, module, r,
                        rv ? "rank_pattern" : "'r'");
    if (!isfinite(a)) return tp_error("%s: module %s: alpha %g (alpha_pattern) is not finite", ad->path, module, a);
    *out = c->rslora ? a / sqrt(r) : a / r;
    return 0;
}

static int read_alpha(lora_adapter *ad, const st_tensor_info *t, double *out) {
    if (st_numel(t) != 1)
        return tp_error("%s: key %s: an alpha must be a scalar (shape [] or [1]), this one has %lld values",
                        ad->path, t->name, (long long)st_numel(t));
    float v;
    size_t sz = dtype_size(t->dtype);
    unsigned char raw[8];
    if (t->dtype != DT_F32 && t->dtype != DT_F16 && t->dtype != DT_BF16 && t->dtype != DT_F64)
        return tp_error("%s: key %s: alpha must be a float (it is %s)", ad->path, t->name, dtype_name(t->dtype));
    if (st_read_range(ad->f, t->begin, raw, sz)) return tp_error_context("%s: key %s", ad->path, t->name);
    convert_to_f32(&v, raw, t->dtype, 1);
    ad->bytes_alpha += sz;
    if (!isfinite(v) || v == 0)
        return tp_error("%s: key %s: alpha is %g; it must be finite and non-zero", ad->path, t->name, v);
    *out = v;
    return 0;
}

static int check_ab(const lora_adapter *ad, const module_rec *r) {
    const st_tensor_info *a = r->a, *b = r->b;
    /* a module of only an alpha: the file holds another adapter type's
     * factors (LyCORIS LoHa/LoKr) cut away, or is truncated */
    if (!a && !b)
        return tp_error("%s: module %s has an alpha (%s) but no lora_A / lora_down and no lora_B / lora_up matrix; a "
                        "LoRA module needs both (is the file truncated, or another adapter type such as LyCORIS?)",
                        ad->path, r->name, r->alpha->name);
    if (!a || !b)
        return tp_error("%s: module %s has %s but no %s; a LoRA module needs both matrices", ad->path, r->name,
                        a ? a->name : b->name, a ? "lora_B / lora_up" : "lora_A / lora_down");
    for (int k = 0; k < 2; k++) {
        const st_tensor_info *t = k ? b : a;
        if (t->ndim != 2)
            return tp_error("%s: key %s has %d dimensions; LoRA matrices are 2-D (conv LoRAs are not supported)",
                            ad->path, t->name, t->ndim);
        if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
            return tp_error("%s: key %s is %s; LoRA matrices must be F32, BF16 or F16", ad->path, t->name,
                            dtype_name(t->dtype));
    }
    if (a->shape[0] < 1 || a->shape[0] != b->shape[1])
        return tp_error("%s: module %s: lora_A %s is [%lld, %lld] and lora_B %s is [%lld, %lld]: the rank (A's rows, "
                        "B's columns) must agree", ad->path, r->name, a->name, (long long)a->shape[0],
                        (long long)a->shape[1], b->name, (long long)b->shape[0], (long long)b->shape[1]);
    return 0;
}

static int cmp_seg(const void *x, const void *y) {
    const lora_segment *a = x, *b = y;
    int c = strcmp(a->tensor, b->tensor);
    return c ? c : (a->adapter - b->adapter);
}

/* A segment of adapter ai already aimed at rows of `tensor` overlapping [row0, row0 + n). */
static const lora_segment *find_overlap(const lora_set *s, int ai, const char *tensor, int64_t row0, int64_t n) {
    for (int i = 0; i < s->n_seg; i++) {
        const lora_segment *g = &s->seg[i];
        if (g->adapter == ai && !strcmp(g->tensor, tensor) && g->row0 < row0 + n && row0 < g->row0 + g->nrows)
            return g;
    }
    return NULL;
}

static void push_seg(lora_set *s, lora_segment g) {
    s->seg = xrealloc(s->seg, (size_t)(s->n_seg + 1) * sizeof *s->seg);
    s->seg[s->n_seg++] = g;
}

/* A FLUX.3 transformer (diffusers names, or BFL FLUX.3 names): the LoRA
 * rules of Flux3LoraLoaderMixin apply instead of Flux2LoraLoaderMixin's. */
static int is_flux3_checkpoint(const checkpoint *ck) {
    static const char *k[] = {"x_embedders.image.weight", "early_stream_modulations.image.linear.weight",
                              "early_stream_modulations.image.lin.weight"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (checkpoint_find(ck, k[i], NULL)) return 1;
    return 0;
}

/* FLUX.3: the older diffusers spellings that load_lora_adapter rewrites
 * (convert_unet_state_dict_to_peft): ".processor." -> ".", then the first
 * UNET_TO_DIFFUSERS pattern found, e.g. ".to_q_lora.down" -> ".to_q.lora_A",
 * ".lora.up" -> ".lora_B". NULL when the key has none of them. */
static char *flux3_old_diffusers_key(const char *key) {
    static const char *map[][2] = {
        {".to_out_lora.up", ".to_out.0.lora_B"}, {".to_out_lora.down", ".to_out.0.lora_A"},
        {".to_q_lora.down", ".to_q.lora_A"},     {".to_q_lora.up", ".to_q.lora_B"},
        {".to_k_lora.down", ".to_k.lora_A"},     {".to_k_lora.up", ".to_k.lora_B"},
        {".to_v_lora.down", ".to_v.lora_A"},     {".to_v_lora.up", ".to_v.lora_B"},
        {".lora.up", ".lora_B"},                 {".lora.down", ".lora_A"},
    };
    char *s = xstrdup(key), *at;
    int changed = 0;
    while ((at = strstr(s, ".processor."))) {
        memmove(at, at + 10, strlen(at + 10) + 1);   /* ".processor." -> "." */
        changed = 1;
    }
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (!strstr(s, map[i][0])) continue;
        while ((at = strstr(s, map[i][0]))) {
            char *t = xasprintf("%.*s%s%s", (int)(at - s), s, map[i][1], at + strlen(map[i][0]));
            free(s);
            s = t;
        }
        changed = 1;
        break;
    }
    if (!changed) { free(s); return NULL; }
    return s;
}

/* ---- LyCORIS, LoKr, LoHa and ComfyUI diffs (docs/lora.md) ---- */

/* A file whose first key belongs to no dialect: list its first keys. */
static void unknown_dialect_error(const lora_adapter *ad) {
    char keys[400];
    size_t k = 0;
    keys[0] = 0;
    for (int i = 0; i < ad->f->n && i < 5 && k + 4 < sizeof keys; i++)
        k += (size_t)snprintf(keys + k, sizeof keys - k, "%s%s", i ? ", " : "", ad->f->tensors[i].name);
    tp_error("%s: no known adapter dialect (LoRA in the diffusers/PEFT, ai-toolkit, kohya or fal layouts, LyCORIS "
             "LoKr/LoHa, ComfyUI .diff); its first keys are: %s", ad->path, keys);
}

/* BFL QK-norm scales and their diffusers names (1-D, for `.diff` patches) */
static const char *k_norms[][2] = {
    {"transformer_blocks.%d.attn.norm_q.weight", "double_blocks.%d.img_attn.norm.query_norm.scale"},
    {"transformer_blocks.%d.attn.norm_k.weight", "double_blocks.%d.img_attn.norm.key_norm.scale"},
    {"transformer_blocks.%d.attn.norm_added_q.weight", "double_blocks.%d.txt_attn.norm.query_norm.scale"},
    {"transformer_blocks.%d.attn.norm_added_k.weight", "double_blocks.%d.txt_attn.norm.key_norm.scale"},
    {"single_transformer_blocks.%d.attn.norm_q.weight", "single_blocks.%d.norm.query_norm.scale"},
    {"single_transformer_blocks.%d.attn.norm_k.weight", "single_blocks.%d.norm.key_norm.scale"},
};

/* A parameter named in full (a diff on a norm scale, or any tensor named
 * exactly): the tensor, whole. */
static int map_param(const checkpoint *ck, int ck_bfl, const char *m, target out[3], int64_t *b_rows) {
    const st_tensor_info *ti = checkpoint_find(ck, m, NULL);
    char *tn = NULL;
    for (size_t i = 0; !ti && i < sizeof k_norms / sizeof k_norms[0]; i++) {
        int idx;
        for (int side = 0; side < 2 && !ti; side++)
            if (pat_match(k_norms[i][side], m, 0, &idx)) {
                tn = pat_fill(k_norms[i][ck_bfl], idx);
                if (!(ti = checkpoint_find(ck, tn, NULL))) free(tn), tn = NULL;
            }
    }
    if (!ti) return 0;
    *b_rows = ti->shape[0];
    return add_target(out, 0, tn ? tn : xstrdup(ti->name), 0, ti->shape[0], 0);
}

/* LyCORIS names are diffusers module paths with '.' -> '_': decode them
 * through the FLUX.2 name table, else through the checkpoint's own tensors
 * (FLUX.3, or any diffusers-named model). */
static char *lycoris_decode(const checkpoint *ck, const char *m) {
    for (int i = 0; i < N_NAMES; i++) {
        int idx;
        if (pat_match(k_names[i].dif, m, 1, &idx)) return pat_fill(k_names[i].dif, idx);
    }
    for (int i = 0; i < ck->n; i++) {
        const char *t = ck->infos[i]->name;
        size_t n = strlen(t);
        if (n < 8 || strcmp(t + n - 7, ".weight") || strlen(m) != n - 7) continue;
        int same = 1;
        for (size_t j = 0; j < n - 7 && same; j++) same = (t[j] == '.' ? '_' : t[j]) == m[j];
        if (same) return xasprintf("%.*s", (int)(n - 7), t);
    }
    return NULL;
}

/* Targets of a module of any dialect; *cols: the module's input width. */
static int map_any(const lora_adapter *ad, const checkpoint *ck, int ck_bfl, const char *m, int diff, target tg[3],
                   int64_t *b_rows, int64_t *cols) {
    int nt = 0;
    if (ad->fmt == LORA_FMT_LYCORIS) {
        char *d = lycoris_decode(ck, m);
        if (d) nt = map_module(ck, ck_bfl, d, 0, tg, b_rows);
        free(d);
    } else if (ad->fmt == LORA_FMT_KOHYA) {
        nt = map_module(ck, ck_bfl, m, 2, tg, b_rows);
    } else {
        int first = ad->fmt == LORA_FMT_PEFT ? 0 : 1;   /* diffusion_model.: BFL names first */
        nt = map_module(ck, ck_bfl, m, first, tg, b_rows);
        if (!nt) nt = map_module(ck, ck_bfl, m, !first, tg, b_rows);
    }
    if (!nt && diff) nt = map_param(ck, ck_bfl, m, tg, b_rows);
    if (nt) {
        const st_tensor_info *t0 = checkpoint_find(ck, tg[0].tensor, NULL);
        *cols = t0->ndim == 2 ? t0->shape[1] : 1;
    }
    return nt;
}

/* The module's kind from its parts; -1: only .diff_b (ignored). Parts of two
 * dialects in one module are refused. */
static int rec_kind(const lora_adapter *ad, const module_rec *r, int *kind) {
    static const struct { key_part lo, hi; int kind; } k[] = {
        {PART_A, PART_B, LORA_KIND_LORA}, {PART_W1, PART_W2B, LORA_KIND_LOKR},
        {PART_H1A, PART_H2B, LORA_KIND_LOHA}, {PART_DIFF, PART_DIFF, LORA_KIND_DIFF},
    };
    *kind = -2;
    const st_tensor_info *first = NULL;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        for (int p = k[i].lo; p <= (int)k[i].hi; p++) {
            if (!r->p[p]) continue;
            if (*kind >= 0 && *kind != k[i].kind)
                return tp_error("%s: module %s is named twice, by two dialects: %s (%s) and %s (%s); one module takes "
                                "one adapter kind", ad->path, r->name, first->name, lora_kind_name(*kind), r->p[p]->name,
                                lora_kind_name(k[i].kind));
            if (*kind < 0) first = r->p[p];
            *kind = k[i].kind;
        }
    if (*kind == -2) *kind = r->p[PART_DIFF_B] ? -1 : LORA_KIND_LORA;   /* LoRA: check_ab names what is missing */
    return 0;
}

static int check_factor(const lora_adapter *ad, const module_rec *r, const st_tensor_info *t, int ndim) {
    if (!t) return 0;
    if (t->ndim != ndim && !(ndim == 2 && t->ndim == 1 && r->p[PART_DIFF] == t))
        return tp_error("%s: module %s: key %s has %d dimensions; it must have %d (conv adapters are not supported)",
                        ad->path, r->name, t->name, t->ndim, ndim);
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
        return tp_error("%s: module %s: key %s is %s; adapter factors must be F32, BF16 or F16", ad->path, r->name,
                        t->name, dtype_name(t->dtype));
    return 0;
}

#define DIM(t, i) ((long long)(t)->shape[i])

/* One LoKr factor: full (w) or w_a @ w_b; its shape and rank. */
static int lokr_factor(const lora_adapter *ad, const module_rec *r, int which, int64_t *rows, int64_t *cols,
                       int64_t *rank) {
    const st_tensor_info *w = r->p[which ? PART_W2 : PART_W1], *wa = r->p[which ? PART_W2A : PART_W1A],
                         *wb = r->p[which ? PART_W2B : PART_W1B];
    if (check_factor(ad, r, w, 2) || check_factor(ad, r, wa, 2) || check_factor(ad, r, wb, 2)) return -1;
    *rank = 0;
    if (w && !wa && !wb) { *rows = w->shape[0], *cols = w->shape[1]; return 0; }
    if (!w && wa && wb && wa->shape[1] == wb->shape[0] && wa->shape[1] >= 1) {
        *rows = wa->shape[0], *cols = wb->shape[1], *rank = wa->shape[1];
        return 0;
    }
    if (!w && wa && wb)
        return tp_error("%s: module %s: %s is [%lld, %lld] and %s [%lld, %lld]: their inner dimension (the rank) must "
                        "agree", ad->path, r->name, wa->name, DIM(wa, 0), DIM(wa, 1), wb->name, DIM(wb, 0), DIM(wb, 1));
    return tp_error("%s: module %s: LoKr factor w%d needs lokr_w%d, or lokr_w%d_a with lokr_w%d_b (it has %s)", ad->path,
                    r->name, which + 1, which + 1, which + 1, which + 1,
                    w ? "both the full and a decomposed form" : wa || wb ? "only one half of the product" : "none");
}

/* Validate a LoKr / LoHa / diff module: its delta's shape [*out, *in], rank
 * and scale (spec: LoKr alpha/r with r of w2_b, else of w1_b, and 1 when both
 * factors are full; LoHa alpha/r with r of hada_w1_b; diff 1). */
static int structured_shape(lora_adapter *ad, const module_rec *r, int kind, int64_t *out, int64_t *in,
                            int64_t *rank, double *scale) {
    double alpha = 0;
    *scale = 1;
    if (kind == LORA_KIND_DIFF) {
        const st_tensor_info *d = r->p[PART_DIFF];
        if (check_factor(ad, r, d, 2)) return -1;
        *out = d->shape[0], *in = d->ndim == 2 ? d->shape[1] : 1, *rank = 0;
        return 0;
    }
    if (kind == LORA_KIND_LOKR) {
        int64_t a, c, r1, b, d, r2;
        if (lokr_factor(ad, r, 0, &a, &c, &r1) || lokr_factor(ad, r, 1, &b, &d, &r2)) return -1;
        *out = a * b, *in = c * d, *rank = r2 ? r2 : r1;
        if (*rank && r->alpha) {
            if (read_alpha(ad, r->alpha, &alpha)) return -1;
            *scale = alpha / (double)*rank;
        }
        return 0;
    }
    const st_tensor_info *w1a = r->p[PART_H1A], *w1b = r->p[PART_H1B], *w2a = r->p[PART_H2A], *w2b = r->p[PART_H2B];
    if (!w1a || !w1b || !w2a || !w2b)
        return tp_error("%s: module %s: a LoHa module needs hada_w1_a, hada_w1_b, hada_w2_a and hada_w2_b (%s is "
                        "missing)", ad->path, r->name, !w1a ? "hada_w1_a" : !w1b ? "hada_w1_b" : !w2a ? "hada_w2_a"
                                                                                            : "hada_w2_b");
    if (check_factor(ad, r, w1a, 2) || check_factor(ad, r, w1b, 2) || check_factor(ad, r, w2a, 2) ||
        check_factor(ad, r, w2b, 2))
        return -1;
    if (w1a->shape[1] != w1b->shape[0] || w2a->shape[1] != w2b->shape[0] || w1a->shape[0] != w2a->shape[0] ||
        w1b->shape[1] != w2b->shape[1] || w1a->shape[1] < 1 || w2a->shape[1] < 1)
        return tp_error("%s: module %s: LoHa factors hada_w1_a [%lld, %lld], hada_w1_b [%lld, %lld], hada_w2_a [%lld, "
                        "%lld], hada_w2_b [%lld, %lld] do not make two products of one shape", ad->path, r->name,
                        DIM(w1a, 0), DIM(w1a, 1), DIM(w1b, 0), DIM(w1b, 1), DIM(w2a, 0), DIM(w2a, 1), DIM(w2b, 0),
                        DIM(w2b, 1));
    *out = w1a->shape[0], *in = w1b->shape[1], *rank = w1b->shape[0];
    if (r->alpha) {
        if (read_alpha(ad, r->alpha, &alpha)) return -1;
        *scale = alpha / (double)*rank;
    }
    return 0;
}

/* inspect: a module that matches no weight, listed */
static int note_unmatched(lora_adapter *ad, const char *name) {
    ad->unmatched = xrealloc(ad->unmatched, (size_t)(ad->n_unmatched + 1) * sizeof *ad->unmatched);
    ad->unmatched[ad->n_unmatched++] = xstrdup(name);
    return 0;
}

/* Map and push the segments of a LoKr / LoHa / diff module. */
static int structured_module(lora_set *s, int ai, const checkpoint *ck, int ck_bfl, const module_rec *r, int kind,
                             int *n_zero) {
    lora_adapter *ad = &s->ad[ai];
    int64_t out = 0, in = 0, rank = 0, b_rows = 0, cols = 0;
    double scale;
    if (structured_shape(ad, r, kind, &out, &in, &rank, &scale)) return -1;
    double coef = ad->weight * scale;
    if (!isfinite(coef) || fabs(coef) > LORA_MAX_SCALE)
        return tp_error("%s: module %s: scale %g x weight %g = %g; the scale must be finite and of magnitude at most %g "
                        "(the file's alpha is wrong)", ad->path, r->name, scale, ad->weight, coef, LORA_MAX_SCALE);
    target tg[3];
    int nt = map_any(ad, ck, ck_bfl, r->name, kind == LORA_KIND_DIFF, tg, &b_rows, &cols);
    if (!nt && s->inspect) return note_unmatched(ad, r->name);
    if (!nt) {
        const char *fam = family_hint(r->name);
        return tp_error("%s: %s module '%s' matches no weight of this transformer (%s)%s%s", ad->path,
                        lora_kind_name(kind), r->name, ck->dir,
                        fam ? "; the names look like an adapter for " : "; is the adapter for another model?",
                        fam ? fam : "");
    }
    if (out != b_rows || in != cols) {
        tp_error("%s: module %s: its %s delta is [%lld, %lld] (%s), but the module (%s%s) is [%lld, %lld]; the factors' "
                 "product is not the module's shape", ad->path, r->name, lora_kind_name(kind), (long long)out,
                 (long long)in, kind == LORA_KIND_LOKR ? "kron(w1, w2)" : kind == LORA_KIND_LOHA ? "the Hadamard product"
                                                                                               : "the stored diff",
                 tg[0].tensor, nt > 1 ? ", ..." : "", (long long)b_rows, (long long)cols);
        for (int q = 0; q < nt; q++) free(tg[q].tensor);
        return -1;
    }
    lora_segment g = {.adapter = ai, .kind = (lora_kind)kind, .rank = rank, .cols = in, .coef = coef};
    static const int lk[LK_N] = {PART_W1, PART_W1A, PART_W1B, PART_W2, PART_W2A, PART_W2B};
    static const int lh[LK_N] = {-1, PART_H1A, PART_H1B, -1, PART_H2A, PART_H2B};
    for (int j = 0; j < LK_N; j++) {
        int p = kind == LORA_KIND_LOKR ? lk[j] : kind == LORA_KIND_LOHA ? lh[j] : (j == LK_W1 ? PART_DIFF : -1);
        g.x[j] = p >= 0 ? r->p[p] : NULL;
    }
    for (int j = 0; j < nt; j++) {
        const lora_segment *twice = find_overlap(s, ai, tg[j].tensor, tg[j].row0, tg[j].nrows);
        if (twice) {
            tp_error("%s: modules %s and %s both target tensor '%s' (rows %lld..%lld); the file names one module twice "
                     "(two dialects or diffusers and BFL names?), so it would be merged twice", ad->path, twice->module,
                     r->name, tg[j].tensor, (long long)tg[j].row0, (long long)(tg[j].row0 + tg[j].nrows - 1));
            for (int q = j; q < nt; q++) free(tg[q].tensor);
            return -1;
        }
        g.tensor = tg[j].tensor, g.row0 = tg[j].row0, g.nrows = tg[j].nrows, g.brow0 = tg[j].brow0;
        g.module = xstrdup(r->name);
        push_seg(s, g);
    }
    if (rank > ad->rank) ad->rank = rank;
    ad->scale = ad->scale < 0 ? scale : (ad->scale == scale ? scale : NAN);
    ad->kinds |= 1u << kind;
    ad->n_modules++;
    if (coef == 0) (*n_zero)++;
    return 0;
}

/* Map every module of adapter ai onto ck and append its segments. */
static int adapter_map(lora_set *s, int ai, const checkpoint *ck, int ck_bfl, int verbose) {
    lora_adapter *ad = &s->ad[ai];
    const char *prefix;
    ad->fmt = detect_format(ad->f, &prefix);
    int flux3 = is_flux3_checkpoint(ck);
    if (flux3 && ad->fmt == LORA_FMT_KOHYA)
        return tp_error("%s: a kohya LoRA (lora_unet_* keys) on a FLUX.3 transformer: diffusers 0.42.1 converts no "
                        "kohya file for FLUX.3 (Flux3LoraLoaderMixin takes diffusers/PEFT transformer.* and "
                        "ai-toolkit diffusion_model.* names only, and loads nothing of a lora_unet_* file), so tpgen "
                        "refuses it; rename its modules to diffusers (transformer.<module>.lora_A/B.weight) or "
                        "ai-toolkit (diffusion_model.<BFL module>) names", ad->path);
    peft_cfg pc;
    name_index by_name = {0};   /* module -> index in rec (a file may hold 10^5 modules) */
    int rc = -1, n_rec = 0;
    module_rec *rec = xcalloc((size_t)ad->f->n + 1, sizeof *rec);
    char **kn = xcalloc((size_t)ad->f->n + 1, sizeof *kn);   /* FLUX.3: keys in the older diffusers spellings, renamed */
    if (peft_cfg_read(ad->f, &pc)) goto done;
    for (int i = 0; i < ad->f->n; i++) {
        const st_tensor_info *t = &ad->f->tensors[i];
        const char *k = t->name;
        if (flux3 && (kn[i] = flux3_old_diffusers_key(k))) k = kn[i];   /* the name diffusers reads it under */
        if (is_text_encoder_key(k)) {
            tp_error("%s: key %s belongs to a text encoder; tpgen applies adapters to the transformer only, so "
                     "text-encoder LoRAs are refused (use a file without text-encoder keys)", ad->path, k);
            goto done;
        }
        size_t plen = strlen(prefix);
        if (plen && strncmp(k, prefix, plen)) {
            const char *fam = family_hint(k);
            tp_error("%s: key %s does not start with '%s' like the file's other keys (format %s)%s%s", ad->path, t->name,
                     prefix, lora_format_name(ad->fmt), fam ? "; it looks like a LoRA for " : "", fam ? fam : "");
            goto done;
        }
        size_t mlen;
        key_part part = key_suffix(k + plen, &mlen);
        if (part == PART_OTHER && flux3 && (strstr(k, "lora_magnitude_vector") || strstr(k, ".lora_B.bias"))) {
            int dora = strstr(k, "lora_magnitude_vector") != NULL;
            tp_error("%s: key %s is a PEFT %s; diffusers applies it, tpgen does not (it merges plain LoRAs only); "
                     "merge the adapter into the weights first (PEFT merge_and_unload) or train it without %s",
                     ad->path, t->name, dora ? "DoRA magnitude vector (use_dora)" : "lora_B bias (lora_bias)",
                     dora ? "DoRA" : "lora_bias");
            goto done;
        }
        if (part == PART_OTHER) {
            if (n_rec == 0 && i == 0) unknown_dialect_error(ad);
            else
                tp_error("%s: key %s is not a LoRA matrix or alpha, nor a part of another known adapter dialect "
                         "(LoRA .lora_A/.lora_B/.lora_down/.lora_up.weight, .alpha; LyCORIS LoKr .lokr_w1[_a|_b]/.lokr_w2[_a|_b]; LoHa .hada_w1_a/"
                         "_b, .hada_w2_a/_b; ComfyUI .diff, .diff_b; other extras are not supported)", ad->path, t->name);
            goto done;
        }
        if (part == PART_TUCKER) {
            tp_error("%s: key %s is a LyCORIS Tucker core (use_tucker, for conv layers); tpgen merges LoKr and LoHa on "
                     "Linear layers without Tucker cores and refuses it; retrain without use_tucker", ad->path, t->name);
            goto done;
        }
        if (part == PART_DORA) { ad->n_dora_dropped++; continue; }
        char *mod = xasprintf("%.*s", (int)mlen, k + plen);
        int ri = name_index_get(&by_name, mod, strlen(mod));
        module_rec *r = ri >= 0 ? &rec[ri] : NULL;
        if (!r) {
            name_index_put(&by_name, mod, strlen(mod), n_rec);
            r = &rec[n_rec++];
            r->name = mod;
        } else {
            free(mod);
        }
        const st_tensor_info **slot = &r->p[part];
        if (*slot) {
            tp_error("%s: module %s has two %s tensors (%s and %s)", ad->path, r->name,
                     part == PART_ALPHA ? "alpha" : part == PART_A ? "down (A)" : part == PART_B ? "up (B)" : "such",
                     (*slot)->name, k);
            goto done;
        }
        *slot = t;
        r->a = r->p[PART_A], r->b = r->p[PART_B], r->alpha = r->p[PART_ALPHA];
    }
    if (ad->n_dora_dropped && verbose)
        fprintf(stderr, "tpgen: warning: %s: %d DoRA dora_scale key(s) dropped, as diffusers does; the adapter is "
                        "merged as a plain LoRA\n", ad->path, ad->n_dora_dropped);
    if (n_rec == 0) { tp_error("%s: no adapter modules in the file", ad->path); goto done; }
    ad->scale = -1;
    int n_zero = 0;
    for (int i = 0; i < n_rec; i++) {
        module_rec *r = &rec[i];
        int kind;
        if (rec_kind(ad, r, &kind)) goto done;
        if (r->p[PART_DIFF_B]) {   /* a bias patch: FLUX has no Linear biases */
            if (verbose)
                fprintf(stderr, "tpgen: warning: %s: key %s is a bias patch (.diff_b), but this transformer's layers "
                                "have no bias; it is ignored\n", ad->path, r->p[PART_DIFF_B]->name);
            ad->n_ignored++;
        }
        if (kind == -1) continue;
        if (kind != LORA_KIND_LORA) {
            if (structured_module(s, ai, ck, ck_bfl, r, kind, &n_zero)) goto done;
            continue;
        }
        if (check_ab(ad, r)) goto done;
        int64_t rank = r->a->shape[0];
        double scale = 1.0, alpha = 1.0;
        if (r->alpha) {
            if (read_alpha(ad, r->alpha, &alpha)) goto done;
            scale = alpha / (double)rank;
        } else if (ad->fmt == LORA_FMT_PEFT) {
            if (peft_scale(&pc, ad, r->name, &scale)) goto done;
        }
        double coef = ad->weight * scale;
        if (!isfinite(coef) || fabs(coef) > LORA_MAX_SCALE) {
            tp_error("%s: module %s: scale %g (alpha / rank%s) x weight %g = %g; a LoRA scale must be finite and of "
                     "magnitude at most %g (the file's alpha or rank metadata is wrong)", ad->path, r->name, scale,
                     pc.rslora && !r->alpha ? " with rsLoRA: alpha / sqrt(rank)" : "", ad->weight, coef, LORA_MAX_SCALE);
            goto done;
        }
        if (coef == 0) n_zero++;
        if (rank > r->a->shape[1] || rank > r->b->shape[0]) {
            tp_error("%s: module %s: rank %lld is larger than the module's input (%lld) or output (%lld) width; the "
                     "matrices are not a low-rank adapter", ad->path, r->name, (long long)rank,
                     (long long)r->a->shape[1], (long long)r->b->shape[0]);
            goto done;
        }
        /* module names: kohya's '_' spelling, else diffusers or BFL names */
        target tg[3];
        int64_t b_rows = 0, cols_unused = 0;
        int nt = map_any(ad, ck, ck_bfl, r->name, 0, tg, &b_rows, &cols_unused);
        if (!nt && s->inspect) { note_unmatched(ad, r->name); continue; }
        if (!nt) {
            const char *fam = family_hint(r->name);
            tp_error("%s: key %s: module '%s' matches no Linear of this transformer (%s)%s%s", ad->path,
                     r->a->name, r->name, ck->dir,
                     fam ? "; the names look like a LoRA for " : "; is the adapter for another model?",
                     fam ? fam : "");
            goto done;
        }
        int64_t in = r->a->shape[1], out = r->b->shape[0];
        const st_tensor_info *t0 = checkpoint_find(ck, tg[0].tensor, NULL);
        if (in != t0->shape[1] || out != b_rows) {
            if (nt == 3 && out % 3)
                tp_error("%s: module %s: lora_B %s has %lld rows, which do not divide into the 3 fused projections "
                         "(q, k, v) of %s", ad->path, r->name, r->b->name, (long long)out, tg[0].tensor);
            else
                tp_error("%s: module %s: lora_A %s is [%lld, %lld] and lora_B %s [%lld, %lld], but the module "
                         "(%s%s [%lld, %lld]) needs A [r, %lld] and B [%lld, r]; the adapter is for another model "
                         "size", ad->path, r->name, r->a->name, (long long)rank, (long long)in, r->b->name,
                         (long long)out, (long long)rank, tg[0].tensor, nt > 1 ? ", ..." : "",
                         (long long)t0->shape[0], (long long)t0->shape[1], (long long)t0->shape[1], (long long)b_rows);
            for (int q = 0; q < nt; q++) free(tg[q].tensor);
            goto done;
        }
        for (int j = 0; j < nt; j++) {
            const st_tensor_info *ti = checkpoint_find(ck, tg[j].tensor, NULL);
            const lora_segment *twice = find_overlap(s, ai, ti->name, tg[j].row0, tg[j].nrows);
            if (twice) {
                tp_error("%s: modules %s and %s both target tensor '%s' (rows %lld..%lld); the file names one "
                         "module twice (diffusers and BFL names?), so it would be merged twice", ad->path, twice->module,
                         r->name, ti->name, (long long)tg[j].row0, (long long)(tg[j].row0 + tg[j].nrows - 1));
                for (int q = j; q < nt; q++) free(tg[q].tensor);
                goto done;
            }
            push_seg(s, (lora_segment){.adapter = ai, .tensor = xstrdup(ti->name), .row0 = tg[j].row0, .nrows = tg[j].nrows,
                                       .kind = LORA_KIND_LORA, .cols = in,
                                       .a = r->a, .b = r->b, .brow0 = tg[j].brow0, .rank = rank,
                                       .coef = ad->weight * scale, .module = xstrdup(r->name)});
            free(tg[j].tensor);
        }
        if (rank > ad->rank) ad->rank = rank;
        ad->scale = ad->scale < 0 ? scale : (ad->scale == scale ? scale : NAN);
        ad->kinds |= 1u << LORA_KIND_LORA;
        ad->n_modules++;
    }
    if (ad->n_modules == 0 && ad->n_unmatched) {
        tp_error("%s: none of its %d modules matches a weight of this transformer (%s), e.g. '%s'; is the adapter "
                 "for another model?", ad->path, ad->n_unmatched, ck->dir, ad->unmatched[0]);
        goto done;
    }
    if (ad->n_modules == 0) {   /* every module was an ignored bias patch */
        tp_error("%s: every module of the file is a .diff_b bias patch (%d), and this transformer's layers have no "
                 "bias: the adapter would change nothing", ad->path, ad->n_ignored);
        goto done;
    }
    if (n_zero && verbose)
        fprintf(stderr, "tpgen: warning: %s: %d of %d modules have scale 0 (lora_alpha 0 or --lora weight 0), so they "
                        "change nothing\n", ad->path, n_zero, ad->n_modules);
    rc = 0;
done:
    for (int i = 0; i < n_rec; i++) free(rec[i].name);
    free(rec);
    name_index_free(&by_name);
    for (int i = 0; i < ad->f->n; i++) free(kn[i]);
    free(kn);
    json_decref(pc.meta);
    return rc;
}

static int set_open(const lora_spec *specs, int n, const checkpoint *ck, int verbose, int inspect, lora_set **out) {
    *out = NULL;
    if (n > LORA_MAX_ADAPTERS) return tp_error("at most %d LoRA adapters (got %d)", LORA_MAX_ADAPTERS, n);
    lora_set *s = xcalloc(1, sizeof *s);
    s->inspect = inspect;
    int ck_bfl = checkpoint_is_bfl(ck);
    for (int i = 0; i < n; i++) {
        lora_adapter *ad = &s->ad[s->n++];
        ad->path = xstrdup(specs[i].path);
        ad->weight = specs[i].weight;
        if (st_open(ad->path, &ad->f) || adapter_map(s, i, ck, ck_bfl, verbose)) {
            tp_error_context("LoRA adapter %s", ad->path);
            lora_set_free(s);
            return -1;
        }
    }
    if (s->n_seg) qsort(s->seg, (size_t)s->n_seg, sizeof *s->seg, cmp_seg);   /* none: only ignored .diff_b keys */
    *out = s;
    return 0;
}

int lora_set_open(const lora_spec *specs, int n, const checkpoint *ck, int verbose, lora_set **out) {
    return set_open(specs, n, ck, verbose, 0, out);
}

int lora_set_open_inspect(const lora_spec *specs, int n, const checkpoint *ck, int verbose, lora_set **out) {
    return set_open(specs, n, ck, verbose, 1, out);
}

void lora_set_free(lora_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        st_close(s->ad[i].f);
        free(s->ad[i].path);
        for (int k = 0; k < s->ad[i].n_unmatched; k++) free(s->ad[i].unmatched[k]);
        free(s->ad[i].unmatched);
    }
    for (int i = 0; i < s->n_seg; i++) free(s->seg[i].module), free((char *)s->seg[i].tensor);
    free(s->seg);
    if (s->merge_be) backend_destroy(s->merge_be);
    free(s);
}

