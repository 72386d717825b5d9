/* FLUX.2 transformer tests: host-side pieces (config, sinusoid, RoPE tables)
 * against independent double-precision computations, and the TP forward
 * against the golden diffusers outputs of flux2-tiny-a at every np. */
#include "test.h"
#include "golden_case.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/models/flux2/flux2.h"
#include "core/models/flux2/flux2_impl.h"
#include "core/formats/safetensors.h"
#include "kernels/ops.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static const char *tiny_config =
    "{\"patch_size\":1,\"in_channels\":32,\"out_channels\":null,\"num_layers\":2,\"num_single_layers\":3,"
    "\"attention_head_dim\":32,\"num_attention_heads\":4,\"joint_attention_dim\":96,"
    "\"timestep_guidance_channels\":64,\"mlp_ratio\":3.0,\"axes_dims_rope\":[8,8,8,8],\"rope_theta\":2000,"
    "\"eps\":1e-06,\"guidance_embeds\":true}";

static int parse_text(const char *text, flux2_config *c) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    int rc = flux2_config_parse(j, "test config", c);
    json_decref(j);
    return rc;
}

TEST(flux2_config_fields_and_derived) {
    flux2_config c;
    REQUIRE(parse_text(tiny_config, &c) == 0, "parse: %s", tp_error_msg());
    CHECK(c.D == 128 && c.M == 384 && c.out_dim == 32, "derived D=%lld M=%lld out=%lld", (long long)c.D,
          (long long)c.M, (long long)c.out_dim);
    CHECK(c.out_channels == 32 && c.num_layers == 2 && c.num_single_layers == 3 && c.joint_dim == 96 &&
              c.time_channels == 64 && c.guidance_embeds == 1 && c.n_axes == 4 && c.axes_dims[3] == 8,
          "fields not read as written");
    CHECK(c.eps == 1e-6f && c.rope_theta == 2000.0, "eps/theta");
    /* defaults are the FLUX.2-dev values */
    REQUIRE(parse_text("{}", &c) == 0, "defaults: %s", tp_error_msg());
    CHECK(c.D == 6144 && c.M == 18432 && c.num_single_layers == 48 && c.joint_dim == 15360 && c.guidance_embeds,
          "dev defaults");
}

TEST(flux2_config_rejects_inconsistent) {
    flux2_config c;
    CHECK(parse_text("{\"attention_head_dim\":64}", &c) != 0 && strstr(tp_error_msg(), "axes_dims_rope"),
          "axes sum vs head dim not caught: %s", tp_error_msg());
    CHECK(parse_text("{\"num_attention_heads\":0}", &c) != 0 && strstr(tp_error_msg(), "num_attention_heads"),
          "zero heads not caught: %s", tp_error_msg());
    CHECK(parse_text("{\"axes_dims_rope\":[32,32,31,33]}", &c) != 0, "odd axis dims not caught");
    CHECK(parse_text("{\"guidance_embeds\":3}", &c) != 0, "non-boolean guidance_embeds not caught");
}

/* Independent sinusoid: frequencies as 10000^(-k/half) in double. The spec's
 * fp32 rounding of the exponent and argument moves the angle by at most a few
 * ulp of |arg| (<= 1000 here), so compare with an absolute tolerance. */
TEST(flux2_sinusoid_matches_double_formula) {
    int ch = 256, half = 128;
    float out[256];
    float values[] = {0.0f, 1.0f, 250.0f, 996.0f, 4000.0f};
    for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
        for (int i = 0; i < ch; i++) out[i] = NAN;
        flux2_sinusoid(values[v], ch, out);
        double worst = 0;
        for (int k = 0; k < half; k++) {
            double arg = values[v] * pow(10000.0, -(double)k / half);
            double dc = fabs(out[k] - cos(arg)), ds = fabs(out[half + k] - sin(arg));
            worst = fmax(worst, fmax(dc, ds));
            if (!(dc == dc) || !(ds == ds)) worst = INFINITY;
        }
        double tol = 2e-6 + 4e-7 * values[v];
        CHECK(worst <= tol, "value %g: max |diff| %.3g > %.3g", values[v], worst, tol);
    }
    flux2_sinusoid(0.0f, ch, out);
    CHECK(out[0] == 1.0f && out[half] == 0.0f && out[half - 1] == 1.0f, "cos must come first");
}

