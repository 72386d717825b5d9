/* FLUX.3 transformer tests: config parsing and the RoPE table against an
 * independent double-precision formula; the TP forward of both golden
 * flux3-tiny models (base and flow-map, with and without references)
 * against diffusers' outputs in f32 and bf16 and, under MPI, against an
 * unsharded run of the same model; and load errors that name the file. */
#include "test.h"
#include "flux3_case.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/models/flux3/flux3.h"
#include "core/formats/safetensors.h"
#include "kernels/ops.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int parse_text(const char *text, flux3_config *c) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    int rc = flux3_config_parse(j, "test config", c);
    json_decref(j);
    return rc;
}

TEST(flux3_config_fields_and_defaults) {
    flux3_config c;
    REQUIRE(parse_text("{\"_class_name\":\"Flux3Transformer2DModel\",\"in_channels\":32,\"cond_in_channels\":16,"
                       "\"num_layers\":2,\"num_single_layers\":3,\"attention_head_dim\":16,\"num_attention_heads\":6,"
                       "\"joint_attention_dim\":80,\"timestep_channels\":32,\"mlp_ratio\":3.0,"
                       "\"axes_dims_rope\":[4,4,4,4],\"rope_theta\":500,\"eps\":1e-5,\"flow_map\":true}", &c) == 0,
            "parse: %s", tp_error_msg());
    CHECK(c.D == 96 && c.M == 288 && c.in_channels == 32 && c.cond_in_channels == 16 && c.num_layers == 2 &&
              c.num_single_layers == 3 && c.joint_dim == 80 && c.time_channels == 32 && c.flow_map == 1 &&
              c.rope_theta == 500 && c.eps == 1e-5f && c.n_axes == 4 && c.axes_dims[3] == 4,
          "fields not read as written");
    /* the defaults are the diffusers class's: 24 x 128, 5 + 28 blocks, joint dim 20480, theta 10000 */
    REQUIRE(parse_text("{}", &c) == 0, "defaults: %s", tp_error_msg());
    CHECK(c.D == 3072 && c.M == 9216 && c.num_layers == 5 && c.num_single_layers == 28 && c.joint_dim == 20480 &&
              c.rope_theta == 10000 && c.time_channels == 256 && !c.flow_map && c.axes_dims[0] == 32,
          "defaults D=%lld layers %d/%d joint %d theta %g", (long long)c.D, c.num_layers, c.num_single_layers,
          c.joint_dim, c.rope_theta);
}

TEST(flux3_config_rejects_bad_fields) {
    flux3_config c;
    struct { const char *json, *says; } bad[] = {
        {"{\"_class_name\":\"Flux2Transformer2DModel\"}", "not a FLUX.3"},
        {"{\"attention_head_dim\":64}", "axes_dims_rope"},
        {"{\"num_attention_heads\":0}", "num_attention_heads"},
        {"{\"axes_dims_rope\":[32,32,31,33]}", "axes_dims_rope[2]"},
        {"{\"flow_map\":1}", "flow_map"},
        {"{\"num_layers\":-1}", "num_layers"},
        {"{\"joint_attention_dim\":99999999999}", "joint_attention_dim"},
        {"{\"mlp_ratio\":1e9}", "mlp_ratio"},
        {"{\"timestep_channels\":33}", "timestep_channels"},
        {"[1]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(parse_text(bad[i].json, &c) != 0 && strstr(tp_error_msg(), bad[i].says) &&
                  strstr(tp_error_msg(), "test config"),
              "%s: not refused naming '%s': %s", bad[i].json, bad[i].says, tp_error_msg());
}

/* Independent RoPE: omega = exp(-(2k/d) ln theta) per axis, negative ids
 * (the references' l = -1, -2) included. */
TEST(flux3_rope_table_matches_double_formula) {
    flux3_config c;
    REQUIRE(parse_text("{}", &c) == 0, "parse");
    int32_t ids[] = {0, 0, 0, 0, 0, 5, 9, 0, 0, 3, 7, -1, 0, 63, 47, -2, 0, 0, 0, 511};
    int n = 5, hd = c.head_dim;
    float *co = malloc((size_t)(n * hd) * 4), *si = malloc((size_t)(n * hd) * 4);
    for (int i = 0; i < n * hd; i++) co[i] = si[i] = NAN;
    flux3_rope_table(&c, ids, n, co, si);
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int a = 0, base = 0; a < c.n_axes; base += c.axes_dims[a], a++)
            for (int j = 0; j < c.axes_dims[a]; j++) {
                double ang = ids[4 * t + a] * exp(-(2.0 * (j / 2) / c.axes_dims[a]) * log(c.rope_theta));
                double e = fmax(fabs(co[t * hd + base + j] - cos(ang)), fabs(si[t * hd + base + j] - sin(ang)));
                worst = e == e ? fmax(worst, e) : INFINITY;
            }
    CHECK(worst <= 1e-7, "max |diff| %.3g against the double formula", worst);
    free(co), free(si);
}

