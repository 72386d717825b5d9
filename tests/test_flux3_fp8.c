/* FLUX.3 with fp8 weights. fp8 copies of the golden flux3-tiny transformers
 * (base and flow-map) are written here: the block linears (attn.to_q/k/v,
 * attn.to_out.0, ff.linear_in/out) as F8_E4M3 with one scale per tensor
 * (`scale_weight`, shape []) or per output channel (`weight_scale` [out]),
 * the rest kept F32, by this test's own quantiser (absmax / 448, the nearest
 * E4M3 value by a search over a decode table computed here from the format
 * definition, ties to the even code). The reference is the dequantised
 * twin: an F32 file of the exact values decode(code) x scale, run through
 * the same forward. Checked at tp 1, 2, 3 (MPI np 1, 2, 4; groups as in
 * tests/test_flux3.c), on the 4 golden cases (2 with reference tokens):
 *   fp8 file vs twin within 1e-5 (f32); the fp8 file at bf16 within 3e-2 of
 *   the twin's f32 output; --quantize fp8 of the golden F32 model (f32; bf16
 *   within 3e-2) vs a twin
 *   quantised per rank shard (what the loader quantises: a rowwise weight's
 *   rows are absmax-scaled over this rank's column block) within 1e-5; and
 *   every fp8 output differs from the unquantised golden by more than 1e-4. */
#include "test.h"
#include "flux3_case.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/models/flux3/flux3.h"
#include "core/formats/checkpoint.h"
#include "core/formats/safetensors.h"
#include "kernels/ops.h"
#include <mpi.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- the independent E4M3 quantiser ---- */

/* E4M3 (fn): bias 7; exponent 0 subnormal m/8 * 2^-6; S.1111.111 NaN; max 448 */
static double e4m3_value(unsigned c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

/* the nearest E4M3 code to x (clamped to +-448), ties to the even code */
static uint8_t e4m3_nearest(double x) {
    unsigned sign = x < 0 ? 0x80 : 0;
    double a = fabs(x);
    if (a >= 448) return (uint8_t)(sign | 0x7E);
    unsigned lo = 0, hi = 0x7E;   /* positive codes increase with value */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (e4m3_value(mid) <= a) lo = mid;
        else hi = mid;
    }
    double dl = a - e4m3_value(lo), dh = e4m3_value(hi) - a;
    unsigned c = dl < dh ? lo : dh < dl ? hi : (lo % 2 ? hi : lo);
    if (c == 0) sign = 0;
    return (uint8_t)(sign | c);
}

enum { KIND_TENSOR, KIND_CHANNEL, KIND_QUANTIZE };   /* KIND_QUANTIZE: --quantize fp8's per-row, per-shard scales */

static int ends_with(const char *s, const char *t) {
    size_t n = strlen(s), m = strlen(t);
    return n >= m && !strcmp(s + n - m, t);
}
static int is_block_linear(const char *name) {
    return ends_with(name, ".weight") && (strstr(name, ".attn.to_") || strstr(name, ".ff.linear_"));
}
static int is_rowwise(const char *name) {
    return ends_with(name, ".attn.to_out.0.weight") || ends_with(name, ".ff.linear_out.weight");
}

/* Quantise w [R, C] in scale groups: per tensor, per row, or per (row,
 * column block of C / tp) for KIND_QUANTIZE's rowwise weights. codes and
 * scales out (scales: 1, R or R x tp); w is overwritten with the exactly
 * dequantised values. */
