/* VAE decoder tests: each decoder op against a naive C reference on
 * decoder-shaped random data, the whole pipeline tail against the golden
 * data computed by diffusers (golden vae-tiny, tests/data/golden), the same decode
 * through a naive reference backend, banded convolutions, configs and
 * load errors. */
#include "test.h"
#include "kernels/err.h"
#include "core/formats/safetensors.h"
#include "core/models/vae/vae_internal.h"
#include "kernels/ops.h"
#include <stdlib.h>
#include <string.h>

/* ---------- naive references on host arrays (double accumulation) ---------- */

static void ref_conv(float *y, const float *x, const float *w, const float *b, int cin, int cout, int h, int wd, int k) {
    int p = k / 2;
    for (int o = 0; o < cout; o++)
        for (int r = 0; r < h; r++)
            for (int q = 0; q < wd; q++) {
                double s = b ? b[o] : 0;
                for (int i = 0; i < cin; i++)
                    for (int dy = 0; dy < k; dy++)
                        for (int dx = 0; dx < k; dx++) {
                            int rr = r + dy - p, qq = q + dx - p;
                            if (rr < 0 || rr >= h || qq < 0 || qq >= wd) continue;
                            s += (double)w[((o * cin + i) * k + dy) * k + dx] * x[(i * h + rr) * wd + qq];
                        }
                y[(o * h + r) * wd + q] = (float)s;
            }
}

static void ref_group_norm(float *y, const float *x, const float *g, const float *b, int C, int hw, int groups,
                           float eps, int silu) {
    int cg = C / groups;
    for (int gi = 0; gi < groups; gi++) {
        const float *xs = x + (size_t)gi * cg * hw;
        double m = 0, v = 0, n = (double)cg * hw;
        for (int i = 0; i < cg * hw; i++) m += xs[i];
        m /= n;
        for (int i = 0; i < cg * hw; i++) v += (xs[i] - m) * (xs[i] - m);
        v /= n;
        double inv = 1.0 / sqrt(v + eps);
        for (int c = gi * cg; c < (gi + 1) * cg; c++)
            for (int i = 0; i < hw; i++) {
                double t = (x[(size_t)c * hw + i] - m) * inv * g[c] + b[c];
                if (silu) t = t / (1 + exp(-t));
                y[(size_t)c * hw + i] = (float)t;
            }
    }
}

static void ref_upsample(float *y, const float *x, int C, int h, int wd) {
    for (int c = 0; c < C; c++)
        for (int r = 0; r < 2 * h; r++)
            for (int q = 0; q < 2 * wd; q++) y[((size_t)c * 2 * h + r) * 2 * wd + q] = x[((size_t)c * h + r / 2) * wd + q / 2];
}

static void ref_gemm(float *y, const float *x, const float *w, const float *b, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = b ? b[j] : 0;
            for (int k = 0; k < K; k++) s += (double)x[(size_t)i * K + k] * w[(size_t)j * K + k];
            y[(size_t)i * N + j] = (float)s;
        }
}

/* multi-head attention without mask, kv head = q head */
static void ref_attention(float *o, const float *q, const float *k, const float *v, int sq, int sk, int heads, int hd,
                          float scale) {
    int D = heads * hd;
    double *p = malloc((size_t)sk * sizeof *p);
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < sq; i++) {
            double mx = -1e300, sum = 0;
            for (int j = 0; j < sk; j++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[(size_t)i * D + h * hd + d] * k[(size_t)j * D + h * hd + d];
                p[j] = s * scale;
                if (p[j] > mx) mx = p[j];
            }
            for (int j = 0; j < sk; j++) sum += (p[j] = exp(p[j] - mx));
            for (int d = 0; d < hd; d++) {
                double s = 0;
                for (int j = 0; j < sk; j++) s += p[j] * v[(size_t)j * D + h * hd + d];
                o[(size_t)i * D + h * hd + d] = (float)(s / sum);
            }
        }
    free(p);
}

/* ---------- a naive reference backend: CPU memory, naive compute ---------- */

static float *dl(const tensor *t) {
    float *h = malloc(tensor_numel(t) * sizeof(float) + 4);
    if (tensor_download_f32(t, h)) tp_fatal("naive backend: download failed");
    return h;
}
static void ul(tensor *t, float *h) {
    if (tensor_upload_f32(t, h)) tp_fatal("naive backend: upload failed");
    free(h);
}

