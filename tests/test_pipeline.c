/* Denoising loop tests: the f32 loop against the diffusers pipeline run of
 * flux2-tiny-a (denoise.safetensors) at np 1, 2, 4; the bf16 loop at tp K
 * against an unsharded bf16 loop on rank 0; CFG against an independent
 * step computed from two plain forwards; the id helpers. */
#include "test.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/pipeline.h"
#include "core/formats/safetensors.h"
#include "core/schedule.h"
#include "kernels/ops.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

TEST(pipeline_image_and_text_ids) {
    int32_t ids[2 * 3 * 4], t[5 * 4];
    for (int i = 0; i < 24; i++) ids[i] = -7;
    flux2_image_ids(2, 3, 10, ids);
    int ok = 1;
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 3; x++) {
            const int32_t *id = ids + (y * 3 + x) * 4;
            ok &= id[0] == 10 && id[1] == y && id[2] == x && id[3] == 0;
        }
    CHECK(ok, "image ids must be (t, y, x, 0) in row-major order");
    flux2_text_ids(5, t);
    ok = 1;
    for (int l = 0; l < 5; l++) ok &= t[4 * l] == 0 && t[4 * l + 1] == 0 && t[4 * l + 2] == 0 && t[4 * l + 3] == l;
    CHECK(ok, "text ids must be (0, 0, 0, l)");
}

typedef struct denoise_golden {
    float *latents, *embeds, *noise0, *final, *sigmas, *timesteps, *guidance;
    int64_t N, L, steps;
    int32_t *img_ids, *txt_ids;
} denoise_golden;

static int read_golden(denoise_golden *g) {
    memset(g, 0, sizeof *g);
    char path[1024];
    snprintf(path, sizeof path, "%s/flux2-tiny-a/denoise.safetensors", test_golden_dir());
    st_file *f;
    if (st_open(path, &f)) return -1;
    const st_tensor_info *ilat, *iemb, *isig;
    int rc = st_read_f32(f, "packed_latents", &g->latents, &ilat) || st_read_f32(f, "prompt_embeds", &g->embeds, &iemb) ||
             st_read_f32(f, "noise_pred_step0", &g->noise0, NULL) || st_read_f32(f, "final_packed_latents", &g->final, NULL) ||
             st_read_f32(f, "sigmas", &g->sigmas, &isig) || st_read_f32(f, "timesteps", &g->timesteps, NULL) ||
             st_read_f32(f, "guidance", &g->guidance, NULL);
    if (!rc) {
        g->N = ilat->shape[1], g->L = iemb->shape[1], g->steps = isig->shape[0] - 1;
        const char *gh = st_meta(f, "grid_h"), *gw = st_meta(f, "grid_w");
        if (!gh || !gw || atoi(gh) * atoi(gw) != g->N) rc = tp_error("denoise.safetensors: grid metadata");
    }
    if (!rc) {
        g->img_ids = malloc((size_t)g->N * 16), g->txt_ids = malloc((size_t)g->L * 16);
        flux2_image_ids(atoi(st_meta(f, "grid_h")), atoi(st_meta(f, "grid_w")), 0, g->img_ids);
        flux2_text_ids(g->L, g->txt_ids);
    }
    st_close(f);
    return rc ? -1 : 0;
}

static void free_golden(denoise_golden *g) {
    free(g->latents), free(g->embeds), free(g->noise0), free(g->final), free(g->sigmas), free(g->timesteps);
    free(g->guidance), free(g->img_ids), free(g->txt_ids);
}

static int all_ok(int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

static flux2_model *load_tiny(backend *be, comm *c, dtype_t prec) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/flux2-tiny-a/model/transformer", test_golden_dir());
    flux2_model *m = NULL;
    if (flux2_load(dir, be, c, prec, &m, NULL)) test_fail(__FILE__, __LINE__, "load: %s", tp_error_msg());
    return m;
}

typedef struct step_log { float *v0; int calls; } step_log;

static int keep_step0(int step, int steps, double sec, const float *v, const float *x, float sigma, void *ctx) {
    step_log *l = ctx;
    if (step == 0) memcpy(l->v0, v, sizeof(float) * 24 * 32);
    l->calls++;
    return 0;
}

static denoise_params params_of(const denoise_golden *g) {
    return (denoise_params){.latents = g->latents, .N = g->N, .img_ids = g->img_ids, .prompt_embeds = g->embeds,
                            .L = g->L, .txt_ids = g->txt_ids, .sigmas = g->sigmas, .steps = (int)g->steps,
                            .guidance = g->guidance};
}