static void quantise(float *w, int64_t R, int64_t C, int kind, int col_blocks, uint8_t *codes, float *scales) {
    int64_t gr = kind == KIND_TENSOR ? R : 1, gc = C / col_blocks;
    for (int64_t r0 = 0, g = 0; r0 < R; r0 += gr)
        for (int64_t c0 = 0; c0 < C; c0 += gc, g++) {
            float a = 0;
            for (int64_t r = r0; r < r0 + gr; r++)
                for (int64_t j = c0; j < c0 + gc; j++) a = fmaxf(a, fabsf(w[r * C + j]));
            float s = a > 0 ? a / 448.0f : 1.0f;
            scales[g] = s;
            for (int64_t r = r0; r < r0 + gr; r++)
                for (int64_t j = c0; j < c0 + gc; j++) {
                    uint8_t q = e4m3_nearest((double)(w[r * C + j] / s));
                    codes[r * C + j] = q;
                    w[r * C + j] = (float)(e4m3_value(q) * s);   /* exact in double, one rounding */
                }
        }
}

static int write_config(const char *src, const char *dst) {
    char *a = xasprintf("%s/config.json", src), *b = xasprintf("%s/config.json", dst);
    json_error_t je;
    json_t *j = json_load_file(a, 0, &je);
    int rc = j && json_dump_file(j, b, 0) == 0 ? 0 : tp_error("copying %s", a);
    json_decref(j);
    free(a), free(b);
    return rc;
}

/* From the golden transformer in src: the twin (F32, dequantised block
 * linears) in dd and, unless kind is KIND_QUANTIZE, the fp8 file in dq.
 * *n_fp8: the number of quantised weights. */
static int write_pair(const char *src, int kind, int tp, const char *dq, const char *dd, int *n_fp8) {
    checkpoint *c;
    if (checkpoint_open(src, &c)) return -1;
    if (dq) mkdir(dq, 0755);
    mkdir(dd, 0755);
    int n = c->n, m = 0, rc = 0, nb = 0;
    st_write_tensor *tq = calloc((size_t)(2 * n), sizeof *tq), *td = calloc((size_t)n, sizeof *td);
    void **bufs = calloc((size_t)(4 * n), sizeof *bufs);
    *n_fp8 = 0;
    for (int k = 0; k < n && !rc; k++) {
        const st_tensor_info *t = c->infos[k];
        float *f;
        if ((rc = st_read_f32(c->files[c->file_of[k]], t->name, &f, NULL))) break;
        bufs[nb++] = f;
        st_write_tensor w = {t->name, DT_F32, t->ndim, {0}, f};
        memcpy(w.shape, t->shape, sizeof w.shape);
        td[k] = w;
        if (!is_block_linear(t->name) || t->ndim != 2) { tq[m++] = w; continue; }
        int64_t R = t->shape[0], C = t->shape[1];
        int blocks = kind == KIND_QUANTIZE && is_rowwise(t->name) ? tp : 1;
        uint8_t *q = malloc((size_t)(R * C));
        float *s = malloc((size_t)(R * blocks) * 4);
        bufs[nb++] = q, bufs[nb++] = s;
        quantise(f, R, C, kind, blocks, q, s);
        (*n_fp8)++;
        tq[m++] = (st_write_tensor){t->name, DT_F8_E4M3, 2, {R, C}, q};
        char *sn = xasprintf("%.*s.%s", (int)(strlen(t->name) - 7), t->name,
                             kind == KIND_TENSOR ? "scale_weight" : "weight_scale");
        bufs[nb++] = sn;
        tq[m++] = kind == KIND_TENSOR ? (st_write_tensor){sn, DT_F32, 0, {0}, s}
                                      : (st_write_tensor){sn, DT_F32, 1, {R}, s};
    }
    char *pq = dq ? xasprintf("%s/diffusion_pytorch_model.safetensors", dq) : NULL;
    char *pd = xasprintf("%s/diffusion_pytorch_model.safetensors", dd);
    if (!rc && dq) rc = st_write(pq, tq, m, NULL) || write_config(src, dq);
    if (!rc) rc = st_write(pd, td, n, NULL) || write_config(src, dd);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    free(bufs), free(tq), free(td), free(pq), free(pd);
    checkpoint_close(c);
    return rc;
}


static int all_ok(int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}


