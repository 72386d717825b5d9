/* FLUX.3 transformers stored as GGUF (docs/flux3.md "GGUF"): the golden
 * flux3-tiny models written as GGUF here with tpgen's quantisers (Q8_0 in
 * diffusers and BFL names, and a mixed file: the i-th tensor in name order
 * asks for Q4_0, Q5_1, Q8_0, F16, as tests/tools/flux3_gguf_golden.py
 * writes it with gguf-py; tests/sh/flux3_gguf.sh checks the bytes against
 * gguf-py's sha256 and runs `tpgen check` against diffusers on gguf-py's
 * dequantised weights). Here, per rank at tp 1, 2, 3 (mpirun -np 1, 2, 3/4):
 * the bytes each rank reads equal the covering-blocks formula computed
 * from the tensor names (independent of the plan engine), the block
 * linears stay quantised, and the forward equals the dequantised twin's
 * (an F32 safetensors file of gguf_read_f32's values) within 1e-6; the
 * BFL-named GGUF gives the diffusers-named one's output bit for bit; a
 * wider random model (D 256) carries Q4_K/Q5_K/Q6_K through tp 1, 2, 4. */
#include "test.h"
#include "flux3_case.h"
#include "gguf_twin.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "core/models/flux3/flux3.h"
#include "core/models/flux3/flux3_bfl_names.h"
#include "core/formats/checkpoint.h"
#include "core/formats/gguf.h"
#include "core/formats/gguf_quantize.h"
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };
static const int k_mix[4] = {T_Q4_0, T_Q5_1, T_Q8_0, T_F16};
static const int k_kmix[3] = {T_Q4_K, T_Q5_K, T_Q6_K};

/* Write the golden FLUX.3 transformer of `variant` as the GGUF `out`:
 * type T for every tensor (mixed: k_mix[i % 4] by name order), typed by
 * gguf_quantize_pick as `tpgen quantize` does; bfl: BFL names
 * (flux3_bfl_names, norm_out's halves swapped); drop: a tensor left out. */
static int write_gguf_from(const char *src, const char *out, int type, const int *mix, int n_mix, int bfl,
                           const char *drop) {
    checkpoint *c = NULL;
    flux2_bfl_tensor *bt = NULL;
    int n = 0, rc = checkpoint_open(src, &c);
    if (!rc) n = c->n;
    if (!rc && bfl) rc = flux3_bfl_names(c, &bt, &n);
    gguf_write_tensor *wt = xcalloc((size_t)n + 1, sizeof *wt);
    void **bufs = xcalloc((size_t)n + 1, sizeof *bufs);
    int m = 0;
    for (int i = 0; !rc && i < n; i++) {
        int k = bt ? bt[i].src[0] : i;
        const st_tensor_info *ti = c->infos[k];
        const char *name = bt ? bt[i].name : ti->name;
        if (drop && !strcmp(name, drop)) continue;
        float *x;
        const st_tensor_info *info;
        if ((rc = st_read_f32(c->files[c->file_of[k]], ti->name, &x, &info))) break;
        int64_t nv = st_numel(ti);
        if (bt && bt[i].swap)
            for (int64_t j = 0; j < nv / 2; j++) {
                float v = x[j];
                x[j] = x[nv / 2 + j], x[nv / 2 + j] = v;
            }
        gguf_write_tensor *w = &wt[m];
        w->name = name;
        w->ndim = ti->ndim;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) w->ne[d] = 1;
        for (int d = 0; d < ti->ndim; d++) w->ne[d] = ti->shape[ti->ndim - 1 - d];
        w->type = gguf_quantize_pick(mix ? mix[i % n_mix] : type, w->ndim, w->ne);
        size_t nb = (size_t)quant_row_bytes(quant_type_get(w->type), w->ne[0]) * (size_t)(nv / w->ne[0]);
        bufs[m] = xmalloc(nb);
        gguf_quantize_row(w->type, x, nv, bufs[m]);
        w->data = bufs[m++];
        free(x);
    }
    if (!rc) {
        gguf_kv kv = {.key = "general.architecture", .v = {.type = GGUF_STRING, .str = {5, "flux3"}}};
        rc = gguf_write(out, &kv, 1, wt, m, NULL, NULL);
    }
    for (int i = 0; i < m; i++) free(bufs[i]);
    free(bufs), free(wt);
    flux2_bfl_names_free(bt, bt ? n : 0);
    checkpoint_close(c);
    return rc;
}

