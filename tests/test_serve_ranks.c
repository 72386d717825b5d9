/* The ranks of `tpgen serve` under MPI (np 1: one group; np 2: two groups of
 * tp 1; np 4: two groups of tp 2): world rank 0 dispatches queued jobs to
 * the TP groups, each group gets identical requests (checked inside the
 * group), results come back to rank 0 intact and in the right job, a failing
 * job fails alone, and a stop with jobs still queued answers them 503 and
 * ends every rank's loop. The render here is the test's: image k of a
 * request is the bytes "PROMPT|SEED+k", computed on the group's first rank. */
#include "test.h"
#include "cli/serve_ranks.h"
#include "kernels/err.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t hash_req(const serve_request *r) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = r->prompt; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return h ^ (r->seed * 31 + (uint64_t)r->n * 7 + (uint64_t)r->width);
}

typedef struct { serve_ranks *s; int mismatches; int rendered; } render_ctx;

static void render(void *ctx, const serve_request *req, serve_job *out) {
    render_ctx *rc = ctx;
    const dist *d = rc->s->d;
    /* the whole group must have the same request */
    uint64_t h = hash_req(req), lo, hi;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, d->tp_comm);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, d->tp_comm);
    if (lo != hi) rc->mismatches++;
    for (int step = 0; step < 3; step++) {   /* "steps": rank 0 keeps feeding the other groups meanwhile */
        usleep(5000);
        serve_ranks_service(rc->s);
        MPI_Barrier(d->tp_comm);             /* lockstep, as the all-reduces of a forward */
    }
    rc->rendered++;
    if (d->tp_rank != 0) return;
    if (!strcmp(req->prompt, "fail")) {
        out->status = 400;
        serve_error_set(&out->err, 400, "invalid_request_error", "prompt", "this prompt fails (group %d)", d->dp_rank);
        return;
    }
    out->n_pngs = req->n;
    out->pngs = calloc((size_t)req->n, sizeof *out->pngs);
    out->png_sizes = calloc((size_t)req->n, sizeof *out->png_sizes);
    for (int k = 0; k < req->n; k++) {
        char *b = xasprintf("%s|%llu", req->prompt, (unsigned long long)(req->seed + (uint64_t)k));
        out->png_sizes[k] = strlen(b);
        out->pngs[k] = (uint8_t *)b;
    }
    out->status = 200;
    out->timing.steps = 3;
}

#define NJOBS 12
#define NLATE 6

typedef struct {
    serve_queue *q;
    volatile sig_atomic_t *stop;
    serve_job jobs[NJOBS + NLATE];
    int submitted[NJOBS + NLATE];
} submitter;

static void make_job(serve_job *j, int i) {
    memset(j, 0, sizeof *j);
    j->req.prompt = i == 5 ? strdup("fail") : xasprintf("prompt %d", i);
    j->req.n = 1 + i % 3;
    j->req.seed = (uint64_t)(100 * i);
    j->req.has_seed = 1;
}

static void *submit_main(void *p) {
    submitter *sb = p;
    serve_error e;
    for (int i = 0; i < NJOBS; i++) {
        make_job(&sb->jobs[i], i);
        sb->submitted[i] = serve_queue_submit(sb->q, &sb->jobs[i], &e) == 0;
    }
    for (int i = 0; i < NJOBS; i++)
        if (sb->submitted[i]) serve_job_wait(sb->q, &sb->jobs[i]);
    /* late jobs, then stop at once: some may still be rendered, the rest get 503 */
    for (int i = NJOBS; i < NJOBS + NLATE; i++) {
        make_job(&sb->jobs[i], i);
        sb->submitted[i] = serve_queue_submit(sb->q, &sb->jobs[i], &e) == 0;
    }
    *sb->stop = 1;
    for (int i = NJOBS; i < NJOBS + NLATE; i++)
        if (sb->submitted[i]) serve_job_wait(sb->q, &sb->jobs[i]);
    return NULL;
}

/* watchdog_s: 0 no heartbeat; > 0 the heartbeat on, with that bound (its
 * beats and final beats must leave nothing behind: the sanitized np 2 run) */