static void nv_conv2d(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *b, int64_t h, int64_t wd, int k) {
    float *xh = dl(x), *wh = dl(w), *bh = b ? dl(b) : NULL, *yh = malloc(tensor_numel(y) * sizeof(float));
    ref_conv(yh, xh, wh, bh, (int)x->rows, (int)y->rows, (int)h, (int)wd, k);
    ul(y, yh);
    free(xh); free(wh); free(bh);
}
static void nv_group_norm(backend *be, tensor *y, const tensor *x, const tensor *g, const tensor *b, int groups, float eps, int silu) {
    float *xh = dl(x), *gh = dl(g), *bh = dl(b), *yh = malloc(tensor_numel(y) * sizeof(float));
    ref_group_norm(yh, xh, gh, bh, (int)x->rows, (int)x->cols, groups, eps, silu);
    ul(y, yh);
    free(xh); free(gh); free(bh);
}
static void nv_upsample(backend *be, tensor *y, const tensor *x, int64_t h, int64_t wd) {
    float *xh = dl(x), *yh = malloc(tensor_numel(y) * sizeof(float));
    ref_upsample(yh, xh, (int)x->rows, (int)h, (int)wd);
    ul(y, yh);
    free(xh);
}
static void nv_gemm(backend *be, tensor *y, const tensor *x, const tensor *w, const tensor *b) {
    float *xh = dl(x), *wh = dl(w), *bh = b ? dl(b) : NULL, *yh = malloc(tensor_numel(y) * sizeof(float));
    ref_gemm(yh, xh, wh, bh, (int)x->rows, (int)w->rows, (int)x->cols);
    ul(y, yh);
    free(xh); free(wh); free(bh);
}
static void nv_attention(backend *be, tensor *o, const tensor *q, const tensor *k, const tensor *v, const attn_params *p) {
    if (p->n_q_heads != p->n_kv_heads || p->causal || p->key_valid) tp_fatal("naive attention: only plain MHA");
    float *qh = dl(q), *kh = dl(k), *vh = dl(v), *oh = malloc(tensor_numel(o) * sizeof(float));
    ref_attention(oh, qh, kh, vh, (int)q->rows, (int)k->rows, p->n_q_heads, p->head_dim, p->scale);
    ul(o, oh);
    free(qh); free(kh); free(vh);
}
static void nv_transpose(backend *be, tensor *y, const tensor *x) {
    float *xh = dl(x), *yh = malloc(tensor_numel(y) * sizeof(float));
    for (int64_t r = 0; r < x->rows; r++)
        for (int64_t c = 0; c < x->cols; c++) yh[c * x->rows + r] = xh[r * x->cols + c];
    ul(y, yh);
    free(xh);
}
static void nv_add(backend *be, tensor *y, const tensor *a, const tensor *b) {
    float *ah = dl(a), *bh = dl(b);
    size_t n = tensor_numel(a), bn = tensor_numel(b);
    for (size_t i = 0; i < n; i++) ah[i] += bh[bn == n ? i : i % bn];
    ul(y, ah);
    free(bh);
}
static void nv_copy(backend *be, tensor *y, const tensor *x) { ul(y, dl(x)); }

static backend *naive_backend(void) {
    static backend_vtable vt;
    backend *be = backend_cpu_create(1);
    vt = *be->vt;
    vt.name = "naive";
    vt.conv2d = nv_conv2d;
    vt.group_norm = nv_group_norm;
    vt.upsample2x = nv_upsample;
    vt.gemm = nv_gemm;
    vt.attention = nv_attention;
    vt.transpose = nv_transpose;
    vt.add = nv_add;
    vt.copy = nv_copy;
    be->vt = &vt;
    return be;
}

/* ---------- helpers ---------- */

static float *rand_array(size_t n, float lo, float hi) {
    float *a = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = lo + (hi - lo) * (float)rand() / (float)RAND_MAX;
    return a;
}

static tensor *upload_new(backend *be, dtype_t dt, int64_t rows, int64_t cols, const float *h) {
    tensor *t = tensor_new(be, dt, rows, cols);
    if (t && tensor_upload_f32(t, h)) { tensor_free(t); return NULL; }
    return t;
}

static void poison(tensor *t) {
    size_t n = tensor_numel(t);
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    tensor_upload_f32(t, h);
    free(h);
}

/* download any tensor (views too) as f32; caller frees */
static float *fetch(const tensor *t) { return dl(t); }

/* ---------- op tests: decoder shapes (C=64, 9x7, 32 groups) ---------- */

enum { OC = 64, OH = 9, OW = 7 };