static int write_gguf(const char *variant, const char *out, int type, int mixed, int bfl, const char *drop) {
    char *src = xasprintf("%s/flux3-tiny/%s/model/transformer", test_golden_dir(), variant);
    int rc = write_gguf_from(src, out, type, mixed ? k_mix : NULL, 4, bfl, drop);
    free(src);
    return rc;
}

static int write_random_flux3(const char *dir);

/* With TPGEN_F3GGUF_RANDOM=DIR it writes the random D 256 FLUX.3 of
 * flux3_gguf_kquants (config.json + safetensors) into DIR (tests/sh/flux3_gguf.sh
 * quantises it to K-quants; tests/tools/flux3_gguf_golden.py draws the same
 * values). With TPGEN_F3GGUF_OUT=FILE.gguf (TPGEN_F3GGUF_VARIANT base|flowmap,
 * TPGEN_F3GGUF_TYPE mixed (default) or a type name, TPGEN_F3GGUF_BFL=1 for
 * BFL names, TPGEN_F3GGUF_DROP=NAME to leave a tensor out) it writes that
 * file for tests/sh/flux3_gguf.sh, and with TPGEN_F3GGUF_TWIN=FILE also the
 * file's dequantised twin. Always: the mixed base file holds every type of
 * the mix in the places the rule gives. */
TEST(flux3_gguf_write) {
    const char *out = getenv("TPGEN_F3GGUF_OUT"), *var = getenv("TPGEN_F3GGUF_VARIANT");
    const char *tn = getenv("TPGEN_F3GGUF_TYPE"), *b = getenv("TPGEN_F3GGUF_BFL"), *drop = getenv("TPGEN_F3GGUF_DROP");
    const char *twin = getenv("TPGEN_F3GGUF_TWIN"), *rnd = getenv("TPGEN_F3GGUF_RANDOM");
    if (rnd) {
        mkdir(rnd, 0755);
        REQUIRE(write_random_flux3(rnd) == 0, "%s", tp_error_msg());
    }
    if (out) {
        int mixed = !tn || !strcmp(tn, "mixed"), type = mixed ? -1 : gguf_quantize_type_id(tn);
        REQUIRE(mixed || (type >= 0 && gguf_quantize_supported(type)), "TPGEN_F3GGUF_TYPE %s", tn);
        REQUIRE(write_gguf(var && *var ? var : "base", out, type, mixed, b && !strcmp(b, "1"), drop) == 0, "%s",
                tp_error_msg());
        if (twin) REQUIRE(gguf_twin_write(out, twin) == 0, "%s", tp_error_msg());
    }
    char *p = xasprintf("%s/mixed.gguf", test_tmp_dir());
    REQUIRE(write_gguf("base", p, -1, 1, 0, NULL) == 0, "%s", tp_error_msg());
    gguf_file *g;
    REQUIRE(gguf_open(p, &g) == 0, "%s", tp_error_msg());
    int count[40] = {0}, bad = 0;
    for (int i = 0; i < g->n; i++) {
        const gguf_tensor *t = &g->tensors[i];
        int ask = k_mix[i % 4], bs = quant_type_get(ask)->block;
        int64_t nv = t->ne[0] * t->rows;
        int want = t->ndim == 1 || nv <= 1024 ? T_F32 : t->ne[0] % bs ? T_F16 : ask;
        bad += t->type != want;
        count[t->type]++;
        if (i && strcmp(g->tensors[i - 1].name, t->name) >= 0) bad++;   /* name order */
    }
    CHECK(!bad && count[T_Q4_0] && count[T_Q5_1] && count[T_Q8_0] && count[T_F16] && count[T_F32],
          "mixed file: %d tensors off the rule; Q4_0 %d Q5_1 %d Q8_0 %d F16 %d F32 %d", bad, count[T_Q4_0],
          count[T_Q5_1], count[T_Q8_0], count[T_F16], count[T_F32]);
    gguf_close(g);
    free(p);
}

/* 0 replicated, 1 colwise (whole rows: q, k, v; mlp_in packed [gate; up],
 * whole rows too), 2 rowwise (attn out, mlp out), from the name alone */
static int style_of(const char *n) {
    static const char *const col[] = {".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight",
                                      ".ff.linear_in.weight", ".q_proj.weight", ".k_proj.weight",
                                      ".v_proj.weight", ".mlp_in.weight"};
    static const char *const row[] = {".attn.to_out.0.weight", ".ff.linear_out.weight", ".attn_out.weight",
                                      ".mlp_out.weight"};
    size_t l = strlen(n);
    for (size_t i = 0; i < sizeof col / sizeof col[0]; i++)
        if (l > strlen(col[i]) && !strcmp(n + l - strlen(col[i]), col[i])) return 1;
    for (size_t i = 0; i < sizeof row / sizeof row[0]; i++)
        if (l > strlen(row[i]) && !strcmp(n + l - strlen(row[i]), row[i])) return 2;
    return 0;
}