/* ---- golden cases ---- */

static char *golden_path(const char *fmt, const char *variant) {
    char rel[256];
    snprintf(rel, sizeof rel, fmt, variant);
    return xasprintf("%s/%s", test_golden_dir(), rel);
}

/* 1 on every rank of WORLD when ok is 1 on every rank */
static int all_ok(int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}


/* Every case of one golden model: the TP result against diffusers' output
 * (tol_ref) and, when the group has tp > 1, against this rank's own
 * unsharded run (tol_tp1). One all-reduce per layer at tp > 1. */
static void golden_model(const char *variant, dtype_t prec, double tol_ref, double tol_tp1) {
    int tp;
    MPI_Comm g = f3_tp_group(6, &tp);
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(g, be), *self = comm_create_mpi(MPI_COMM_SELF, be);
    flux3_model *m = NULL, *m1 = NULL;
    st_file *f = NULL;
    char *dir = golden_path("flux3-tiny/%s/model/transformer", variant);
    char *cases = golden_path("flux3-tiny/%s/transformer_cases.safetensors", variant);
    int rc = flux3_load(dir, be, c, prec, &m, NULL);
    if (!rc && tp > 1) rc = flux3_load(dir, be, self, prec, &m1, NULL);
    if (!rc) rc = st_open(cases, &f);
    CHECK(rc == 0, "%s: %s", variant, tp_error_msg());
    if (!all_ok(rc == 0)) goto out;
    if (prec == DT_BF16) flux3_set_exact_timestep(m, 1);
    if (m1 && prec == DT_BF16) flux3_set_exact_timestep(m1, 1);
    const flux3_config *cfg = flux3_get_config(m);
    int n_refs = 0;
    for (int k = 0; k < 4; k++) {
        f3_case cs;
        int ok = f3_case_read(f, k, &cs) == 0;
        CHECK(ok, "%s case%d: %s", variant, k, tp_error_msg());
        if (!all_ok(ok)) break;
        n_refs += cs.R > 0;
        size_t n = (size_t)cs.N * (size_t)cfg->in_channels;
        float *out = malloc(n * 4), *out1 = malloc(n * 4);
        for (size_t i = 0; i < n; i++) out[i] = out1[i] = NAN;
        flux3_inputs in = f3_case_inputs(&cs);
        flux3_stats s0, s1;
        flux3_get_stats(m, &s0);
        rc = flux3_forward(m, &in, out);
        flux3_get_stats(m, &s1);
        if (!rc && m1) rc = flux3_forward(m1, &in, out1);
        CHECK(rc == 0, "%s case%d forward: %s", variant, k, tp_error_msg());
        if (rc == 0) {
            double err = rel_l2(out, cs.ref, n);
            CHECK(err <= tol_ref, "%s case%d (%s, tp %d, R %lld): rel_err %.3g > %.3g", variant, k,
                  prec == DT_F32 ? "f32" : "bf16", tp, (long long)cs.R, err, tol_ref);
            if (m1) {
                double e1 = rel_l2(out, out1, n);
                CHECK(e1 <= tol_tp1, "%s case%d: tp %d vs tp 1 rel_err %.3g > %.3g", variant, k, tp, e1, tol_tp1);
            }
            long want = tp > 1 ? cfg->num_layers + cfg->num_single_layers : 0;
            CHECK(s1.allreduces - s0.allreduces == want, "%ld all-reduces per forward, expected %ld",
                  s1.allreduces - s0.allreduces, want);
            int grank;
            MPI_Comm_rank(g, &grank);
            if (getenv("TPGEN_TEST_VERBOSE") && grank == 0)
                printf("# %s %s tp %d case%d R=%lld rel_err %.3e vs tp 1 %.3e\n", variant,
                       prec == DT_F32 ? "f32" : "bf16", tp, k, (long long)cs.R, err, m1 ? rel_l2(out, out1, n) : 0.0);
        }
        free(out), free(out1);
        f3_case_free(&cs);
        if (!all_ok(rc == 0)) break;
    }
    CHECK(n_refs == 2, "%s: expected 2 cases with references, read %d", variant, n_refs);
out:
    if (f) st_close(f);
    flux3_free(m), flux3_free(m1);
    comm_destroy(c), comm_destroy(self);
    backend_destroy(be);
    MPI_Comm_free(&g);
    free(dir), free(cases);
}

