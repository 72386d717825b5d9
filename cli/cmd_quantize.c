/* `tpgen quantize --type T [--force] IN OUT.gguf`: a FLUX.2 (or FLUX.3:
 * BFL recipes from core/models/flux3/flux3_bfl_names.c) transformer
 * checkpoint that tpgen reads (a diffusers folder, a BFL single file, a
 * .gguf; bf16/f16/f32/fp8/GGUF blocks) rewritten as a GGUF in the
 * ComfyUI-GGUF layout (docs/gguf.md "tpgen quantize"). Each tensor is read
 * as f32 (fp8 with its scales, GGUF blocks dequantised), typed by
 * gguf_quantize_pick and quantised by core/formats/gguf_quantize.c, one
 * tensor in memory at a time (gguf_write's fill callback). Names: --names
 * bfl (the default for a diffusers FLUX.2 transformer) writes the BFL names
 * ComfyUI-GGUF loads, each BFL tensor assembled in f32 from its diffusers
 * rows (core/models/flux2/flux2_bfl_names.c: fused qkv, the final layer's swapped
 * halves); --names keep (the default otherwise) keeps IN's names. OUT is written through a temporary file renamed at
 * the end (gguf_write), so no error leaves a partial OUT. */
#include "commands.h"
#include "kernels/err.h"
#include "kernels/quant.h"
#include "kernels/tensor.h"
#include "core/formats/checkpoint.h"
#include "core/formats/fp8.h"
#include "core/formats/gguf.h"
#include "core/formats/gguf_quantize.h"
#include "core/models/flux2/flux2_bfl_names.h"
#include "core/models/flux3/flux3.h"
#include "core/models/flux3/flux3_bfl_names.h"
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int usage(FILE *f) {
    fprintf(f,
            "usage: tpgen quantize --type T [--names bfl|keep] [--force] IN OUT.gguf\n\n"
            "Write the FLUX.2 or FLUX.3 transformer checkpoint IN (a diffusers transformer folder, a BFL single\n"
            ".safetensors file, or a .gguf; bf16/f16/f32/fp8 or GGUF blocks) as a GGUF in the ComfyUI-GGUF\n"
            "layout (general.architecture \"flux\"; a FLUX.3 transformer: \"flux3\").\n\n"
            "  --type T   %s\n"
            "             (bit-identical to gguf-py 0.19.0's quantisers; the K-quants to ggml's\n"
            "             reference quantisers, IQ4_NL and IQ4_XS to ggml's quantize_iq4_nl/_xs,\n"
            "             no importance matrix)\n"
            "             1-D tensors and tensors of <= 1024 values stay F32; a tensor whose rows are not\n"
            "             whole blocks of T is written F16; every other tensor is T\n"
            "  --names N  bfl: BFL names, what ComfyUI-GGUF loads (double_blocks.N.img_attn.qkv from to_q,\n"
            "             to_k, to_v stacked by rows, final_layer.adaLN_modulation.1 with the halves swapped,\n"
            "             ...; FLUX.3: the inverse of diffusers' FLUX.3 converter): IN must be a diffusers FLUX.2\n"
            "             or FLUX.3 transformer. keep: IN's names as they are.\n"
            "             Default: bfl for a diffusers transformer, keep otherwise (a BFL file or a\n"
            "             ComfyUI GGUF already has BFL names)\n"
            "  --force    replace an existing OUT\n\n"
            "OUT is written to a temporary file in its folder and renamed when complete.\n",
            gguf_quantize_supported_list());
    return f == stdout ? 0 : 2;
}

typedef struct qctx {
    const checkpoint *c;
    const gguf_write_tensor *wt;
    const flux2_bfl_tensor *bt;   /* --names bfl: the recipe of each written tensor; NULL: tensor k is c's k */
    int cur;              /* the tensor held in buf, -1 none */
    uint8_t *buf;         /* its quantised bytes */
    uint64_t n_buf;
} qctx;