static void denoise_golden_run(dtype_t prec, double tol);
TEST_MPI(pipeline_denoise_golden_f32) { denoise_golden_run(DT_F32, 1e-4); }
/* bf16 with the full eager rounding (quantised timesteps, bf16 latents and
 * Euler step) against the f32 reference: about 2e-2 after 4 steps */
TEST_MPI(pipeline_denoise_golden_bf16) { denoise_golden_run(DT_BF16, 3e-2); }

static void denoise_golden_run(dtype_t prec, double tol) {
    denoise_golden g;
    int ok = read_golden(&g) == 0;
    CHECK(ok, "golden: %s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_WORLD, be);
    flux2_model *m = ok ? load_tiny(be, c, prec) : NULL;
    if (all_ok(m != NULL)) {
        /* the scheduler's timesteps are fl32(sigma * 1000) */
        int ts_ok = 1;
        for (int i = 0; i < g.steps; i++) ts_ok &= g.sigmas[i] * 1000.0f == g.timesteps[i];
        CHECK(ts_ok, "timesteps are not fl32(sigma*1000)");
        size_t n = (size_t)g.N * 32;
        float *out = malloc(n * 4);
        step_log log = {malloc(n * 4), 0};
        for (size_t i = 0; i < n; i++) out[i] = log.v0[i] = NAN;
        denoise_params p = params_of(&g);
        p.on_step = keep_step0, p.ctx = &log;
        int rc = flux2_denoise(m, &p, out);
        CHECK(rc == 0, "denoise: %s", tp_error_msg());
        CHECK(log.calls == g.steps, "callback ran %d times for %lld steps", log.calls, (long long)g.steps);
        double e0 = rel_l2(log.v0, g.noise0, n), e = rel_l2(out, g.final, n);
        CHECK(e0 <= tol, "noise_pred_step0 rel_err %.3g > %.3g", e0, tol);
        CHECK(e <= tol, "final_packed_latents rel_err %.3g > %.3g", e, tol);
        free(out), free(log.v0);
    }
    flux2_free(m);
    comm_destroy(c);
    backend_destroy(be);
    if (ok) free_golden(&g);
}

/* bf16 loop at tp K against the same loop unsharded on rank 0; the latents
 * must stay bf16 values after every step. */
TEST_MPI(pipeline_denoise_bf16_tp_matches_unsharded) {
    denoise_golden g;
    int ok = read_golden(&g) == 0, rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_WORLD, be), *self = comm_create_mpi(MPI_COMM_SELF, be);
    flux2_model *m = ok ? load_tiny(be, c, DT_BF16) : NULL, *ref = ok && rank == 0 ? load_tiny(be, self, DT_BF16) : NULL;
    if (all_ok(m != NULL && (rank != 0 || ref != NULL))) {
        size_t n = (size_t)g.N * 32;
        float *out = malloc(n * 4), *want = malloc(n * 4);
        denoise_params p = params_of(&g);
        int rc = flux2_denoise(m, &p, out);
        CHECK(rc == 0, "denoise: %s", tp_error_msg());
        int bf = 1;
        for (size_t i = 0; i < n; i++) bf &= bf16r(out[i]) == out[i];
        CHECK(bf, "bf16 latents must be bf16 values");
        if (rank == 0) {
            CHECK(flux2_denoise(ref, &p, want) == 0, "unsharded: %s", tp_error_msg());
            double e = rel_l2(out, want, n);
            CHECK(e <= 3e-2, "bf16 tp vs unsharded rel_err %.3g", e);
        }
        free(out), free(want);
    }
    flux2_free(m), flux2_free(ref);
    comm_destroy(c), comm_destroy(self);
    backend_destroy(be);
    if (ok) free_golden(&g);
}

/* CFG: one step with a negative prompt equals vn + gs (v - vn) from two
 * plain forwards and the Euler step written out here. */