static void check_conv(dtype_t dt, int k, int cout, double tol) {
    backend *be = backend_cpu_create(1);
    int hw = OH * OW;
    float *x = rand_array((size_t)OC * hw, -1, 1), *w = rand_array((size_t)cout * OC * k * k, -0.2f, 0.2f),
          *b = rand_array((size_t)cout, -0.5f, 0.5f), *ref = malloc((size_t)cout * hw * sizeof(float));
    if (dt == DT_BF16) /* the reference sees the values the op sees */
        for (size_t i = 0; i < (size_t)cout * OC * k * k; i++) w[i] = bf16r(w[i]);
    if (dt == DT_BF16)
        for (size_t i = 0; i < (size_t)OC * hw; i++) x[i] = bf16r(x[i]);
    tensor *xt = upload_new(be, dt, OC, hw, x), *wt = upload_new(be, dt, cout, (int64_t)OC * k * k, w),
           *bt = upload_new(be, dt, 1, cout, b), *yt = tensor_new(be, dt, cout, hw);
    if (dt == DT_BF16)
        for (int i = 0; i < cout; i++) b[i] = bf16r(b[i]);
    ref_conv(ref, x, w, b, OC, cout, OH, OW, k);
    poison(yt);
    op_conv2d(be, yt, xt, wt, bt, OH, OW, k);
    float *y = fetch(yt);
    double e = rel_l2(y, ref, (size_t)cout * hw);
    CHECK(e < tol, "conv%dx%d %s: rel_l2 %.3g >= %.1g", k, k, dtype_name(dt), e, tol);
    free(x); free(w); free(b); free(ref); free(y);
    tensor_free(xt); tensor_free(wt); tensor_free(bt); tensor_free(yt);
    backend_destroy(be);
}

TEST(vae_op_conv3x3_f32) { check_conv(DT_F32, 3, 32, 1e-5); }
TEST(vae_op_conv1x1_f32) { check_conv(DT_F32, 1, 32, 1e-5); }
TEST(vae_op_conv3x3_bf16) { check_conv(DT_BF16, 3, 32, 1e-2); }
TEST(vae_op_conv3x3_rgb_out) { check_conv(DT_F32, 3, 3, 1e-5); }

/* what the banded convolution does: input rows as a column view of a wider
 * [C, H*W] tensor (ld > cols), output into a column view */
TEST(vae_op_conv3x3_views) {
    backend *be = backend_cpu_create(1);
    int hw = OH * OW, r0 = 2, nr = 5, cout = 16;
    float *x = rand_array((size_t)OC * hw, -1, 1), *w = rand_array((size_t)cout * OC * 9, -0.2f, 0.2f),
          *b = rand_array(cout, -0.5f, 0.5f);
    float *xs = malloc((size_t)OC * nr * OW * sizeof(float)), *ref = malloc((size_t)cout * nr * OW * sizeof(float));
    for (int c = 0; c < OC; c++) memcpy(xs + (size_t)c * nr * OW, x + ((size_t)c * OH + r0) * OW, (size_t)nr * OW * sizeof(float));
    ref_conv(ref, xs, w, b, OC, cout, nr, OW, 3);
    tensor *xt = upload_new(be, DT_F32, OC, hw, x), *wt = upload_new(be, DT_F32, cout, OC * 9, w),
           *bt = upload_new(be, DT_F32, 1, cout, b), *yt = tensor_new(be, DT_F32, cout, hw);
    poison(yt);
    tensor xv = tensor_cols(xt, r0 * OW, nr * OW), yv = tensor_cols(yt, r0 * OW, nr * OW);
    op_conv2d(be, &yv, &xv, wt, bt, nr, OW, 3);
    float *y = fetch(&yv);
    double e = rel_l2(y, ref, (size_t)cout * nr * OW);
    CHECK(e < 1e-5, "conv on views: rel_l2 %.3g", e);
    free(x); free(w); free(b); free(xs); free(ref); free(y);
    tensor_free(xt); tensor_free(wt); tensor_free(bt); tensor_free(yt);
    backend_destroy(be);
}

static void check_group_norm(int silu, int in_place) {
    backend *be = backend_cpu_create(1);
    int hw = OH * OW, groups = 32;
    float *x = rand_array((size_t)OC * hw, -2, 3), *g = rand_array(OC, 0.5f, 1.5f), *b = rand_array(OC, -0.5f, 0.5f);
    float *ref = malloc((size_t)OC * hw * sizeof(float));
    for (int i = 0; i < hw; i++) x[5 * hw + i] += 40.0f;   /* one channel far from zero mean: needs a stable variance */
    ref_group_norm(ref, x, g, b, OC, hw, groups, 1e-6f, silu);
    tensor *xt = upload_new(be, DT_F32, OC, hw, x), *gt = upload_new(be, DT_F32, 1, OC, g),
           *bt = upload_new(be, DT_F32, 1, OC, b), *yt = in_place ? xt : tensor_new(be, DT_F32, OC, hw);
    if (!in_place) poison(yt);
    op_group_norm(be, yt, xt, gt, bt, groups, 1e-6f, silu);
    float *y = fetch(yt);
    double e = rel_l2(y, ref, (size_t)OC * hw);
    CHECK(e < 1e-5, "group_norm silu=%d in_place=%d: rel_l2 %.3g", silu, in_place, e);
    free(x); free(g); free(b); free(ref); free(y);
    if (!in_place) tensor_free(yt);
    tensor_free(xt); tensor_free(gt); tensor_free(bt);
    backend_destroy(be);
}

