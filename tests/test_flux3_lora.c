/* LoRA on FLUX.3 through the library (flux3_load_ex with adapters): the
 * golden adapter (tests/data/flux3-lora, diffusers + PEFT, made by
 * tests/tools/flux3_lora_golden.py) at weight 0 gives the base model's
 * outputs bit for bit (f32 and bf16) while its 31 modules were mapped and
 * their pieces read; at weight 1 it gives diffusers' adapted output; a
 * FLUX.2 adapter on the FLUX.3 model is refused naming a module. The TP
 * sizes 1, 2, 3 against diffusers are in tests/sh/flux3_lora.sh. */
#include "test.h"
#include "golden_case.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/formats/lora.h"
#include "core/formats/safetensors.h"
#include "core/models/flux3/flux3.h"
#include "kernels/ops.h"
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#define ADAPTER "tests/data/flux3-lora/adapter.safetensors"
#define LCASES "tests/data/flux3-lora/lora_cases.safetensors"

/* case1 of the golden lora cases (it has reference tokens) through a model
 * loaded with `loras` (n 0: none); *out gets the output, *ref diffusers'
 * adapted output. */
static int run(const lora_spec *loras, int n, dtype_t prec, float **out, float **ref, size_t *numel, lora_set **ls) {
    char *dir = xasprintf("%s/flux3-tiny/base/model/transformer", test_golden_dir());
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_SELF, be);
    flux3_model *m = NULL;
    st_file *f = NULL;
    float *x = NULL, *txt = NULL, *cond = NULL, *t = NULL;
    int32_t *img = NULL, *tid = NULL, *cid = NULL;
    int64_t N = 0, L = 0, R = 0;
    flux3_load_extras xl = {.loras = loras, .n_loras = n, .lora_set_out = ls};
    int rc = flux3_load_ex(dir, be, c, prec, &xl, &m, NULL);
    if (!rc) rc = st_open(LCASES, &f);
    if (!rc)
        rc = st_read_f32(f, "case1.hidden_states", &x, NULL) || st_read_f32(f, "case1.encoder_hidden_states", &txt, NULL) ||
             st_read_f32(f, "case1.image_cond_hidden_states", &cond, NULL) || st_read_f32(f, "case1.timestep", &t, NULL) ||
             st_read_f32(f, "case1.output", ref, NULL) || !(img = golden_ids32(f, "case1.img_ids", &N)) ||
             !(tid = golden_ids32(f, "case1.txt_ids", &L)) || !(cid = golden_ids32(f, "case1.image_cond_ids", &R));
    if (!rc) {
        if (prec == DT_BF16) flux3_set_exact_timestep(m, 1);
        *numel = (size_t)N * (size_t)flux3_get_config(m)->in_channels;
        *out = xmalloc(*numel * sizeof **out);
        flux3_inputs in = {.x = x, .img_ids = img, .N = N, .txt = txt, .txt_ids = tid, .L = L, .cond = cond,
                           .cond_ids = cid, .R = R, .timestep = t[0]};
        rc = flux3_forward(m, &in, *out);
    }
    if (f) st_close(f);
    free(x), free(txt), free(cond), free(t), free(img), free(tid), free(cid);
    flux3_free(m);
    comm_destroy(c);
    backend_destroy(be);
    free(dir);
    return rc ? -1 : 0;
}

static double rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / den);
}

