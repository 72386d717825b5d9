/* fp8 checkpoints: the 256 codes of each format against a table computed
 * here from the format definitions; the flux2-fp8 golden set (dequantised
 * tensors bit-exact, per rank at np 1/2/4; diffusers' outputs at f32 and
 * bf16); --quantize fp8 against an independent absmax quantiser; and the
 * bad inputs (bad_* tests also run under the sanitizers). */
#include "core/models/model_plan.h"
#include "test.h"
#include "golden_case.h"
#include "core/formats/checkpoint.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "kernels/cpu/cpu_ops.h"
#include "core/formats/fp8.h"
#include "core/models/flux2/flux2.h"
#include "core/formats/safetensors.h"
#include "core/formats/weights.h"
#include "kernels/ops.h"
#include <mpi.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

/* ---- decode: every code, from the definitions ---- */

/* E4M3 (fn): bias 7; exponent 0 subnormal m/8 * 2^-6; S.1111.111 NaN; no inf.
 * E5M2: bias 15; exponent 0 subnormal m/4 * 2^-14; exponent 31: inf (m 0) or NaN. */
static double ref_e4m3(unsigned c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double v;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) v = m / 8.0 * pow(2, -6);
    else v = (1 + m / 8.0) * pow(2, e - 7);
    return s ? -v : v;
}
static double ref_e5m2(unsigned c) {
    int s = c >> 7, e = (c >> 2) & 31, m = c & 3;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = m / 4.0 * pow(2, -14);
    else v = (1 + m / 4.0) * pow(2, e - 15);
    return s ? -v : v;
}

TEST(fp8_decode_all_256_codes) {
    int bad = 0, nan4 = 0, nan5 = 0, inf5 = 0;
    for (unsigned c = 0; c < 256; c++) {
        double a = ref_e4m3(c), b = ref_e5m2(c);
        float x = fp8_to_f32(DT_F8_E4M3, (uint8_t)c), y = fp8_to_f32(DT_F8_E5M2, (uint8_t)c);
        if (isnan(a)) nan4++, bad += !isnan(x);
        else bad += (double)x != a || !signbit(x) != !signbit(a);
        if (isnan(b)) nan5++, bad += !isnan(y);
        else bad += (double)y != b || !signbit(y) != !signbit(b);
        inf5 += isinf(y) != 0;
        if (bad) { CHECK(0, "code 0x%02x: e4m3 %g (want %g), e5m2 %g (want %g)", c, x, a, y, b); return; }
    }
    CHECK(nan4 == 2 && nan5 == 6 && inf5 == 2, "NaN/inf code counts %d %d %d", nan4, nan5, inf5);
    CHECK(fp8_to_f32(DT_F8_E4M3, 0x7e) == 448.0f && fp8_to_f32(DT_F8_E5M2, 0x7b) == 57344.0f, "max finite");
    /* safetensors reads go through the same decode */
    uint8_t codes[3] = {0x38, 0xb8, 0x01};
    float out[3];
    REQUIRE(convert_to_f32(out, codes, DT_F8_E4M3, 3) == 0, "convert");
    CHECK(out[0] == 1.0f && out[1] == -1.0f && out[2] == ldexpf(1, -9), "convert_to_f32: %g %g %g", out[0], out[1], out[2]);
}

/* The encoder: every finite code round-trips, and random values go to a
 * nearest code (ties to the even code), as torch's float -> float8 does. */
TEST(fp8_encode_nearest_even) {
    dtype_t dts[2] = {DT_F8_E4M3, DT_F8_E5M2};
    srand(test_seed());
    for (int d = 0; d < 2; d++) {
        double (*ref)(unsigned) = d ? ref_e5m2 : ref_e4m3;
        for (unsigned c = 0; c < 256; c++) {
            double v = ref(c);
            if (!isfinite(v)) continue;
            uint8_t got = f32_to_fp8(dts[d], (float)v);
            CHECK(got == c || (v == 0 && (got & 0x7f) == 0), "%s code 0x%02x -> 0x%02x", dtype_name(dts[d]), c, got);
        }
        for (int i = 0; i < 20000; i++) {
            float x = (float)((rand() / (double)RAND_MAX * 2 - 1) * fp8_max(dts[d]) * pow(2, -(rand() % 12)));
            uint8_t q = f32_to_fp8(dts[d], x);
            double e = fabs(ref(q) - x);
            for (unsigned c = 0; c < 256; c++) {
                double v = ref(c);
                if (!isfinite(v)) continue;
                double f = fabs(v - x);
                int worse = f < e || (f == e && (c & 1) == 0 && (q & 1) && v != ref(q));
                if (worse) { CHECK(0, "%s: %.9g -> %g, but %g is nearer (or the even tie)", dtype_name(dts[d]), x, ref(q), v); return; }
            }
        }
    }
}

/* ---- the golden set ---- */

static char *gpath(const char *rel) { return xasprintf("%s/flux2-fp8/%s", test_golden_dir(), rel); }