TEST(vae_op_group_norm) { check_group_norm(0, 0); }
TEST(vae_op_group_norm_silu_in_place) { check_group_norm(1, 1); }

TEST(vae_op_upsample2x) {
    backend *be = backend_cpu_create(1);
    int hw = OH * OW;
    float *x = rand_array((size_t)OC * hw, -1, 1), *ref = malloc((size_t)OC * hw * 4 * sizeof(float));
    ref_upsample(ref, x, OC, OH, OW);
    tensor *xt = upload_new(be, DT_F32, OC, hw, x), *yt = tensor_new(be, DT_F32, OC, 4 * hw);
    poison(yt);
    op_upsample2x(be, yt, xt, OH, OW);
    float *y = fetch(yt);
    CHECK(max_abs_diff(y, ref, (size_t)OC * hw * 4) == 0, "nearest upsample must be exact");
    free(y);
    /* a band of source rows (column view), as the banded upsampler reads it */
    tensor *bt = tensor_new(be, DT_F32, OC, 4 * 3 * OW);
    poison(bt);
    tensor src = tensor_cols(xt, 4 * OW, 3 * OW);
    op_upsample2x(be, bt, &src, 3, OW);
    y = fetch(bt);
    int bad = 0;
    for (int c = 0; c < OC; c++)
        for (int i = 0; i < 6 * 2 * OW; i++) bad += y[(size_t)c * 12 * OW + i] != ref[((size_t)c * 2 * OH + 8) * 2 * OW + i];
    CHECK(bad == 0, "upsample of a row band: %d wrong values", bad);
    free(x); free(ref); free(y);
    tensor_free(xt); tensor_free(yt); tensor_free(bt);
    backend_destroy(be);
}

/* mid-block attention: one head of the full channel width over h*w tokens,
 * projections are GEMMs with bias */
TEST(vae_op_attention_single_head) {
    backend *be = backend_cpu_create(1);
    int S = OH * OW, D = OC;
    float *t = rand_array((size_t)S * D, -1, 1), *w = rand_array((size_t)D * D, -0.3f, 0.3f), *b = rand_array(D, -0.2f, 0.2f);
    float *q = malloc((size_t)S * D * sizeof(float)), *k = rand_array((size_t)S * D, -2, 2),
          *v = rand_array((size_t)S * D, -1, 1), *ref = malloc((size_t)S * D * sizeof(float));
    ref_gemm(q, t, w, b, S, D, D);
    tensor *tt = upload_new(be, DT_F32, S, D, t), *wt = upload_new(be, DT_F32, D, D, w), *bt = upload_new(be, DT_F32, 1, D, b),
           *qt = tensor_new(be, DT_F32, S, D), *kt = upload_new(be, DT_F32, S, D, k), *vt = upload_new(be, DT_F32, S, D, v),
           *ot = tensor_new(be, DT_F32, S, D);
    poison(qt);
    op_gemm(be, qt, tt, wt, bt);
    float *qg = fetch(qt);
    double e = rel_l2(qg, q, (size_t)S * D);
    CHECK(e < 1e-5, "gemm with bias: rel_l2 %.3g", e);
    ref_attention(ref, q, k, v, S, S, 1, D, 1.0f / sqrtf((float)D));
    attn_params p = {.n_q_heads = 1, .n_kv_heads = 1, .head_dim = D, .scale = 1.0f / sqrtf((float)D)};
    poison(ot);
    op_attention(be, ot, qt, kt, vt, &p);
    float *o = fetch(ot);
    e = rel_l2(o, ref, (size_t)S * D);
    CHECK(e < 1e-5, "attention (1 head x %d): rel_l2 %.3g", D, e);
    free(t); free(w); free(b); free(q); free(k); free(v); free(ref); free(qg); free(o);
    tensor_free(tt); tensor_free(wt); tensor_free(bt); tensor_free(qt); tensor_free(kt); tensor_free(vt); tensor_free(ot);
    backend_destroy(be);
}

TEST(vae_op_transpose) {
    backend *be = backend_cpu_create(1);
    int R = OC, C = OH * OW;
    float *x = rand_array((size_t)R * C, -1, 1);
    tensor *xt = upload_new(be, DT_F32, R, C, x), *yt = tensor_new(be, DT_F32, C, R);
    poison(yt);
    op_transpose(be, yt, xt);
    float *y = fetch(yt);
    int bad = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) bad += y[(size_t)c * R + r] != x[(size_t)r * C + c];
    CHECK(bad == 0, "transpose: %d wrong values", bad);
    free(x); free(y);
    tensor_free(xt); tensor_free(yt);
    backend_destroy(be);
}

