/* LoRA adapters on weights that stay quantised (fp8 and GGUF): each rank
 * keeps its shard's bytes and adds coef * B(Ax) on its rows and columns
 * (core/formats/lora_merge.c attach_rects, op_gemm's low-rank terms).
 *
 * The reference is independent of that path: the checkpoint's dequantised
 * twin (every tensor as the exact f32 values the fp8 or GGUF decoder gives,
 * written as a plain safetensors file) with the same adapters merged into
 * it in f32 by the merge path that the golden flux2-lora set checks against
 * diffusers. Every case also checks that the adapters change the output by
 * far more than the tolerance, so a LoRA silently left out fails. */
#include "test.h"
#include "golden_case.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include "core/formats/checkpoint.h"
#include "core/formats/gguf.h"
#include "core/formats/lora.h"
#include "core/formats/safetensors.h"
#include "core/formats/weights.h"
#include "core/models/flux2/flux2.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include "lora_dialects_models.h"

static char *gpath(const char *rel) { return xasprintf("%s/%s", test_golden_dir(), rel); }

static int all_ok(MPI_Comm w, int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, w);
    return r;
}

static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    char buf[65536];
    size_t n;
    int rc = a && b ? 0 : -1;
    while (!rc && (n = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, n, b) != n) rc = -1;
    if (a) fclose(a);
    if (b && fclose(b)) rc = -1;
    return rc;
}

/* The dequantised twin of an fp8 transformer folder, in this rank's temp
 * folder: every weight loaded whole on the CPU and copied to f32 (op_copy
 * dequantises fp8 exactly: decode(code) * scale, golden-checked in
 * test_fp8.c), the config copied. */
static char *fp8_twin(const char *src, const char *tag) {
    char *dir = xasprintf("%s/twin-%s", test_tmp_dir(), tag);
    mkdir(dir, 0755);
    backend *be = backend_cpu_create(1);
    checkpoint *ck = NULL;
    weights *w = NULL;
    load_opts o = {.tp = 1, .rank = 0, .be = be, .dtype = DT_F32};
    int rc = checkpoint_open(src, &ck) || weights_load(ck, NULL, &o, &w, NULL) ? -1 : 0;
    int n = rc ? 0 : weights_count(w);
    st_write_tensor *t = xcalloc((size_t)n + 1, sizeof *t);
    float **vals = xcalloc((size_t)n + 1, sizeof *vals);
    for (int i = 0; i < n && !rc; i++) {
        const char *name = weights_name(w, i);
        const tensor *src_t = weights_get(w, name);
        const st_tensor_info *info = weights_info(w, name);
        tensor *f = tensor_new(be, DT_F32, src_t->rows, src_t->cols);
        op_copy(be, f, src_t);
        vals[i] = xmalloc(tensor_numel(f) * sizeof(float));
        rc = tensor_download_f32(f, vals[i]);
        tensor_free(f);
        t[i] = (st_write_tensor){.name = name, .dtype = DT_F32, .ndim = info->ndim, .data = vals[i]};
        for (int d = 0; d < info->ndim; d++) t[i].shape[d] = info->shape[d];
    }
    char *out = xasprintf("%s/diffusion_pytorch_model.safetensors", dir);
    char *cfg_in = xasprintf("%s/config.json", src), *cfg_out = xasprintf("%s/config.json", dir);
    if (!rc) rc = st_write(out, t, n, NULL);
    if (!rc) rc = copy_file(cfg_in, cfg_out);
    CHECK(rc == 0, "twin of %s: %s", src, tp_error_msg());
    for (int i = 0; i < n; i++) free(vals[i]);
    free(vals), free(t), free(out), free(cfg_in), free(cfg_out);
    weights_free(w);
    checkpoint_close(ck);
    backend_destroy(be);
    return dir;
}

/* The same for a GGUF file: gguf_read_f32 (bit-identical to gguf-py's
 * dequantiser, test_gguf.c) of every tensor, BFL names kept. */
