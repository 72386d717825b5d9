/* LoRA adapters (core/formats/lora.h) against the golden flux2-lora set (diffusers'
 * LoRA loading + PEFT on flux2-tiny-a) at every np, the merged tensors
 * against the golden f32 fuse_lora result, the bytes each rank reads
 * against a formula from the adapter's shapes, the BFL final-layer swap
 * against a double-precision computation, and every bad adapter. */
#include "core/models/model_plan.h"
#include "test.h"
#include "golden_case.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/formats/lora.h"
#include "core/models/flux2/flux2.h"
#include "core/formats/safetensors.h"
#include "core/formats/weights.h"
#include "cli/runspec.h"
#include "kernels/ops.h"
#include "plans/plan.h"
#include <jansson.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static char *gpath(const char *rel) { return xasprintf("%s/%s", test_golden_dir(), rel); }

static int all_ok(int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

static json_t *lora_json(void) {
    char *p = gpath("flux2-lora/lora.json");
    json_t *j = json_load_file(p, 0, NULL);
    free(p);
    return j;
}

/* the adapters of a golden case as specs (paths into the golden folder) */
static int case_specs(json_t *c, lora_spec *sp) {
    json_t *ads = json_object_get(c, "adapters");
    int n = (int)json_array_size(ads);
    for (int i = 0; i < n; i++) {
        json_t *a = json_array_get(ads, i);
        sp[i].path = xasprintf("%s/flux2-lora/%s", test_golden_dir(), json_string_value(json_object_get(a, "file")));
        sp[i].weight = json_number_value(json_object_get(a, "weight"));
    }
    return n;
}



/* outputs of the 3 golden inputs with model m (out: 3 arrays, malloc'ed) */
static int run_inputs(flux2_model *m, const st_file *in, float *out[3], size_t n_out[3]) {
    for (int k = 0; k < 3; k++) {
        golden_case c = {0};
        if (golden_case_read(in, k, &c)) return -1;
        n_out[k] = (size_t)c.N * 32;
        out[k] = xmalloc(n_out[k] * sizeof(float));
        int rc = flux2_forward(m, c.x, c.N, c.img_ids, c.txt, c.L, c.txt_ids, c.ts, &c.g, out[k]);
        golden_case_free(&c);
        if (rc) return -1;
    }
    return 0;
}

typedef struct env { backend *be; comm *c; st_file *in, *want; char *dir; } env;

static int env_open(env *e) {
    memset(e, 0, sizeof *e);
    e->be = backend_cpu_create(1);
    e->c = comm_create_mpi(MPI_COMM_WORLD, e->be);
    e->dir = gpath("flux2-tiny-a/model/transformer");
    char *a = gpath("flux2-tiny-a/transformer_cases.safetensors"), *b = gpath("flux2-lora/lora_cases.safetensors");
    int ok = st_open(a, &e->in) == 0 && st_open(b, &e->want) == 0;
    free(a), free(b);
    CHECK(ok, "golden files: %s", tp_error_msg());
    return all_ok(ok);
}

static void env_close(env *e) {
    if (e->in) st_close(e->in);
    if (e->want) st_close(e->want);
    comm_destroy(e->c);
    backend_destroy(e->be);
    free(e->dir);
}

/* One case: load with its adapters at tp = world, compare the 3 outputs. */
static void check_case(env *e, const char *name, const lora_spec *sp, int n, double tol, float *keep[3]) {
    flux2_model *m = NULL;
    flux2_load_extras x = {.loras = sp, .n_loras = n};
    int rc = flux2_load_ex(e->dir, e->be, e->c, DT_F32, &x, &m, NULL);
    CHECK(rc == 0, "%s: load: %s", name, tp_error_msg());
    if (!all_ok(rc == 0)) return;
    float *out[3] = {0};
    size_t no[3];
    rc = run_inputs(m, e->in, out, no);
    CHECK(rc == 0, "%s: forward: %s", name, tp_error_msg());
    for (int k = 0; k < 3 && !rc; k++) {
        char key[128];
        snprintf(key, sizeof key, "%s.case%d.output", name, k);
        float *ref = NULL;
        const st_tensor_info *ti;
        REQUIRE(st_read_f32(e->want, key, &ref, &ti) == 0 && (size_t)st_numel(ti) == no[k], "%s: %s", key,
                tp_error_msg());
        double err = rel_l2(out[k], ref, no[k]);
        CHECK(err <= tol, "%s case%d: rel_err %.3g > %.3g (np %d)", name, k, err, tol, e->c->size);
        free(ref);
    }
    for (int k = 0; k < 3; k++) {
        if (keep) keep[k] = out[k];
        else free(out[k]);
    }
    flux2_free(m);
}

/* every golden case at tp = world (run by tests/run.sh at np 1, 2, 4);
 * weight 0 must also give the base model's outputs bit for bit */
TEST_MPI(lora_golden_outputs_f32) {
    env e;
    json_t *j = lora_json();
    REQUIRE(j, "lora.json unreadable");
    if (!env_open(&e)) { json_decref(j); env_close(&e); return; }
    json_t *cases = json_object_get(j, "cases");
    CHECK(json_array_size(cases) == 9, "lora.json: %zu cases, expected 9", json_array_size(cases));
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        lora_spec sp[4];
        int n = case_specs(c, sp);
        const char *name = json_string_value(json_object_get(c, "name"));
        float *w0[3] = {0};
        int zero = !strcmp(name, "peft_r4_w0");
        check_case(&e, name, sp, n, 1e-4, zero ? w0 : NULL);
        if (zero) {   /* the base model, no adapter */
            float *base[3] = {0};
            check_case(&e, "base", NULL, 0, 1e-4, base);
            for (int k = 0; k < 3; k++) {
                CHECK(w0[k] && base[k] && max_abs_diff(w0[k], base[k], 12 * 32) == 0,
                      "weight 0 differs from the base model (case%d)", k);
                free(w0[k]), free(base[k]);
            }
        }
        lora_specs_free(sp, n);
    }
    json_decref(j);
    env_close(&e);
}

/* ---- writing adapters for the tests ---- */

/* adapter values from the run's seed (tests/harness.c prints it on failure) */
static uint64_t rng;
static float frand(void) {
    if (!rng) rng = 0x1234567ull ^ ((uint64_t)test_seed() << 20);
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * (1.0 / 16777216.0) * 2 - 1) * 0.25f;
}

typedef struct wt { const char *name; dtype_t dt; int ndim; int64_t s0, s1; float fill; int nan_at; } wt;