/* ---------- golden: the pipeline tail as diffusers runs it ---------- */

static char *golden_path(const char *rel) { return xasprintf("%s/vae-tiny/%s", test_golden_dir(), rel); }

typedef struct golden_result {
    double tail_err[3], dec_err;
    int u8_max, u8_exact, u8_n;
} golden_result;

/* Decode golden case `ci` on be; band_bytes 0 keeps the default. */
static int run_golden_case(backend *be, dtype_t dt, int ci, size_t band_bytes, golden_result *res) {
    char *dir = golden_path("model/vae"), *cases = golden_path("vae_cases.safetensors");
    vae_model *v = NULL;
    st_file *f = NULL;
    int rc = -1;
    memset(res, 0, sizeof *res);
    if (vae_load(dir, be, dt, &v)) { test_fail(__FILE__, __LINE__, "vae_load: %s", tp_error_msg()); goto out; }
    if (band_bytes) vae_set_band_bytes(v, band_bytes);
    if (st_open(cases, &f)) { test_fail(__FILE__, __LINE__, "%s", tp_error_msg()); goto out; }
    const char *keys[] = {"packed_latents", "after_unpack", "after_bn", "after_unpatchify", "decoded"};
    float *g[5] = {0};
    const st_tensor_info *info[5];
    int64_t *u8 = NULL;
    char name[64];
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "case%d.%s", ci, keys[i]);
        if (st_read_f32(f, name, &g[i], &info[i])) { test_fail(__FILE__, __LINE__, "%s", tp_error_msg()); goto free_g; }
    }
    snprintf(name, sizeof name, "case%d.image_u8", ci);
    if (st_read_i64(f, name, &u8, NULL)) { test_fail(__FILE__, __LINE__, "%s", tp_error_msg()); goto free_g; }
    int c4 = (int)info[1]->shape[1], hl = (int)info[1]->shape[2], wl = (int)info[1]->shape[3];
    int H = (int)info[4]->shape[2], W = (int)info[4]->shape[3];
    size_t nz = (size_t)c4 * hl * wl, npx = (size_t)H * W;
    float *un = malloc(nz * sizeof(float)), *bn = malloc(nz * sizeof(float)), *x = malloc(nz * sizeof(float));
    vae_unpack_bn_unpatchify(v, g[0], hl, wl, un, bn, x);
    res->tail_err[0] = rel_l2(un, g[1], nz);
    res->tail_err[1] = rel_l2(bn, g[2], nz);
    res->tail_err[2] = rel_l2(x, g[3], nz);
    float *img = malloc(npx * 3 * sizeof(float));
    uint8_t *rgb = malloc(npx * 3);
    for (size_t i = 0; i < npx * 3; i++) img[i] = NAN;
    memset(rgb, 0xab, npx * 3);
    if (vae_decode_packed(v, g[0], hl, wl, img, rgb)) {
        test_fail(__FILE__, __LINE__, "decode: %s", tp_error_msg());
    } else {
        res->dec_err = rel_l2(img, g[4], npx * 3);
        res->u8_n = (int)(npx * 3);
        for (size_t i = 0; i < npx * 3; i++) {
            int d = abs((int)rgb[i] - (int)u8[i]);
            res->u8_exact += d == 0;
            if (d > res->u8_max) res->u8_max = d;
        }
        rc = 0;
    }
    free(un); free(bn); free(x); free(img); free(rgb);
free_g:
    for (int i = 0; i < 5; i++) free(g[i]);
    free(u8);
out:
    st_close(f);
    vae_free(v);
    free(dir);
    free(cases);
    return rc;
}

static void check_golden(backend *be, const char *label, dtype_t dt, size_t band_bytes, double tail_tol, double dec_tol,
                         int u8_tol) {
    for (int ci = 0; ci < 2; ci++) {
        golden_result r;
        if (run_golden_case(be, dt, ci, band_bytes, &r)) return;
        printf("# vae golden %s case%d: tail %.2g %.2g %.2g, decoded rel_l2 %.3g, u8 exact %d/%d, max diff %d\n", label, ci,
               r.tail_err[0], r.tail_err[1], r.tail_err[2], r.dec_err, r.u8_exact, r.u8_n, r.u8_max);
        CHECK(r.tail_err[0] == 0, "case%d after_unpack: rel_l2 %.3g (a permutation must be exact)", ci, r.tail_err[0]);
        CHECK(r.tail_err[1] < tail_tol, "case%d after_bn: rel_l2 %.3g", ci, r.tail_err[1]);
        CHECK(r.tail_err[2] < tail_tol, "case%d after_unpatchify: rel_l2 %.3g", ci, r.tail_err[2]);
        CHECK(r.dec_err < dec_tol, "case%d decoded: rel_l2 %.3g >= %.1g", ci, r.dec_err, dec_tol);
        CHECK(r.u8_max <= u8_tol, "case%d image_u8: max diff %d > %d", ci, r.u8_max, u8_tol);
    }
}