static char *gguf_twin(const char *src_file, const char *tag) {
    char *dir = xasprintf("%s/twin-%s", test_tmp_dir(), tag);
    mkdir(dir, 0755);
    gguf_file *g = NULL;
    int rc = gguf_open(src_file, &g);
    int n = rc ? 0 : g->n;
    st_write_tensor *t = xcalloc((size_t)n + 1, sizeof *t);
    float **vals = xcalloc((size_t)n + 1, sizeof *vals);
    for (int i = 0; i < n && !rc; i++) {
        const gguf_tensor *gt;
        rc = gguf_read_f32(g, g->tensors[i].name, &vals[i], &gt);
        if (rc) break;
        t[i] = (st_write_tensor){.name = gt->name, .dtype = DT_F32, .ndim = gt->ndim, .data = vals[i]};
        for (int d = 0; d < gt->ndim; d++) t[i].shape[d] = gt->shape[d];
    }
    char *out = xasprintf("%s/flux2-twin.safetensors", dir);
    if (!rc) rc = st_write(out, t, n, NULL);
    CHECK(rc == 0, "twin of %s: %s", src_file, tp_error_msg());
    for (int i = 0; i < n; i++) free(vals[i]);
    free(vals), free(t), free(out);
    if (g) gguf_close(g);
    return dir;
}

typedef struct inputs {
    int n;
    float *x[3], *txt[3], ts[3], g[3];
    int has_g;
    int32_t *img_ids[3], *txt_ids[3];
    int64_t N[3], L[3];
    int out_ch;
} inputs;

/* the (up to) three cases of a transformer_cases file (guidance only when present) */
static int inputs_read(const char *path, int out_ch, inputs *in) {
    memset(in, 0, sizeof *in);
    in->out_ch = out_ch;
    st_file *f = NULL;
    if (st_open(path, &f)) return -1;
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) {
        char key[64];
        snprintf(key, sizeof key, "case%d.hidden_states", k);
        if (k > 0 && !st_find(f, key)) break;   /* a file of fewer cases */
        float *ts = NULL, *g = NULL;
        const st_tensor_info *ti;
#define K(s) (snprintf(key, sizeof key, "case%d.%s", k, s), key)
        rc = st_read_f32(f, K("hidden_states"), &in->x[k], &ti) || st_read_f32(f, K("encoder_hidden_states"),
                                                                                  &in->txt[k], NULL) ||
             st_read_f32(f, K("timestep"), &ts, NULL) ? -1 : 0;
        if (!rc) {
            in->ts[k] = ts[0];
            in->has_g = st_find(f, K("guidance")) != NULL;
            if (in->has_g && st_read_f32(f, K("guidance"), &g, NULL) == 0) in->g[k] = g[0];
            in->img_ids[k] = golden_ids32(f, K("img_ids"), &in->N[k]);
            in->txt_ids[k] = golden_ids32(f, K("txt_ids"), &in->L[k]);
            if (!in->img_ids[k] || !in->txt_ids[k]) rc = -1;
        }
#undef K
        free(ts), free(g);
        in->n = k + 1;
    }
    st_close(f);
    return rc;
}

static void inputs_free(inputs *in) {
    for (int k = 0; k < in->n; k++) free(in->x[k]), free(in->txt[k]), free(in->img_ids[k]), free(in->txt_ids[k]);
}

/* outputs of the three cases, concatenated (malloc'ed); NULL on failure */
static int terms[2];   /* the last run's LoKr/LoHa blocks kept as structured and as dense terms */

static float *run_cases(const char *dir, backend *be, comm *c, dtype_t prec, const lora_spec *sp, int n_sp,
                        const inputs *in, size_t *n_out) {
    flux2_model *m = NULL;
    lora_set *ls = NULL;
    flux2_load_extras x = {.loras = sp, .n_loras = n_sp, .lora_set_out = &ls};
    if (flux2_load_ex(dir, be, c, prec, &x, &m, NULL)) return NULL;
    terms[0] = ls ? ls->structured_terms : 0, terms[1] = ls ? ls->dense_terms : 0;
    lora_set_free(ls);
    /* bf16: the timestep embedding in f32 as diffusers computes it, as the fp8 golden test does (its
     * argument reaches ~1000, where bf16 rounding alone moves the output by ~0.2) */
    if (prec == DT_BF16) flux2_set_exact_timestep(m, 1);
    size_t total = 0;
    for (int k = 0; k < in->n; k++) total += (size_t)in->N[k] * (size_t)in->out_ch;
    float *out = xmalloc(total * sizeof *out), *p = out;
    int rc = 0;
    for (int k = 0; k < in->n && !rc; k++) {
        rc = flux2_forward(m, in->x[k], in->N[k], in->img_ids[k], in->txt[k], in->L[k], in->txt_ids[k], in->ts[k],
                           in->has_g ? &in->g[k] : NULL, p);
        p += in->N[k] * in->out_ch;
    }
    flux2_free(m);
    if (rc) { free(out); return NULL; }
    *n_out = total;
    return out;
}