/* Independent RoPE table: omega = exp(-(2k/d) ln theta), angle per axis. */
static void rope_reference(const flux2_config *c, const int32_t *id, double *co, double *si) {
    int base = 0;
    for (int a = 0; a < c->n_axes; a++) {
        for (int j = 0; j < c->axes_dims[a]; j++) {
            int k = j / 2;
            double ang = id[a] * exp(-(2.0 * k / c->axes_dims[a]) * log(c->rope_theta));
            co[base + j] = cos(ang), si[base + j] = sin(ang);
        }
        base += c->axes_dims[a];
    }
}

static void check_rope(const flux2_config *c, const int32_t *ids, int n) {
    int hd = c->head_dim;
    float *co = malloc((size_t)(n * hd) * 4), *si = malloc((size_t)(n * hd) * 4);
    double *rc = malloc((size_t)hd * 8), *rs = malloc((size_t)hd * 8);
    for (int i = 0; i < n * hd; i++) co[i] = si[i] = NAN;
    flux2_rope_table(c, ids, n, co, si);
    double worst = 0;
    for (int t = 0; t < n; t++) {
        rope_reference(c, ids + 4 * t, rc, rs);
        for (int d = 0; d < hd; d++) {
            double e = fmax(fabs(co[t * hd + d] - rc[d]), fabs(si[t * hd + d] - rs[d]));
            worst = e == e ? fmax(worst, e) : INFINITY;
        }
    }
    CHECK(worst <= 1e-7, "hd %d: max |diff| %.3g against the double formula", hd, worst);
    free(co), free(si), free(rc), free(rs);
}

TEST(flux2_rope_table_matches_double_formula) {
    flux2_config tiny, dev;
    REQUIRE(parse_text(tiny_config, &tiny) == 0 && parse_text("{}", &dev) == 0, "parse");
    int32_t ids[] = {0, 0, 0, 0, 0, 0, 0, 511, 0, 3, 5, 0, 0, 63, 47, 0, 10, 7, 2, 0, 0, 127, 1, 0};
    check_rope(&tiny, ids, 6);
    check_rope(&dev, ids, 6);
    /* a text token (0,0,0,l) rotates only the last axis */
    float co[128], si[128];
    int32_t txt[4] = {0, 0, 0, 9};
    flux2_rope_table(&dev, txt, 1, co, si);
    int passthrough = 1;
    for (int d = 0; d < 96; d++) passthrough &= co[d] == 1.0f && si[d] == 0.0f;
    CHECK(passthrough, "dims 0..95 of a text token must pass through");
    CHECK(si[96] != 0.0f && co[96] == co[97] && si[96] == si[97], "pairs share a frequency");
}

/* ---- the TP forward against golden outputs (run at np 1, 2, 4) ---- */

static char *golden_path(const char *rel) {
    char *p = malloc(strlen(test_golden_dir()) + strlen(rel) + 2);
    sprintf(p, "%s/%s", test_golden_dir(), rel);
    return p;
}


static int read_golden_case(const st_file *f, int k, golden_case *c) {
    char key[32];
    snprintf(key, sizeof key, "case%d.output", k);
    return golden_case_read(f, k, c) || golden_case_read_ref(f, key, c) ? -1 : 0;
}


