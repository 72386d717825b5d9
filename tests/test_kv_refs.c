/* KV-cached references (Flux2KleinKVPipeline; diffusers transformer_flux2.py
 * kv_cache_mode "extract" / "cached"). No golden exists for this pipeline,
 * so the checks are consequences of its definition, at tp 1, 2 and 4 on
 * the klein-tiny transformer with klein-tiny-edit's reference tokens:
 *  - reference rows attend only to each other and are modulated with the
 *    fixed reference timestep: their cached K/V do not change when the
 *    noise tokens or the step's timestep change;
 *  - a cached pass at any step equals a fresh extract pass at that step
 *    (the cache holds exactly what the extract pass computes);
 *  - the extract pass differs from the plain full pass (the mode is live),
 *    and sharded runs equal the unsharded one;
 *  - the denoising loop with KV (extract at step 0, cached after) equals a
 *    loop written here that runs a fresh extract pass every step;
 *  - with sequence parallelism over the world, both passes are the one-rank
 *    ones byte for byte and each rank's cache is its heads' share. */
#include "test.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/pipeline.h"
#include "core/refs.h"
#include "core/schedule.h"
#include "core/models/flux2/flux2_impl.h"
#include "kernels/ops.h"
#include <stdlib.h>
#include <string.h>

typedef struct kv_env {
    backend *be;
    comm *c, *self;
    flux2_model *m, *ref;     /* sharded over the world; unsharded on rank 0 */
    ref_set rs;
    int rank;
} kv_env;

static int env_open(kv_env *e) {
    memset(e, 0, sizeof *e);
    MPI_Comm_rank(MPI_COMM_WORLD, &e->rank);
    const char *gd = test_golden_dir();
    char *t = xasprintf("%s/klein-tiny/model/transformer", gd), *vd = xasprintf("%s/klein-tiny/model/vae", gd);
    char *p0 = xasprintf("%s/klein-tiny-edit/refs/r0_64x80.png", gd), *p1 = xasprintf("%s/klein-tiny-edit/refs/r1_100x70.png", gd);
    char *paths[2] = {p0, p1};
    e->be = backend_cpu_create(1);
    e->c = comm_create_mpi(MPI_COMM_WORLD, e->be);
    e->self = comm_create_mpi(MPI_COMM_SELF, e->be);
    vae_model *v = NULL;
    int rc = flux2_load(t, e->be, e->c, DT_F32, &e->m, NULL);
    if (!rc && e->rank == 0) rc = flux2_load(t, e->be, e->self, DT_F32, &e->ref, NULL);
    if (!rc) rc = vae_load_parts(vd, e->be, DT_F32, VAE_ENCODER, &v);
    if (!rc) rc = refs_encode(v, paths, 2, &e->rs);
    vae_free(v);
    free(t), free(vd), free(p0), free(p1);
    int all = 0;
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rc || all) test_fail(__FILE__, __LINE__, "setup: %s", tp_error_msg());
    return rc || all ? -1 : 0;
}

static void env_close(kv_env *e) {
    flux2_free(e->m), flux2_free(e->ref);
    refs_free(&e->rs);
    comm_destroy(e->c), comm_destroy(e->self);
    backend_destroy(e->be);
}

/* deterministic inputs: N noise tokens of a 4x6 grid, L text tokens */
enum { H = 4, W = 6, NN = H * W, LT = 8, C = 32, JT = 96 };
static void fill(float *x, size_t n, unsigned seed) {
    uint64_t s = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
}

typedef struct inputs {
    float x[NN * C], txt[LT * JT];
    int32_t ids[NN * 4], tids[LT * 4];
    float *kin;
    int32_t *kids;
    int64_t R;
} inputs;