/* one model: unmerged on the quantised folder vs merged on the twin, f32
 * (and bf16 against the same f32 reference), the adapters' effect checked */
static void compare(MPI_Comm w, const char *what, const char *qdir, const char *twin, const lora_spec *sp, int n_sp,
                    const inputs *in, int *structured, int *dense) {
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(w, be);
    size_t n1 = 0, n2 = 0, n3 = 0, n4 = 0;
    float *q = run_cases(qdir, be, c, DT_F32, sp, n_sp, in, &n1);
    if (structured) *structured = terms[0], *dense = terms[1];
    CHECK(q, "%s: unmerged on the quantised weights: %s", what, tp_error_msg());
    float *ref = all_ok(w, q != NULL) ? run_cases(twin, be, c, DT_F32, sp, n_sp, in, &n2) : NULL;
    CHECK(!q || ref, "%s: merged on the twin: %s", what, tp_error_msg());
    float *base = all_ok(w, ref != NULL) ? run_cases(twin, be, c, DT_F32, NULL, 0, in, &n3) : NULL;
    float *qb = all_ok(w, base != NULL) ? run_cases(qdir, be, c, DT_BF16, sp, n_sp, in, &n4) : NULL;
    CHECK(!base || qb, "%s: bf16: %s", what, tp_error_msg());
    if (q && ref && base && qb && n1 == n2 && n2 == n3 && n3 == n4) {
        double e = rel_l2(q, ref, n1), effect = rel_l2(base, ref, n1), eb = rel_l2(qb, ref, n1);
        CHECK(e <= 1e-5, "%s tp %d: f32 unmerged vs merged twin rel_err %.3g > 1e-5", what, c->size, e);
        CHECK(eb <= 3e-2, "%s tp %d: bf16 unmerged vs merged f32 twin rel_err %.3g > 3e-2", what, c->size, eb);
        CHECK(effect > 100 * 1e-5, "%s: the adapters change the output by only %.3g (the test could not fail)",
              what, effect);
        if (c->rank == 0) printf("# %s tp %d: f32 %.2e, bf16 %.2e (adapters move the output %.2e)\n", what,
                                 c->size, e, eb, effect);
    } else if (q && ref && base && qb) {
        CHECK(0, "%s: output sizes differ (%zu %zu %zu %zu)", what, n1, n2, n3, n4);
    }
    free(q), free(ref), free(base), free(qb);
    comm_destroy(c);
    backend_destroy(be);
}

/* The golden fp8 variants of flux2-tiny-a (per-tensor scaled, per-channel,
 * raw e5m2) with the golden adapters: PEFT r8 at 0.7 + kohya at -0.3 (the
 * "two" case), and ai-toolkit's fused BFL qkv. tp = world (1, 2, 4). */