static void weight0(dtype_t prec) {
    float *base = NULL, *w0 = NULL, *w1 = NULL, *ref = NULL, *ref2 = NULL, *ref3 = NULL;
    size_t n = 0, n0 = 0, n1 = 0;
    lora_set *ls = NULL;
    lora_spec s0 = {.path = ADAPTER, .weight = 0.0}, s1 = {.path = ADAPTER, .weight = 1.0};
    int rc = run(NULL, 0, prec, &base, &ref, &n, NULL);
    CHECK(rc == 0, "base: %s", tp_error_msg());
    rc = rc ? rc : run(&s0, 1, prec, &w0, &ref2, &n0, &ls);
    CHECK(rc == 0, "weight 0: %s", tp_error_msg());
    if (!rc) {
        CHECK(ls && ls->n == 1 && ls->ad[0].n_modules == 31 && ls->ad[0].bytes_read > 0,
              "the weight-0 adapter was not mapped and read (%d modules, %llu bytes)", ls ? ls->ad[0].n_modules : -1,
              ls ? (unsigned long long)ls->ad[0].bytes_read : 0ull);
        CHECK(n0 == n && !memcmp(base, w0, n * sizeof *base), "weight 0 is not the base model bit for bit (rel %.3g)",
              rel(w0, base, n));
    }
    lora_set_free(ls);
    rc = rc ? rc : run(&s1, 1, prec, &w1, &ref3, &n1, NULL);
    CHECK(rc == 0, "weight 1: %s", tp_error_msg());
    if (!rc) {
        double e = rel(w1, ref3, n1), d = rel(base, ref3, n1);
        double tol = prec == DT_F32 ? 1e-5 : 3e-2;
        CHECK(e <= tol, "weight 1 against diffusers: rel_err %.3g > %g", e, tol);
        CHECK(d > 0.3, "the adapter barely changes the output (%.3g): the check is vacuous", d);
    }
    free(base), free(w0), free(w1), free(ref), free(ref2), free(ref3);
}

TEST(flux3_lora_weight0_is_base_f32) { weight0(DT_F32); }
TEST(flux3_lora_weight0_is_base_bf16) { weight0(DT_BF16); }

/* the golden FLUX.2 adapters (diffusers names of FLUX.2's double/single
 * blocks) on the FLUX.3 base: refused naming the module, nothing loaded */
TEST(flux3_lora_flux2_adapter_refused) {
    char *p = xasprintf("%s/flux2-lora/adapters/peft_r4.safetensors", test_golden_dir());
    lora_spec s = {.path = p, .weight = 1.0};
    float *out = NULL, *ref = NULL;
    size_t n = 0;
    int rc = run(&s, 1, DT_F32, &out, &ref, &n, NULL);
    CHECK(rc != 0, "a FLUX.2 adapter loaded onto FLUX.3");
    const char *msg = tp_error_msg();
    CHECK(rc == 0 || (strstr(msg, "module '") && strstr(msg, "matches no Linear of this transformer") &&
                      strstr(msg, p)), "message: %s", msg);
    free(out), free(ref), free(p);
}

/* The other adapter dialects on FLUX.3 (diffusers names): the golden PEFT
 * adapter rewritten, module by module, as exact equivalents in three
 * dialects, each of which must give diffusers' adapted output:
 *  - LyCORIS LoKr (lycoris_<module with _>, decoded through the checkpoint's
 *    tensor names): w1 = [[1]] full, w2 = lokr_w2_a @ lokr_w2_b = B @ A,
 *    alpha = scale * r, so scale * kron([[1]], B A) = scale * B A;
 *  - LyCORIS LoHa: (B A) (.) (1 1^T), alpha = scale * r;
 *  - a ComfyUI full diff (transformer.<module>.diff = scale * B A, in double). */
static void put(st_write_tensor *t, int *n, char *name, float *data, int64_t r, int64_t c, int ndim) {
    t[*n] = (st_write_tensor){.name = name, .dtype = DT_F32, .ndim = ndim, .data = data};
    t[*n].shape[0] = r, t[*n].shape[1] = c;
    (*n)++;
}

static char *under(const char *m) {
    char *s = xstrdup(m);
    for (char *p = s; *p; p++) if (*p == '.') *p = '_';
    return s;
}

static float *filled(int64_t n, float v) {
    float *f = xmalloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = v;
    return f;
}