TEST_MPI(pipeline_cfg_step_matches_two_forwards) {
    denoise_golden g;
    int ok = read_golden(&g) == 0;
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_WORLD, be);
    flux2_model *m = ok ? load_tiny(be, c, DT_F32) : NULL;
    if (all_ok(m != NULL)) {
        size_t n = (size_t)g.N * 32;
        int64_t Ln = 3;
        float *neg = malloc((size_t)(Ln * 96) * 4), *v = malloc(n * 4), *vn = malloc(n * 4), *out = malloc(n * 4);
        int32_t nid[12];
        flux2_text_ids(Ln, nid);
        for (int64_t i = 0; i < Ln * 96; i++) neg[i] = 0.5f * g.embeds[i + 96] - 0.25f;
        denoise_params p = params_of(&g);
        p.steps = 1, p.neg_embeds = neg, p.Ln = Ln, p.neg_txt_ids = nid, p.cfg_scale = 3.5f;
        float tin = (g.sigmas[0] * 1000.0f) / 1000.0f;
        int rc = flux2_forward(m, g.latents, g.N, g.img_ids, g.embeds, g.L, g.txt_ids, tin, g.guidance, v);
        rc |= flux2_forward(m, g.latents, g.N, g.img_ids, neg, Ln, nid, tin, g.guidance, vn);
        rc |= flux2_denoise(m, &p, out);
        CHECK(rc == 0, "forward/denoise: %s", tp_error_msg());
        float dt = g.sigmas[1] - g.sigmas[0];
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double want = g.latents[i] + dt * (vn[i] + 3.5 * ((double)v[i] - vn[i]));
            worst = fmax(worst, fabs(out[i] - want));
        }
        CHECK(worst <= 1e-5, "CFG step differs by %.3g", worst);
        free(neg), free(v), free(vn), free(out);
    }
    flux2_free(m);
    comm_destroy(c);
    backend_destroy(be);
    if (ok) free_golden(&g);
}

TEST(pipeline_rejects_bad_params) {
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_SELF, be);
    denoise_golden g;
    REQUIRE(read_golden(&g) == 0, "golden: %s", tp_error_msg());
    flux2_model *m = load_tiny(be, c, DT_F32);
    if (m) {
        float out[24 * 32];
        denoise_params p = params_of(&g);
        p.steps = 0;
        CHECK(flux2_denoise(m, &p, out) != 0 && strstr(tp_error_msg(), "steps"), "steps 0: %s", tp_error_msg());
        p = params_of(&g);
        p.sigmas = NULL;
        CHECK(flux2_denoise(m, &p, out) != 0 && strstr(tp_error_msg(), "sigmas"), "no sigmas: %s", tp_error_msg());
    }
    flux2_free(m);
    free_golden(&g);
    comm_destroy(c);
    backend_destroy(be);
}

/* klein-tiny (no guidance embedder, 32 padded text tokens): the diffusers
 * Flux2KleinPipeline loop, with its per-step latents, from the packed
 * initial noise and the schedule of core/schedule.c. */
typedef struct klein_log { const float *want[4]; double worst; int calls; float *v0; } klein_log;

static int klein_step(int step, int steps, double sec, const float *v, const float *x, float sigma, void *ctx) {
    klein_log *l = ctx;
    if (step == 0) memcpy(l->v0, v, sizeof(float) * 24 * 32);
    if (step < 3) {
        double e = rel_l2(x, l->want[step], 24 * 32);
        if (!(e <= l->worst)) l->worst = e;
    }
    l->calls++;
    return 0;
}

static int32_t *ids_of(const st_file *f, const char *name, int64_t n) {
    int64_t *v;
    const st_tensor_info *info;
    if (st_read_i64(f, name, &v, &info)) return NULL;
    if (st_numel(info) != n * 4) { free(v); return NULL; }
    int32_t *r = malloc((size_t)n * 16);
    for (int64_t i = 0; i < n * 4; i++) r[i] = (int32_t)v[i];
    free(v);
    return r;
}