/* One variant and kind: the models under test (fp8 file at f32 and bf16,
 * or --quantize fp8 of the golden at f32) against the twin, every case. */
static void fp8_case(const char *variant, int kind) {
    static const char *kinds[] = {"per-tensor", "per-channel", "--quantize"};
    int tp;
    MPI_Comm g = f3_tp_group(6, &tp);
    backend *be = backend_cpu_create(1);
    comm *cm = comm_create_mpi(g, be);
    char *src = xasprintf("%s/flux3-tiny/%s/model/transformer", test_golden_dir(), variant);
    char *cases = xasprintf("%s/flux3-tiny/%s/transformer_cases.safetensors", test_golden_dir(), variant);
    char *dq = xasprintf("%s/f3-%s-%d-fp8", test_tmp_dir(), variant, kind);
    char *dd = xasprintf("%s/f3-%s-%d-deq", test_tmp_dir(), variant, kind);
    flux3_model *mq = NULL, *mb = NULL, *md = NULL;
    st_file *f = NULL;
    int n_fp8 = 0;
    int rc = write_pair(src, kind, tp, kind == KIND_QUANTIZE ? NULL : dq, dd, &n_fp8);
    CHECK(rc == 0 && n_fp8 >= 24, "%s %s: writing the fp8 copies: %s (%d fp8 weights)", variant, kinds[kind],
          tp_error_msg(), n_fp8);
    if (!all_ok(rc == 0)) goto out;
    flux3_load_extras qx = {.quantize_fp8 = 1};
    if (kind == KIND_QUANTIZE) {
        rc = flux3_load_ex(src, be, cm, DT_F32, &qx, &mq, NULL);
        if (!rc) rc = flux3_load_ex(src, be, cm, DT_BF16, &qx, &mb, NULL);
    } else {
        rc = flux3_load(dq, be, cm, DT_F32, &mq, NULL);
        if (!rc) rc = flux3_load(dq, be, cm, DT_BF16, &mb, NULL);
    }
    if (!rc) flux3_set_exact_timestep(mb, 1);
    if (!rc) rc = flux3_load(dd, be, cm, DT_F32, &md, NULL);
    if (!rc) rc = st_open(cases, &f);
    CHECK(rc == 0, "%s %s tp %d: loading: %s", variant, kinds[kind], tp, tp_error_msg());
    if (!all_ok(rc == 0)) goto out;
    int n_refs = 0, grank;
    MPI_Comm_rank(g, &grank);
    for (int k = 0; k < 4; k++) {
        f3_case cs;
        int ok = f3_case_read(f, k, &cs) == 0;
        CHECK(ok, "%s case%d: %s", variant, k, tp_error_msg());
        if (!all_ok(ok)) break;
        n_refs += cs.R > 0;
        size_t n = (size_t)cs.N * (size_t)flux3_get_config(md)->in_channels;
        float *yq = malloc(n * 4), *yd = malloc(n * 4), *yb = malloc(n * 4);
        flux3_inputs in = f3_case_inputs(&cs);
        rc = flux3_forward(mq, &in, yq);
        if (!rc) rc = flux3_forward(md, &in, yd);
        if (!rc && mb) rc = flux3_forward(mb, &in, yb);
        CHECK(rc == 0, "%s case%d forward: %s", variant, k, tp_error_msg());
        if (!rc) {
            double e = rel_l2(yq, yd, n), eg = rel_l2(yq, cs.ref, n), eb = mb ? rel_l2(yb, yd, n) : 0;
            CHECK(e <= 1e-5, "%s %s tp %d case%d (R %lld): fp8 vs dequantised twin rel_err %.3g > 1e-5", variant,
                  kinds[kind], tp, k, (long long)cs.R, e);
            CHECK(eg > 1e-4, "%s %s tp %d case%d: fp8 output only %.3g from the unquantised golden: not quantised",
                  variant, kinds[kind], tp, k, eg);
            CHECK(eb <= 3e-2, "%s %s tp %d case%d: fp8 at bf16 vs the twin at f32 rel_err %.3g > 3e-2", variant,
                  kinds[kind], tp, k, eb);
            if (getenv("TPGEN_TEST_VERBOSE") && grank == 0)
                printf("# %s %s tp %d case%d R=%lld fp8-twin %.3e fp8-golden %.3e bf16-twin %.3e\n", variant,
                       kinds[kind], tp, k, (long long)cs.R, e, eg, eb);
        }
        free(yq), free(yd), free(yb);
        f3_case_free(&cs);
        if (!all_ok(rc == 0)) break;
    }
    CHECK(n_refs == 2, "%s: expected 2 cases with references, read %d", variant, n_refs);
out:
    if (f) st_close(f);
    flux3_free(mq), flux3_free(mb), flux3_free(md);
    comm_destroy(cm);
    backend_destroy(be);
    MPI_Comm_free(&g);
    free(src), free(cases), free(dq), free(dd);
}