static char *write_dialect(const lora_set *ls, int kind) {
    static const char *names[] = {"lokr", "loha", "diff"};
    st_file *f = ls->ad[0].f;
    st_write_tensor *t = xcalloc((size_t)ls->n_seg * 6 + 1, sizeof *t);
    int n = 0;
    for (int i = 0; i < ls->n_seg; i++) {
        const lora_segment *g = &ls->seg[i];
        float *A = NULL, *B = NULL;
        st_read_f32(f, g->a->name, &A, NULL);
        st_read_f32(f, g->b->name, &B, NULL);
        int64_t r = g->rank, in = g->a->shape[1], out = g->b->shape[0];
        char *u = under(g->module);
        if (kind == 2) {
            float *d = xmalloc((size_t)(out * in) * sizeof *d);
            for (int64_t y = 0; y < out; y++)
                for (int64_t x = 0; x < in; x++) {
                    double s = 0;
                    for (int64_t k = 0; k < r; k++) s += (double)B[y * r + k] * A[k * in + x];
                    d[y * in + x] = (float)(g->coef * s);
                }
            put(t, &n, xasprintf("transformer.%s.diff", g->module), d, out, in, 2);
            free(A), free(B);
        } else if (kind == 0) {
            put(t, &n, xasprintf("lycoris_%s.lokr_w1", u), filled(1, 1), 1, 1, 2);
            put(t, &n, xasprintf("lycoris_%s.lokr_w2_a", u), B, out, r, 2);
            put(t, &n, xasprintf("lycoris_%s.lokr_w2_b", u), A, r, in, 2);
            put(t, &n, xasprintf("lycoris_%s.alpha", u), filled(1, (float)(g->coef * r)), 0, 0, 0);
        } else {
            put(t, &n, xasprintf("lycoris_%s.hada_w1_a", u), B, out, r, 2);
            put(t, &n, xasprintf("lycoris_%s.hada_w1_b", u), A, r, in, 2);
            put(t, &n, xasprintf("lycoris_%s.hada_w2_a", u), filled(out, 1), out, 1, 2);
            put(t, &n, xasprintf("lycoris_%s.hada_w2_b", u), filled(in, 1), 1, in, 2);
            put(t, &n, xasprintf("lycoris_%s.alpha", u), filled(1, (float)(g->coef * r)), 0, 0, 0);
        }
        free(u);
    }
    char *path = xasprintf("%s/flux3-%s.safetensors", test_tmp_dir(), names[kind]);
    CHECK(st_write(path, t, n, NULL) == 0, "%s: %s", path, tp_error_msg());
    for (int i = 0; i < n; i++) free((void *)t[i].name), free((void *)t[i].data);
    free(t);
    return path;
}

TEST(flux3_lora_dialects_equal_diffusers) {
    float *out = NULL, *ref = NULL;
    size_t n = 0;
    lora_set *ls = NULL;
    lora_spec s = {.path = ADAPTER, .weight = 1.0};
    REQUIRE(run(&s, 1, DT_F32, &out, &ref, &n, &ls) == 0, "%s", tp_error_msg());
    free(out), free(ref);
    for (int kind = 0; kind < 3; kind++) {
        char *p = write_dialect(ls, kind);
        lora_spec d = {.path = p, .weight = 1.0};
        lora_set *ld = NULL;
        int rc = run(&d, 1, DT_F32, &out, &ref, &n, &ld);
        CHECK(rc == 0, "%s: %s", p, tp_error_msg());
        if (!rc) {
            double e = rel(out, ref, n);
            CHECK(e <= 1e-5, "%s on FLUX.3: rel_err %.3g against diffusers > 1e-5", p, e);
            CHECK(ld->ad[0].n_modules == 31, "%s: %d modules mapped, 31 expected", p, ld->ad[0].n_modules);
            printf("# FLUX.3 %s: rel_err %.2e against diffusers (%d modules)\n", lora_kind_name(ld->seg[0].kind), e,
                   ld->ad[0].n_modules);
        }
        lora_set_free(ld);
        free(out), free(ref), free(p);
        out = ref = NULL;
    }
    lora_set_free(ls);
}