static int all_ok(int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

static const char *k_variants[3] = {"scaled", "channel", "e5m2"};

/* The rows or columns rank `rank` of tp holds, by the FLUX.2 TP plan
 * (written out here from the diffusers _tp_plan, not from plans/):
 * colwise: rows in blocks; rowwise: columns in blocks. */
static void expected_part(const char *name, int64_t D, int64_t M, int *dim, int64_t *blocks, int *nb) {
    *dim = -1, *nb = 1;
    if (strstr(name, "to_qkv_mlp_proj")) { *dim = 0, *nb = 5; int64_t b[5] = {D, D, D, M, M}; memcpy(blocks, b, sizeof b); return; }
    if (strstr(name, "single_transformer_blocks") && strstr(name, "attn.to_out")) { *dim = 1, *nb = 2; blocks[0] = D, blocks[1] = M; return; }
    if (strstr(name, "linear_in")) { *dim = 0, *nb = 2; blocks[0] = blocks[1] = M; return; }
    if (strstr(name, "to_out.0") || strstr(name, "to_add_out") || strstr(name, "linear_out")) { *dim = 1, blocks[0] = strstr(name, "linear_out") ? M : D; return; }
    if (strstr(name, "to_q") || strstr(name, "to_k") || strstr(name, "to_v") || strstr(name, "add_")) { *dim = 0, blocks[0] = D; return; }
}

static float *slice_expected(const float *full, int64_t R, int64_t C, const char *name, int tp, int rank, int64_t *lr, int64_t *lc) {
    int dim, nb;
    int64_t bl[8];
    expected_part(name, 128, 384, &dim, bl, &nb);
    *lr = dim == 0 ? R / tp : R, *lc = dim == 1 ? C / tp : C;
    float *o = malloc((size_t)(*lr * *lc) * 4);
    int64_t k = 0, start = 0;
    for (int b = 0; b < nb; b++) {
        int64_t n = (dim < 0 ? (dim == 0 ? R : C) : bl[b]) / (dim < 0 ? 1 : tp), s0 = start + (dim < 0 ? 0 : rank * n);
        if (dim == 0) for (int64_t r = 0; r < n; r++) memcpy(o + (k + r) * C, full + (s0 + r) * C, (size_t)C * 4);
        else if (dim == 1) for (int64_t r = 0; r < R; r++) memcpy(o + r * *lc + k, full + r * C + s0, (size_t)n * 4);
        else memcpy(o, full, (size_t)(R * C) * 4);
        k += n;
        start += dim < 0 ? 0 : bl[b];
        if (dim < 0) break;
    }
    return o;
}

/* Each rank's dequantised shard of the stored `<variant>.dequant.*` tensors
 * (op_copy of the fp8 tensor to f32 = decode x scale) must equal the
 * golden's slice bit for bit: the per-channel scales follow the rows. */
TEST_MPI(fp8_golden_dequant_bit_exact_per_rank) {
    int rank, tp;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &tp);
    char *cp = gpath("fp8_cases.safetensors");
    st_file *cases = NULL;
    REQUIRE(st_open(cp, &cases) == 0, "%s", tp_error_msg());
    free(cp);
    backend *be = backend_cpu_create(1);
    int checked = 0;
    for (int v = 0; v < 3; v++) {
        char *dir = gpath(k_variants[v]), *tdir = xasprintf("%s/transformer", dir);
        model_dir *md = NULL;
        json_t *cfg = NULL;
        checkpoint *c = NULL;
        plan p;
        weights *w = NULL;
        int rc = model_dir_open(dir, &md) || !(cfg = model_dir_config(md, "transformer")) || plan_flux2(cfg, &p) ||
                 checkpoint_open(tdir, &c);
        load_opts o = {.tp = tp, .rank = rank, .be = be, .dtype = DT_F32};
        if (!rc) rc = weights_load(c, &p, &o, &w, NULL);
        CHECK(rc == 0, "%s: %s", k_variants[v], tp_error_msg());
        char prefix[64];
        snprintf(prefix, sizeof prefix, "%s.dequant.", k_variants[v]);
        for (int i = 0; !rc && i < cases->n; i++) {
            const char *n = cases->tensors[i].name;
            if (strncmp(n, prefix, strlen(prefix))) continue;
            const char *tn = n + strlen(prefix);
            const tensor *t = weights_get(w, tn);
            REQUIRE(t && dtype_is_fp8(t->dtype), "%s: %s not loaded as fp8", k_variants[v], tn);
            float *full;
            const st_tensor_info *gi;
            REQUIRE(st_read_f32(cases, n, &full, &gi) == 0, "%s", tp_error_msg());
            int64_t lr, lc;
            float *want = slice_expected(full, gi->shape[0], gi->shape[1], tn, tp, rank, &lr, &lc);
            REQUIRE(t->rows == lr && t->cols == lc, "%s: local shape %lldx%lld, want %lldx%lld", tn, (long long)t->rows,
                    (long long)t->cols, (long long)lr, (long long)lc);
            tensor *d = tensor_new(be, DT_F32, lr, lc);
            op_copy(be, d, t);
            CHECK(memcmp(d->data, want, (size_t)(lr * lc) * 4) == 0, "%s %s rank %d of %d: not bit-exact", k_variants[v],
                  tn, rank, tp);
            checked++;
            tensor_free(d);
            free(want), free(full);
        }
        weights_free(w);
        checkpoint_close(c);
        json_decref(cfg);
        model_dir_close(md);
        free(dir), free(tdir);
    }
    CHECK(checked == 9, "checked %d dequantised tensors, expected 9", checked);
    backend_destroy(be);
    st_close(cases);
}


static int read_case(const st_file *src, const st_file *out, const char *variant, int k, golden_case *c) {
    char key[96];
    snprintf(key, sizeof key, "%s.case%d.output", variant, k);
    return golden_case_read(src, k, c) || golden_case_read_ref(out, key, c) ? -1 : 0;
}


/* Every variant's three cases at this np against diffusers' forward on the
 * exactly dequantised weights. */