static void dispatch_results_and_stop(double watchdog_s) {
    dist d;
    REQUIRE(dist_init(NULL, NULL, &d) == 0, "%s", tp_error_msg());
    REQUIRE(dist_set_tp(&d, d.world_size >= 4 ? 2 : 1) == 0, "%s", tp_error_msg());
    serve_queue q;
    serve_queue_init(&q, 64);
    serve_metrics m;
    serve_metrics_init(&m, d.world_size);
    static volatile sig_atomic_t stop;
    stop = 0;
    serve_ranks s = {.d = &d, .queue = &q, .metrics = &m, .render = render, .stop = &stop,
                     .watchdog_s = watchdog_s};
    render_ctx rc = {.s = &s};
    s.ctx = &rc;
    submitter sb = {.q = &q, .stop = &stop};
    pthread_t t;
    if (d.world_rank == 0) pthread_create(&t, NULL, submit_main, &sb);
    int r = serve_ranks_run(&s);
    CHECK(r == 0, "serve_ranks_run: %d (%s)", r, tp_error_msg());
    CHECK(rc.mismatches == 0, "rank %d: %d jobs differed inside the group", d.world_rank, rc.mismatches);
    /* every group rendered something (dp 2: the jobs were shared) */
    int did = rc.rendered > 0, all = 0;
    MPI_Allreduce(&did, &all, 1, MPI_INT, MPI_MIN, d.world);
    CHECK(all == 1, "some group rendered no job (rank %d rendered %d)", d.world_rank, rc.rendered);
    if (d.world_rank == 0) {
        pthread_join(t, NULL);
        int ok = 0, refused = 0;
        for (int i = 0; i < NJOBS + NLATE; i++) {
            serve_job *j = &sb.jobs[i];
            CHECK(sb.submitted[i], "job %d not queued", i);
            if (!sb.submitted[i]) continue;
            if (i == 5) {
                CHECK(j->status == 400 && strstr(j->err.message, "this prompt fails") && !strcmp(j->err.param, "prompt"),
                      "the failing job: status %d '%s'", j->status, j->err.message);
            } else if (i >= NJOBS && j->status == 503) {
                refused++;
            } else {
                CHECK(j->status == 200 && j->n_pngs == j->req.n, "job %d: status %d, %d images (%s)", i, j->status,
                      j->n_pngs, j->err.message);
                for (int k = 0; k < j->n_pngs && j->status == 200; k++) {
                    char want[64];
                    snprintf(want, sizeof want, "prompt %d|%d", i, 100 * i + k);
                    CHECK(j->png_sizes[k] == strlen(want) && !memcmp(j->pngs[k], want, strlen(want)),
                          "job %d image %d: got '%.*s', want '%s'", i, k, (int)j->png_sizes[k], (char *)j->pngs[k], want);
                }
                ok++;
            }
            serve_job_free_result(j);
            serve_request_free(&j->req);
        }
        CHECK(ok + refused == NJOBS + NLATE - 1, "%d rendered + %d refused of %d", ok, refused, NJOBS + NLATE - 1);
        CHECK(ok >= NJOBS - 1, "only %d of the first jobs rendered", ok);
        CHECK(m.steps == (uint64_t)(3 * ok), "metrics: %llu steps for %d rendered jobs", (unsigned long long)m.steps, ok);
    }
    serve_queue_destroy(&q);
    dist_set_tp(&d, 0);
}

TEST_MPI(serve_ranks_dispatch_results_and_stop) { dispatch_results_and_stop(0); }
TEST_MPI(serve_ranks_dispatch_with_heartbeat) { dispatch_results_and_stop(30); }

TEST(serve_request_pack_roundtrip) {
    serve_request r = {.prompt = strdup("caf\xc3\xa9 | fox"), .negative_prompt = NULL, .precision = strdup("f32"), .rng = strdup("torch1"), .n = 3,
                       .width = 256, .height = 128, .has_seed = 1, .seed = 0xffffffffffull, .steps = 9,
                       .has_guidance = 1, .guidance = 3.25};
    size_t n = 0;
    uint8_t *p = serve_request_pack(&r, 42, &n);
    serve_request b;
    uint64_t id = 0;
    REQUIRE(p && serve_request_unpack(p, n, &b, &id) == 0, "%s", tp_error_msg());
    CHECK(id == 42 && !strcmp(b.prompt, r.prompt) && !b.negative_prompt && !strcmp(b.precision, "f32") && b.n == 3 &&
              b.width == 256 && b.height == 128 && b.has_seed && b.seed == r.seed && b.steps == 9 && b.has_guidance &&
              b.guidance == 3.25 && b.rng && !strcmp(b.rng, "torch1"),
          "fields differ after the round trip");
    serve_request_free(&b);
    CHECK(serve_request_unpack(p, n - 1, &b, &id) == -1, "a truncated message was accepted");
    free(p);
    /* with reference images (edits): bytes and names survive */
    r.n_images = 2;
    r.images = calloc(2, sizeof *r.images);
    r.image_sizes = calloc(2, sizeof *r.image_sizes);
    r.image_names = calloc(2, sizeof *r.image_names);
    for (int i = 0; i < 2; i++) {
        r.image_sizes[i] = 1000 + (size_t)i;
        r.images[i] = malloc(r.image_sizes[i]);
        for (size_t k = 0; k < r.image_sizes[i]; k++) r.images[i][k] = (uint8_t)(k * 7 + (size_t)i);
        r.image_names[i] = strdup(i ? "b.jpg" : "a.png");
    }
    p = serve_request_pack(&r, 43, &n);
    REQUIRE(p && serve_request_unpack(p, n, &b, &id) == 0, "%s", tp_error_msg());
    int same = b.n_images == 2;
    for (int i = 0; same && i < 2; i++)
        same = b.image_sizes[i] == r.image_sizes[i] && !memcmp(b.images[i], r.images[i], r.image_sizes[i]) &&
               !strcmp(b.image_names[i], r.image_names[i]);
    CHECK(id == 43 && same, "reference images differ after the round trip");
    serve_request_free(&b);
    CHECK(serve_request_unpack(p, n - 500, &b, &id) == -1, "a message cut inside an image was accepted");
    free(p);
    serve_request_free(&r);
}