TEST(vae_golden_f32) {
    backend *be = backend_cpu_create(1);
    check_golden(be, "cpu f32", DT_F32, 0, 1e-6, 1e-4, 1);
    backend_destroy(be);
}

/* Same numbers through the naive backend: the decoder's structure checked
 * independently of the optimised CPU kernels. */
TEST(vae_golden_f32_naive_backend) {
    backend *be = naive_backend();
    check_golden(be, "naive f32", DT_F32, 0, 1e-6, 1e-4, 1);
    backend_destroy(be);
}

/* Bands of one output row: every convolution, upsampler and halo path runs
 * banded; the result must still match the reference. */
TEST(vae_golden_f32_banded) {
    backend *be = backend_cpu_create(1);
    check_golden(be, "cpu f32 1-row bands", DT_F32, 1, 1e-6, 1e-4, 1);
    backend_destroy(be);
}

/* bf16 weights and activations against the f32 reference: documented
 * tolerance (docs/vae.md) */
TEST(vae_golden_bf16) {
    backend *be = backend_cpu_create(1);
    check_golden(be, "cpu bf16", DT_BF16, 0, 1e-2, 3e-2, 8);
    backend_destroy(be);
}

/* ---------- config, tiny writer, load errors ---------- */

static json_t *tiny_json(void) {
    char *p = golden_path("model/vae/config.json");
    json_t *j = json_load_file(p, 0, NULL);
    free(p);
    return j;
}

TEST(vae_config_golden) {
    json_t *j = tiny_json();
    REQUIRE(j, "cannot read the golden vae config");
    vae_config c;
    REQUIRE(vae_config_parse(j, "config.json", &c) == 0, "%s", tp_error_msg());
    CHECK(c.n_blocks == 4 && c.block_out[0] == 32 && c.block_out[3] == 64, "block_out_channels");
    CHECK(c.latent_channels == 8 && c.layers_per_block == 1 && c.norm_groups == 8 && c.mid_attention, "sizes");
    CHECK(vae_upscale(&c) == 8 && vae_pixels_per_token(&c) == 16, "scale factors");
    /* decoder_block_out_channels wins over block_out_channels */
    json_t *dec = json_array();
    for (int i = 0; i < 3; i++) json_array_append_new(dec, json_integer(16 << i));
    json_object_set_new(j, "decoder_block_out_channels", dec);
    REQUIRE(vae_config_parse(j, "config.json", &c) == 0, "%s", tp_error_msg());
    CHECK(c.n_blocks == 3 && c.block_out[2] == 64 && vae_upscale(&c) == 4, "decoder_block_out_channels ignored");
    json_decref(j);
}

static void expect_config_error(const char *key, json_t *val, const char *needle) {
    json_t *j = tiny_json();
    json_object_set_new(j, key, val);
    vae_config c;
    int rc = vae_config_parse(j, "vae/config.json", &c);
    CHECK(rc == -1 && strstr(tp_error_msg(), needle), "%s: expected an error naming '%s', got rc %d: %s", key, needle, rc,
          tp_error_msg());
    json_decref(j);
}

TEST(vae_config_errors) {
    expect_config_error("out_channels", json_integer(4), "out_channels");
    expect_config_error("norm_num_groups", json_integer(5), "norm_num_groups");
    expect_config_error("act_fn", json_string("gelu"), "act_fn");
    expect_config_error("patch_size", json_pack("[i,i]", 1, 1), "patch_size");
    expect_config_error("block_out_channels", json_string("wide"), "block_out_channels");
    expect_config_error("latent_channels", json_string("8"), "latent_channels");
    expect_config_error("up_block_types", json_pack("[s]", "AttnUpDecoderBlock2D"), "up_block_types");
}