/* the bytes rank `rank` of tp reads from the GGUF file: replicated all,
 * colwise rows/tp whole rows, rowwise rows x (ceil(c1/bs) - floor(c0/bs))
 * blocks of its columns [c0, c1); *held: the bytes it then holds in f32
 * (blocks as read, F16/F32 tensors as f32) */
static uint64_t formula(const char *path, int tp, int rank, uint64_t *held) {
    gguf_file *g;
    if (gguf_open(path, &g)) return 0;
    uint64_t b = 0;
    *held = 0;
    for (int i = 0; i < g->n; i++) {
        const gguf_tensor *t = &g->tensors[i];
        int s = style_of(t->name);
        int64_t bs = t->qt->block, R = t->rows, C = t->row_len;
        uint64_t x = s == 0 ? (uint64_t)R * t->row_bytes : s == 1 ? (uint64_t)(R / tp) * t->row_bytes : 0;
        if (s == 2) {
            int64_t c0 = rank * (C / tp), c1 = c0 + C / tp;
            x = (uint64_t)R * (uint64_t)((c1 + bs - 1) / bs - c0 / bs) * t->qt->bytes;
        }
        b += x;
        *held += bs > 1 ? x : x / t->qt->bytes * 4;
    }
    gguf_close(g);
    return b;
}

