/* Block caching (core/models/block_cache.h): the --cache parser and its
 * refusals, the decision order of docs/spec/block-cache.md §3 case by case,
 * TaylorSeer's ladder (§5) against values written out by hand, and on a
 * random FLUX.2 at np 1, 2 and 3 (6 heads) whose ranks hold different
 * replicated weights: every rank records the same decisions (agreed), the
 * disagreements were resolved by computing, and the run finishes. The
 * golden comparison with cache-dit, and tp 3 on identical weights, are
 * tests/sh/cache.sh. */
#include "test.h"
#include "core/models/block_cache.h"
#include "core/pipeline.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

TEST(block_cache_spec_parse) {
    bc_spec s;
    CHECK(bc_spec_parse(NULL, &s) == 0 && !s.on, "no spec: off");
    CHECK(bc_spec_parse("off", &s) == 0 && !s.on, "off");
    CHECK(bc_spec_parse("fn=2,bn=1,warmup=3,threshold=0.12,max_continuous=2", &s) == 0 && s.on && s.fn == 2 &&
              s.bn == 1 && s.warmup == 3 && fabs(s.threshold - 0.12) < 1e-12 && s.max_continuous == 2 &&
              s.max_cached == -1 && s.taylorseer == 0 && bc_threshold(&s, BC_SINGLE) == s.threshold,
          "key=value pairs");
    CHECK(bc_spec_parse("threshold=0.06,threshold_single=0.18,taylorseer=2", &s) == 0 &&
              fabs(bc_threshold(&s, BC_SINGLE) - 0.18) < 1e-12 && fabs(bc_threshold(&s, BC_DOUBLE) - 0.06) < 1e-12 &&
              s.taylorseer == 2,
          "a single-group threshold");
    CHECK(bc_spec_parse("fast", &s) == 0 && s.taylorseer == 1 && fabs(s.threshold_single - 0.36) < 1e-12,
          "preset fast");
    CHECK(bc_spec_parse("balanced,warmup=4", &s) == 0 && s.warmup == 4 && fabs(s.threshold - 0.08) < 1e-12,
          "a preset with an override");
    char *t = bc_spec_format(&s);
    bc_spec back;
    CHECK(bc_spec_parse(t, &back) == 0 && !memcmp(&back, &s, sizeof s), "the canonical text parses back: %s", t);
    free(t);
    struct { const char *spec, *msg; } bad[] = {
        {"fn=0", "fn=0"}, {"treshold=0.1", "unknown key 'treshold'"}, {"threshold=-0.1", "threshold=-0.1"},
        {"taylorseer=3", "taylorseer=3"}, {"bn=x", "bn=x"}, {"quick", "'quick' is not key=value"},
        {"max_cached=-2", "max_cached=-2"}, {"threshold=nan", "threshold=nan"}, {"fn=1,fast", "'fast'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = bc_spec_parse(bad[i].spec, &s);
        CHECK(rc == -1 && strstr(tp_error_msg(), bad[i].msg), "'%s' refused naming it: %s", bad[i].spec, tp_error_msg());
    }
    const char *names[2] = {"double blocks", "single blocks"};
    bc_spec_parse("fn=3,bn=2", &s);
    CHECK(bc_spec_check_model(&s, 4, 5, names) == -1 && strstr(tp_error_msg(), "4 double blocks"),
          "fn + bn above the double group: %s", tp_error_msg());
    bc_spec_parse("fn=2,bn=2", &s);
    CHECK(bc_spec_check_model(&s, 4, 3, names) == -1 && strstr(tp_error_msg(), "3 single blocks"),
          "fn + bn above the single group: %s", tp_error_msg());
    CHECK(bc_spec_check_model(&s, 4, 4, names) == 0, "fn + bn equal to the count is allowed (nothing skipped)");
}

TEST(block_cache_decide_order) {
    bc_spec s;
    bc_spec_parse("fn=1,warmup=2,threshold=0.1,max_cached=3,max_continuous=2", &s);
    double code;
    bc_counts c = {.n_cached = 0, .cont = 0, .have_prev = 1, .same_shape = 1};
    CHECK(bc_decide(&s, 0.1, &c, 1, &code) == BC_COMPUTE && isnan(code), "warmup computes, no diff");
    CHECK(bc_decide(&s, 0.1, &c, 2, &code) == BC_MEASURE, "after warmup: measure");
    c.n_cached = 3;
    CHECK(bc_decide(&s, 0.1, &c, 5, &code) == BC_COMPUTE && isnan(code), "max_cached reached: compute");
    c.n_cached = 2, c.cont = 2;
    CHECK(bc_decide(&s, 0.1, &c, 5, &code) == BC_COMPUTE, "max_continuous reached: compute");
    c.cont = 1, c.have_prev = 0;
    CHECK(bc_decide(&s, 0.1, &c, 5, &code) == BC_COMPUTE && isnan(code), "no reference yet: compute");
    c.have_prev = 1, c.same_shape = 0;
    CHECK(bc_decide(&s, 0.1, &c, 5, &code) == BC_COMPUTE && code == -2, "shape changed: compute, diff -2");
    CHECK(bc_decide(&s, 1.0, &c, 5, &code) == BC_CACHE && code == -1, "threshold >= 1: cache before the shape, diff -1");
    CHECK(bc_decide(&s, 0.0, &c, 5, &code) == BC_COMPUTE, "threshold 0: compute");
    /* the ratio: mean|prev - r| / mean|prev| */
    CHECK(fabs(bc_ratio(3.0, 30.0, 6, MPI_COMM_NULL) - 0.1) < 1e-15, "ratio of the means");
}

TEST(block_cache_taylorseer_ladder) {
    /* one element; Y at computed steps 0, 1, 4, 6 (order 2): derivatives
     * only from step 3 on, so step 4's first derivative is (Y4 - Y1)/3 and
     * the second forms at step 6: ((Y6 - Y4)/2 - (Y4 - Y1)/3)/2 */
    bc_taylor t = {.k = 2, .last = -1};
    float y0 = 1.0f, y1 = 2.0f, y4 = 5.0f, y6 = 9.0f, out;
    bc_taylor_update(&t, &y0, 1, 0);
    bc_taylor_update(&t, &y1, 1, 1);
    bc_taylor_approx(&t, 3, &out);
    CHECK(t.levels == 1 && out == y1, "before step 3 the forecast is the last residual (%g)", out);
    bc_taylor_update(&t, &y4, 1, 4);
    float d1 = (y4 - y1) / 3.0f;
    bc_taylor_approx(&t, 5, &out);
    CHECK(t.levels == 2 && out == y4 + d1 * 1.0f, "order 1 at step 5: %g, want %g", out, y4 + d1);
    bc_taylor_update(&t, &y6, 1, 6);
    float e1 = (y6 - y4) / 2.0f, e2 = (e1 - d1) / 2.0f;
    bc_taylor_approx(&t, 8, &out);
    float want = (y6 + (1.0f * e1) * 2.0f) + (0.5f * e2) * 4.0f;
    CHECK(t.levels == 3 && out == want, "order 2 at step 8: %g, want %g", out, want);
    free(t.dy);
}

static int all_ok(int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

/* a random FLUX.2 with 6 heads (tp 1, 2 and 3 divide it), 2 + 3 blocks */
static flux2_config six_heads(void) {
    flux2_config c = {.patch_size = 1, .in_channels = 16, .out_channels = 16, .num_layers = 2,
                      .num_single_layers = 3, .head_dim = 16, .heads = 6, .joint_dim = 24, .time_channels = 32,
                      .mlp_ratio = 2.0, .n_axes = 4, .axes_dims = {4, 4, 4, 4}, .rope_theta = 2000, .eps = 1e-6f,
                      .guidance_embeds = 0};
    c.D = 96, c.M = 192, c.out_dim = 16;
    return c;
}

TEST_MPI(block_cache_flux2_ranks_agree) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_WORLD, be);
    flux2_config cfg = six_heads();
    flux2_model *m = NULL;
    int ok = size <= 3 && flux2_init_random(&cfg, be, c, DT_F32, 99, &m) == 0;
    if (all_ok(ok)) {
        enum { H = 4, W = 4, N = H * W, L = 5, STEPS = 12 };
        float x[N * 16], txt[L * 24], neg[L * 24], sig[STEPS + 1], out[N * 16];
        for (int i = 0; i < N * 16; i++) x[i] = sinf(0.37f * (float)i);
        for (int i = 0; i < L * 24; i++) txt[i] = cosf(0.11f * (float)i), neg[i] = 0.5f * sinf(0.05f * (float)i);
        /* small steps: a random net's residual moves little between them */
        for (int i = 0; i <= STEPS; i++) sig[i] = 1.0f - 0.002f * (float)i;
        int32_t img_ids[N * 4], txt_ids[L * 4];
        flux2_image_ids(H, W, 0, img_ids);
        flux2_text_ids(L, txt_ids);
        /* a first run measures the diffs (threshold 0.999: every one is
         * measured); the threshold of the second run
         * lies halfway between two of rank 0's diffs of the single group,
         * so that some steps cache and the decisions depend on the diffs */
        bc_spec s;
        bc_spec_parse("fn=1,bn=1,warmup=2,threshold=0.999", &s);
        bc_log log = {0};
        denoise_params p = {.latents = x, .N = N, .img_ids = img_ids, .prompt_embeds = txt, .L = L,
                            .txt_ids = txt_ids, .neg_embeds = neg, .Ln = L, .neg_txt_ids = txt_ids,
                            .cfg_scale = 3.0f, .sigmas = sig, .steps = STEPS, .cache = &s, .cache_log = &log};
        int rc = flux2_denoise(m, &p, out);
        double d[STEPS], thr = 0;
        int nd = 0;
        for (int i = 0; !rc && i < STEPS; i++)
            if (log.diff[0][1][i] > 0) d[nd++] = log.diff[0][1][i];
        for (int i = 1; i < nd; i++)   /* sort */
            for (int k = i; k > 0 && d[k] < d[k - 1]; k--) { double t = d[k]; d[k] = d[k - 1], d[k - 1] = t; }
        if (nd >= 2) thr = 0.5 * (d[nd / 2 - 1] + d[nd / 2]);
        MPI_Bcast(&thr, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        CHECK(!rc && nd >= 2 && thr > 0 && thr < 1, "a first run measured the diffs (%d, threshold %g): %s", nd, thr,
              rc ? tp_error_msg() : "");
        bc_log_free(&log);
        s.threshold = s.threshold_single = thr;
        if (!rc) rc = flux2_denoise(m, &p, out);
        CHECK(rc == 0, "denoise: %s", tp_error_msg());
        if (!rc) {
            /* the four decision strings of rank 0 against every rank's */
            char mine[4 * (STEPS + 1)], all[3][4 * (STEPS + 1)];
            snprintf(mine, sizeof mine, "%s%s%s%s", log.dec[0][0], log.dec[0][1], log.dec[1][0], log.dec[1][1]);
            MPI_Gather(mine, sizeof mine, MPI_CHAR, all, sizeof mine, MPI_CHAR, 0, MPI_COMM_WORLD);
            int same = 1;
            for (int r = 1; rank == 0 && r < size; r++) same &= !strcmp(all[r], mine);
            CHECK(same, "every rank recorded rank 0's decisions %s", mine);
            CHECK(strchr(mine, 'K') && strchr(mine, 'C'), "some steps cached, some computed: %s", mine);
            /* flux2_init_random seeds every tensor with the rank, the
             * replicated ones too, so at np > 1 the ranks' streams (and
             * diffs) differ, as they never do with loaded weights: the
             * agreement must then have made them compute together */
            if (size == 1) CHECK(log.disagreements == 0, "one rank: no disagreement (%d)", log.disagreements);
            else CHECK(log.disagreements > 0, "ranks with different streams disagreed (%d times) and stayed in "
                       "lockstep", log.disagreements);
        }
        bc_log_free(&log);
    }
    flux2_free(m);
    comm_destroy(c);
    backend_destroy(be);
}