static void golden_forward(dtype_t prec, double tol) {
    char *sp = xasprintf("%s/flux2-tiny-a/transformer_cases.safetensors", test_golden_dir()), *op = gpath("fp8_cases.safetensors");
    st_file *src = NULL, *out = NULL;
    int ok = st_open(sp, &src) == 0 && st_open(op, &out) == 0;
    free(sp), free(op);
    CHECK(ok, "cases: %s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    comm *cm = comm_create_mpi(MPI_COMM_WORLD, be);
    double worst = 0;
    for (int v = 0; all_ok(ok) && v < 3; v++) {
        char *dir = xasprintf("%s/flux2-fp8/%s/transformer", test_golden_dir(), k_variants[v]);
        flux2_model *m = NULL;
        int rc = flux2_load(dir, be, cm, prec, &m, NULL);
        free(dir);
        CHECK(rc == 0, "%s load: %s", k_variants[v], tp_error_msg());
        if (!all_ok(rc == 0)) { flux2_free(m); break; }
        if (prec == DT_BF16) flux2_set_exact_timestep(m, 1);
        for (int k = 0; k < 3; k++) {
            golden_case c = {0};
            int okc = read_case(src, out, k_variants[v], k, &c) == 0;
            CHECK(okc, "%s case%d: %s", k_variants[v], k, tp_error_msg());
            if (!all_ok(okc)) break;
            size_t n = (size_t)c.N * 32;
            float *y = malloc(n * 4);
            for (size_t i = 0; i < n; i++) y[i] = NAN;
            rc = flux2_forward(m, c.x, c.N, c.img_ids, c.txt, c.L, c.txt_ids, c.ts, &c.g, y);
            CHECK(rc == 0, "%s case%d forward: %s", k_variants[v], k, tp_error_msg());
            double err = rel_l2(y, c.ref, n);
            worst = err > worst ? err : worst;
            CHECK(err <= tol, "%s case%d (%s): rel_err %.3g > %.3g", k_variants[v], k, prec == DT_F32 ? "f32" : "bf16", err, tol);
            free(y);
            golden_case_free(&c);
        }
        flux2_free(m);
        int rk, np;
        MPI_Comm_rank(MPI_COMM_WORLD, &rk);
        MPI_Comm_size(MPI_COMM_WORLD, &np);
        if (rk == 0) printf("# %s %s tp %d: max rel_l2 %.3g\n", k_variants[v], prec == DT_F32 ? "f32" : "bf16", np, worst);
        worst = 0;
    }
    comm_destroy(cm);
    backend_destroy(be);
    if (src) st_close(src);
    if (out) st_close(out);
}

TEST_MPI(fp8_golden_forward_f32) { golden_forward(DT_F32, 1e-5); }
TEST_MPI(fp8_golden_forward_bf16) { golden_forward(DT_BF16, 3e-2); }

/* The loader takes the scales, hints and marker out of the tensor list and
 * reads the hints: the scaled variant's two comfy_quant layers, one with
 * full_precision_matrix_mult. */
TEST(fp8_scaled_variant_layout) {
    char *dir = gpath("scaled/transformer");
    checkpoint *c;
    REQUIRE(checkpoint_open(dir, &c) == 0, "%s", tp_error_msg());
    free(dir);
    CHECK(c->n == 55 && c->fp8 && c->fp8->n_fp8 == 30 && c->fp8->n_scaled == 30 && c->fp8->marker == 2,
          "n %d fp8 %d scaled %d marker %d", c->n, c->fp8 ? c->fp8->n_fp8 : -1, c->fp8 ? c->fp8->n_scaled : -1,
          c->fp8 ? c->fp8->marker : -1);
    CHECK(!checkpoint_find(c, "scaled_fp8", NULL) && !checkpoint_find(c, "transformer_blocks.0.attn.to_q.scale_weight", NULL),
          "aux tensors still listed");
    int k = -1;
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->infos[i]->name, "transformer_blocks.0.attn.to_q.weight")) k = i;
    const fp8_layer *L = fp8_layer_of(c, k);
    REQUIRE(L, "to_q not fp8");
    CHECK(L->input_scale == 1.0f && !L->per_row && L->hint && strstr(L->hint, "comfy_quant"), "to_q layer: %g %d %s",
          L->input_scale, L->per_row, L->hint ? L->hint : "-");
    checkpoint_close(c);
}

/* ---- --quantize fp8 against an independent quantiser ---- */

TEST(fp8_quantize_matches_absmax_reference) {
    backend *be = backend_cpu_create(1);
    int64_t R = 7, C = 33;
    float *x = malloc((size_t)(R * C) * 4), *back = malloc((size_t)(R * C) * 4);
    srand(test_seed());
    for (int64_t i = 0; i < R * C; i++) x[i] = (float)((rand() / (double)RAND_MAX - 0.5) * (1 + i % 5));
    for (int64_t j = 0; j < C; j++) x[3 * C + j] = 0;   /* an all-zero row: scale 1 */
    tensor *t = tensor_new(be, DT_BF16, R, C);
    tensor_upload_f32(t, x);
    tensor_download_f32(t, x);   /* the bf16 values */
    REQUIRE(fp8_quantize_tensor(t, "test") == 0, "%s", tp_error_msg());
    CHECK(t->dtype == DT_F8_E4M3 && t->scale && t->scale_per_row, "not E4M3 with row scales");
    tensor *d = tensor_new(be, DT_F32, R, C);
    op_copy(be, d, t);
    memcpy(back, d->data, (size_t)(R * C) * 4);
    for (int64_t r = 0; r < R; r++) {
        double amax = 0;
        for (int64_t j = 0; j < C; j++) amax = fmax(amax, fabs(x[r * C + j]));
        float s = amax > 0 ? (float)amax / 448.0f : 1.0f;
        CHECK(((float *)t->scale)[r] == s, "row %lld scale %g want %g", (long long)r, ((float *)t->scale)[r], s);
        for (int64_t j = 0; j < C; j++) {
            /* nearest E4M3 value of x/s, by search over the reference table */
            double q = x[r * C + j] / s, best = 0, be_ = INFINITY;
            for (unsigned c = 0; c < 256; c++) {
                double v = ref_e4m3(c);
                if (isfinite(v) && fabs(v - q) < be_) be_ = fabs(v - q), best = v;
            }
            double want = (double)(float)(best * s);
            if (fabs(back[r * C + j] - want) > 1e-6 * fabs(want) + 1e-30 && fabs(fabs(back[r * C + j] / s - q) - be_) > 1e-9) {
                CHECK(0, "row %lld col %lld: %g, want %g", (long long)r, (long long)j, back[r * C + j], want);
                r = R;
                break;
            }
        }
    }
    tensor_free(d), tensor_free(t);
    free(x), free(back);
    backend_destroy(be);
}

/* --quantize fp8 on flux2-tiny-a: the sharded linears become E4M3, the rest
 * keep their dtype, and the output stays near the golden (the quality cost,
 * measured in docs/fp8.md). */