static int all_ok(int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

/* per rank of tp 1, 2, 3: bytes read = the formula; forward = the twin's
 * (within 1e-6, all 4 golden cases, 2 with references); BFL names = the
 * diffusers names bit for bit */
static void shards_and_twin(const char *variant) {
    int tp, wrank;
    MPI_Comm g = f3_tp_group(6, &tp);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    backend *be = backend_cpu_create(1);
    comm *cm = comm_create_mpi(g, be);
    const char *kinds[3] = {"Q8_0", "mixed", "Q8_0-bfl"};
    char *dirs[3], *twin = xasprintf("%s/f3gguf-%s-%d-twin", test_tmp_dir(), variant, wrank);
    mkdir(twin, 0755);
    int rc = 0;
    for (int i = 0; i < 3; i++) {
        dirs[i] = xasprintf("%s/f3gguf-%s-%d-%s", test_tmp_dir(), variant, wrank, kinds[i]);
        mkdir(dirs[i], 0755);
        char *f = xasprintf("%s/x.gguf", dirs[i]);
        if (!rc) rc = write_gguf(variant, f, T_Q8_0, i == 1, i == 2, NULL);
        if (!rc && i == 1) {
            char *t = xasprintf("%s/x.safetensors", twin);
            rc = gguf_twin_write(f, t);
            free(t);
        }
        free(f);
    }
    CHECK(rc == 0, "%s: writing the GGUF files: %s", variant, tp_error_msg());
    flux3_model *m[3] = {NULL, NULL, NULL}, *mt = NULL;
    st_file *cf = NULL;
    int grank;
    MPI_Comm_rank(g, &grank);
    for (int i = 0; i < 3 && rc == 0; i++) {
        load_stats st = {0};
        size_t before = be->bytes_in_use;
        rc = flux3_load(dirs[i], be, cm, DT_F32, &m[i], &st);
        size_t held = be->bytes_in_use - before;
        CHECK(rc == 0, "%s %s: %s", variant, kinds[i], tp_error_msg());
        if (rc) break;
        char *f = xasprintf("%s/x.gguf", dirs[i]);
        uint64_t want_held = 0, want = formula(f, tp, grank, &want_held);
        CHECK(st.bytes_read == want && want > 0, "%s %s tp %d rank %d: read %llu bytes, formula %llu", variant,
              kinds[i], tp, grank, (unsigned long long)st.bytes_read, (unsigned long long)want);
        CHECK(held == want_held, "%s %s tp %d rank %d: holds %zu bytes, blocks + f32 of the rest %llu: the block "
              "linears are not kept quantised", variant, kinds[i], tp, grank, held, (unsigned long long)want_held);
        if (getenv("TPGEN_TEST_VERBOSE"))
            printf("# %s %s tp %d rank %d: bytes read %llu = formula %llu, held %zu\n", variant, kinds[i], tp, grank,
                   (unsigned long long)st.bytes_read, (unsigned long long)want, held);
        free(f);
    }
    if (!rc) rc = flux3_load(twin, be, cm, DT_F32, &mt, NULL);
    char *cases = xasprintf("%s/flux3-tiny/%s/transformer_cases.safetensors", test_golden_dir(), variant);
    if (!rc) rc = st_open(cases, &cf);
    CHECK(rc == 0, "%s: loading: %s", variant, tp_error_msg());
    if (!all_ok(rc == 0)) goto out;
    int n_refs = 0;
    for (int k = 0; k < 4; k++) {
        f3_case cs;
        int ok = f3_case_read(cf, k, &cs) == 0;
        CHECK(ok, "%s case%d: %s", variant, k, tp_error_msg());
        if (!all_ok(ok)) break;
        n_refs += cs.R > 0;
        size_t n = (size_t)cs.N * 32;
        float *y[4];
        flux3_inputs in = f3_case_inputs(&cs);
        for (int i = 0; i < 3; i++) {
            y[i] = malloc(n * 4);
            if (!rc) rc = flux3_forward(m[i], &in, y[i]);
        }
        y[3] = malloc(n * 4);
        if (!rc) rc = flux3_forward(mt, &in, y[3]);
        CHECK(rc == 0, "%s case%d forward: %s", variant, k, tp_error_msg());
        if (!rc) {
            double e = rel_l2(y[1], y[3], n), eg = rel_l2(y[1], cs.ref, n), eq = rel_l2(y[0], cs.ref, n);
            CHECK(e <= 1e-6, "%s tp %d case%d (R %lld): mixed GGUF vs its dequantised twin %.3g > 1e-6", variant, tp,
                  k, (long long)cs.R, e);
            CHECK(eg > 1e-4 && eq > 1e-4, "%s case%d: GGUF output %.3g / %.3g from the unquantised: not quantised",
                  variant, k, eq, eg);
            CHECK(!memcmp(y[0], y[2], n * 4), "%s tp %d case%d: the BFL-named GGUF differs from the diffusers-named",
                  variant, tp, k);
            if (getenv("TPGEN_TEST_VERBOSE") && grank == 0)
                printf("# %s tp %d case%d R=%lld mixed-twin %.3e Q8_0-golden %.3e mixed-golden %.3e\n", variant, tp, k,
                       (long long)cs.R, e, eq, eg);
        }
        for (int i = 0; i < 4; i++) free(y[i]);
        f3_case_free(&cs);
        if (!all_ok(rc == 0)) break;
    }
    CHECK(n_refs == 2, "%s: expected 2 cases with references, read %d", variant, n_refs);
out:
    if (cf) st_close(cf);
    for (int i = 0; i < 3; i++) flux3_free(m[i]), free(dirs[i]);
    flux3_free(mt);
    comm_destroy(cm);
    backend_destroy(be);
    MPI_Comm_free(&g);
    free(cases), free(twin);
}

TEST_MPI(flux3_gguf_shards_base) { shards_and_twin("base"); }
TEST_MPI(flux3_gguf_shards_flowmap) { shards_and_twin("flowmap"); }

/* ---- K-quants: a random FLUX.3 wide enough for 256-value blocks ---- */

/* D 256 = 4 heads x 64, M 768, one mode and one single block, joint 80,
 * 32 channels: every block linear has rows of 256 or 768 values, so the
 * K-quants apply, and at tp 2 / 4 the row-parallel shards are half / a
 * quarter of a block (to_out.0) and 1.5 / 0.75 blocks (ff.linear_out). */
static int write_random_flux3(const char *dir) {
    enum { D = 256, M = 768, CT = 32, J = 80, CIN = 32, HD = 64 };
    static const char *const modes[3] = {"txt", "image", "image_cond"};
    static const char *const blocks[4] = {"txt_mode_blocks.0", "mode_blocks.image.0", "mode_blocks.image_cond.0",
                                          "single_transformer_blocks.0"};
    struct { char name[96]; int64_t r, c; } t[64];
    int n = 0;
#define ADD(R, C, ...) (snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__), t[n].r = (R), t[n].c = (C), n++)
    ADD(D, CT, "timestep_embedder.linear_1.weight");
    ADD(D, D, "timestep_embedder.linear_2.weight");
    for (int k = 0; k < 3; k++) {
        ADD(3 * D, D, "early_stream_modulations.%s.linear.weight", modes[k]);
        ADD(3 * D, D, "single_stream_modulations.%s.linear.weight", modes[k]);
    }
    ADD(D, J, "context_embedder.weight");
    ADD(D, CIN, "x_embedders.image.weight");
    ADD(D, CIN, "x_embedders.image_cond.weight");
    ADD(2 * D, D, "norm_out.linear.weight");
    ADD(CIN, D, "proj_out.weight");
    for (int b = 0; b < 4; b++) {
        ADD(D, D, "%s.attn.to_q.weight", blocks[b]);
        ADD(D, D, "%s.attn.to_k.weight", blocks[b]);
        ADD(D, D, "%s.attn.to_v.weight", blocks[b]);
        ADD(D, D, "%s.attn.to_out.0.weight", blocks[b]);
        ADD(0, HD, "%s.attn.norm_q.weight", blocks[b]);
        ADD(0, HD, "%s.attn.norm_k.weight", blocks[b]);
        ADD(2 * M, D, "%s.ff.linear_in.weight", blocks[b]);
        ADD(D, M, "%s.ff.linear_out.weight", blocks[b]);
    }
#undef ADD
    st_write_tensor w[64];
    float *vals[64];
    uint64_t s = 0x243F6A8885A308D3ull;
    for (int i = 0; i < n; i++) {
        int64_t nv = (t[i].r ? t[i].r : 1) * t[i].c;
        vals[i] = xmalloc((size_t)nv * sizeof(float));
        float scale = t[i].r ? sqrtf(3.0f / (float)t[i].c) : 0.1f, off = t[i].r ? 0.0f : 1.0f;
        for (int64_t j = 0; j < nv; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            vals[i][j] = off + scale * (2.0f * (float)(s >> 40) / 16777216.0f - 1.0f);
        }
        w[i] = (st_write_tensor){.name = t[i].name, .dtype = DT_F32, .ndim = t[i].r ? 2 : 1,
                                 .shape = {t[i].r ? t[i].r : t[i].c, t[i].c}, .data = vals[i]};
    }
    char *p = xasprintf("%s/diffusion_pytorch_model.safetensors", dir);
    int rc = st_write(p, w, n, NULL);
    free(p);
    for (int i = 0; i < n; i++) free(vals[i]);
    p = xasprintf("%s/config.json", dir);
    FILE *f = rc ? NULL : fopen(p, "w");
    if (f) {
        fprintf(f, "{\"_class_name\": \"Flux3Transformer2DModel\", \"in_channels\": %d, \"cond_in_channels\": %d, "
                   "\"num_layers\": 1, \"num_single_layers\": 1, \"attention_head_dim\": %d, "
                   "\"num_attention_heads\": %d, \"joint_attention_dim\": %d, \"timestep_channels\": %d, "
                   "\"mlp_ratio\": 3.0, \"axes_dims_rope\": [16, 16, 16, 16], \"flow_map\": false}\n",
                CIN, CIN, HD, D / HD, J, CT);
        rc = fclose(f) ? -1 : 0;
    } else if (!rc) rc = tp_error("cannot write %s", p);
    free(p);
    return rc;
}

/* seeded inputs: 8 image tokens, 5 text, 3 references */
static int forward_k(flux3_model *m, float *out) {
    enum { N = 8, L = 5, R = 3 };
    static float x[N * 32], txt[L * 80], cond[R * 32];
    static int32_t img_ids[N * 4], txt_ids[L * 4], cond_ids[R * 4];
    for (int i = 0; i < N * 32; i++) x[i] = sinf(0.37f * (float)i);
    for (int i = 0; i < L * 80; i++) txt[i] = cosf(0.11f * (float)i);
    for (int i = 0; i < R * 32; i++) cond[i] = sinf(0.23f * (float)i + 1);
    for (int i = 0; i < N; i++) img_ids[4 * i] = 0, img_ids[4 * i + 1] = 0, img_ids[4 * i + 2] = i / 4, img_ids[4 * i + 3] = i % 4;
    for (int i = 0; i < L; i++) txt_ids[4 * i] = 0, txt_ids[4 * i + 1] = 0, txt_ids[4 * i + 2] = 0, txt_ids[4 * i + 3] = i;
    for (int i = 0; i < R; i++) cond_ids[4 * i] = 0, cond_ids[4 * i + 1] = 0, cond_ids[4 * i + 2] = i, cond_ids[4 * i + 3] = -1;
    flux3_inputs in = {.x = x, .N = N, .img_ids = img_ids, .txt = txt, .L = L, .txt_ids = txt_ids, .cond = cond,
                       .R = R, .cond_ids = cond_ids, .timestep = 0.625f};
    return flux3_forward(m, &in, out);
}

/* A K-quant FLUX.3 GGUF (Q4_K, Q5_K, Q6_K by name order) at tp 1, 2, 4:
 * bytes read = the formula (shards of half / a quarter of a block), the
 * block linears held quantised, the forward = the dequantised twin's in
 * f32 (1e-6) and within 3e-2 in bf16 (the int8-dot route). */
TEST_MPI(flux3_gguf_kquants) {
    int tp, wrank;
    MPI_Comm g = f3_tp_group(4, &tp);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    backend *be = backend_cpu_create(1);
    comm *cm = comm_create_mpi(g, be);
    char *src = xasprintf("%s/f3k-%d-src", test_tmp_dir(), wrank), *dq = xasprintf("%s/f3k-%d-q", test_tmp_dir(), wrank);
    char *dt = xasprintf("%s/f3k-%d-twin", test_tmp_dir(), wrank), *fq = xasprintf("%s/x.gguf", dq);
    char *ft = xasprintf("%s/x.safetensors", dt);
    mkdir(src, 0755), mkdir(dq, 0755), mkdir(dt, 0755);
    int rc = write_random_flux3(src);
    if (!rc) rc = write_gguf_from(src, fq, -1, k_kmix, 3, 0, NULL);
    if (!rc) rc = gguf_twin_write(fq, ft);
    CHECK(rc == 0, "writing the K-quant files: %s", tp_error_msg());
    flux3_model *mq = NULL, *mb = NULL, *mt = NULL;
    load_stats st = {0};
    int grank;
    MPI_Comm_rank(g, &grank);
    size_t before = be->bytes_in_use, held = 0;
    if (!rc) rc = flux3_load(dq, be, cm, DT_F32, &mq, &st);
    held = be->bytes_in_use - before;
    if (!rc) rc = flux3_load(dq, be, cm, DT_BF16, &mb, NULL);
    if (!rc) flux3_set_exact_timestep(mb, 1);   /* the twin runs in f32 */
    if (!rc) rc = flux3_load(dt, be, cm, DT_F32, &mt, NULL);
    CHECK(rc == 0, "loading: %s", tp_error_msg());
    if (!all_ok(rc == 0)) goto out;
    uint64_t want_held = 0, want = formula(fq, tp, grank, &want_held);
    CHECK(st.bytes_read == want && held == want_held, "tp %d rank %d: read %llu (formula %llu), holds %zu (%llu)", tp,
          grank, (unsigned long long)st.bytes_read, (unsigned long long)want, held, (unsigned long long)want_held);
    gguf_file *gf;
    int nk = 0;
    if (gguf_open(fq, &gf) == 0) {
        for (int i = 0; i < gf->n; i++) nk += gf->tensors[i].type >= T_Q4_K && gf->tensors[i].type <= T_Q6_K;
        gguf_close(gf);
    }
    CHECK(nk == 4 * 6 + 6 + 3, "%d K-quant tensors, want the 24 block linears, 6 modulations, linear_2, norm_out, "
          "proj_out", nk);
    enum { NOUT = 8 * 32 };
    float yq[NOUT], yb[NOUT], yt[NOUT];
    rc = forward_k(mq, yq) || forward_k(mb, yb) || forward_k(mt, yt);
    CHECK(rc == 0, "forward: %s", tp_error_msg());
    if (!rc) {
        double e = rel_l2(yq, yt, NOUT), eb = rel_l2(yb, yt, NOUT), n2 = 0;
        for (int i = 0; i < NOUT; i++) n2 += (double)yt[i] * yt[i];
        CHECK(e <= 1e-6 && eb <= 3e-2 && n2 > 1e-3, "tp %d: K-quant GGUF vs twin f32 %.3g (tol 1e-6), bf16 %.3g (tol 3e-2)",
              tp, e, eb);
        if (getenv("TPGEN_TEST_VERBOSE") && grank == 0)
            printf("# kquants tp %d: read %llu B/rank, f32 vs twin %.3e, bf16 vs twin %.3e\n", tp,
                   (unsigned long long)st.bytes_read, e, eb);
    }
    all_ok(rc == 0);
out:
    flux3_free(mq), flux3_free(mb), flux3_free(mt);
    comm_destroy(cm);
    backend_destroy(be);
    MPI_Comm_free(&g);
    free(src), free(dq), free(dt), free(fq), free(ft);
}