static void inputs_make(inputs *in, const ref_set *rs, unsigned seed) {
    fill(in->x, NN * C, seed);
    fill(in->txt, LT * JT, 99);
    flux2_image_ids(H, W, 0, in->ids);
    flux2_text_ids(LT, in->tids);
    in->R = rs->R;
    in->kin = malloc(sizeof(float) * (size_t)(rs->R + NN) * C);
    in->kids = malloc(sizeof(int32_t) * (size_t)(rs->R + NN) * 4);
    memcpy(in->kin, rs->tokens, sizeof(float) * (size_t)rs->R * C);
    memcpy(in->kin + rs->R * C, in->x, sizeof in->x);
    memcpy(in->kids, rs->ids, sizeof(int32_t) * (size_t)rs->R * 4);
    memcpy(in->kids + rs->R * 4, in->ids, sizeof in->ids);
}

static int extract(flux2_model *m, flux2_kv_cache *kv, const inputs *in, float t, float *out) {
    return flux2_forward_kv(m, FLUX2_KV_EXTRACT, kv, in->kin, in->R + NN, in->R, in->kids, in->txt, LT, in->tids, t,
                            NULL, 0.0f, out);
}

static double cache_diff(const flux2_kv_cache *a, const flux2_kv_cache *b) {
    double worst = 0;
    for (int l = 0; l < a->n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            const tensor *ta = kv ? a->v[l] : a->k[l], *tb = kv ? b->v[l] : b->k[l];
            size_t n = (size_t)(ta->rows * ta->cols);
            float *x = malloc(n * 4), *y = malloc(n * 4);
            tensor_download_f32(ta, x), tensor_download_f32(tb, y);
            double e = rel_l2(x, y, n);
            if (e > worst || e != e) worst = e;
            free(x), free(y);
        }
    return worst;
}

TEST_MPI(kv_refs_cache_is_independent_of_noise_and_timestep) {
    kv_env e;
    if (env_open(&e)) return;
    inputs a, b;
    inputs_make(&a, &e.rs, 1);
    inputs_make(&b, &e.rs, 2);
    float out[NN * C];
    flux2_kv_cache *ka = flux2_kv_new(), *kb = flux2_kv_new();
    int rc = extract(e.m, ka, &a, 0.9f, out) || extract(e.m, kb, &b, 0.3f, out);
    CHECK(!rc, "extract: %s", tp_error_msg());
    if (!rc) {
        double d = cache_diff(ka, kb);
        if (e.rank == 0) printf("# kv cache: %lld reference tokens, %d blocks; K/V change with noise and timestep: %.3g\n",
                                (long long)e.rs.R, ka->n_layers, d);
        CHECK(d < 1e-6, "reference K/V depend on the noise tokens or the timestep (rel %.3g)", d);
    }
    flux2_kv_free(ka), flux2_kv_free(kb);
    free(a.kin), free(a.kids), free(b.kin), free(b.kids);
    env_close(&e);
}