/* make-tiny's VAE loads, decodes the same on the CPU and the naive backend */
TEST(vae_tiny_roundtrip) {
    char *dir = xasprintf("%s/tiny/vae", test_tmp_dir());
    REQUIRE(vae_write_tiny(dir, 7) == 0, "vae_write_tiny: %s", tp_error_msg());
    backend *cpu = backend_cpu_create(1), *nv = naive_backend();
    vae_model *a = NULL, *b = NULL;
    REQUIRE(vae_load(dir, cpu, DT_F32, &a) == 0, "load on cpu: %s", tp_error_msg());
    REQUIRE(vae_load(dir, nv, DT_F32, &b) == 0, "load on naive: %s", tp_error_msg());
    const vae_config *c = vae_get_config(a);
    CHECK(c->latent_channels == 8 && c->n_blocks == 4 && c->block_out[2] == 64, "tiny config");
    CHECK(a->bn_std[0] > 0.7f && a->bn_std[0] < 1.42f && a->bn_mean[0] != 0, "BatchNorm statistics not loaded");
    int hl = 2, wl = 3, n = hl * wl * 32, px = 32 * 48 * 3;
    float *lat = rand_array((size_t)n, -2, 2), *ia = malloc(px * sizeof(float)), *ib = malloc(px * sizeof(float));
    uint8_t *ra = malloc(px), *rb = malloc(px);
    REQUIRE(vae_decode_packed(a, lat, hl, wl, ia, ra) == 0, "%s", tp_error_msg());
    REQUIRE(vae_decode_packed(b, lat, hl, wl, ib, rb) == 0, "%s", tp_error_msg());
    double e = rel_l2(ia, ib, (size_t)px);
    CHECK(e < 1e-5, "cpu vs naive decode of the tiny VAE: rel_l2 %.3g", e);
    int diff = 0;
    for (int i = 0; i < px; i++) diff += abs(ra[i] - rb[i]) > 1;
    CHECK(diff == 0, "%d RGB values differ by more than 1", diff);
    /* the same model in bf16 decodes close to f32 */
    vae_model *h = NULL;
    REQUIRE(vae_load(dir, cpu, DT_BF16, &h) == 0, "%s", tp_error_msg());
    REQUIRE(vae_decode_packed(h, lat, hl, wl, ib, rb) == 0, "%s", tp_error_msg());
    e = rel_l2(ib, ia, (size_t)px);
    CHECK(e < 3e-2, "bf16 vs f32: rel_l2 %.3g", e);
    vae_free(a); vae_free(b); vae_free(h);
    free(lat); free(ia); free(ib); free(ra); free(rb); free(dir);
    backend_destroy(cpu);
    backend_destroy(nv);
}

TEST(vae_load_errors) {
    backend *be = backend_cpu_create(1);
    vae_model *v = NULL;
    char *dir = xasprintf("%s/bad/vae", test_tmp_dir());
    int rc = vae_load(dir, be, DT_F32, &v);
    CHECK(rc == -1 && v == NULL && strstr(tp_error_msg(), "config.json"), "missing folder: %s", tp_error_msg());
    REQUIRE(vae_write_tiny(dir, 3) == 0, "%s", tp_error_msg());
    /* a config that promises more channels than the weights have */
    char *cfg_path = xasprintf("%s/config.json", dir);
    vae_config c;
    json_t *j = json_load_file(cfg_path, 0, NULL);
    REQUIRE(j && vae_config_parse(j, cfg_path, &c) == 0, "re-read tiny config");
    json_decref(j);
    c.block_out[3] = 128;
    REQUIRE(vae_config_write(&c, cfg_path) == 0, "%s", tp_error_msg());
    rc = vae_load(dir, be, DT_F32, &v);
    CHECK(rc == -1 && v == NULL && strstr(tp_error_msg(), "decoder.") && strstr(tp_error_msg(), "do not match"),
          "shape mismatch must name the tensor: %s", tp_error_msg());
    /* fewer layers in the config than in the file is fine; more is an error naming the missing tensor */
    c.block_out[3] = 64;
    c.layers_per_block = 2;
    REQUIRE(vae_config_write(&c, cfg_path) == 0, "%s", tp_error_msg());
    rc = vae_load(dir, be, DT_F32, &v);
    CHECK(rc == -1 && strstr(tp_error_msg(), "resnets.2") && strstr(tp_error_msg(), "missing"),
          "missing tensor must be named: %s", tp_error_msg());
    vae_free(v);
    free(cfg_path);
    free(dir);
    backend_destroy(be);
}

/* End to end tail of the klein-tiny pipeline: its final packed latents
 * decode to the image diffusers' Flux2KleinPipeline returned (another VAE,
 * a 4 x 6 token grid). */