TEST_MPI(lora_unmerged_fp8) {
    const char *variants[] = {"scaled", "channel", "e5m2"};
    const char *cases[][3] = {{"two", "adapters/peft_r8.safetensors", "adapters/kohya_r4.safetensors"},
                              {"aitk", "adapters/aitk_r4.safetensors", NULL}};
    double weights[][2] = {{0.7, -0.3}, {1.0, 0}};
    char *cases_path = gpath("flux2-tiny-a/transformer_cases.safetensors");
    inputs in;
    int ok = inputs_read(cases_path, 32, &in) == 0;
    CHECK(ok, "%s: %s", cases_path, tp_error_msg());
    for (int v = 0; v < 3 && all_ok(MPI_COMM_WORLD, ok); v++) {
        char *rel = xasprintf("flux2-fp8/%s/transformer", variants[v]);
        char *qdir = gpath(rel), *twin = fp8_twin(qdir, variants[v]);
        for (int k = 0; k < 2; k++) {
            lora_spec sp[2];
            int n = 0;
            for (int i = 0; i < 2 && cases[k][1 + i]; i++, n++) {
                char *r = xasprintf("flux2-lora/%s", cases[k][1 + i]);
                sp[i] = (lora_spec){gpath(r), weights[k][i]};
                free(r);
            }
            char what[64];
            snprintf(what, sizeof what, "fp8 %s + %s", variants[v], cases[k][0]);
            compare(MPI_COMM_WORLD, what, qdir, twin, sp, n, &in, NULL, NULL);
            for (int i = 0; i < n; i++) free(sp[i].path);
        }
        free(rel), free(qdir), free(twin);
    }
    inputs_free(&in);
    free(cases_path);
}

/* ---- a random PEFT adapter for the golden GGUF model ---- */

static uint64_t lcg = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) * (1.0 / 16777216.0) * 2 - 1) * 0.2f;
}

/* diffusers module names (the checkpoint is BFL-named: to_q is a third of
 * the fused qkv, to_qkv_mlp_proj the packed linear1), every parallel style:
 * colwise, packed colwise, rowwise (half a Q4_K block a rank at tp 2),
 * packed rowwise */
static char *write_gguf_adapter(const char *dir) {
    struct { const char *m; int64_t out, in; } mods[] = {
        {"transformer_blocks.0.attn.to_q", 256, 256},
        {"transformer_blocks.0.attn.to_out.0", 256, 256},
        {"transformer_blocks.0.ff.linear_in", 1536, 256},
        {"transformer_blocks.0.ff.linear_out", 256, 768},
        {"transformer_blocks.0.attn.add_k_proj", 256, 256},
        {"single_transformer_blocks.0.attn.to_qkv_mlp_proj", 2304, 256},
        {"single_transformer_blocks.0.attn.to_out", 256, 1024},
    };
    enum { NM = sizeof mods / sizeof mods[0], R = 8 };
    st_write_tensor t[2 * NM];
    char names[2 * NM][128];
    for (int i = 0; i < NM; i++) {
        for (int ab = 0; ab < 2; ab++) {
            int64_t r = ab ? mods[i].out : R, c = ab ? R : mods[i].in;
            float *f = xmalloc((size_t)(r * c) * sizeof *f);
            for (int64_t e = 0; e < r * c; e++) f[e] = frand();
            snprintf(names[2 * i + ab], sizeof names[0], "transformer.%s.lora_%c.weight", mods[i].m, ab ? 'B' : 'A');
            t[2 * i + ab] = (st_write_tensor){.name = names[2 * i + ab], .dtype = DT_F32, .ndim = 2, .data = f};
            t[2 * i + ab].shape[0] = r, t[2 * i + ab].shape[1] = c;
        }
    }
    char *path = xasprintf("%s/gguf-lora.safetensors", dir);
    int rc = st_write(path, t, 2 * NM, NULL);
    CHECK(rc == 0, "write %s: %s", path, tp_error_msg());
    for (int i = 0; i < 2 * NM; i++) free((void *)t[i].data);
    return path;
}

/* The golden GGUF transformers (Q4_K, mixed: Q6_K/Q4_K/Q8_0/BF16/F16/F32)
 * with a random rank-8 adapter at weight 0.8, at tp 1 and 2 (the model has
 * 2 heads: at np 4, ranks 0-1 run it as one group of 2 while 2-3 run tp 1
 * each). */