TEST_MPI(kv_refs_cached_pass_equals_fresh_extract) {
    kv_env e;
    if (env_open(&e)) return;
    inputs s0, s1;
    inputs_make(&s0, &e.rs, 3);
    inputs_make(&s1, &e.rs, 4);
    float o0[NN * C], cached[NN * C], fresh[NN * C], plain[NN * C];
    flux2_kv_cache *kv = flux2_kv_new(), *kf = flux2_kv_new();
    int rc = extract(e.m, kv, &s0, 1.0f, o0);
    /* a later step: new latents, new timestep, cached references */
    if (!rc) rc = flux2_forward_kv(e.m, FLUX2_KV_CACHED, kv, s1.x, NN, 0, s1.ids, s1.txt, LT, s1.tids, 0.7f, NULL, 0.0f, cached);
    if (!rc) rc = extract(e.m, kf, &s1, 0.7f, fresh);
    CHECK(!rc, "forward: %s", tp_error_msg());
    if (!rc) {
        double d = rel_l2(cached, fresh, NN * C);
        /* the plain pass (references as ordinary tokens after the noise) differs */
        float *xin = malloc(sizeof(float) * (size_t)(NN + e.rs.R) * C), *vall = malloc(sizeof(float) * (size_t)(NN + e.rs.R) * C);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(NN + e.rs.R) * 4);
        memcpy(xin, s1.x, sizeof s1.x), memcpy(xin + NN * C, e.rs.tokens, sizeof(float) * (size_t)e.rs.R * C);
        memcpy(ids, s1.ids, sizeof s1.ids), memcpy(ids + NN * 4, e.rs.ids, sizeof(int32_t) * (size_t)e.rs.R * 4);
        rc = flux2_forward(e.m, xin, NN + e.rs.R, ids, s1.txt, LT, s1.tids, 0.7f, NULL, vall);
        memcpy(plain, vall, sizeof plain);
        double dp = rc ? -1 : rel_l2(plain, fresh, NN * C);
        int world;
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        if (e.rank == 0) printf("# kv world %d: cached vs fresh extract %.3g; extract vs plain full pass %.3g\n", world, d, dp);
        CHECK(d < 1e-5, "cached pass differs from a fresh extract pass: %.3g", d);
        CHECK(dp > 1e-3, "the extract pass equals the plain pass (%.3g): reference modulation/attention not applied", dp);
        free(xin), free(vall), free(ids);
        /* sharded = unsharded */
        if (e.rank == 0) {
            float un[NN * C];
            flux2_kv_cache *ku = flux2_kv_new();
            CHECK(extract(e.ref, ku, &s1, 0.7f, un) == 0, "%s", tp_error_msg());
            double du = rel_l2(fresh, un, NN * C);
            CHECK(du < 1e-5, "extract at world %d vs unsharded: %.3g", world, du);
            flux2_kv_free(ku);
        }
    }
    flux2_kv_free(kv), flux2_kv_free(kf);
    free(s0.kin), free(s0.kids), free(s1.kin), free(s1.kids);
    env_close(&e);
}

typedef struct vlog { float v[8][NN * C]; int n; } vlog;
static int log_v(int step, int steps, double sec, const float *v, const float *x, float sigma, void *ctx) {
    vlog *l = ctx;
    if (step < 8) memcpy(l->v[step], v, sizeof l->v[step]);
    l->n++;
    return 0;
}

TEST_MPI(kv_refs_denoise_loop_equals_fresh_extract_each_step) {
    kv_env e;
    if (env_open(&e)) return;
    inputs in;
    inputs_make(&in, &e.rs, 5);
    float sig[5], ts[4], out[NN * C];
    schedule_flux2(NN, 4, sig, ts);
    vlog log = {0};
    denoise_params p = {.latents = in.x, .N = NN, .img_ids = in.ids, .prompt_embeds = in.txt, .L = LT,
                        .txt_ids = in.tids, .sigmas = sig, .steps = 4, .ref_tokens = e.rs.tokens, .R = e.rs.R,
                        .ref_ids = e.rs.ids, .kv_refs = 1, .on_step = log_v, .ctx = &log};
    int rc = flux2_denoise(e.m, &p, out);
    CHECK(!rc && log.n == 4, "denoise: %s", tp_error_msg());
    /* the loop written out: a fresh extract pass every step, f32 Euler */
    float x[NN * C], v[NN * C];
    memcpy(x, in.x, sizeof x);
    double worst = 0;
    for (int i = 0; i < 4 && !rc; i++) {
        memcpy(in.kin + e.rs.R * C, x, sizeof x);
        flux2_kv_cache *kv = flux2_kv_new();
        rc = extract(e.m, kv, &in, sig[i] * 1000.0f / 1000.0f, v);
        flux2_kv_free(kv);
        double d = rel_l2(log.v[i], v, NN * C);
        if (d > worst) worst = d;
        for (int j = 0; j < NN * C; j++) x[j] += (sig[i + 1] - sig[i]) * v[j];
    }
    double df = rel_l2(out, x, NN * C);
    if (e.rank == 0) printf("# kv loop: per-step velocity vs fresh extract %.3g, final latents %.3g\n", worst, df);
    CHECK(!rc && worst < 1e-5 && df < 1e-5, "KV loop vs fresh extract: velocity %.3g, latents %.3g", worst, df);
    free(in.kin), free(in.kids);
    env_close(&e);
}