/* Write an adapter: random values (or `fill` when non-zero), converted to
 * dt; a NaN at element nan_at when >= 0. */
static char *write_adapter(const char *tag, const wt *t, int n, const char *const *meta) {
    st_write_tensor w[32];
    for (int i = 0; i < n; i++) {
        int64_t ne = (t[i].ndim ? t[i].s0 : 1) * (t[i].ndim > 1 ? t[i].s1 : 1);
        float *f = xmalloc((size_t)ne * sizeof *f);
        for (int64_t k = 0; k < ne; k++) f[k] = t[i].fill != 0 ? t[i].fill : frand();
        if (t[i].nan_at >= 0 && t[i].nan_at < ne) f[t[i].nan_at] = NAN;
        void *d = xmalloc((size_t)ne * dtype_size(t[i].dt));
        convert_from_f32(d, t[i].dt, f, (size_t)ne);
        free(f);
        w[i] = (st_write_tensor){.name = t[i].name, .dtype = t[i].dt, .ndim = t[i].ndim, .data = d};
        w[i].shape[0] = t[i].s0, w[i].shape[1] = t[i].s1, w[i].shape[2] = 1;
    }
    char *path = xasprintf("%s/%s.safetensors", test_tmp_dir(), tag);
    int rc = st_write(path, w, n, meta);
    for (int i = 0; i < n; i++) free((void *)w[i].data);
    if (rc) test_fail(__FILE__, __LINE__, "write %s: %s", path, tp_error_msg());
    return path;
}

/* ai-toolkit's diffusion_model.*.lora_down/up spelling, which diffusers
 * takes for kohya (and drops every key): loaded as ai-toolkit, the golden
 * aitk_r4 adapter renamed so must give the aitk_r4 outputs */
TEST_MPI(lora_aitk_down_up_spelling) {
    char *src = gpath("flux2-lora/adapters/aitk_r4.safetensors");
    st_file *f = NULL;
    int ok = st_open(src, &f) == 0;
    CHECK(ok, "%s", tp_error_msg());
    char *path = NULL;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (ok) {
        st_write_tensor w[64];
        int n = f->n;
        for (int i = 0; i < n; i++) {
            const st_tensor_info *t = &f->tensors[i];
            char *nm = xstrdup(t->name), *p;
            if ((p = strstr(nm, ".lora_A.weight"))) { *p = 0; p = xasprintf("%s.lora_down.weight", nm); }
            else if ((p = strstr(nm, ".lora_B.weight"))) { *p = 0; p = xasprintf("%s.lora_up.weight", nm); }
            else p = xstrdup(nm);
            free(nm);
            void *d = xmalloc(t->end - t->begin);
            st_read_raw(f, t, d);
            w[i] = (st_write_tensor){.name = p, .dtype = t->dtype, .ndim = t->ndim, .data = d};
            memcpy(w[i].shape, t->shape, sizeof w[i].shape);
        }
        char tag[64];
        snprintf(tag, sizeof tag, "aitk_down_up_%d", rank);
        path = xasprintf("%s/%s.safetensors", test_tmp_dir(), tag);
        ok = st_write(path, w, n, NULL) == 0;
        for (int i = 0; i < n; i++) free((void *)w[i].name), free((void *)w[i].data);
        st_close(f);
    }
    free(src);
    env e;
    if (all_ok(ok) && env_open(&e)) {
        lora_spec sp = {path, 1.0};
        check_case(&e, "aitk_r4", &sp, 1, 1e-4, NULL);
        env_close(&e);
    }
    free(path);
}

/* ---- merged tensors against the golden f32 fuse_lora ---- */

static json_t *golden_config(void) {
    char *p = gpath("flux2-tiny-a/model/transformer/config.json");
    json_t *j = json_load_file(p, 0, NULL);
    free(p);
    return j;
}

/* Load the transformer's shards with adapters through the hook. */
static int load_with(const char *dir, const lora_spec *sp, int n, int tp, int rank, dtype_t dt, backend *be,
                     weights **w, lora_set **ls, checkpoint **ck, plan *p) {
    json_t *cfg = golden_config();
    int rc = checkpoint_open(dir, ck) || (checkpoint_is_bfl(*ck) ? plan_flux2_bfl(cfg, p) : plan_flux2(cfg, p)) ||
             lora_set_open(sp, n, *ck, 0, ls);
    json_decref(cfg);
    if (rc) return -1;
    load_opts o = {.tp = tp, .rank = rank, .be = be, .dtype = dt, .transform = lora_merge_shard, .transform_ctx = *ls};
    return weights_load(*ck, p, &o, w, NULL);
}

/* the rank's slice of a full [rows, cols] host matrix through the plan */
static float *slice(const checkpoint *ck, const plan *p, const char *name, const float *full, int tp, int rank,
                    int64_t *n) {
    shard_info si;
    plan_shard(p, st_plan_tensor(checkpoint_find(ck, name, NULL)), tp, &si);
    shard_piece pc[PLAN_MAX_PIECES];
    int np = plan_shard_pieces(&si, tp, rank, pc);
    *n = shard_local_numel(&si);
    float *out = xmalloc((size_t)*n * sizeof *out);
    for (int i = 0; i < np; i++)
        for (int64_t r = 0; r < pc[i].height; r++)
            memcpy(out + pc[i].dst_off + r * pc[i].dst_pitch, full + pc[i].src_off + r * pc[i].src_pitch,
                   (size_t)pc[i].width * sizeof *out);
    return out;
}