/* 1 on every rank when ok is 1 on every rank (keeps ranks in step before a collective) */
static int all_ok(int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

typedef struct tp_env { backend *be; comm *c; flux2_model *m; } tp_env;

static int env_open(tp_env *e, dtype_t prec) {
    memset(e, 0, sizeof *e);
    e->be = backend_cpu_create(1);
    e->c = comm_create_mpi(MPI_COMM_WORLD, e->be);
    char *dir = golden_path("flux2-tiny-a/model/transformer");
    int rc = flux2_load(dir, e->be, e->c, prec, &e->m, NULL);
    free(dir);
    if (rc) test_fail(__FILE__, __LINE__, "load: %s", tp_error_msg());
    return all_ok(rc == 0);
}

static void env_close(tp_env *e) {
    flux2_free(e->m);
    comm_destroy(e->c);
    backend_destroy(e->be);
}

static void golden_cases(dtype_t prec, double tol) {
    tp_env e;
    st_file *f = NULL;
    char *path = golden_path("flux2-tiny-a/transformer_cases.safetensors");
    int opened = st_open(path, &f) == 0;
    free(path);
    if (!opened) test_fail(__FILE__, __LINE__, "cases: %s", tp_error_msg());
    if (!env_open(&e, prec) || !all_ok(opened)) goto out;
    if (prec == DT_BF16) flux2_set_exact_timestep(e.m, 1);
    for (int k = 0; k < 3; k++) {
        golden_case c = {0};
        int ok = read_golden_case(f, k, &c) == 0;
        CHECK(ok, "case%d: %s", k, tp_error_msg());
        if (!all_ok(ok)) break;
        size_t n = (size_t)c.N * 32;
        float *out = malloc(n * 4);
        for (size_t i = 0; i < n; i++) out[i] = NAN;
        int rc = flux2_forward(e.m, c.x, c.N, c.img_ids, c.txt, c.L, c.txt_ids, c.ts, &c.g, out);
        CHECK(rc == 0, "case%d forward: %s", k, tp_error_msg());
        double err = rel_l2(out, c.ref, n);
        CHECK(err <= tol, "case%d (%s): rel_err %.3g > %.3g", k, prec == DT_F32 ? "f32" : "bf16", err, tol);
        free(out);
        golden_case_free(&c);
    }
out:
    if (f) st_close(f);
    env_close(&e);
}

TEST_MPI(flux2_golden_cases_f32) { golden_cases(DT_F32, 1e-4); }
TEST_MPI(flux2_golden_cases_bf16) { golden_cases(DT_BF16, 3e-2); }

/* Fused (one all-reduce per sub-layer) and unfused all-reduces add the same
 * pairs at tp 2 (bit-identical); at tp 4 MPI may order the sums differently.
 * Also: the text-projection cache returns the same result as a fresh run. */
TEST_MPI(flux2_fused_allreduce_and_text_cache) {
    tp_env e;
    st_file *f = NULL;
    golden_case c = {0};
    char *path = golden_path("flux2-tiny-a/transformer_cases.safetensors");
    int ok = st_open(path, &f) == 0 && read_golden_case(f, 1, &c) == 0;
    free(path);
    CHECK(ok, "cases: %s", tp_error_msg());
    if (!env_open(&e, DT_F32) || !all_ok(ok)) goto out;
    size_t n = (size_t)c.N * 32;
    float *a = malloc(n * 4), *b = malloc(n * 4), *d = malloc(n * 4);
    flux2_stats s0, s1;
    flux2_get_stats(e.m, &s0);
    int rc = flux2_forward(e.m, c.x, c.N, c.img_ids, c.txt, c.L, c.txt_ids, c.ts, &c.g, a);
    flux2_set_fused_allreduce(e.m, 0);
    rc |= flux2_forward(e.m, c.x, c.N, c.img_ids, c.txt, c.L, c.txt_ids, c.ts, &c.g, b);
    flux2_get_stats(e.m, &s1);
    REQUIRE(all_ok(rc == 0), "forward: %s", tp_error_msg());
    int size = e.c->size;
    double diff = max_abs_diff(a, b, n);
    CHECK(size > 2 ? diff <= 1e-6 : diff == 0, "fused vs unfused differ by %.3g at tp %d", diff, size);
    long want = size == 1 ? 0 : (2 + 4) * 2 + 3 * 2;   /* one fused + one unfused forward */
    CHECK(s1.allreduces - s0.allreduces == want, "%ld all-reduces, expected %ld", s1.allreduces - s0.allreduces, want);
    CHECK(s1.txt_cache_hits == 1 && s1.txt_cache_misses == 1, "text cache hits %ld misses %ld", s1.txt_cache_hits,
          s1.txt_cache_misses);
    /* a fresh model (no cache) gives the same bits as the cached run */
    flux2_model *fresh = NULL;
    char *dir = golden_path("flux2-tiny-a/model/transformer");
    rc = flux2_load(dir, e.be, e.c, DT_F32, &fresh, NULL);
    free(dir);
    if (all_ok(rc == 0)) {
        flux2_set_fused_allreduce(fresh, 0);
        rc = flux2_forward(fresh, c.x, c.N, c.img_ids, c.txt, c.L, c.txt_ids, c.ts, &c.g, d);
        CHECK(all_ok(rc == 0) && max_abs_diff(b, d, n) == 0, "cached text projection changed the result");
    }
    flux2_free(fresh);
    free(a), free(b), free(d);
out:
    golden_case_free(&c);
    if (f) st_close(f);
    env_close(&e);
}

/* ---- load errors speak about the file ---- */

/* a transformer folder whose shards are the golden ones, with an edited config */
static char *edited_model(const char *tag, const char *key, const char *value) {
    char *dir = malloc(512), *cmd = malloc(2048);
    snprintf(dir, 512, "%s/%s", test_tmp_dir(), tag);
    char *rel = golden_path("flux2-tiny-a/model/transformer"), *src = realpath(rel, NULL);
    free(rel);
    if (!src) { free(dir), free(cmd); return NULL; }
    snprintf(cmd, 2048,
             "mkdir -p %s && ln -sf %s/*.safetensors %s/*.json %s/ && rm %s/config.json && "
             "sed 's/\"%s\": *[^,]*/\"%s\": %s/' %s/config.json > %s/config.json",
             dir, src, src, dir, dir, key, key, value, src, dir);
    int rc = system(cmd);
    free(src), free(cmd);
    if (rc) { free(dir); return NULL; }
    return dir;
}

TEST(flux2_load_rejects_mismatched_config) {
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_SELF, be);
    flux2_model *m = NULL;
    char *d1 = edited_model("layers", "num_layers", "3"), *d2 = edited_model("jt", "joint_attention_dim", "64");
    REQUIRE(d1 && d2, "could not build the edited model folders");
    CHECK(flux2_load(d1, be, c, DT_F32, &m, NULL) != 0 && !m && strstr(tp_error_msg(), "tensors"),
          "wrong num_layers not reported by tensor count: %s", tp_error_msg());
    CHECK(flux2_load(d2, be, c, DT_F32, &m, NULL) != 0 && strstr(tp_error_msg(), "context_embedder.weight"),
          "wrong joint_attention_dim not reported on the tensor: %s", tp_error_msg());
    CHECK(flux2_load("/nonexistent/transformer", be, c, DT_F32, &m, NULL) != 0 &&
              strstr(tp_error_msg(), "/nonexistent/transformer/config.json"),
          "missing folder: %s", tp_error_msg());
    free(d1), free(d2);
    comm_destroy(c);
    backend_destroy(be);
}