/* Sequence parallelism over the world (tp 1 on every rank, --sp world):
 * the extract pass, a cached pass and the cache itself are the one-rank
 * ones byte for byte. The cache lives in the layout after the all-to-all:
 * rank r holds all R reference rows of heads [r·H/sp, (r+1)·H/sp), i.e.
 * columns [r·w, (r+1)·w) of the one-rank cache. */
static int cache_is_window(const flux2_kv_cache *sp, const flux2_kv_cache *one, int rank) {
    int same = sp->n_layers == one->n_layers && sp->R == one->R;
    for (int l = 0; same && l < sp->n_layers; l++)
        for (int kv = 0; same && kv < 2; kv++) {
            const tensor *a = kv ? sp->v[l] : sp->k[l], *b = kv ? one->v[l] : one->k[l];
            int64_t w = a->cols, n = a->rows * w;
            float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)(b->rows * b->cols));
            tensor_download_f32(a, x), tensor_download_f32(b, y);
            for (int64_t i = 0; same && i < a->rows; i++)
                same = !memcmp(x + i * w, y + i * b->cols + rank * w, sizeof(float) * (size_t)w);
            free(x), free(y);
        }
    return same;
}

TEST_MPI(kv_refs_sp_equals_one_rank) {
    kv_env e;
    if (env_open(&e)) return;
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    /* the SP model: every rank holds the whole transformer (its own comm), the world is its SP group */
    char *t = xasprintf("%s/klein-tiny/model/transformer", test_golden_dir());
    flux2_model *sp = NULL, *one = NULL;
    int rc = flux2_load(t, e.be, e.self, DT_F32, &sp, NULL) || flux2_set_sp(sp, e.c) ||
             flux2_load(t, e.be, e.self, DT_F32, &one, NULL);
    free(t);
    CHECK(!rc, "load: %s", tp_error_msg());
    inputs s0, s1;
    inputs_make(&s0, &e.rs, 6);
    inputs_make(&s1, &e.rs, 7);
    float a[2][NN * C], b[2][NN * C];
    flux2_kv_cache *ks = flux2_kv_new(), *k1 = flux2_kv_new();
    for (int i = 0; !rc && i < 2; i++) {
        flux2_model *m = i ? one : sp;
        flux2_kv_cache *kv = i ? k1 : ks;
        float (*o)[NN * C] = i ? b : a;
        rc = extract(m, kv, &s0, 0.9f, o[0]) ||
             flux2_forward_kv(m, FLUX2_KV_CACHED, kv, s1.x, NN, 0, s1.ids, s1.txt, LT, s1.tids, 0.6f, NULL, 0.0f, o[1]);
    }
    CHECK(!rc, "forward: %s", tp_error_msg());
    if (!rc) {
        int ok = !memcmp(a, b, sizeof a), win = cache_is_window(ks, k1, e.rank), all[2] = {ok, win};
        MPI_Allreduce(MPI_IN_PLACE, all, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (e.rank == 0)
            printf("# kv sp %d: %lld reference + %d noise + %d text tokens; extract and cached outputs = one rank: %s; "
                   "each rank's cache [%lld, %lld] = its heads' columns of the one-rank cache: %s (rel %.3g)\n",
                   world, (long long)e.rs.R, NN, LT, all[0] ? "yes" : "no", (long long)ks->R,
                   (long long)ks->k[0]->cols, all[1] ? "yes" : "no", rel_l2(a[1], b[1], NN * C));
        CHECK(all[0], "KV passes at sp %d differ from one rank", world);
        CHECK(all[1], "the KV cache at sp %d is not the one-rank cache's heads", world);
        CHECK(ks->k[0]->cols * world == k1->k[0]->cols, "cache width %lld at sp %d", (long long)ks->k[0]->cols, world);
    }
    flux2_kv_free(ks), flux2_kv_free(k1);
    flux2_free(sp), flux2_free(one);
    free(s0.kin), free(s0.kids), free(s1.kin), free(s1.kids);
    env_close(&e);
}