static void merged_case(const char *cname, int tp, int rank) {
    json_t *j = lora_json();
    json_t *cases = json_object_get(j, "cases"), *c = NULL;
    for (size_t i = 0; i < json_array_size(cases); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(cases, i), "name")), cname))
            c = json_array_get(cases, i);
    REQUIRE(c, "case %s not in lora.json", cname);
    lora_spec sp[4];
    int n = case_specs(c, sp);
    char *dir = gpath("flux2-tiny-a/model/transformer"), *gp = gpath("flux2-lora/lora_cases.safetensors");
    st_file *g = NULL;
    REQUIRE(st_open(gp, &g) == 0, "%s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    for (int prec = 0; prec < 2; prec++) {
        dtype_t dt = prec ? DT_BF16 : DT_F32;
        weights *w = NULL;
        lora_set *ls = NULL;
        checkpoint *ck = NULL;
        plan p;
        int rc = load_with(dir, sp, n, tp, rank, dt, be, &w, &ls, &ck, &p);
        CHECK(rc == 0, "%s tp %d: %s", cname, tp, tp_error_msg());
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(json_object_get(c, "fused"), "modules"), k, v) {
            if (rc) break;
            char *tn = xasprintf("%s.weight", k), *key = xasprintf("%s.merged.%s", cname, tn);
            float *full = NULL, *pipe = NULL;
            const st_tensor_info *ti;
            REQUIRE(st_read_f32(g, key, &full, &ti) == 0, "%s", tp_error_msg());
            int64_t nl;
            float *want = slice(ck, &p, tn, full, tp, rank, &nl);
            const tensor *t = weights_get(w, tn);
            float *got = xmalloc((size_t)nl * sizeof *got);
            CHECK(t && (int64_t)tensor_numel(t) == nl && tensor_download_f32(t, got) == 0, "%s: shard", tn);
            double mx = 0;
            for (int64_t i = 0; i < nl; i++) mx = fmax(mx, fabs(want[i]));
            if (dt == DT_F32) {
                double rel = rel_l2(got, want, (size_t)nl), ma = max_abs_diff(got, want, (size_t)nl);
                CHECK(rel <= 1e-6 && ma <= 1e-6 * mx, "%s %s tp %d rank %d: f32 merge rel %.3g max abs %.3g", cname,
                      tn, tp, rank, rel, ma);
            } else {
                /* rounded once: bf16 of the golden f32 merge, but for sums across a rounding boundary */
                int64_t off = 0, bad = 0;
                for (int64_t i = 0; i < nl; i++) {
                    float r = bf16r(want[i]);
                    if (got[i] == r) continue;
                    off++;
                    uint16_t a = f32_to_bf16(got[i]), b = f32_to_bf16(r);
                    if (abs((int)a - (int)b) > 1) bad++;
                }
                CHECK(bad == 0 && off * 1000 <= nl, "%s %s tp %d rank %d: bf16 merge %lld of %lld off bf16(f32 merge), "
                      "%lld by more than 1 ulp", cname, tn, tp, rank, (long long)off, (long long)nl, (long long)bad);
                /* diffusers' own bf16 pipeline rounds three times: report how far it is */
                char *pk = xasprintf("%s.merged_bf16pipe.%s", cname, tn);
                if (st_find(g, pk) && st_read_f32(g, pk, &pipe, &ti) == 0) {
                    float *pw = slice(ck, &p, tn, pipe, tp, rank, &nl);
                    int64_t diff = 0;
                    for (int64_t i = 0; i < nl; i++) diff += got[i] != pw[i];
                    if (tp == 1 && rank == 0)
                        printf("# %s %s: ours (f32 merge, one rounding) vs diffusers' bf16 fuse_lora: %lld of %lld "
                               "differ, rel %.3g; ours vs f32 merge rel %.3g\n", cname, tn, (long long)diff,
                               (long long)nl, rel_l2(pw, want, (size_t)nl), rel_l2(got, want, (size_t)nl));
                    free(pw);
                }
                free(pk);
            }
            free(got), free(want), free(full), free(pipe), free(tn), free(key);
        }
        weights_free(w);
        lora_set_free(ls);
        checkpoint_close(ck);
    }
    backend_destroy(be);
    st_close(g);
    free(dir), free(gp);
    lora_specs_free(sp, n);
    json_decref(j);
}

TEST(lora_golden_merged_tensors) {
    for (int tp = 1; tp <= 4; tp *= 2)
        for (int r = 0; r < tp; r++) {
            merged_case("aitk_r4", tp, r);
            merged_case("two", tp, r);
        }
}

/* ---- bytes read per rank ---- */

/* the adapter's share for a rank, from its shapes and the FLUX.2 split
 * (docs/spec/flux2-transformer.md §7.2), without the plan: colwise targets read out/tp rows of B and
 * all of A; rowwise targets in/tp columns of A and all of B; a fused BFL
 * qkv is three colwise targets sharing A */
static uint64_t expected_bytes(const char *adapter, int tp) {
    static const char *rowwise[] = {"to_out.0", "to_add_out", "linear_out", "attn.to_out", "attn_proj", "attn.proj",
                                    "mlp_2", "mlp.2", "linear2"};
    st_file *f;
    if (st_open(adapter, &f)) return 0;
    uint64_t sum = 0;
    for (int i = 0; i < f->n; i++) {
        const st_tensor_info *a = &f->tensors[i];
        char *p = strstr(a->name, ".lora_A.weight");
        if (!p) p = strstr(a->name, ".lora_down.weight");
        if (!p) continue;
        int down = !strcmp(p, ".lora_down.weight");
        char *mod = xasprintf("%.*s", (int)(p - a->name), a->name);
        char *bk = xasprintf("%s%s", mod, down ? ".lora_up.weight" : ".lora_B.weight");
        const st_tensor_info *b = st_find(f, bk);
        int row = 0;
        size_t ml = strlen(mod);
        for (size_t q = 0; q < sizeof rowwise / sizeof *rowwise; q++) {
            size_t l = strlen(rowwise[q]);
            row |= ml >= l && !strcmp(mod + ml - l, rowwise[q]);
        }
        int fused = strstr(mod, "attn.qkv") || strstr(mod, "attn_qkv");
        uint64_t es = dtype_size(a->dtype), r = (uint64_t)a->shape[0], in = (uint64_t)a->shape[1];
        uint64_t out = b ? (uint64_t)b->shape[0] : 0;
        if (row) sum += r * (in / tp) * es + out * r * es;
        else if (fused) sum += 3 * ((out / 3 / tp) * r * es + r * in * es);
        else sum += (out / tp) * r * es + r * in * es;
        free(mod), free(bk);
    }
    st_close(f);
    return sum;
}