TEST_MPI(pipeline_klein_tiny_loop_f32) {
    char path[1024], key[64];
    snprintf(path, sizeof path, "%s/klein-tiny/e2e.safetensors", test_golden_dir());
    st_file *f = NULL;
    int ok = st_open(path, &f) == 0;
    CHECK(ok, "%s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_WORLD, be);
    flux2_model *m = NULL;
    snprintf(path, sizeof path, "%s/klein-tiny/model/transformer", test_golden_dir());
    if (ok && flux2_load(path, be, c, DT_F32, &m, NULL)) test_fail(__FILE__, __LINE__, "load: %s", tp_error_msg());
    float sigmas[5], ts[4];
    if (all_ok(m != NULL && schedule_flux2(24, 4, sigmas, ts) == 0)) {
        for (int k = 0; k < 2; k++) {
            float *init = NULL, *emb = NULL, *v0 = NULL, *fin = NULL, *gts = NULL, *steps[3] = {0};
            int32_t *img = NULL, *txt = NULL;
#define K(s) (snprintf(key, sizeof key, "case%d.%s", k, s), key)
            int rd = st_read_f32(f, K("initial_latents"), &init, NULL) || st_read_f32(f, K("prompt_embeds"), &emb, NULL) ||
                     st_read_f32(f, K("noise_pred_step0"), &v0, NULL) || st_read_f32(f, K("final_packed_latents"), &fin, NULL) ||
                     st_read_f32(f, K("timesteps"), &gts, NULL) || st_read_f32(f, K("latents_step0"), &steps[0], NULL) ||
                     st_read_f32(f, K("latents_step1"), &steps[1], NULL) || st_read_f32(f, K("latents_step2"), &steps[2], NULL) ||
                     !(img = ids_of(f, K("latent_ids"), 24)) || !(txt = ids_of(f, K("text_ids"), 32));
#undef K
            CHECK(!rd, "case%d: %s", k, tp_error_msg());
            if (!all_ok(!rd)) break;
            /* this file stores the timesteps as the model receives them (t / 1000) */
            int ts_ok = 1;
            for (int i = 0; i < 4; i++) ts_ok &= fabsf(ts[i] / 1000.0f - gts[i]) <= 1e-6f;
            CHECK(ts_ok, "case%d: schedule timesteps differ from the pipeline's", k);
            /* pack [C, h, w] -> [h*w, C] */
            float packed[24 * 32], out[24 * 32];
            for (int ch = 0; ch < 32; ch++)
                for (int t = 0; t < 24; t++) packed[t * 32 + ch] = init[ch * 24 + t];
            klein_log log = {{steps[0], steps[1], steps[2]}, 0, 0, malloc(sizeof(float) * 24 * 32)};
            denoise_params p = {.latents = packed, .N = 24, .img_ids = img, .prompt_embeds = emb, .L = 32,
                                .txt_ids = txt, .sigmas = sigmas, .steps = 4, .on_step = klein_step, .ctx = &log};
            int rc = flux2_denoise(m, &p, out);
            CHECK(rc == 0 && log.calls == 4, "case%d denoise: %s", k, tp_error_msg());
            double e0 = rel_l2(log.v0, v0, 24 * 32), ef = rel_l2(out, fin, 24 * 32);
            CHECK(e0 <= 1e-4 && log.worst <= 1e-4 && ef <= 1e-4,
                  "case%d: noise_pred_step0 %.3g, steps 0-2 worst %.3g, final %.3g (tol 1e-4)", k, e0, log.worst, ef);
            free(log.v0), free(init), free(emb), free(v0), free(fin), free(gts), free(img), free(txt);
            for (int i = 0; i < 3; i++) free(steps[i]);
        }
    }
    flux2_free(m);
    if (f) st_close(f);
    comm_destroy(c);
    backend_destroy(be);
}

/* Reference-image tokens: one step with R extra tokens (ids T = 10) equals
 * x + dt · forward([x; ref])[:N], the forward run here directly. */
TEST_MPI(pipeline_reference_tokens_step) {
    denoise_golden g;
    int ok = read_golden(&g) == 0;
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_WORLD, be);
    flux2_model *m = ok ? load_tiny(be, c, DT_F32) : NULL;
    if (all_ok(m != NULL)) {
        int64_t R = 6, N = g.N, rows = N + R;
        float *ref = malloc((size_t)(R * 32) * 4), *xin = malloc((size_t)(rows * 32) * 4);
        float *vfull = malloc((size_t)(rows * 32) * 4), *out = malloc((size_t)(N * 32) * 4);
        int32_t *rid = malloc((size_t)R * 16), *ids = malloc((size_t)rows * 16);
        flux2_image_ids(2, 3, 10, rid);
        for (int64_t i = 0; i < R * 32; i++) ref[i] = g.latents[(i * 7) % (N * 32)] * 0.5f;
        memcpy(xin, g.latents, (size_t)(N * 32) * 4);
        memcpy(xin + N * 32, ref, (size_t)(R * 32) * 4);
        memcpy(ids, g.img_ids, (size_t)N * 16);
        memcpy(ids + N * 4, rid, (size_t)R * 16);
        for (int64_t i = 0; i < N * 32; i++) out[i] = NAN;
        denoise_params p = params_of(&g);
        p.steps = 1, p.ref_tokens = ref, p.R = R, p.ref_ids = rid;
        float tin = (g.sigmas[0] * 1000.0f) / 1000.0f;
        int rc = flux2_forward(m, xin, rows, ids, g.embeds, g.L, g.txt_ids, tin, g.guidance, vfull);
        rc |= flux2_denoise(m, &p, out);
        CHECK(rc == 0, "forward/denoise: %s", tp_error_msg());
        float dt = g.sigmas[1] - g.sigmas[0];
        double worst = 0;
        for (int64_t i = 0; i < N * 32; i++) {
            double d = fabs(out[i] - (g.latents[i] + dt * vfull[i]));
            worst = d == d ? fmax(worst, d) : INFINITY;
        }
        CHECK(worst <= 1e-6, "reference-token step differs by %.3g", worst);
        free(ref), free(xin), free(vfull), free(out), free(rid), free(ids);
    }
    flux2_free(m);
    comm_destroy(c);
    backend_destroy(be);
    if (ok) free_golden(&g);
}
