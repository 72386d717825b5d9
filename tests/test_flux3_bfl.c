/* FLUX.3 transformers in Black Forest Labs single-file names
 * (core/models/flux3/flux3.c's BFL binder, plans/flux3_bfl_plan.c): the golden
 * flux3-tiny models renamed by tests/tools/flux3_bfl_testdata.py (bare and
 * behind model.diffusion_model.) load on every rank with exactly the bytes
 * the diffusers-named load reads, with the config derived from the shapes
 * equal to the golden config.json, and give bitwise the outputs of the
 * diffusers-named model; FLUX.3 BFL detection. tests/sh/flux3_bfl.sh runs
 * `tpgen check` on the same files against diffusers' outputs. */
#include "test.h"
#include "flux3_case.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include "core/models/flux3/flux3.h"
#include "core/formats/checkpoint.h"
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

/* DIR/{base,flowmap}/flux3-tiny-bfl.safetensors (this rank's own copy) */
static char *make_bfl(int prefix) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char *dir = xasprintf("%s/flux3-bfl-%d-%d", test_tmp_dir(), prefix, rank);
    char *cmd = xasprintf("python3 tests/tools/flux3_bfl_testdata.py '%s/flux3-tiny' '%s' --no-verify --raw%s",
                          test_golden_dir(), dir, prefix ? " --prefix" : "");
    int rc = system(cmd);
    free(cmd);
    if (rc) { free(dir); return NULL; }
    return dir;
}