TEST(vae_golden_klein_tiny_e2e) {
    char *dir = xasprintf("%s/klein-tiny/model/vae", test_golden_dir()), *e2e = xasprintf("%s/klein-tiny/e2e.safetensors", test_golden_dir());
    backend *be = backend_cpu_create(1);
    vae_model *v = NULL;
    st_file *f = NULL;
    REQUIRE(vae_load(dir, be, DT_F32, &v) == 0, "%s", tp_error_msg());
    REQUIRE(st_open(e2e, &f) == 0, "%s", tp_error_msg());
    for (int ci = 0; ci < 3; ci++) {
        char name[64];
        float *lat = NULL, *ref = NULL;
        int64_t *u8 = NULL;
        const st_tensor_info *ti;
        snprintf(name, sizeof name, "case%d.final_packed_latents", ci);
        if (st_read_f32(f, name, &lat, NULL)) { CHECK(0, "%s", tp_error_msg()); break; }
        snprintf(name, sizeof name, "case%d.image_f32", ci);
        if (st_read_f32(f, name, &ref, &ti)) { CHECK(0, "%s", tp_error_msg()); free(lat); break; }
        snprintf(name, sizeof name, "case%d.image_u8", ci);
        if (st_read_i64(f, name, &u8, NULL)) { CHECK(0, "%s", tp_error_msg()); free(lat); free(ref); break; }
        int H = (int)ti->shape[0], W = (int)ti->shape[1];
        size_t px = (size_t)H * W;
        float *chw = malloc(px * 3 * sizeof(float)), *hwc = malloc(px * 3 * sizeof(float));
        uint8_t *rgb = malloc(px * 3);
        CHECK(vae_decode_packed(v, lat, H / 16, W / 16, chw, rgb) == 0, "%s", tp_error_msg());
        int maxd = 0;
        for (size_t p = 0; p < px; p++)
            for (int c = 0; c < 3; c++) {
                float u = chw[c * px + p] * 0.5f + 0.5f;
                hwc[p * 3 + c] = u < 0 ? 0 : u > 1 ? 1 : u;
                int d = abs((int)rgb[p * 3 + c] - (int)u8[p * 3 + c]);
                if (d > maxd) maxd = d;
            }
        double e = rel_l2(hwc, ref, px * 3);
        CHECK(e < 1e-4, "klein-tiny case%d image_f32: rel_l2 %.3g", ci, e);
        CHECK(maxd <= 1, "klein-tiny case%d image_u8: max diff %d", ci, maxd);
        free(lat); free(ref); free(u8); free(chw); free(hwc); free(rgb);
    }
    st_close(f);
    vae_free(v);
    backend_destroy(be);
    free(dir);
    free(e2e);
}

/* The decoder's peak activation memory is its design live set: the first
 * ResNet of the last up block (channel change, full resolution) holds the
 * shortcut, its input normalised in place, and one output-sized buffer,
 * i.e. 2 x cout + cin channels; upsampling never holds the whole upsampled
 * image. Catches buffers that stay alive or an unbanded upsampler. */
TEST(vae_peak_memory_bounded) {
    vae_config c = {.latent_channels = 4, .n_blocks = 3, .block_out = {16, 32, 32}, .layers_per_block = 1,
                    .norm_groups = 8, .out_channels = 3, .mid_attention = 1, .post_quant_conv = 1,
                    .bn_eps = 1e-4f, .norm_eps = 1e-6f};
    backend *be = backend_cpu_create(1);
    vae_model *v = NULL;
    REQUIRE(vae_create_random(&c, be, DT_F32, 5, &v) == 0, "%s", tp_error_msg());
    int hl = 8, wl = 8, H = hl * 8, W = wl * 8;
    float *lat = rand_array((size_t)hl * wl * 16, -2, 2);
    uint8_t *rgb = malloc((size_t)H * W * 3);
    size_t base = be->bytes_in_use;
    be->peak_bytes = base;
    REQUIRE(vae_decode_packed(v, lat, hl, wl, NULL, rgb) == 0, "%s", tp_error_msg());
    double A = 16.0 * H * W * 4;   /* one 16-channel full-resolution f32 activation */
    double peak = (double)(be->peak_bytes - base);
    printf("# vae peak activations %.2f x A\n", peak / A);
    CHECK(peak <= 4.0 * A * 1.02, "peak activations %.0f bytes > 4 x %.0f (skip + a + 2x-wide input)", peak, A);
    CHECK(peak >= 3.0 * A, "peak %.0f bytes is below the live set 4 x %.0f: is peak_bytes tracked?", peak, A);
    CHECK(be->bytes_in_use == base, "decode left %zu bytes allocated", be->bytes_in_use - base);
    vae_free(v);
    free(lat);
    free(rgb);
    backend_destroy(be);
}

/* The same golden decode on the CUDA backend (tpgen_tests --gpu). */
TEST_GPU(vae_golden_cuda) {
    backend *be = backend_cuda_create(0);
    REQUIRE(be, "%s", tp_error_msg());
    check_golden(be, "cuda f32", DT_F32, 0, 1e-6, 1e-4, 1);
    check_golden(be, "cuda f32 1-row bands", DT_F32, 1, 1e-6, 1e-4, 1);
    check_golden(be, "cuda bf16", DT_BF16, 0, 1e-2, 3e-2, 8);
    backend_destroy(be);
}