/* The caches follow their inputs: after a forward with one prompt and one id
 * set, a forward with another prompt and other ids gives the same bits as a
 * fresh model (no stale context projection or RoPE table). */
TEST_MPI(flux2_caches_follow_inputs) {
    tp_env e;
    st_file *f = NULL;
    golden_case a = {0}, b = {0};
    char *path = golden_path("flux2-tiny-a/transformer_cases.safetensors");
    int ok = st_open(path, &f) == 0 && read_golden_case(f, 0, &a) == 0 && read_golden_case(f, 2, &b) == 0;
    free(path);
    CHECK(ok, "cases: %s", tp_error_msg());
    if (!env_open(&e, DT_F32) || !all_ok(ok)) goto out;
    size_t n = (size_t)b.N * 32;
    float *o1 = malloc(n * 4), *o2 = malloc(n * 4);
    for (int64_t i = 0; i < b.N; i++) b.img_ids[4 * i] = 10;   /* a reference-image time offset */
    b.txt[5] += 0.25f;                                          /* a prompt never seen before */
    int rc = flux2_forward(e.m, a.x, a.N, a.img_ids, a.txt, a.L, a.txt_ids, a.ts, &a.g, o1);
    rc |= flux2_forward(e.m, a.x, b.N, b.img_ids, b.txt, b.L, b.txt_ids, a.ts, &a.g, o1);
    flux2_stats s;
    flux2_get_stats(e.m, &s);
    flux2_model *fresh = NULL;
    char *dir = golden_path("flux2-tiny-a/model/transformer");
    rc |= flux2_load(dir, e.be, e.c, DT_F32, &fresh, NULL);
    free(dir);
    if (all_ok(rc == 0)) {
        rc = flux2_forward(fresh, a.x, b.N, b.img_ids, b.txt, b.L, b.txt_ids, a.ts, &a.g, o2);
        CHECK(all_ok(rc == 0) && max_abs_diff(o1, o2, n) == 0, "stale cache: outputs differ by %.3g",
              max_abs_diff(o1, o2, n));
        CHECK(s.txt_cache_misses == 2 && s.txt_cache_hits == 0, "hits %ld misses %ld", s.txt_cache_hits,
              s.txt_cache_misses);
    } else {
        CHECK(0, "forward/load: %s", tp_error_msg());
    }
    flux2_free(fresh);
    free(o1), free(o2);
out:
    golden_case_free(&a), golden_case_free(&b);
    if (f) st_close(f);
    env_close(&e);
}