TEST_MPI(lora_unmerged_gguf) {
    int wr, ws;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    MPI_Comm w;
    MPI_Comm_split(MPI_COMM_WORLD, ws >= 2 ? (wr < 2 ? 0 : 1 + wr) : 0, wr, &w);
    char *cases_path = gpath("flux2-gguf/transformer_cases.safetensors");
    inputs in;
    int ok = inputs_read(cases_path, 64, &in) == 0;
    CHECK(ok, "%s: %s", cases_path, tp_error_msg());
    char *ad = write_gguf_adapter(test_tmp_dir());
    const char *variants[] = {"Q4_K", "mixed"};
    for (int v = 0; v < 2 && all_ok(w, ok); v++) {
        char *rel = xasprintf("flux2-gguf/%s/transformer", variants[v]);
        char *qdir = gpath(rel), *file = xasprintf("%s/flux2-tiny-%s.gguf", qdir, variants[v]);
        char *twin = gguf_twin(file, variants[v]);
        lora_spec sp = {ad, 0.8};
        char what[64];
        snprintf(what, sizeof what, "gguf %s + random PEFT r8", variants[v]);
        compare(w, what, qdir, twin, &sp, 1, &in, NULL, NULL);
        free(rel), free(qdir), free(file), free(twin);
    }
    free(ad);
    inputs_free(&in);
    free(cases_path);
    MPI_Comm_free(&w);
}

/* The same adapter as a file for tests/sh/lora.sh (TPGEN_LORA_GGUF_OUT=DIR),
 * checked to open against the GGUF checkpoint with every module mapped. */
TEST(lora_gguf_adapter_file) {
    const char *env = getenv("TPGEN_LORA_GGUF_OUT");
    char *ad = write_gguf_adapter(env ? env : test_tmp_dir());
    char *dir = gpath("flux2-gguf/mixed/transformer");
    checkpoint *ck = NULL;
    lora_set *ls = NULL;
    lora_spec sp = {ad, 1.0};
    REQUIRE(checkpoint_open(dir, &ck) == 0, "%s", tp_error_msg());
    CHECK(lora_set_open(&sp, 1, ck, 0, &ls) == 0 && ls->ad[0].n_modules == 7, "%s", tp_error_msg());
    lora_set_free(ls);
    checkpoint_close(ck);
    free(ad), free(dir);
}

/* ---- the adapter dialects (LoKr, LoHa, fal) on fp8 and GGUF weights ----
 * The flux2-lora-dialects klein (tests/test_lora_dialects.c regenerates it;
 * TPGEN_LORA_DIALECTS_MODELS names a folder that holds it already) written as
 * raw E4M3 (every 2-D weight; nearest code, s = 1) and, when
 * TPGEN_LORA_DIALECTS_GGUF names it (tests/sh/lora_dialects.sh: `tpgen
 * quantize --type Q8_0`, BFL names), as GGUF; each against its dequantised
 * twin with the same adapters merged. A LoKr/LoHa on quantised weights is a
 * structured low-rank term of the shard's block, or a dense one where that
 * is no cheaper (lora_merge.c attach_structured). */

static float e4m3_value(int c) {
    int e = (c >> 3) & 15, m = c & 7;
    float v = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
    return (c & 0x80) ? -v : v;
}

static uint8_t e4m3_nearest(float x) {
    int best = 0;
    float bd = INFINITY;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;   /* NaN */
        float d = fabsf(e4m3_value(c) - x);
        if (d < bd) bd = d, best = c;
    }
    return (uint8_t)best;
}