TEST_MPI(fp8_quantize_flux2_tiny_close_to_golden) {
    backend *be = backend_cpu_create(1);
    comm *cm = comm_create_mpi(MPI_COMM_WORLD, be);
    char *dir = xasprintf("%s/flux2-tiny-a/model/transformer", test_golden_dir());
    flux2_model *m = NULL;
    flux2_load_extras x = {.quantize_fp8 = 1};
    int rc = flux2_load_ex(dir, be, cm, DT_F32, &x, &m, NULL);
    free(dir);
    CHECK(rc == 0, "load: %s", tp_error_msg());
    if (!all_ok(rc == 0)) goto out;
    char *sp = xasprintf("%s/flux2-tiny-a/transformer_cases.safetensors", test_golden_dir());
    st_file *src = NULL;
    int ok = st_open(sp, &src) == 0;
    free(sp);
    golden_case c = {0};
    char key[64];
    float *t = NULL, *g = NULL;
    int64_t nl = 0;
    ok = ok && st_read_f32(src, "case0.hidden_states", &c.x, NULL) == 0 &&
         st_read_f32(src, "case0.encoder_hidden_states", &c.txt, NULL) == 0 && st_read_f32(src, "case0.output", &c.ref, NULL) == 0 &&
         st_read_f32(src, "case0.timestep", &t, NULL) == 0 && st_read_f32(src, "case0.guidance", &g, NULL) == 0 &&
         (c.img_ids = golden_ids32(src, "case0.img_ids", &c.N)) && (c.txt_ids = golden_ids32(src, "case0.txt_ids", &nl));
    (void)key;
    CHECK(ok, "case0: %s", tp_error_msg());
    if (all_ok(ok)) {
        size_t n = (size_t)c.N * 32;
        float *y = malloc(n * 4);
        rc = flux2_forward(m, c.x, c.N, c.img_ids, c.txt, nl, c.txt_ids, t[0], g, y);
        CHECK(rc == 0, "forward: %s", tp_error_msg());
        double err = rel_l2(y, c.ref, n);
        /* fp8 rounding costs ~2e-2 (the golden variants: 1.8-2.3e-2); far from 0 and from ~1 */
        CHECK(err > 1e-3 && err < 6e-2, "rel_err %.3g vs the bf16 weights' golden", err);
        int rk;
        MPI_Comm_rank(MPI_COMM_WORLD, &rk);
        if (rk == 0) printf("# quantize fp8: case0 rel_l2 %.4g\n", err);
        free(y);
    }
    free(t), free(g);
    golden_case_free(&c);
    if (src) st_close(src);
out:
    flux2_free(m);
    comm_destroy(cm);
    backend_destroy(be);
}

/* ---- bad input: each is an error naming the tensor, never a silent image ---- */

typedef struct tw { const char *name; dtype_t dt; int nd; int64_t s0, s1; const void *data; } tw;

/* write the tensors as dir/model.safetensors and open the folder */
static int open_bad(const char *tag, const tw *t, int n, const char *const *meta) {
    char *dir = xasprintf("%s/%s", test_tmp_dir(), tag), *p = xasprintf("%s/model.safetensors", dir);
    mkdir(dir, 0755);
    st_write_tensor w[16];
    for (int i = 0; i < n; i++) w[i] = (st_write_tensor){t[i].name, t[i].dt, t[i].nd, {t[i].s0, t[i].s1}, t[i].data};
    int rc = st_write(p, w, n, meta);
    checkpoint *c = NULL;
    if (!rc) rc = checkpoint_open(dir, &c);
    checkpoint_close(c);
    free(dir), free(p);
    return rc;
}

static uint8_t g_codes[32] = {0x38, 0x40, 0x30};
static float g_one = 1.0f, g_inf = INFINITY, g_three[3] = {1, 2, 3}, g_four[4] = {1, 2, 3, 4};
static uint16_t g_bf16[32];

#define EXPECT_BAD(tag, pat, ...) do { \
        const tw t_[] = {__VA_ARGS__}; \
        int rc_ = open_bad(tag, t_, (int)(sizeof t_ / sizeof t_[0]), NULL); \
        CHECK(rc_ != 0 && strstr(tp_error_msg(), pat), "%s: rc %d, message: %s", tag, rc_, tp_error_msg()); \
    } while (0)