/* tensor k of c as a malloc'ed f32 array of n values */
static int read_f32(const checkpoint *c, int k, float **out, int64_t *n_out) {
    const st_tensor_info *t = c->infos[k];
    const st_file *f = c->files[c->file_of[k]];
    int64_t n = st_numel(t);
    uint64_t nb = t->end - t->begin;
    void *raw = malloc(nb ? nb : 1);
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    if (!raw || !x) {
        free(raw), free(x);
        return tp_error("quantize: out of memory reading tensor '%s' (%lld values)", t->name, (long long)n);
    }
    if (st_read_raw(f, t, raw)) goto fail;
    if (t->dtype == DT_GGML) {
        if (!quant_supported(t->qtype)) {
            tp_error("%s: tensor '%s' is %s, which tpgen cannot decode (supported: %s)", f->path, t->name,
                     quant_type_name(t->qtype), quant_supported_list());
            goto fail;
        }
        quant_dequant_row(t->qtype, raw, x, n);
    } else if (dtype_is_fp8(t->dtype)) {
        const fp8_layer *l = fp8_layer_of(c, k);
        const float *tab = fp8_table(t->dtype);
        int64_t row = t->ndim && t->shape[0] ? n / t->shape[0] : n;
        for (int64_t i = 0; i < n; i++) {
            float s = !l || !l->values ? 1.0f : l->per_row ? l->values[i / row] : l->values[0];
            x[i] = tab[((const uint8_t *)raw)[i]] * s;
        }
    } else if (t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16 || t->dtype == DT_F64) {
        if (convert_to_f32(x, raw, t->dtype, (size_t)n)) goto fail;
    } else {
        tp_error("%s: tensor '%s' is %s, not a float tensor: tpgen quantize writes float weights only", f->path,
                 t->name, dtype_name(t->dtype));
        goto fail;
    }
    free(raw);
    *out = x, *n_out = n;
    return 0;
fail:
    free(raw), free(x);
    return -1;
}

/* BFL tensor b of c in f32: its diffusers sources stacked by rows, the two
 * row halves exchanged when b->swap */
static int read_bfl_f32(const checkpoint *c, const flux2_bfl_tensor *b, float **out, int64_t *n_out) {
    int64_t n = 1;
    for (int i = 0; i < b->ndim; i++) n *= b->shape[i];
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    if (!x) return tp_error("quantize: out of memory assembling tensor '%s' (%lld values)", b->name, (long long)n);
    int64_t off = 0;
    for (int i = 0; i < b->n_src; i++) {
        float *p = NULL;
        int64_t np = 0;
        if (read_f32(c, b->src[i], &p, &np)) return free(x), tp_error_context("quantize: assembling '%s'", b->name);
        if (off + np > n) return free(x), free(p), tp_error("quantize: internal: '%s' overflows", b->name);
        memcpy(x + off, p, (size_t)np * sizeof *x);
        off += np;
        free(p);
    }
    if (off != n) return free(x), tp_error("quantize: internal: '%s' has %lld of %lld values", b->name, (long long)off, (long long)n);
    if (b->swap) {
        int64_t h = n / 2;
        for (int64_t i = 0; i < h; i++) {
            float v = x[i];
            x[i] = x[h + i], x[h + i] = v;
        }
    }
    *out = x, *n_out = n;
    return 0;
}

static int fill(void *vctx, int index, void *buf, uint64_t offset, size_t n) {
    qctx *q = vctx;
    if (q->cur != index) {
        free(q->buf), q->buf = NULL, q->cur = -1;
        float *x = NULL;
        int64_t nv = 0;
        if (q->bt ? read_bfl_f32(q->c, &q->bt[index], &x, &nv) : read_f32(q->c, index, &x, &nv)) return -1;
        const gguf_write_tensor *w = &q->wt[index];
        q->n_buf = (uint64_t)quant_row_bytes(quant_type_get(w->type), w->ne[0]) * (uint64_t)(nv / w->ne[0]);
        q->buf = malloc(q->n_buf ? q->n_buf : 1);
        if (!q->buf) {
            free(x);
            return tp_error("quantize: out of memory for tensor '%s'", w->name);
        }
        gguf_quantize_row(w->type, x, nv, q->buf);
        free(x);
        q->cur = index;
    }
    if (offset + n > q->n_buf) return tp_error("quantize: internal: read past tensor %d", index);
    memcpy(buf, q->buf + offset, n);
    return 0;
}