static int all_ok(int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

/* one input, deterministic, with two reference tokens */
static int forward_once(flux3_model *m, float *out) {
    const flux3_config *c = flux3_get_config(m);
    enum { N = 6, L = 3, R = 2 };
    static float x[N * 32], txt[L * 80], cond[R * 32];
    static int32_t img_ids[N * 4], txt_ids[L * 4], cond_ids[R * 4];
    if (c->in_channels != 32 || c->joint_dim != 80 || c->cond_in_channels != 32) return -1;
    for (int i = 0; i < N * 32; i++) x[i] = sinf(0.37f * (float)i);
    for (int i = 0; i < L * 80; i++) txt[i] = cosf(0.11f * (float)i);
    for (int i = 0; i < R * 32; i++) cond[i] = sinf(0.23f * (float)i + 1);
    for (int i = 0; i < N; i++) img_ids[4 * i] = 0, img_ids[4 * i + 1] = 0, img_ids[4 * i + 2] = i / 3, img_ids[4 * i + 3] = i % 3;
    for (int i = 0; i < L; i++) txt_ids[4 * i] = 0, txt_ids[4 * i + 1] = 0, txt_ids[4 * i + 2] = 0, txt_ids[4 * i + 3] = i;
    for (int i = 0; i < R; i++) cond_ids[4 * i] = 1, cond_ids[4 * i + 1] = 0, cond_ids[4 * i + 2] = 0, cond_ids[4 * i + 3] = i;
    static const float tt = 0.25f;
    flux3_inputs in = {.x = x, .N = N, .img_ids = img_ids, .txt = txt, .L = L, .txt_ids = txt_ids, .cond = cond,
                       .R = R, .cond_ids = cond_ids, .timestep = 0.625f, .target_timestep = c->flow_map ? &tt : NULL};
    return flux3_forward(m, &in, out);
}

static void same_as_diffusers(const char *variant, int prefix, dtype_t prec) {
    int tp;
    MPI_Comm g = f3_tp_group(6, &tp);
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(g, be);
    char *root = make_bfl(prefix);
    char *dir = root ? xasprintf("%s/%s", root, variant) : NULL;
    char *gold = xasprintf("%s/flux3-tiny/%s/model/transformer", test_golden_dir(), variant);
    flux3_model *mb = NULL, *md = NULL;
    load_stats sb = {0}, sd = {0};
    int rc = dir ? 0 : tp_error("tests/tools/flux3_bfl_testdata.py failed");
    if (!rc) rc = flux3_load(dir, be, c, prec, &mb, &sb);
    if (!rc) rc = flux3_load(gold, be, c, prec, &md, &sd);
    CHECK(rc == 0, "%s prefix %d: %s", variant, prefix, tp_error_msg());
    if (!all_ok(rc == 0)) goto out;
    CHECK(sb.bytes_read == sd.bytes_read && sb.bytes_replicated == sd.bytes_replicated &&
              sb.bytes_sharded == sd.bytes_sharded && sb.bytes_read > 0,
          "%s tp %d: BFL read %llu (%llu replicated, %llu sharded), diffusers %llu (%llu, %llu)", variant, tp,
          (unsigned long long)sb.bytes_read, (unsigned long long)sb.bytes_replicated,
          (unsigned long long)sb.bytes_sharded, (unsigned long long)sd.bytes_read,
          (unsigned long long)sd.bytes_replicated, (unsigned long long)sd.bytes_sharded);
    const flux3_config *a = flux3_get_config(mb), *b = flux3_get_config(md);
    CHECK(a->in_channels == b->in_channels && a->cond_in_channels == b->cond_in_channels &&
              a->num_layers == b->num_layers && a->num_single_layers == b->num_single_layers &&
              a->head_dim == b->head_dim && a->heads == b->heads && a->joint_dim == b->joint_dim &&
              a->time_channels == b->time_channels && a->mlp_ratio == b->mlp_ratio && a->n_axes == b->n_axes &&
              !memcmp(a->axes_dims, b->axes_dims, sizeof a->axes_dims) && a->rope_theta == b->rope_theta &&
              a->eps == b->eps && a->flow_map == b->flow_map && a->D == b->D && a->M == b->M,
          "%s: the config derived from the BFL shapes differs from config.json", variant);
    float ob[6 * 32], od[6 * 32];
    int r1 = forward_once(mb, ob), r2 = forward_once(md, od);
    CHECK(r1 == 0 && r2 == 0, "%s forward: %s", variant, tp_error_msg());
    int same = r1 == 0 && r2 == 0 && !memcmp(ob, od, sizeof ob), finite = 1;
    for (int i = 0; i < 6 * 32; i++) finite &= isfinite(ob[i]) && ob[i] != 0;
    CHECK(same && finite, "%s tp %d prefix %d: BFL output differs from the diffusers-named model's (%g vs %g)",
          variant, tp, prefix, ob[0], od[0]);
out:
    flux3_free(mb), flux3_free(md);
    comm_destroy(c);
    backend_destroy(be);
    MPI_Comm_free(&g);
    free(root), free(dir), free(gold);
}

TEST_MPI(flux3_bfl_base_same_as_diffusers) { same_as_diffusers("base", 0, DT_F32); }
TEST_MPI(flux3_bfl_flowmap_same_as_diffusers) { same_as_diffusers("flowmap", 0, DT_F32); }
TEST_MPI(flux3_bfl_prefixed_flowmap_bf16_same_as_diffusers) { same_as_diffusers("flowmap", 1, DT_BF16); }

/* FLUX.3 BFL detection: the bare and prefixed BFL files, not the diffusers folder */
TEST(flux3_bfl_detection) {
    for (int prefix = 0; prefix < 2; prefix++) {
        char *root = make_bfl(prefix);
        REQUIRE(root, "tests/tools/flux3_bfl_testdata.py failed");
        char *dir = xasprintf("%s/base", root);
        checkpoint *ck = NULL;
        REQUIRE(checkpoint_open(dir, &ck) == 0, "%s", tp_error_msg());
        const char *p = flux3_bfl_prefix(ck);
        CHECK(p && !*p, "prefix %d: detected as %s", prefix, p ? "BFL behind a prefix" : "not BFL");
        /* names behind model.diffusion_model. are read without it, by checkpoint_open */
        CHECK(prefix ? ck->prefix && !strcmp(ck->prefix, "model.diffusion_model.") : !ck->prefix,
              "prefix %d: checkpoint prefix %s", prefix, ck->prefix ? ck->prefix : "none");
        CHECK(ck->n_other == 0, "prefix %d: %d tensors outside the prefix", prefix, ck->n_other);
        CHECK(!checkpoint_is_bfl(ck), "a FLUX.3 BFL file taken for FLUX.2 BFL");
        CHECK(flux3_is_transformer_dir(dir), "%s not routed to FLUX.3", dir);
        checkpoint_close(ck);
        free(dir), free(root);
    }
    char *gold = xasprintf("%s/flux3-tiny/base/model/transformer", test_golden_dir());
    checkpoint *ck = NULL;
    REQUIRE(checkpoint_open(gold, &ck) == 0, "%s", tp_error_msg());
    CHECK(flux3_bfl_prefix(ck) == NULL, "the diffusers-named FLUX.3 taken for BFL");
    checkpoint_close(ck);
    free(gold);
}