static char *write_fp8_model(const char *src) {
    char *dir = xasprintf("%s/fp8-dialects", test_tmp_dir());
    mkdir(dir, 0755);
    checkpoint *ck = NULL;
    if (checkpoint_open(src, &ck)) {
        CHECK(0, "%s", tp_error_msg());
        free(dir);
        return NULL;
    }
    st_write_tensor *t = xcalloc((size_t)ck->n, sizeof *t);
    void **bufs = xcalloc((size_t)ck->n, sizeof *bufs);
    int rc = 0;
    for (int i = 0; i < ck->n && !rc; i++) {
        const st_tensor_info *ti = ck->infos[i];
        float *v = NULL;
        int64_t n = st_numel(ti);
        const st_file *f = NULL;
        checkpoint_find(ck, ti->name, &f);
        rc = f ? st_read_f32(f, ti->name, &v, NULL) : -1;
        t[i] = (st_write_tensor){.name = ti->name, .dtype = ti->ndim == 2 ? DT_F8_E4M3 : DT_F32, .ndim = ti->ndim};
        for (int d = 0; d < ti->ndim; d++) t[i].shape[d] = ti->shape[d];
        if (!rc && ti->ndim == 2) {
            uint8_t *q = xmalloc((size_t)n);
            for (int64_t j = 0; j < n; j++) q[j] = e4m3_nearest(v[j]);
            free(v);
            bufs[i] = q;
        } else {
            bufs[i] = v;
        }
        t[i].data = bufs[i];
    }
    char *out = xasprintf("%s/diffusion_pytorch_model.safetensors", dir), *cfg = xasprintf("%s/config.json", src),
         *cfg_out = xasprintf("%s/config.json", dir);
    if (!rc) rc = st_write(out, t, ck->n, NULL);
    if (!rc) rc = copy_file(cfg, cfg_out);
    CHECK(rc == 0, "fp8 model: %s", tp_error_msg());
    for (int i = 0; i < ck->n; i++) free(bufs[i]);
    free(bufs), free(t), free(out), free(cfg), free(cfg_out);
    checkpoint_close(ck);
    return dir;
}

TEST_MPI(lora_dialects_unmerged) {
    const char *env = getenv("TPGEN_LORA_DIALECTS_MODELS"), *gguf = getenv("TPGEN_LORA_DIALECTS_GGUF");
    char *models = env ? xstrdup(env) : xasprintf("%s/dialect-models", test_tmp_dir());
    if (!env) REQUIRE(lora_dialects_write_models(models) == 0, "%s", tp_error_msg());
    char *src = xasprintf("%s/transformer", models), *cases = gpath("flux2-lora-dialects/cases_klein.safetensors");
    inputs in;
    int ok = inputs_read(cases, 128, &in) == 0;
    CHECK(ok, "%s: %s", cases, tp_error_msg());
    static const char *ads[][2] = {{"lycoris_lokr_full", "comfy_bfl_loha"}, {"comfy_bfl_lokr_lowrank", "lycoris_loha"},
                                   {"lycoris_lokr_bothlowrank", "fal_klein_peft"}};
    char *fp8 = all_ok(MPI_COMM_WORLD, ok) ? write_fp8_model(src) : NULL;
    char *gdir = gguf ? xstrdup(gguf) : NULL, *slash = gdir ? strrchr(gdir, '/') : NULL;
    if (slash) *slash = 0;
    int wr;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    if (!gguf && wr == 0) printf("# GGUF: TPGEN_LORA_DIALECTS_GGUF not set (tests/sh/lora_dialects.sh sets it)\n");
    for (int q = 0; q < 2 && fp8; q++) {
        if (q == 1 && !gguf) break;
        char *twin = q == 0 ? fp8_twin(fp8, "dialects-fp8") : gguf_twin(gguf, "dialects-gguf");
        for (int k = 0; k < 3; k++) {
            lora_spec sp[2];
            for (int i = 0; i < 2; i++) {
                char *r = xasprintf("flux2-lora-dialects/adapters/%s.safetensors", ads[k][i]);
                sp[i] = (lora_spec){gpath(r), i ? -0.6 : 0.8};
                free(r);
            }
            char what[128];
            snprintf(what, sizeof what, "%s + %s 0.8 + %s -0.6", q ? "GGUF Q8_0" : "fp8 raw E4M3", ads[k][0], ads[k][1]);
            int st = 0, de = 0;
            compare(MPI_COMM_WORLD, what, q ? gdir : fp8, twin, sp, 2, &in, &st, &de);
            /* the low-rank LoKr (R1·R2 = 4·4) and LoHa (4·4) blocks stay structured; the LoKr of two full
             * factors (rank 8·16 = the 128 columns) is no cheaper than its block and goes dense */
            CHECK(st > 0 && (k > 0 || de > 0), "%s: %d structured and %d dense terms", what, st, de);
            if (wr == 0) printf("# %s: %d structured, %d dense terms on this rank\n", what, st, de);
            free(sp[0].path), free(sp[1].path);
        }
        free(twin);
    }
    inputs_free(&in);
    free(models), free(src), free(cases), free(fp8), free(gdir);
}