/* names: 0 default, 1 bfl, 2 keep */
static int run(const char *in, const char *out, int type, int names, int force) {
    if (!path_is_dir(in) && !path_is_file(in))
        return tp_error("quantize: input %s does not exist (give a transformer folder, a .safetensors or a .gguf file)",
                        in);
    if (path_is_dir(out)) return tp_error("quantize: output %s is a folder; give the .gguf file to write", out);
    if (!force && access(out, F_OK) == 0)
        return tp_error("quantize: output %s exists; pass --force to replace it", out);
    char *tmp = xstrdup(out), *dir = dirname(tmp);
    if (!path_is_dir(dir) || access(dir, W_OK)) {
        int e = path_is_dir(dir) ? errno : path_is_file(dir) ? ENOTDIR : ENOENT;
        tp_error("quantize: cannot write to the folder %s of %s: %s (create it, or give a writable folder)", dir,
                 out, strerror(e));
        free(tmp);
        return -1;
    }
    free(tmp);
    checkpoint *c;
    if (checkpoint_open(in, &c)) return tp_error_context("quantize: %s", in);
    if (c->n == 0) {
        checkpoint_close(c);
        return tp_error("quantize: %s holds no tensors", in);
    }
    /* FLUX.3 (diffusers or BFL names): its own recipes (flux3_bfl_names.h), architecture "flux3" */
    const char *bfl3 = NULL;
    int flux3 = flux3_checkpoint_names(c, &bfl3);
    if (names == 0) names = flux2_bfl_is_diffusers(c) || flux3_bfl_is_diffusers(c) ? 1 : 2;
    if (names == 1 && (checkpoint_is_bfl(c) || bfl3)) names = 2;   /* a BFL file or ComfyUI GGUF: already BFL names */
    flux2_bfl_tensor *bt = NULL;
    int n_out = c->n;
    if (names == 1 && (flux3 ? flux3_bfl_names(c, &bt, &n_out) : flux2_bfl_names(c, &bt, &n_out))) {
        checkpoint_close(c);
        return tp_error_context("quantize --names bfl: %s", in);
    }
    gguf_write_tensor *wt = xcalloc((size_t)n_out, sizeof *wt);
    int counts[64] = {0}, rc = 0;
    for (int k = 0; k < n_out && !rc; k++) {
        const char *name = bt ? bt[k].name : c->infos[k]->name;
        int ndim = bt ? bt[k].ndim : c->infos[k]->ndim;
        const int64_t *shape = bt ? bt[k].shape : c->infos[k]->shape;
        int64_t numel = 1;
        for (int i = 0; i < ndim; i++) numel *= shape[i];
        if (ndim > GGUF_MAX_DIMS) {
            rc = tp_error("quantize: tensor '%s' has %d dimensions; GGUF holds at most %d", name, ndim,
                          GGUF_MAX_DIMS);
            break;
        }
        if (numel == 0) {
            rc = tp_error("quantize: tensor '%s' is empty (a dimension of 0); GGUF tensors have every dimension > 0",
                          name);
            break;
        }
        wt[k].name = name;
        wt[k].ndim = ndim ? ndim : 1;
        for (int i = 0; i < GGUF_MAX_DIMS; i++) wt[k].ne[i] = 1;
        for (int i = 0; i < ndim; i++) wt[k].ne[i] = shape[ndim - 1 - i];
        wt[k].type = gguf_quantize_pick(type, wt[k].ndim, wt[k].ne);
        counts[wt[k].type]++;
    }
    if (!rc) {
        gguf_kv kv[1];
        memset(kv, 0, sizeof kv);
        kv[0].key = "general.architecture";
        kv[0].v.type = GGUF_STRING;
        kv[0].v.str.s = flux3 ? "flux3" : "flux";
        kv[0].v.str.len = strlen(kv[0].v.str.s);
        qctx q = {c, wt, bt, -1, NULL, 0};
        rc = gguf_write(out, kv, 1, wt, n_out, fill, &q);
        free(q.buf);
        if (rc) tp_error_context("quantize: writing %s", out);
    }
    if (!rc) {
        printf("tpgen quantize: %s -> %s: %d tensors (%s names):", in, out, n_out, bt ? "BFL" : "kept");
        for (int i = 0; i < 64; i++)
            if (counts[i]) printf(" %d %s", counts[i], quant_type_name(i));
        printf("\n");
    }
    free(wt);
    flux2_bfl_names_free(bt, bt ? n_out : 0);
    checkpoint_close(c);
    return rc;
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL}, *tname = NULL, *nname = NULL;
    int npos = 0, force = 0, rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout);
        if (!strcmp(argv[i], "--force")) { force = 1; continue; }
        if (!strncmp(argv[i], "--", 2)) {
            char k[64];
            const char *v;
            if (cli_flag(argc, argv, &i, "quantize", k, &v)) { rc = -1; break; }
            if (!strcmp(k, "--type")) tname = v;
            else if (!strcmp(k, "--names")) nname = v;
            else rc = tp_error("quantize: unknown option '%s' (see tpgen quantize --help)", k);
            continue;
        }
        if (npos == 2) { rc = tp_error("quantize: one input and one output, got a third argument '%s'", argv[i]); break; }
        pos[npos++] = argv[i];
    }
    int type = -1;
    if (!rc && !tname) rc = tp_error("quantize needs --type T (one of %s)", gguf_quantize_supported_list());
    if (!rc && npos != 2) rc = tp_error("quantize needs IN and OUT.gguf (see tpgen quantize --help)");
    if (!rc) {
        type = gguf_quantize_type_id(tname);
        if (type < 0 || !gguf_quantize_supported(type))
            rc = tp_error("quantize: --type %s is %s; tpgen quantize writes %s", tname,
                          type < 0 ? "not a ggml type" : "not supported yet", gguf_quantize_supported_list());
    }
    int names = 0;
    if (!rc && nname) {
        if (!strcmp(nname, "bfl")) names = 1;
        else if (!strcmp(nname, "keep")) names = 2;
        else rc = tp_error("quantize: --names %s: give bfl (BFL names, ComfyUI-GGUF's layout) or keep", nname);
    }
    if (!rc) rc = run(pos[0], pos[1], type, names, force);
    if (rc) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    return 0;
}