/* the quantiser itself against the definition: every finite code maps to
 * itself, midpoints go to the even neighbour, and it agrees with tpgen's
 * encoder on a sweep (so the twins are built by the same rounding rule) */
TEST(flux3_fp8_test_quantiser) {
    int bad = 0;
    for (unsigned c = 0; c < 256; c++) {
        double v = e4m3_value(c);
        if (isnan(v) || c == 0x80) continue;
        bad += e4m3_nearest(v) != c;
        if ((c & 0x7F) < 0x7E) {
            double mid = (v + e4m3_value(c + 1)) / 2;   /* same sign, next magnitude */
            unsigned want = (c % 2) ? c + 1 : c;
            bad += e4m3_nearest(mid) != want;
        }
    }
    CHECK(bad == 0, "%d codes or midpoints mis-rounded", bad);
    int diff = 0;
    for (int i = -5000; i <= 5000; i++) {
        float x = (float)(i * 0.0895);
        diff += e4m3_nearest(x) != f32_to_fp8(DT_F8_E4M3, x);
    }
    CHECK(diff == 0, "%d of 10001 values round differently from f32_to_fp8", diff);
}

TEST_MPI(flux3_fp8_base_per_tensor) { fp8_case("base", KIND_TENSOR); }
TEST_MPI(flux3_fp8_base_per_channel) { fp8_case("base", KIND_CHANNEL); }
TEST_MPI(flux3_fp8_flowmap_per_tensor) { fp8_case("flowmap", KIND_TENSOR); }
TEST_MPI(flux3_fp8_flowmap_per_channel) { fp8_case("flowmap", KIND_CHANNEL); }
TEST_MPI(flux3_fp8_base_quantize) { fp8_case("base", KIND_QUANTIZE); }
TEST_MPI(flux3_fp8_flowmap_quantize) { fp8_case("flowmap", KIND_QUANTIZE); }

/* With TPGEN_F3FP8_OUT=DIR: the base model's per-channel fp8 file in
 * DIR/fp8 and its dequantised twin in DIR/twin, for tests/sh/flux3_gguf.sh
 * (`tpgen quantize` of an fp8 FLUX.3 checkpoint = of its twin). */
TEST(flux3_fp8_write_pair) {
    const char *env = getenv("TPGEN_F3FP8_OUT");
    char *root = env ? xstrdup(env) : xasprintf("%s/f3fp8", test_tmp_dir());
    mkdir(root, 0755);
    char *src = xasprintf("%s/flux3-tiny/base/model/transformer", test_golden_dir());
    char *dq = xasprintf("%s/fp8", root), *dd = xasprintf("%s/twin", root);
    int n_fp8 = 0;
    CHECK(write_pair(src, KIND_CHANNEL, 1, dq, dd, &n_fp8) == 0 && n_fp8 >= 24, "%s (%d fp8 weights)", tp_error_msg(),
          n_fp8);
    free(root), free(src), free(dq), free(dd);
}