TEST(lora_bytes_read_per_rank) {
    const char *names[] = {"peft_r4", "aitk_r4", "kohya_r4"};
    char *dir = gpath("flux2-tiny-a/model/transformer");
    backend *be = backend_cpu_create(1);
    for (int a = 0; a < 3; a++) {
        char *rel = xasprintf("flux2-lora/adapters/%s.safetensors", names[a]), *path = gpath(rel);
        lora_spec sp = {path, 0.5};
        for (int tp = 1; tp <= 4; tp *= 2) {
            uint64_t want = expected_bytes(path, tp);
            CHECK(want > 0, "%s: no expected bytes", names[a]);
            for (int r = 0; r < tp; r++) {
                weights *w = NULL;
                lora_set *ls = NULL;
                checkpoint *ck = NULL;
                plan p;
                int rc = load_with(dir, &sp, 1, tp, r, DT_BF16, be, &w, &ls, &ck, &p);
                CHECK(rc == 0, "%s: %s", names[a], tp_error_msg());
                if (!rc) {
                    uint64_t est;
                    CHECK(ls->ad[0].bytes_read == want, "%s tp %d rank %d: read %llu bytes of the adapter, its share "
                          "is %llu", names[a], tp, r, (unsigned long long)ls->ad[0].bytes_read, (unsigned long long)want);
                    CHECK(lora_estimate(ls, ck, &p, tp, r, &est) == 0 && est == want,
                          "%s tp %d rank %d: estimate %llu != %llu", names[a], tp, r, (unsigned long long)est,
                          (unsigned long long)want);
                }
                weights_free(w);
                lora_set_free(ls);
                checkpoint_close(ck);
            }
        }
        free(rel), free(path);
    }
    backend_destroy(be);
    free(dir);
}

/* ---- the BFL final layer onto diffusers' norm_out: halves swapped ---- */

TEST(lora_final_layer_halves_swapped) {
    const int64_t D = 128, r = 2;
    wt t[] = {{"diffusion_model.final_layer.adaLN_modulation.1.lora_A.weight", DT_F32, 2, r, D, 0, -1},
              {"diffusion_model.final_layer.adaLN_modulation.1.lora_B.weight", DT_F32, 2, 2 * D, r, 0, -1}};
    char *path = write_adapter("final_layer", t, 2, NULL);
    st_file *f;
    float *A = NULL, *B = NULL, *W = NULL;
    REQUIRE(st_open(path, &f) == 0, "%s", tp_error_msg());
    st_read_f32(f, t[0].name, &A, NULL);
    st_read_f32(f, t[1].name, &B, NULL);
    st_close(f);
    char *dir = gpath("flux2-tiny-a/model/transformer");
    checkpoint *c0;
    REQUIRE(checkpoint_open(dir, &c0) == 0, "%s", tp_error_msg());
    const st_file *sf;
    const st_tensor_info *wi = checkpoint_find(c0, "norm_out.linear.weight", &sf);
    st_read_f32(sf, wi->name, &W, NULL);
    checkpoint_close(c0);
    backend *be = backend_cpu_create(1);
    lora_spec sp = {path, -0.7};
    weights *w = NULL;
    lora_set *ls = NULL;
    checkpoint *ck = NULL;
    plan p;
    int rc = load_with(dir, &sp, 1, 1, 0, DT_F32, be, &w, &ls, &ck, &p);
    CHECK(rc == 0, "%s", tp_error_msg());
    if (!rc) {
        float *got = xmalloc((size_t)(2 * D * D) * sizeof *got), *want = xmalloc((size_t)(2 * D * D) * sizeof *want);
        tensor_download_f32(weights_get(w, "norm_out.linear.weight"), got);
        /* BFL rows [0, D) are shift, diffusers' norm_out rows [0, D) scale */
        for (int64_t i = 0; i < 2 * D; i++) {
            int64_t bi = (i + D) % (2 * D);
            for (int64_t j = 0; j < D; j++) {
                double s = 0;
                for (int64_t k = 0; k < r; k++) s += (double)B[bi * r + k] * A[k * D + j];
                want[i * D + j] = (float)(W[i * D + j] + -0.7 * s);
            }
        }
        CHECK(rel_l2(got, want, (size_t)(2 * D * D)) <= 1e-6, "norm_out merge rel %.3g",
              rel_l2(got, want, (size_t)(2 * D * D)));
        free(got), free(want);
    }
    weights_free(w);
    lora_set_free(ls);
    checkpoint_close(ck);
    /* tests/sh/lora.sh: the same on a BFL single file (TPGEN_LORA_BFL = its folder), before the loader's own
     * swap: a BFL-named adapter lands as is, a diffusers-named norm_out one with its halves swapped */
    const char *bfl = getenv("TPGEN_LORA_BFL");
    if (bfl) {
        wt td[] = {{"transformer.norm_out.linear.lora_A.weight", DT_F32, 2, r, D, 0, -1},
                   {"transformer.norm_out.linear.lora_B.weight", DT_F32, 2, 2 * D, r, 0, -1}};
        char *dpath = write_adapter("norm_out_diffusers", td, 2, NULL);
        float *Ad = NULL, *Bd = NULL, *Wb = NULL;
        REQUIRE(st_open(dpath, &f) == 0, "%s", tp_error_msg());
        st_read_f32(f, td[0].name, &Ad, NULL);
        st_read_f32(f, td[1].name, &Bd, NULL);
        st_close(f);
        REQUIRE(checkpoint_open(bfl, &c0) == 0, "%s", tp_error_msg());
        wi = checkpoint_find(c0, "final_layer.adaLN_modulation.1.weight", &sf);
        REQUIRE(wi, "no BFL final layer in %s", bfl);
        st_read_f32(sf, wi->name, &Wb, NULL);
        checkpoint_close(c0);
        for (int variant = 0; variant < 2; variant++) {   /* 0: BFL names, 1: diffusers names */
            lora_spec bs = {variant ? dpath : path, 0.6};
            const float *AA = variant ? Ad : A, *BB = variant ? Bd : B;
            rc = load_with(bfl, &bs, 1, 1, 0, DT_F32, be, &w, &ls, &ck, &p);
            CHECK(rc == 0, "BFL: %s", tp_error_msg());
            if (!rc) {
                float *got = xmalloc((size_t)(2 * D * D) * sizeof *got), *want = xmalloc((size_t)(2 * D * D) * 4);
                tensor_download_f32(weights_get(w, "final_layer.adaLN_modulation.1.weight"), got);
                for (int64_t i = 0; i < 2 * D; i++) {
                    int64_t bi = variant ? (i + D) % (2 * D) : i;
                    for (int64_t j = 0; j < D; j++) {
                        double sum = 0;
                        for (int64_t k = 0; k < r; k++) sum += (double)BB[bi * r + k] * AA[k * D + j];
                        want[i * D + j] = (float)(Wb[i * D + j] + 0.6 * sum);
                    }
                }
                double e = rel_l2(got, want, (size_t)(2 * D * D));
                CHECK(e <= 1e-6, "BFL final layer, %s names: rel %.3g", variant ? "diffusers" : "BFL", e);
                printf("# BFL layout: final layer with %s names rel %.3g\n", variant ? "diffusers" : "BFL", e);
                free(got), free(want);
            }
            weights_free(w);
            lora_set_free(ls);
            checkpoint_close(ck);
        }
        free(Ad), free(Bd), free(Wb), free(dpath);
    }
    backend_destroy(be);
    free(A), free(B), free(W), free(dir), free(path);
}