TEST(bad_fp8_scales) {
    EXPECT_BAD("scale_on_bf16", "not fp8", {"a.weight", DT_BF16, 2, 4, 8, g_bf16}, {"a.weight_scale", DT_F32, 0, 0, 0, &g_one});
    EXPECT_BAD("input_scale_on_bf16", "not fp8", {"a.weight", DT_BF16, 2, 4, 8, g_bf16}, {"a.input_scale", DT_F32, 0, 0, 0, &g_one});
    EXPECT_BAD("scale_shape", "unknown layout", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.weight_scale", DT_F32, 1, 3, 0, g_three});
    EXPECT_BAD("scale_shape_cols", "unknown layout", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.scale_weight", DT_F32, 2, 1, 4, g_four});
    EXPECT_BAD("scale_inf", "non-finite", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.weight_scale", DT_F32, 0, 0, 0, &g_inf});
    EXPECT_BAD("scale_row_inf", "non-finite", {"a.weight", DT_F8_E4M3, 2, 3, 8, g_codes}, {"a.weight_scale", DT_F32, 1, 3, 0, (float[]){1, NAN, 2}});
    /* a scale of 0 zeroes the layer, a negative one flips it, a huge one overflows f32 at the largest code
     * (E4M3 448: the limit is FLT_MAX / 448 = 7.6e35; E5M2 57344: 5.9e33) */
    EXPECT_BAD("scale_zero", "must be above 0", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.weight_scale", DT_F32, 0, 0, 0, (float[]){0}});
    EXPECT_BAD("scale_negative", "is -2 at element 1", {"a.weight", DT_F8_E4M3, 2, 3, 8, g_codes}, {"a.weight_scale", DT_F32, 1, 3, 0, (float[]){1, -2, 2}});
    EXPECT_BAD("scale_overflow", "at most 7.6e+35", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.weight_scale", DT_F32, 0, 0, 0, (float[]){1e36f}});
    EXPECT_BAD("scale_overflow_e5m2", "E5M2 codes reach 57344", {"a.weight", DT_F8_E5M2, 2, 4, 8, g_codes}, {"a.weight_scale", DT_F32, 0, 0, 0, (float[]){1e34f}});
    EXPECT_BAD("two_spellings", "both", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.weight_scale", DT_F32, 0, 0, 0, &g_one},
               {"a.scale_weight", DT_F32, 0, 0, 0, &g_one});
    EXPECT_BAD("orphan_scale", "belongs to no weight", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"b.scale_weight", DT_F32, 0, 0, 0, &g_one});
    EXPECT_BAD("scale_dtype", "must be F32", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.weight_scale", DT_I32, 0, 0, 0, &g_one});
    /* the good forms open: per tensor [], [1]; per channel [4], [4, 1] */
    const tw ok1[] = {{"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.weight_scale", DT_F32, 2, 4, 1, g_four}};
    CHECK(open_bad("good_per_channel", ok1, 2, NULL) == 0, "[4,1] scale: %s", tp_error_msg());
    const tw ok2[] = {{"a.weight", DT_F8_E5M2, 2, 4, 8, g_codes}, {"a.scale_weight", DT_F32, 1, 1, 0, &g_one}};
    CHECK(open_bad("good_per_tensor", ok2, 2, NULL) == 0, "[1] scale: %s", tp_error_msg());
    const tw ok3[] = {{"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.weight_scale", DT_F32, 0, 0, 0, (float[]){7e35f}}};
    CHECK(open_bad("good_large_scale", ok3, 2, NULL) == 0, "scale 7e35 (448 x 7e35 < FLT_MAX): %s", tp_error_msg());
}

/* --scan-weights decodes fp8 codes: E4M3's NaN (0x7F, 0xFF), E5M2's Inf
 * (0x7C, 0xFC) and NaN (0x7D..0x7F, 0xFD..0xFF) are found and named */
static int scan_fp8(const char *tag, dtype_t dt, const uint8_t *codes, int64_t *first) {
    char *dir = xasprintf("%s/%s", test_tmp_dir(), tag), *p = xasprintf("%s/model.safetensors", dir);
    mkdir(dir, 0755);
    st_write_tensor w[1] = {{"a.weight", dt, 2, {4, 8}, codes}};
    checkpoint *c = NULL;
    int rc = st_write(p, w, 1, NULL) || checkpoint_open(dir, &c) ? -1 : checkpoint_scan_finite(c, 0);
    const char *at = strstr(tp_error_msg(), "first at element ");
    *first = rc > 0 && at ? atoll(at + strlen("first at element ")) : -1;
    checkpoint_close(c);
    free(dir), free(p);
    return rc;
}

TEST(scan_weights_fp8) {
    uint8_t codes[32];
    for (int i = 0; i < 32; i++) codes[i] = (uint8_t)(0x30 + i);   /* finite in both formats */
    int64_t first;
    CHECK(scan_fp8("scan_clean_e4m3", DT_F8_E4M3, codes, &first) == 0, "clean E4M3: %s", tp_error_msg());
    CHECK(scan_fp8("scan_clean_e5m2", DT_F8_E5M2, codes, &first) == 0, "clean E5M2: %s", tp_error_msg());
    static const struct { dtype_t dt; uint8_t code; } bad[] = {
        {DT_F8_E4M3, 0x7F}, {DT_F8_E4M3, 0xFF}, {DT_F8_E5M2, 0x7C}, {DT_F8_E5M2, 0xFC}, {DT_F8_E5M2, 0x7E}, {DT_F8_E5M2, 0xFD}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t b[32];
        memcpy(b, codes, sizeof b);
        b[13] = bad[i].code;
        int rc = scan_fp8("scan_bad", bad[i].dt, b, &first);
        CHECK(rc == 1 && first == 13 && strstr(tp_error_msg(), "tensor 'a.weight'"), "%s code 0x%02X: rc %d, %s",
              dtype_name(bad[i].dt), bad[i].code, rc, tp_error_msg());
    }
    /* 0x7E is a finite E4M3 value (448): not reported */
    codes[5] = 0x7E;
    CHECK(scan_fp8("scan_e4m3_max", DT_F8_E4M3, codes, &first) == 0, "E4M3 0x7E (448) reported: %s", tp_error_msg());
}

TEST(bad_fp8_hints) {
    const char *nv = "{\"format\": \"nvfp4\"}", *e5 = "{\"format\": \"float8_e5m2\"}", *e4 = "{\"format\": \"float8_e4m3fn\", \"x\": 1}";
    EXPECT_BAD("hint_unsupported", "does not support", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes},
               {"a.weight_scale", DT_F32, 0, 0, 0, &g_one}, {"a.comfy_quant", DT_U8, 1, (int64_t)strlen(nv), 0, nv});
    EXPECT_BAD("hint_mismatch", "hinted as 'float8_e5m2'", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes},
               {"a.weight_scale", DT_F32, 0, 0, 0, &g_one}, {"a.comfy_quant", DT_U8, 1, (int64_t)strlen(e5), 0, e5});
    EXPECT_BAD("hint_needs_scale", "has no scale", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes},
               {"a.comfy_quant", DT_U8, 1, (int64_t)strlen(e4), 0, e4});
    EXPECT_BAD("hint_bad_json", "not valid JSON", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes},
               {"a.weight_scale", DT_F32, 0, 0, 0, &g_one}, {"a.comfy_quant", DT_U8, 1, 5, 0, "{\"for"});
    EXPECT_BAD("marker_needs_scale", "scaled_fp8 marker", {"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes},
               {"scaled_fp8", DT_F8_E4M3, 1, 0, 0, g_codes});
    const char *meta_bad[] = {"_quantization_metadata", "{\"layers\": {\"a\": {\"format\": \"float8_e4m3fn\"}", NULL};
    const tw t1[] = {{"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.weight_scale", DT_F32, 0, 0, 0, &g_one}};
    CHECK(open_bad("meta_bad_json", t1, 2, meta_bad) != 0 && strstr(tp_error_msg(), "_quantization_metadata is not valid JSON"),
          "meta bad json: %s", tp_error_msg());
    const char *meta_missing[] = {"_quantization_metadata", "{\"layers\": {\"b\": {\"format\": \"float8_e4m3fn\"}}}", NULL};
    CHECK(open_bad("meta_no_layer", t1, 2, meta_missing) != 0 && strstr(tp_error_msg(), "layer 'b'"), "meta names a missing layer: %s",
          tp_error_msg());
    const char *meta_needs[] = {"_quantization_metadata", "{\"layers\": {\"a\": {\"format\": \"float8_e4m3fn\"}}}", NULL};
    const tw t2[] = {{"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}};
    CHECK(open_bad("meta_needs_scale", t2, 1, meta_needs) != 0 && strstr(tp_error_msg(), "has no scale"), "meta needs scale: %s",
          tp_error_msg());
    /* unknown fields are ignored; a good hint opens */
    const tw ok[] = {{"a.weight", DT_F8_E4M3, 2, 4, 8, g_codes}, {"a.weight_scale", DT_F32, 0, 0, 0, &g_one},
                     {"a.comfy_quant", DT_U8, 1, (int64_t)strlen(e4), 0, e4}};
    CHECK(open_bad("hint_good", ok, 3, meta_needs) == 0, "good hint: %s", tp_error_msg());
}

/* a file written by hand: header JSON + data bytes */
static int open_raw(const char *tag, const char *header, size_t data_bytes) {
    char *dir = xasprintf("%s/%s", test_tmp_dir(), tag), *p = xasprintf("%s/model.safetensors", dir);
    mkdir(dir, 0755);
    FILE *f = fopen(p, "wb");
    uint64_t n = strlen(header);
    fwrite(&n, 8, 1, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_bytes; i++) fputc(0x38, f);
    fclose(f);
    checkpoint *c = NULL;
    int rc = checkpoint_open(dir, &c);
    checkpoint_close(c);
    free(dir), free(p);
    return rc;
}

TEST(bad_fp8_files) {
    /* fp8 is one byte per element: a [4, 8] tensor needs 32 bytes */
    CHECK(open_raw("trunc_span", "{\"a.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,8],\"data_offsets\":[0,16]}}", 16) != 0 &&
              strstr(tp_error_msg(), "a.weight"), "span: %s", tp_error_msg());
    CHECK(open_raw("trunc_file", "{\"a.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,8],\"data_offsets\":[0,32]}}", 20) != 0 &&
              strstr(tp_error_msg(), "a.weight"), "short file: %s", tp_error_msg());
    CHECK(open_raw("e8m0", "{\"a.weight\":{\"dtype\":\"F8_E8M0\",\"shape\":[4,8],\"data_offsets\":[0,32]}}", 32) != 0 &&
              strstr(tp_error_msg(), "F8_E8M0") && strstr(tp_error_msg(), "cannot compute"), "e8m0: %s", tp_error_msg());
    CHECK(open_raw("good_raw", "{\"a.weight\":{\"dtype\":\"F8_E5M2\",\"shape\":[4,8],\"data_offsets\":[0,32]}}", 32) == 0,
          "raw fp8: %s", tp_error_msg());
}

/* ---- the CPU fp8 GEMM paths against a naive double reference ---- */

static void fp8_gemm_case(dtype_t wdt, dtype_t xdt, int per_row, int64_t M, int64_t N, int64_t K, int portable) {
    backend *be = backend_cpu_create(2);
    tensor *w = tensor_new(be, wdt, N, K), *x = tensor_new(be, xdt, M, K), *y = tensor_new(be, xdt, M, N);
    uint8_t *q = w->data;
    for (int64_t i = 0; i < N * K; i++) {
        q[i] = (uint8_t)(rand() & 0xff);
        if (!isfinite(fp8_to_f32(wdt, q[i]))) q[i] = 0x31;
    }
    float *s = malloc((size_t)N * 4), *xf = malloc((size_t)(M * K) * 4), *yf = malloc((size_t)(M * N) * 4);
    for (int64_t i = 0; i < N; i++) s[i] = (float)(1e-3 + 1e-2 * rand() / RAND_MAX);
    w->scale = s;   /* host memory on the CPU backend; freed below, not by tensor_free */
    w->scale_per_row = per_row;
    for (int64_t i = 0; i < M * K; i++) xf[i] = (float)(rand() / (double)RAND_MAX * 2 - 1);
    tensor_upload_f32(x, xf);
    tensor_download_f32(x, xf);   /* the values x holds (bf16-rounded) */
    cpu_kernel_route(portable ? CPU_ROUTE_PORTABLE : CPU_ROUTE_VECTOR);
    /* a row view too: rows [3, N) of w with the scales moved along */
    tensor wv = tensor_rows(w, 3, N - 3);
    tensor yv = tensor_cols(y, 0, N - 3);
    for (int view = 0; view < 2; view++) {
        op_gemm(be, view ? &yv : y, x, view ? &wv : w, NULL);
        tensor_download_f32(y, yf);
        double e2 = 0, r2 = 0;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N - 3 * view; n++) {
                int64_t wn = n + 3 * view;
                double acc = 0, sc = s[per_row ? wn : 0];
                for (int64_t k = 0; k < K; k++) acc += (double)xf[m * K + k] * ((double)fp8_to_f32(wdt, q[wn * K + k]) * sc);
                double d = yf[m * N + n] - acc;
                e2 += d * d, r2 += acc * acc;
            }
        double rel = sqrt(e2 / r2), tol = xdt == DT_BF16 ? 8e-3 : 1e-6;
        CHECK(rel <= tol, "%s x %s %s M%lld N%lld K%lld %s%s: rel_l2 %.3g > %.1g", dtype_name(wdt), dtype_name(xdt),
              per_row ? "per-row" : "per-tensor", (long long)M, (long long)N, (long long)K, portable ? "portable" : "default",
              view ? " row view" : "", rel, tol);
    }
    cpu_kernel_route(CPU_ROUTE_AUTO);
    w->scale = NULL;
    free(s), free(xf), free(yf);
    tensor_free(w), tensor_free(x), tensor_free(y);
    backend_destroy(be);
}

TEST(fp8_cpu_gemm_paths) {
    srand(test_seed());
    dtype_t wd[2] = {DT_F8_E4M3, DT_F8_E5M2}, xd[2] = {DT_BF16, DT_F32};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int pr = 0; pr < 2; pr++)
                for (int port = 0; port < 2; port++) fp8_gemm_case(wd[a], xd[b], pr, 37, 70, 96, port);
    fp8_gemm_case(DT_F8_E4M3, DT_BF16, 1, 300, 45, 33, 0);   /* odd K: the tiled path */
    fp8_gemm_case(DT_F8_E4M3, DT_BF16, 1, 5, 130, 260, 0);
}

#ifdef TPGEN_CUDA
/* The golden variants on the CUDA backend (run by scripts/gpu-check.sh):
 * f32 dequantises exactly (1e-4, the CUDA f32 golden tolerance); bf16 runs
 * the fp8 tensor-core GEMM where it applies (sm_89+, E4M3 layers without
 * full_precision_matrix_mult: the channel variant), whose activation
 * quantisation adds ~2-4e-2, hence 1e-1 (scale bugs are off by ~1). */
TEST_GPU(gpu_fp8_golden_variants) {
    backend *be = backend_cuda_create(0);
    REQUIRE(be, "no CUDA backend: %s", tp_error_msg());
    comm *cm = comm_create_mpi(MPI_COMM_WORLD, be);
    char *sp = xasprintf("%s/flux2-tiny-a/transformer_cases.safetensors", test_golden_dir()), *op = gpath("fp8_cases.safetensors");
    st_file *src = NULL, *out = NULL;
    int ok = st_open(sp, &src) == 0 && st_open(op, &out) == 0;
    free(sp), free(op);
    CHECK(ok, "cases: %s", tp_error_msg());
    for (int p = 0; ok && p < 2; p++)
        for (int v = 0; v < 3; v++) {
            dtype_t prec = p ? DT_BF16 : DT_F32;
            char *dir = xasprintf("%s/flux2-fp8/%s/transformer", test_golden_dir(), k_variants[v]);
            flux2_model *m = NULL;
            int rc = flux2_load(dir, be, cm, prec, &m, NULL);
            free(dir);
            CHECK(rc == 0, "%s load: %s", k_variants[v], tp_error_msg());
            if (rc) continue;
            if (p) flux2_set_exact_timestep(m, 1);
            double worst = 0;
            for (int k = 0; k < 3; k++) {
                golden_case c = {0};
                if (read_case(src, out, k_variants[v], k, &c)) { CHECK(0, "%s", tp_error_msg()); break; }
                size_t n = (size_t)c.N * 32;
                float *y = malloc(n * 4);
                rc = flux2_forward(m, c.x, c.N, c.img_ids, c.txt, c.L, c.txt_ids, c.ts, &c.g, y);
                double e = rc ? INFINITY : rel_l2(y, c.ref, n);
                worst = e > worst ? e : worst;
                free(y);
                golden_case_free(&c);
            }
            printf("# cuda fp8 golden %s %s: max rel_l2 %.3g\n", k_variants[v], p ? "bf16" : "f32", worst);
            CHECK(worst <= (p ? 1e-1 : 1e-4), "%s %s: max rel_l2 %.3g", k_variants[v], p ? "bf16" : "f32", worst);
            flux2_free(m);
        }
    if (src) st_close(src);
    if (out) st_close(out);
    comm_destroy(cm);
    backend_destroy(be);
}
#endif

/* ---- fp8 text encoders (Qwen3, Mistral): an fp8 copy of the golden
 * encoder, written here (per-row absmax E4M3, both scale spellings, the
 * embedding table included, norms kept), must give the same hidden states
 * as an F32 copy holding the exactly dequantised weights (decoded by this
 * test's own formula), at np 1/2/4 ---- */
#include "core/models/llm/llm.h"

static int is_fp8_candidate(const st_tensor_info *t) {
    return t->ndim == 2 && strstr(t->name, ".weight") && !strstr(t->name, "norm");
}

static int write_encoder_pair(const char *src, const char *dq, const char *dd, int *n_fp8) {
    checkpoint *c;
    if (checkpoint_open(src, &c)) return -1;
    mkdir(dq, 0755), mkdir(dd, 0755);
    int n = c->n, m = 0, rc = 0;
    st_write_tensor *tq = calloc((size_t)(2 * n), sizeof *tq), *td = calloc((size_t)n, sizeof *td);
    void **bufs = calloc((size_t)(4 * n), sizeof *bufs);   /* per tensor: values, codes, scales, scale name */
    int nb = 0;
    *n_fp8 = 0;
    for (int k = 0; k < n && !rc; k++) {
        const st_tensor_info *t = c->infos[k];
        float *f;
        if ((rc = st_read_f32(c->files[c->file_of[k]], t->name, &f, NULL))) break;
        bufs[nb++] = f;
        st_write_tensor w = {t->name, DT_F32, t->ndim, {0}, f};
        memcpy(w.shape, t->shape, sizeof w.shape);
        td[k] = w;
        if (!is_fp8_candidate(t)) { tq[m++] = w; continue; }
        int64_t R = t->shape[0], C = t->shape[1];
        uint8_t *q = malloc((size_t)(R * C));
        float *s = malloc((size_t)R * 4), *deq = malloc((size_t)(R * C) * 4);
        bufs[nb++] = q, bufs[nb++] = s;
        for (int64_t r = 0; r < R; r++) {
            float a = 0;
            for (int64_t j = 0; j < C; j++) a = fmaxf(a, fabsf(f[r * C + j]));
            s[r] = a > 0 ? a / 448.0f : 1.0f;
            for (int64_t j = 0; j < C; j++) {
                q[r * C + j] = f32_to_fp8(DT_F8_E4M3, f[r * C + j] / s[r]);
                deq[r * C + j] = (float)(ref_e4m3(q[r * C + j]) * s[r]);   /* exact in double, one rounding */
            }
        }
        memcpy(f, deq, (size_t)(R * C) * 4);   /* the F32 copy holds the dequantised values */
        free(deq);
        tq[m] = (st_write_tensor){t->name, DT_F8_E4M3, 2, {R, C}, q};
        char *sn = xasprintf("%.*s.%s", (int)(strlen(t->name) - 7), t->name, (*n_fp8 % 2) ? "scale_weight" : "weight_scale");
        bufs[nb++] = sn;
        tq[m + 1] = (st_write_tensor){sn, DT_F32, 1, {R}, s};
        m += 2;
        (*n_fp8)++;
    }
    char *pq = xasprintf("%s/model.safetensors", dq), *pd = xasprintf("%s/model.safetensors", dd);
    if (!rc) rc = st_write(pq, tq, m, NULL) || st_write(pd, td, n, NULL);
    /* the config travels along */
    char *cs = xasprintf("%s/config.json", src);
    json_error_t je;
    json_t *cfg = json_load_file(cs, 0, &je);
    char *c1 = xasprintf("%s/config.json", dq), *c2 = xasprintf("%s/config.json", dd);
    /* (a BFL single-file folder has none: its config is derived from the shapes) */
    if (!rc && cfg && (json_dump_file(cfg, c1, 0) || json_dump_file(cfg, c2, 0))) rc = tp_error("config copy");
    json_decref(cfg);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    free(bufs), free(tq), free(td), free(pq), free(pd), free(cs), free(c1), free(c2);
    checkpoint_close(c);
    return rc;
}

static int encoder_hidden(const char *dir, int n, const int32_t *ids, float *out, int H, backend *be, comm *cm) {
    char *cp = xasprintf("%s/config.json", dir);
    json_error_t je;
    json_t *j = json_load_file(cp, 0, &je);
    llm_config cfg;
    checkpoint *ck = NULL;
    llm *m = NULL;
    int idx[2] = {1, 2};
    int rc = j ? llm_config_parse(j, cp, &cfg) : tp_error("cannot read %s", cp);
    if (!rc) rc = checkpoint_open(dir, &ck);
    if (!rc) rc = llm_config_resolve_prefix(&cfg, ck);
    if (!rc) rc = llm_load(ck, &cfg, 2, be, cm, DT_F32, &m, NULL);
    if (!rc) rc = llm_forward(m, ids, NULL, n, idx, 2, out);
    if (!rc && llm_cfg(m)->hidden != H) rc = tp_error("hidden %d", llm_cfg(m)->hidden);
    llm_free(m);
    checkpoint_close(ck);
    json_decref(j);
    free(cp);
    return rc;
}

static void fp8_encoder_case(const char *name, int H) {
    char *src = xasprintf("%s/%s/model/text_encoder", test_golden_dir(), name);
    char *dq = xasprintf("%s/%s-fp8", test_tmp_dir(), name), *dd = xasprintf("%s/%s-deq", test_tmp_dir(), name);
    int n_fp8 = 0;
    int ok = write_encoder_pair(src, dq, dd, &n_fp8) == 0;
    CHECK(ok && n_fp8 > 4, "%s: writing the fp8 copy: %s (%d fp8 tensors)", name, tp_error_msg(), n_fp8);
    if (!all_ok(ok)) goto out;
    backend *be = backend_cpu_create(1);
    comm *cm = comm_create_mpi(MPI_COMM_WORLD, be);
    int n = 12;
    int32_t ids[12];
    for (int i = 0; i < n; i++) ids[i] = 3 + 7 * i;
    float *a = malloc((size_t)(n * 2 * H) * 4), *b = malloc((size_t)(n * 2 * H) * 4);
    int rc = encoder_hidden(dq, n, ids, a, H, be, cm);
    CHECK(rc == 0, "%s fp8: %s", name, tp_error_msg());
    int rc2 = rc ? -1 : encoder_hidden(dd, n, ids, b, H, be, cm);
    CHECK(rc || rc2 == 0, "%s dequantised: %s", name, tp_error_msg());
    if (!rc && !rc2) {
        double e = rel_l2(a, b, (size_t)(n * 2 * H));
        CHECK(e <= 1e-6, "%s: fp8 vs dequantised hidden states rel_l2 %.3g", name, e);
    }
    free(a), free(b);
    comm_destroy(cm);
    backend_destroy(be);
out:
    free(src), free(dq), free(dd);
}

TEST_MPI(fp8_text_encoders_match_dequantised) {
    fp8_encoder_case("qwen3-tiny", 64);
    fp8_encoder_case("mistral-tiny", 32);
}

/* A BFL single-file transformer in fp8 (the golden converted to BFL names by
 * tests/test_bfl.c, then quantised here: fused qkv with per-channel scales
 * split per packed block, the final layer whose halves the loader swaps)
 * runs exactly like the F32 file of its dequantised weights, at np 1/2/4. */
int write_bfl(const char *dir, const char *skip);

TEST_MPI(fp8_bfl_transformer_matches_dequantised) {
    char *bdir = xasprintf("%s/bfl-src", test_tmp_dir()), *dq = xasprintf("%s/bfl-fp8", test_tmp_dir()),
         *dd = xasprintf("%s/bfl-deq", test_tmp_dir());
    int n_fp8 = 0;
    int ok = write_bfl(bdir, NULL) > 0 && write_encoder_pair(bdir, dq, dd, &n_fp8) == 0;
    CHECK(ok && n_fp8 > 20, "writing the BFL fp8 copy: %s (%d fp8 tensors)", tp_error_msg(), n_fp8);
    char *sp = xasprintf("%s/flux2-tiny-a/transformer_cases.safetensors", test_golden_dir()), *op = gpath("fp8_cases.safetensors");
    st_file *src = NULL, *out = NULL;
    ok = ok && st_open(sp, &src) == 0 && st_open(op, &out) == 0;
    free(sp), free(op);
    backend *be = backend_cpu_create(1);
    comm *cm = comm_create_mpi(MPI_COMM_WORLD, be);
    golden_case c = {0};
    ok = ok && read_case(src, out, "scaled", 1, &c) == 0;
    if (all_ok(ok)) {
        size_t n = (size_t)c.N * 32;
        float *y[2] = {malloc(n * 4), malloc(n * 4)};
        const char *dirs[2] = {dq, dd};
        int rc = 0;
        for (int i = 0; i < 2 && !rc; i++) {
            flux2_model *m = NULL;
            rc = flux2_load(dirs[i], be, cm, DT_F32, &m, NULL);
            if (!rc) rc = flux2_forward(m, c.x, c.N, c.img_ids, c.txt, c.L, c.txt_ids, c.ts, &c.g, y[i]);
            flux2_free(m);
        }
        CHECK(rc == 0, "BFL fp8: %s", tp_error_msg());
        if (!rc) {
            double e = rel_l2(y[0], y[1], n), g = rel_l2(y[1], c.ref, n);
            CHECK(e <= 1e-6, "BFL fp8 vs dequantised: rel_l2 %.3g", e);
            CHECK(g > 1e-3, "the fp8 copy is not quantised (%.3g from the fp8 golden of other weights)", g);
        }
        free(y[0]), free(y[1]);
    } else {
        CHECK(0, "setup: %s", tp_error_msg());
    }
    golden_case_free(&c);
    if (src) st_close(src);
    if (out) st_close(out);
    comm_destroy(cm);
    backend_destroy(be);
    free(bdir), free(dq), free(dd);
}