TEST_MPI(flux3_golden_base_f32) { golden_model("base", DT_F32, 1e-5, 1e-5); }
TEST_MPI(flux3_golden_flowmap_f32) { golden_model("flowmap", DT_F32, 1e-5, 1e-5); }
TEST_MPI(flux3_golden_base_bf16) { golden_model("base", DT_BF16, 3e-2, 3e-2); }
TEST_MPI(flux3_golden_flowmap_bf16) { golden_model("flowmap", DT_BF16, 3e-2, 3e-2); }

/* ---- errors ---- */

/* A folder with the golden `variant`'s weights (a link) and its config with
 * `key` set to the JSON `value`. */
static char *edited_model(const char *tag, const char *variant, const char *key, const char *value) {
    char *src = golden_path("flux3-tiny/%s/model/transformer", variant);
    char *dir = xasprintf("%s/flux3-%s", test_tmp_dir(), tag), *cfg = xasprintf("%s/config.json", src);   /* the tmp folder is the process's */
    char *abs = realpath(src, NULL);
    json_t *j = json_load_file(cfg, 0, NULL), *v = json_loads(value, JSON_DECODE_ANY, NULL);
    char *link = xasprintf("%s/diffusion_pytorch_model.safetensors", dir), *target = abs ?
        xasprintf("%s/diffusion_pytorch_model.safetensors", abs) : NULL;
    char *out = xasprintf("%s/config.json", dir);
    int ok = j && v && target && mkdir(dir, 0755) == 0 && symlink(target, link) == 0 &&
             json_object_set_new(j, key, v) == 0 && json_dump_file(j, out, 0) == 0;
    json_decref(j);
    free(src), free(cfg), free(abs), free(link), free(target), free(out);
    if (!ok) { free(dir); return NULL; }
    return dir;
}