/* ---- bad adapters: each fails before any weight is read, naming file and key ---- */

static void expect_bad(const char *tag, const wt *t, int n, const char *const *meta, const char *want1,
                       const char *want2, int at_load) {
    char *path = write_adapter(tag, t, n, meta);
    char *dir = gpath("flux2-tiny-a/model/transformer");
    checkpoint *ck = NULL;
    lora_set *ls = NULL;
    lora_spec sp = {path, 1.0};
    REQUIRE(checkpoint_open(dir, &ck) == 0, "%s", tp_error_msg());
    int rc = lora_set_open(&sp, 1, ck, 0, &ls);
    if (at_load && rc == 0) {   /* values are checked where each rank reads them */
        json_t *cfg = golden_config();
        plan p;
        plan_flux2(cfg, &p);
        json_decref(cfg);
        backend *be = backend_cpu_create(1);
        weights *w = NULL;
        load_opts o = {.tp = 2, .rank = 1, .be = be, .dtype = DT_BF16, .transform = lora_merge_shard,
                       .transform_ctx = ls};
        rc = weights_load(ck, &p, &o, &w, NULL);
        CHECK(!w, "%s: weights kept after a failed load", tag);
        backend_destroy(be);
    }
    const char *m = tp_error_msg();
    CHECK(rc != 0, "%s: accepted", tag);
    CHECK(strstr(m, path) && strstr(m, want1) && (!want2 || strstr(m, want2)), "%s: message '%s' lacks '%s'/'%s'",
          tag, m, want1, want2 ? want2 : "");
    lora_set_free(ls);
    checkpoint_close(ck);
    free(dir), free(path);
}

#define A_(k, r, in) {k, DT_F32, 2, r, in, 0, -1}
#define B_(k, out, r) {k, DT_F32, 2, out, r, 0, -1}

/* only alpha scalars (a LyCORIS file with its factors cut away): refused,
 * not a NULL dereference (found by fuzz/fuzz_lora.c) */
TEST(bad_lora_alpha_only) {
    wt t[] = {{"lora_unet_img_in.alpha", DT_F32, 0, 0, 0, 4.0f, -1}};
    expect_bad("alpha_only", t, 1, NULL, "lora_unet_img_in.alpha", "no lora_A", 0);
}

TEST(bad_lora_flux1_names) {
    wt t[] = {A_("transformer.single_transformer_blocks.0.proj_mlp.lora_A.weight", 4, 128),
              B_("transformer.single_transformer_blocks.0.proj_mlp.lora_B.weight", 512, 4)};
    expect_bad("flux1", t, 2, NULL, "single_transformer_blocks.0.proj_mlp", "FLUX.1", 0);
    wt k[] = {A_("lora_unet_double_blocks_0_img_mod_lin.lora_down.weight", 4, 128),
              B_("lora_unet_double_blocks_0_img_mod_lin.lora_up.weight", 768, 4)};
    expect_bad("flux1_kohya", k, 2, NULL, "img_mod", "FLUX.1", 0);
    wt s[] = {A_("lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight", 4, 128),
              B_("lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight", 128, 4)};
    expect_bad("sdxl", s, 2, NULL, "down_blocks", "SDXL", 0);
}

TEST(bad_lora_unknown_module) {
    wt t[] = {A_("transformer.transformer_blocks.7.attn.to_q.lora_A.weight", 4, 128),
              B_("transformer.transformer_blocks.7.attn.to_q.lora_B.weight", 128, 4)};
    expect_bad("block7", t, 2, NULL, "transformer_blocks.7.attn.to_q", "matches no Linear", 0);
}