TEST(flux3_load_refuses_mismatched_configs) {
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_SELF, be);
    struct { const char *tag, *variant, *key, *value, *says; } bad[] = {
        /* a flow-map config over weights without the target embedder */
        {"no-target", "base", "flow_map", "true", "target_timestep_embedder.linear_1.weight"},
        /* a base config over flow-map weights: tensors the config does not explain */
        {"extra-target", "flowmap", "flow_map", "false", "target_timestep_embedder"},
        /* missing mode weights: a third mode block */
        {"layers", "base", "num_layers", "3", "txt_mode_blocks.2.attn.to_q.weight"},
        {"singles", "base", "num_single_layers", "1", "single_transformer_blocks.1"},
        /* a joint dim that does not match the text features */
        {"joint", "base", "joint_attention_dim", "64", "context_embedder.weight"},
        {"cond", "base", "cond_in_channels", "16", "x_embedders.image_cond.weight"},
        {"class", "base", "_class_name", "\"Flux2Transformer2DModel\"", "not a FLUX.3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *dir = edited_model(bad[i].tag, bad[i].variant, bad[i].key, bad[i].value);
        CHECK(dir, "%s: could not build the edited model folder", bad[i].tag);
        if (!dir) continue;
        flux3_model *m = NULL;
        int rc = flux3_load(dir, be, c, DT_F32, &m, NULL);
        CHECK(rc != 0 && !m && strstr(tp_error_msg(), bad[i].says) && strstr(tp_error_msg(), bad[i].tag),
              "%s: not refused naming '%s' and the folder: %s", bad[i].tag, bad[i].says, tp_error_msg());
        flux3_free(m);
        free(dir);
    }
    flux3_model *m = NULL;
    CHECK(flux3_load("/nonexistent/transformer", be, c, DT_F32, &m, NULL) != 0 &&
              strstr(tp_error_msg(), "/nonexistent/transformer/config.json"),
          "missing folder: %s", tp_error_msg());
    comm_destroy(c);
    backend_destroy(be);
}

/* forward arguments: target_timestep exactly for flow-map models, ids with references */
TEST(flux3_forward_refuses_bad_inputs) {
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_SELF, be);
    flux3_model *base = NULL, *fm = NULL;
    char *d1 = golden_path("flux3-tiny/%s/model/transformer", "base");
    char *d2 = golden_path("flux3-tiny/%s/model/transformer", "flowmap");
    char *cases = golden_path("flux3-tiny/%s/transformer_cases.safetensors", "flowmap");
    st_file *f = NULL;
    f3_case cs = {0};
    int ok = flux3_load(d1, be, c, DT_F32, &base, NULL) == 0 && flux3_load(d2, be, c, DT_F32, &fm, NULL) == 0 &&
             st_open(cases, &f) == 0 && f3_case_read(f, 1, &cs) == 0;
    CHECK(ok, "setup: %s", tp_error_msg());
    if (ok) {
        float *out = malloc((size_t)cs.N * 32 * 4);
        flux3_inputs in = f3_case_inputs(&cs);
        CHECK(flux3_forward(base, &in, out) != 0 && strstr(tp_error_msg(), "target_timestep"),
              "base model took a target_timestep: %s", tp_error_msg());
        in.target_timestep = NULL;
        CHECK(flux3_forward(fm, &in, out) != 0 && strstr(tp_error_msg(), "flow_map true"),
              "flow-map model ran without target_timestep: %s", tp_error_msg());
        in = f3_case_inputs(&cs);
        in.cond_ids = NULL;
        CHECK(flux3_forward(fm, &in, out) != 0 && strstr(tp_error_msg(), "reference"),
              "references without ids: %s", tp_error_msg());
        in = f3_case_inputs(&cs);
        CHECK(flux3_forward(fm, &in, out) == 0 && rel_l2(out, cs.ref, (size_t)cs.N * 32) <= 1e-5,
              "the model is not usable after refused calls: %s", tp_error_msg());
        free(out);
    }
    f3_case_free(&cs);
    if (f) st_close(f);
    flux3_free(base), flux3_free(fm);
    free(d1), free(d2), free(cases);
    comm_destroy(c);
    backend_destroy(be);
}

/* tp 4 does not divide 6 heads: refused on every rank, naming the count */
TEST_MPI(flux3_load_refuses_tp_not_dividing_heads) {
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 4) return;   /* 1, 2 (and 3) divide 6 */
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_WORLD, be);
    flux3_model *m = NULL;
    char *dir = golden_path("flux3-tiny/%s/model/transformer", "base");
    CHECK(flux3_load(dir, be, c, DT_F32, &m, NULL) != 0 && !m &&
              strstr(tp_error_msg(), "does not divide num_attention_heads 6"),
          "tp 4 with 6 heads: %s", tp_error_msg());
    free(dir);
    comm_destroy(c);
    backend_destroy(be);
}