TEST(bad_lora_shapes) {
    wt t[] = {A_("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 64),
              B_("transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 128, 4)};
    expect_bad("shape_in", t, 2, NULL, "lora_A.weight", "needs A [r, 128]", 0);
    wt o[] = {A_("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 128),
              B_("transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 96, 4)};
    expect_bad("shape_out", o, 2, NULL, "lora_B.weight", "B [128, r]", 0);
    wt r[] = {A_("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 128),
              B_("transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 128, 3)};
    expect_bad("rank", r, 2, NULL, "to_q", "rank", 0);
    wt q[] = {A_("diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight", 4, 128),
              B_("diffusion_model.double_blocks.0.img_attn.qkv.lora_B.weight", 385, 4)};
    expect_bad("qkv3", q, 2, NULL, "img_attn.qkv.lora_B.weight", "do not divide into the 3", 0);
    wt m[] = {A_("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 128)};
    expect_bad("missing_b", m, 1, NULL, "to_q.lora_A.weight", "needs both", 0);
    wt d3[] = {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", DT_F32, 3, 4, 128, 0, -1},
               B_("transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 128, 4)};
    expect_bad("ndim", d3, 2, NULL, "lora_A.weight", "2-D", 0);
}

TEST(bad_lora_alpha_and_values) {
    wt a[] = {A_("lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", 4, 128),
              B_("lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", 128, 4),
              {"lora_unet_double_blocks_0_img_attn_proj.alpha", DT_F16, 1, 2, 0, 2.0f, -1}};
    expect_bad("alpha_vec", a, 3, NULL, "img_attn_proj.alpha", "scalar", 0);
    wt z[] = {A_("lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", 4, 128),
              B_("lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", 128, 4),
              {"lora_unet_double_blocks_0_img_attn_proj.alpha", DT_F32, 0, 0, 0, NAN, -1}};
    expect_bad("alpha_nan", z, 3, NULL, "alpha", "finite", 0);
    /* a NaN in rank 1's rows of B (to_q colwise at tp 2: rows 64..127) */
    wt n[] = {A_("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 128),
              {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", DT_BF16, 2, 128, 4, 0, 100 * 4 + 1}};
    expect_bad("nan", n, 2, NULL, "to_q.lora_B.weight", "non-finite", 1);
}

/* every scale is checked where it is read: PEFT metadata, patterns, rsLoRA, kohya alphas, the --lora weight */
TEST(bad_lora_scales) {
    wt q[] = {A_("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 128),
              B_("transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 128, 4)};
    const char *tiny_r[] = {"lora_adapter_metadata", "{\"transformer.r\": 1e-300, \"transformer.lora_alpha\": 4}", NULL};
    expect_bad("peft_r_tiny", q, 2, tiny_r, "'r' must be a number of at least 1", NULL, 0);
    const char *huge_a[] = {"lora_adapter_metadata", "{\"transformer.r\": 4, \"transformer.lora_alpha\": 1e300}", NULL};
    expect_bad("peft_alpha_huge", q, 2, huge_a, "attn.to_q", "a LoRA scale must be finite and of magnitude at most", 0);
    const char *pat0[] = {"lora_adapter_metadata",
                          "{\"transformer.r\": 4, \"transformer.rank_pattern\": {\"to_q\": 0}}", NULL};
    expect_bad("rank_pattern_0", q, 2, pat0, "rank 0 (rank_pattern)", NULL, 0);
    const char *rs_neg[] = {"lora_adapter_metadata", "{\"transformer.r\": 4, \"transformer.use_rslora\": true, "
                            "\"transformer.rank_pattern\": {\"attn.to_q\": -4}}", NULL};
    expect_bad("rslora_negative_rank", q, 2, rs_neg, "rank -4 (rank_pattern)", NULL, 0);
    wt k[] = {A_("lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", 4, 128),
              B_("lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", 128, 4),
              {"lora_unet_double_blocks_0_img_attn_proj.alpha", DT_F32, 0, 0, 0, 1e38f, -1}};
    expect_bad("kohya_alpha_huge", k, 3, NULL, "img_attn_proj", "magnitude at most", 0);
    /* the rank is bounded by the module's widths */
    wt r[] = {A_("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 200, 128),
              B_("transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 128, 200)};
    expect_bad("rank_too_large", r, 2, NULL, "rank 200 is larger", NULL, 0);
    /* one module under its diffusers and its BFL name: merged twice before */
    wt two[] = {A_("transformer.transformer_blocks.0.attn.to_out.0.lora_A.weight", 4, 128),
                B_("transformer.transformer_blocks.0.attn.to_out.0.lora_B.weight", 128, 4),
                A_("transformer.double_blocks.0.img_attn.proj.lora_A.weight", 4, 128),
                B_("transformer.double_blocks.0.img_attn.proj.lora_B.weight", 128, 4)};
    expect_bad("module_twice", two, 4, NULL, "both target tensor 'transformer_blocks.0.attn.to_out.0.weight'", NULL, 0);
    /* finite matrices whose product overflows: found in the merged shard, naming adapter and module */
    wt big[] = {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", DT_F32, 2, 4, 128, 1e30f, -1},
                {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", DT_F32, 2, 128, 4, 1e30f, -1}};
    expect_bad("merged_inf", big, 2, NULL, "after the merge of", "module transformer_blocks.0.attn.to_q", 1);
    /* --lora weights: finite and at most 1e6 */
    lora_spec sp;
    CHECK(lora_spec_parse("f.safetensors:1e300", &sp) != 0 && strstr(tp_error_msg(), "at most"), "1e300: %s",
          tp_error_msg());
    CHECK(lora_spec_parse("f.safetensors:1e6", &sp) == 0, "1e6 refused: %s", tp_error_msg());
    lora_specs_free(&sp, 1);
}

/* lora_alpha 0 is PEFT's no-op: accepted, with a warning that names the adapter */
TEST(lora_alpha_zero_warns) {
    wt q[] = {A_("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 128),
              B_("transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 128, 4)};
    const char *meta[] = {"lora_adapter_metadata", "{\"transformer.r\": 4, \"transformer.lora_alpha\": 0}", NULL};
    char *path = write_adapter("alpha0", q, 2, meta), *dir = gpath("flux2-tiny-a/model/transformer");
    char *log = xasprintf("%s/alpha0.log", test_tmp_dir());
    checkpoint *ck = NULL;
    lora_set *ls = NULL;
    lora_spec sp = {path, 1.0};
    REQUIRE(checkpoint_open(dir, &ck) == 0, "%s", tp_error_msg());
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    int rc = lora_set_open(&sp, 1, ck, 1, &ls);
    fflush(stderr);
    dup2(saved, 2);
    close(fd), close(saved);
    char text[1024] = {0};
    FILE *f = fopen(log, "r");
    if (f) { size_t n = fread(text, 1, sizeof text - 1, f); text[n] = 0; fclose(f); }
    CHECK(rc == 0 && ls && ls->ad[0].scale == 0, "alpha 0: rc %d, %s", rc, tp_error_msg());
    CHECK(strstr(text, "warning") && strstr(text, path) && strstr(text, "scale 0"), "no warning: '%s'", text);
    lora_set_free(ls);
    checkpoint_close(ck);
    free(dir), free(path), free(log);
}

TEST(bad_lora_text_encoder_and_extras) {
    wt t[] = {A_("lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight", 4, 64),
              B_("lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_up.weight", 256, 4)};
    expect_bad("te", t, 2, NULL, "lora_te1_text_model", "text encoder", 0);
    wt b[] = {A_("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 128),
              B_("transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 128, 4),
              {"transformer.transformer_blocks.0.attn.to_q.lora_B.bias", DT_F32, 1, 128, 0, 0, -1}};
    expect_bad("bias", b, 3, NULL, "lora_B.bias", "not a LoRA matrix", 0);
    const char *meta[] = {"lora_adapter_metadata", "{\"transformer.r\": 4, \"transformer.use_dora\": true}", NULL};
    wt d[] = {A_("transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 128),
              B_("transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 128, 4)};
    expect_bad("dora_meta", d, 2, meta, "use_dora", NULL, 0);
}

TEST(bad_lora_not_safetensors) {
    char *path = xasprintf("%s/junk.safetensors", test_tmp_dir());
    FILE *f = fopen(path, "wb");
    fputs("not a safetensors file at all", f);
    fclose(f);
    char *dir = gpath("flux2-tiny-a/model/transformer");
    checkpoint *ck = NULL;
    lora_set *ls = NULL;
    lora_spec sp = {path, 1.0};
    REQUIRE(checkpoint_open(dir, &ck) == 0, "%s", tp_error_msg());
    CHECK(lora_set_open(&sp, 1, ck, 0, &ls) != 0 && strstr(tp_error_msg(), path), "junk accepted: %s", tp_error_msg());
    lora_spec miss = {"/nonexistent/x.safetensors", 1.0};
    CHECK(lora_set_open(&miss, 1, ck, 0, &ls) != 0 && strstr(tp_error_msg(), "/nonexistent/x.safetensors"),
          "missing file: %s", tp_error_msg());
    checkpoint_close(ck);
    free(dir), free(path);
}

TEST(lora_spec_parsing) {
    lora_spec s;
    CHECK(lora_spec_parse("a.safetensors", &s) == 0 && !strcmp(s.path, "a.safetensors") && s.weight == 1.0, "plain");
    lora_specs_free(&s, 1);
    CHECK(lora_spec_parse("dir/b.safetensors:-0.35", &s) == 0 && !strcmp(s.path, "dir/b.safetensors") &&
          s.weight == -0.35, "weight");
    lora_specs_free(&s, 1);
    CHECK(lora_spec_parse("c:d.safetensors", &s) == 0 && !strcmp(s.path, "c:d.safetensors") && s.weight == 1.0,
          "colon in the name");
    lora_specs_free(&s, 1);
    CHECK(lora_spec_parse("e.safetensors:inf", &s) != 0, "inf weight accepted");
    CHECK(lora_spec_parse("", &s) != 0, "empty accepted");
}

/* ---- an offline merge, for the end-to-end test (tests/sh/lora.sh) ----
 * A PEFT adapter (lora_alpha 8, r 4: scale 2) on a colwise, a rowwise and
 * a packed module of each kind of klein-tiny's transformer, and a copy of
 * that transformer with W + 0.8 * 2 * B A computed here in double and
 * stored F32. With TPGEN_LORA_E2E=DIR both go to DIR (lora.safetensors,
 * merged/transformer/); either way the loader's f32 merge must equal the
 * offline one. */
static const char *k_e2e_modules[] = {
    "transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.add_v_proj", "transformer_blocks.0.attn.to_out.0",
    "transformer_blocks.1.ff.linear_in", "transformer_blocks.0.ff_context.linear_out",
    "single_transformer_blocks.0.attn.to_qkv_mlp_proj", "single_transformer_blocks.1.attn.to_out", "proj_out"};
#define N_E2E ((int)(sizeof k_e2e_modules / sizeof *k_e2e_modules))

TEST(lora_offline_merge_e2e_files) {
    const char *env = getenv("TPGEN_LORA_E2E");
    char *out = xstrdup(env ? env : test_tmp_dir());
    char *src = gpath("klein-tiny/model/transformer");
    checkpoint *ck;
    REQUIRE(checkpoint_open(src, &ck) == 0, "%s", tp_error_msg());
    const int64_t r = 4;
    const double coef = 0.8 * 2.0;
    st_write_tensor ad[2 * N_E2E];
    float *A[N_E2E], *B[N_E2E];
    for (int m = 0; m < N_E2E; m++) {
        char *tn = xasprintf("%s.weight", k_e2e_modules[m]);
        const st_tensor_info *ti = checkpoint_find(ck, tn, NULL);
        REQUIRE(ti, "%s missing", tn);
        int64_t rows = ti->shape[0], cols = ti->shape[1];
        A[m] = xmalloc((size_t)(r * cols) * sizeof(float));
        B[m] = xmalloc((size_t)(rows * r) * sizeof(float));
        for (int64_t i = 0; i < r * cols; i++) A[m][i] = frand();
        for (int64_t i = 0; i < rows * r; i++) B[m][i] = frand();
        ad[2 * m] = (st_write_tensor){.name = xasprintf("transformer.%s.lora_A.weight", k_e2e_modules[m]),
                                      .dtype = DT_F32, .ndim = 2, .shape = {r, cols}, .data = A[m]};
        ad[2 * m + 1] = (st_write_tensor){.name = xasprintf("transformer.%s.lora_B.weight", k_e2e_modules[m]),
                                          .dtype = DT_F32, .ndim = 2, .shape = {rows, r}, .data = B[m]};
        free(tn);
    }
    const char *meta[] = {"lora_adapter_metadata", "{\"transformer.r\": 4, \"transformer.lora_alpha\": 8}", NULL};
    char *lpath = xasprintf("%s/lora.safetensors", out);
    CHECK(st_write(lpath, ad, 2 * N_E2E, meta) == 0, "%s", tp_error_msg());
    /* the merged copy: every tensor as stored, the targets F32 */
    st_write_tensor *wt_ = xcalloc((size_t)ck->n, sizeof *wt_);
    for (int k = 0; k < ck->n; k++) {
        const st_tensor_info *ti = ck->infos[k];
        int m = -1;
        for (int q = 0; q < N_E2E; q++) {
            char *tn = xasprintf("%s.weight", k_e2e_modules[q]);
            if (!strcmp(tn, ti->name)) m = q;
            free(tn);
        }
        wt_[k] = (st_write_tensor){.name = ti->name, .dtype = ti->dtype, .ndim = ti->ndim};
        memcpy(wt_[k].shape, ti->shape, sizeof wt_[k].shape);
        if (m < 0) {
            void *d = xmalloc(ti->end - ti->begin);
            st_read_raw(ck->files[0], ti, d);
            wt_[k].data = d;
            continue;
        }
        float *W;
        st_read_f32(ck->files[0], ti->name, &W, NULL);
        int64_t rows = ti->shape[0], cols = ti->shape[1];
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                double s = 0;
                for (int64_t q = 0; q < r; q++) s += (double)B[m][i * r + q] * A[m][q * cols + j];
                W[i * cols + j] = (float)((double)W[i * cols + j] + coef * s);
            }
        wt_[k].dtype = DT_F32;
        wt_[k].data = W;
    }
    char *mdir = xasprintf("%s/merged", out), *tdir = xasprintf("%s/merged/transformer", out);
    mkdir(mdir, 0755), mkdir(tdir, 0755);
    char *mpath = xasprintf("%s/diffusion_pytorch_model.safetensors", tdir);
    CHECK(st_write(mpath, wt_, ck->n, NULL) == 0, "%s", tp_error_msg());
    char *cfg_src = xasprintf("%s/config.json", src), *cfg_dst = xasprintf("%s/config.json", tdir);
    json_t *cfg = json_load_file(cfg_src, 0, NULL);
    CHECK(cfg && json_dump_file(cfg, cfg_dst, JSON_INDENT(2)) == 0, "config copy");
    json_decref(cfg);
    /* the loader's merge of the adapter at 0.8 equals the offline one */
    backend *be = backend_cpu_create(1);
    lora_spec sp = {lpath, 0.8};
    for (int tp = 1; tp <= 2; tp++)
        for (int rk = 0; rk < tp; rk++) {
            flux2_model *mm = NULL;
            weights *w = NULL, *ref = NULL;
            lora_set *ls = NULL;
            checkpoint *ck2 = NULL, *ckm = NULL;
            plan p;
            json_t *c = json_load_file(cfg_src, 0, NULL);
            int rc = checkpoint_open(src, &ck2) || plan_flux2(c, &p) || lora_set_open(&sp, 1, ck2, 0, &ls);
            load_opts o = {.tp = tp, .rank = rk, .be = be, .dtype = DT_F32, .transform = lora_merge_shard,
                           .transform_ctx = ls};
            load_opts om = {.tp = tp, .rank = rk, .be = be, .dtype = DT_F32};
            rc = rc || weights_load(ck2, &p, &o, &w, NULL) || checkpoint_open(tdir, &ckm) ||
                 weights_load(ckm, &p, &om, &ref, NULL);
            CHECK(rc == 0, "tp %d: %s", tp, tp_error_msg());
            for (int q = 0; q < N_E2E && !rc; q++) {
                char *tn = xasprintf("%s.weight", k_e2e_modules[q]);
                const tensor *a = weights_get(w, tn), *b = weights_get(ref, tn);
                size_t n = tensor_numel(a);
                float *x = xmalloc(n * 4), *y = xmalloc(n * 4);
                tensor_download_f32(a, x), tensor_download_f32(b, y);
                double e = rel_l2(x, y, n);
                CHECK(e <= 1e-6, "%s tp %d rank %d: loader merge vs offline rel %.3g", tn, tp, rk, e);
                free(x), free(y), free(tn);
            }
            (void)mm;
            weights_free(w), weights_free(ref);
            lora_set_free(ls);
            checkpoint_close(ck2), checkpoint_close(ckm);
            json_decref(c);
        }
    backend_destroy(be);
    for (int i = 0; i < 2 * N_E2E; i++) free((void *)ad[i].name), free((void *)ad[i].data);
    for (int k = 0; k < ck->n; k++) free((void *)wt_[k].data);
    free(wt_);
    checkpoint_close(ck);
    free(out), free(src), free(lpath), free(mdir), free(tdir), free(mpath), free(cfg_src), free(cfg_dst);
}

/* run-spec loras: mappings or "FILE[:W]" strings; errors give line and column */
TEST(lora_runspec_key) {
    run_spec s;
    runspec_init(&s);
    int rc = runspec_load_string(&s, "loras:\n  - {path: a.safetensors, weight: -0.5}\n  - b.safetensors:0.25\n"
                                     "  - {path: c.safetensors}\n", "t.yaml");
    CHECK(rc == 0 && s.n_loras == 3, "parse: %s", tp_error_msg());
    if (!rc && s.n_loras == 3)
        CHECK(!strcmp(s.loras[0].path, "a.safetensors") && s.loras[0].weight == -0.5 &&
              !strcmp(s.loras[1].path, "b.safetensors") && s.loras[1].weight == 0.25 && s.loras[2].weight == 1.0,
              "values");
    char *argv[] = {"generate", "--lora", "x.safetensors:2", NULL};
    CHECK(runspec_parse_args(&s, 3, argv) == 0 && s.n_loras == 1 && s.loras[0].weight == 2.0, "flag replaces spec");
    runspec_free(&s);
    static const struct { const char *yaml, *want; } bad[] = {
        {"loras:\n  - {path: a, weight: \"1\"}\n", "t.yaml:2:"},
        {"loras:\n  - {path: a, wieght: 1}\n", "unknown key 'wieght'"},
        {"loras: a.safetensors\n", "list of adapters"},
        {"loras:\n  - [a]\n", "item 1"},
        {"lora: a.safetensors\n", "unknown key 'lora'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        runspec_init(&s);
        CHECK(runspec_load_string(&s, bad[i].yaml, "t.yaml") != 0 && strstr(tp_error_msg(), bad[i].want),
              "'%s': %s", bad[i].yaml, tp_error_msg());
        runspec_free(&s);
    }
}

/* The merge into shards in GPU memory (chunks copied down, merged on a host
 * backend, copied up) must give the CPU merge's bytes, for every rank of
 * tp 1/2/4, bf16 and f32. Run by scripts/gpu-check.sh (tpgen_tests --gpu). */
TEST_GPU(gpu_lora_merge_matches_cpu) {
    backend *gpu = backend_cuda_create(0), *cpu = backend_cpu_create(1);
    REQUIRE(gpu, "no CUDA backend: %s", tp_error_msg());
    char *dir = gpath("flux2-tiny-a/model/transformer");
    lora_spec sp[2] = {{gpath("flux2-lora/adapters/peft_r8.safetensors"), 0.7},
                       {gpath("flux2-lora/adapters/kohya_r4.safetensors"), -0.3}};
    for (int tp = 1; tp <= 4; tp *= 2)
        for (int k = 0; k < tp; k++)
            for (int d = 0; d < 2; d++) {
                dtype_t dt = d ? DT_F32 : DT_BF16;
                weights *wc = NULL, *wg = NULL;
                lora_set *lc = NULL, *lg = NULL;
                checkpoint *cc = NULL, *cg = NULL;
                plan pc, pg;
                REQUIRE(load_with(dir, sp, 2, tp, k, dt, cpu, &wc, &lc, &cc, &pc) == 0, "cpu: %s", tp_error_msg());
                REQUIRE(load_with(dir, sp, 2, tp, k, dt, gpu, &wg, &lg, &cg, &pg) == 0, "gpu: %s", tp_error_msg());
                for (int i = 0; i < weights_count(wc); i++) {
                    const tensor *a = weights_get(wc, weights_name(wc, i)), *b = weights_get(wg, weights_name(wc, i));
                    REQUIRE(b && tensor_nbytes(a) == tensor_nbytes(b), "%s shape", weights_name(wc, i));
                    char *h = xmalloc(tensor_nbytes(b));
                    CHECK(tensor_download_raw(b, h) == 0 && !memcmp(h, a->data, tensor_nbytes(a)),
                          "%s tp %d rank %d %s: GPU merge differs from the CPU merge", weights_name(wc, i), tp, k,
                          d ? "f32" : "bf16");
                    free(h);
                }
                weights_free(wc), weights_free(wg);
                lora_set_free(lc), lora_set_free(lg);
                checkpoint_close(cc), checkpoint_close(cg);
            }
    lora_specs_free(sp, 2);
    free(dir);
    backend_destroy(gpu);
    backend_destroy(cpu);
}
