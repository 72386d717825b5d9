/* The ranks of `tpgen serve` (serve_ranks.h). */
#include "serve_ranks.h"
#include "serve_stream.h"
#include "core/dist/dist.h"
#include "core/dist/watchdog.h"
#include "kernels/err.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { T_READY = 7101, T_JOB, T_STOP, T_RESULT, T_CANCEL, T_BEAT, T_EVENT };
enum { MSG_JOB = 1, MSG_STOP = 2 };

/* ---- bytes ---- */

typedef struct { uint8_t *p; size_t n, cap; int bad; } wbuf;
typedef struct { const uint8_t *p; size_t n, at; int bad; } rbuf;

static void w_raw(wbuf *b, const void *x, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = (b->cap + n) * 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) { b->bad = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}
static void w_i64(wbuf *b, int64_t v) { w_raw(b, &v, sizeof v); }
static void w_f64(wbuf *b, double v) { w_raw(b, &v, sizeof v); }
static void w_str(wbuf *b, const char *s) {
    w_i64(b, s ? (int64_t)strlen(s) : -1);
    if (s) w_raw(b, s, strlen(s));
}
static void r_raw(rbuf *b, void *x, size_t n) {
    if (b->bad || b->n - b->at < n) { b->bad = 1; memset(x, 0, n); return; }
    memcpy(x, b->p + b->at, n);
    b->at += n;
}
static int64_t r_i64(rbuf *b) { int64_t v; r_raw(b, &v, sizeof v); return v; }
static double r_f64(rbuf *b) { double v; r_raw(b, &v, sizeof v); return v; }
static char *r_str(rbuf *b) {
    int64_t n = r_i64(b);
    if (b->bad || n < 0) return NULL;
    if ((uint64_t)n > b->n - b->at) { b->bad = 1; return NULL; }
    char *s = malloc((size_t)n + 1);
    if (!s) { b->bad = 1; return NULL; }
    r_raw(b, s, (size_t)n);
    s[n] = 0;
    return s;
}

uint8_t *serve_request_pack(const serve_request *r, uint64_t id, size_t *n) {
    wbuf b = {0};
    w_i64(&b, (int64_t)id);
    w_str(&b, r->prompt);
    w_str(&b, r->negative_prompt);
    w_str(&b, r->precision);
    w_str(&b, r->rng);
    w_str(&b, r->cache);
    int64_t ints[] = {r->n, r->width, r->height, r->has_seed, (int64_t)r->seed, r->steps, r->has_guidance,
                      r->stream, r->partial_images};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) w_i64(&b, ints[i]);
    w_f64(&b, r->guidance);
    w_i64(&b, r->n_images);
    for (int i = 0; i < r->n_images; i++) {
        w_str(&b, r->image_names[i]);
        w_i64(&b, (int64_t)r->image_sizes[i]);
        w_raw(&b, r->images[i], r->image_sizes[i]);
    }
    if (b.bad) { free(b.p); return NULL; }
    *n = b.n;
    return b.p;
}

int serve_request_unpack(const uint8_t *p, size_t n, serve_request *r, uint64_t *id) {
    rbuf b = {p, n, 0, 0};
    memset(r, 0, sizeof *r);
    *id = (uint64_t)r_i64(&b);
    r->prompt = r_str(&b);
    r->negative_prompt = r_str(&b);
    r->precision = r_str(&b);
    r->rng = r_str(&b);
    r->cache = r_str(&b);
    r->n = (int)r_i64(&b);
    r->width = (int)r_i64(&b);
    r->height = (int)r_i64(&b);
    r->has_seed = (int)r_i64(&b);
    r->seed = (uint64_t)r_i64(&b);
    r->steps = (int)r_i64(&b);
    r->has_guidance = (int)r_i64(&b);
    r->stream = (int)r_i64(&b);
    r->partial_images = (int)r_i64(&b);
    r->guidance = r_f64(&b);
    int64_t ni = r_i64(&b);
    if (!b.bad && ni >= 0 && ni <= SERVE_MAX_IMAGES) {
        r->images = calloc((size_t)ni + 1, sizeof *r->images);
        r->image_sizes = calloc((size_t)ni + 1, sizeof *r->image_sizes);
        r->image_names = calloc((size_t)ni + 1, sizeof *r->image_names);
        for (int64_t i = 0; i < ni && !b.bad && r->images && r->image_sizes && r->image_names; i++) {
            r->image_names[i] = r_str(&b);
            int64_t sz = r_i64(&b);
            if (b.bad || sz < 0 || (uint64_t)sz > b.n - b.at || !(r->images[i] = malloc((size_t)sz + 1))) {
                b.bad = 1;
                free(r->image_names[i]);
                break;
            }
            r_raw(&b, r->images[i], (size_t)sz);
            r->image_sizes[i] = (size_t)sz;
            r->n_images++;
        }
    } else {
        b.bad = 1;
    }
    if (b.bad || b.at != n || !r->prompt || r->n < 1) {
        serve_request_free(r);
        return tp_error("serve: a job message of %zu bytes could not be decoded (ranks out of step?)", n);
    }
    return 0;
}

static uint8_t *result_pack(const serve_job *j, size_t *n) {
    wbuf b = {0};
    w_i64(&b, (int64_t)j->id);
    w_i64(&b, j->status);
    w_str(&b, j->err.type);
    w_str(&b, j->err.param);
    w_str(&b, j->err.message);
    w_i64(&b, j->timing.steps);
    w_f64(&b, j->timing.step_seconds);
    w_f64(&b, j->timing.encode_seconds);
    w_f64(&b, j->timing.denoise_seconds);
    w_f64(&b, j->timing.decode_seconds);
    w_i64(&b, j->timing.cache_hit);
    w_i64(&b, j->timing.cancelled);
    for (int g = 0; g < 2; g++) w_i64(&b, j->timing.block_steps[g][0]), w_i64(&b, j->timing.block_steps[g][1]);
    w_i64(&b, j->n_pngs);
    for (int i = 0; i < j->n_pngs; i++) {
        w_i64(&b, (int64_t)j->png_sizes[i]);
        w_raw(&b, j->pngs[i], j->png_sizes[i]);
    }
    if (b.bad) { free(b.p); return NULL; }
    *n = b.n;
    return b.p;
}

static const char *k_types[] = {"invalid_request_error", "server_error", "rate_limit_error"};

static int result_unpack(const uint8_t *p, size_t n, serve_job *j) {
    rbuf b = {p, n, 0, 0};
    uint64_t id = (uint64_t)r_i64(&b);
    j->status = (int)r_i64(&b);
    char *type = r_str(&b), *param = r_str(&b), *msg = r_str(&b);
    j->err.status = j->status;
    j->err.type = "server_error";
    for (size_t i = 0; type && i < sizeof k_types / sizeof k_types[0]; i++)
        if (!strcmp(type, k_types[i])) j->err.type = k_types[i];
    snprintf(j->err.param, sizeof j->err.param, "%s", param ? param : "");
    snprintf(j->err.message, sizeof j->err.message, "%s", msg ? msg : "");
    free(type), free(param), free(msg);
    j->timing.steps = (int)r_i64(&b);
    j->timing.step_seconds = r_f64(&b);
    j->timing.encode_seconds = r_f64(&b);
    j->timing.denoise_seconds = r_f64(&b);
    j->timing.decode_seconds = r_f64(&b);
    j->timing.cache_hit = (int)r_i64(&b);
    j->timing.cancelled = (int)r_i64(&b);
    for (int g = 0; g < 2; g++)
        for (int k = 0; k < 2; k++) j->timing.block_steps[g][k] = (int)r_i64(&b);
    int64_t np = r_i64(&b);
    if (b.bad || np < 0 || np > 1024 || id != j->id) return -1;
    j->n_pngs = 0;
    j->pngs = calloc((size_t)np + 1, sizeof *j->pngs);
    j->png_sizes = calloc((size_t)np + 1, sizeof *j->png_sizes);
    if (!j->pngs || !j->png_sizes) return -1;   /* the caller frees and answers 500 */
    for (int64_t i = 0; i < np && !b.bad; i++) {
        int64_t sz = r_i64(&b);
        if (sz < 0 || (uint64_t)sz > b.n - b.at) { b.bad = 1; break; }
        if (!(j->pngs[i] = malloc((size_t)sz + 1))) { b.bad = 1; break; }
        r_raw(&b, j->pngs[i], (size_t)sz);
        j->png_sizes[i] = (size_t)sz;
        j->n_pngs++;
    }
    return b.bad || b.at != n ? -1 : 0;
}

/* ---- a streamed job's images (serve_stream.h) ---- */

/* T_EVENT: job id, completed, image, then the PNG's bytes */
enum { EVENT_HDR = 3 * sizeof(int64_t) };

static void event_deliver(serve_job *j, const uint8_t *p, size_t n) {
    int64_t h[3];
    if (n < EVENT_HDR) return;
    memcpy(h, p, sizeof h);
    if ((uint64_t)h[0] == j->id) serve_stream_image(j->stream, (int)h[1], (int)h[2], p + EVENT_HDR, n - EVENT_HDR);
}

/* ---- waiting without spinning ---- */

static void nap(void) {
    struct timespec t = {0, 2 * 1000 * 1000};
    nanosleep(&t, NULL);
}

/* ---- the heartbeat (serve_ranks.h) ---- */

static double max2(double a, double b) { return a > b ? a : b; }

double serve_beat_idle_bound(double watchdog_s) {
    return watchdog_s > 0 ? watchdog_s : watchdog_s == 0 ? 0 : WATCHDOG_FLOOR_S;
}

void serve_beat_heard(serve_beat_peer *p, double now, double promise) {
    p->heard = now;
    p->promise = promise;
    if (promise < 0) p->final = 1, p->watched = 0;
}

void serve_beat_watch(serve_beat_peer *p, double now, int on) {
    on = on && !p->final;
    if (on && !p->watched) p->heard = now;
    p->watched = on;
}

double serve_beat_limit(const serve_beat_peer *p, double idle_bound) {
    return idle_bound > 0 ? max2(p->promise + SERVE_BEAT_MARGIN_S, idle_bound) : 0;
}

int serve_beat_dead(const serve_beat_peer *p, double now, double idle_bound, double *silent) {
    *silent = now - p->heard;
    return p->watched && idle_bound > 0 && *silent > serve_beat_limit(p, idle_bound);
}

static void beat_setup(serve_ranks *s) {
    const dist *d = s->d;
    int n = d->world_size;
    s->host = xcalloc((size_t)n, sizeof *s->host);
    char me[MPI_MAX_PROCESSOR_NAME] = "";
    int len = 0;
    MPI_Get_processor_name(me, &len);
    char mine[64];
    snprintf(mine, sizeof mine, "%.63s", me);   /* a host name is cut to what the exchange carries */
    MPI_Allgather(mine, 64, MPI_CHAR, s->host, 64, MPI_CHAR, s->msg);
    s->idle_bound = serve_beat_idle_bound(s->watchdog_s);
    if (s->idle_bound <= 0 || n == 1) return;   /* no heartbeat */
    s->peer = xcalloc((size_t)n, sizeof *s->peer);
    s->beat_req = xmalloc((size_t)n * sizeof *s->beat_req);
    s->beat_buf = xcalloc((size_t)n, sizeof *s->beat_buf);
    s->beat_at = xcalloc((size_t)n, sizeof *s->beat_at);
    s->final_want = xcalloc((size_t)n, sizeof *s->final_want);
    s->final_sent = xcalloc((size_t)n, sizeof *s->final_sent);
    double now = serve_now();
    for (int r = 0; r < n; r++) {
        s->beat_req[r] = MPI_REQUEST_NULL;
        s->peer[r].heard = now;
        s->peer[r].promise = SERVE_BEAT_IDLE_PROMISE_S;
    }
}

/* the peers this rank beats and hears: all others on world rank 0, world rank 0 elsewhere */
static int beat_peer_of(const serve_ranks *s, int r) { return s->d->world_rank == 0 ? r != 0 : r == 0; }

static void beat_recv(serve_ranks *s, int src, double now) {
    double v = 0;
    MPI_Recv(&v, 1, MPI_DOUBLE, src, T_BEAT, s->msg, MPI_STATUS_IGNORE);
    if (s->peer) serve_beat_heard(&s->peer[src], now, v);
}

/* take in every beat that arrived (before any check: a peer's beats may
 * have waited while this rank was busy) */
static void beat_drain(serve_ranks *s, double now) {
    int flag;
    MPI_Status st;
    int from = s->d->world_rank == 0 ? MPI_ANY_SOURCE : 0;
    while (MPI_Iprobe(from, T_BEAT, s->msg, &flag, &st), flag) beat_recv(s, st.MPI_SOURCE, now);
}

/* a beat to r when due (a period passed, or the promise changed), and only
 * once the last one to r completed */
static void beat_send(serve_ranks *s, int r, double promise, double now) {
    if (s->final_sent[r]) return;
    if (s->beat_req[r] != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Test(&s->beat_req[r], &done, MPI_STATUS_IGNORE);
        if (!done) return;
    }
    if (s->final_want[r]) promise = -1;
    else if (now - s->beat_at[r] < SERVE_BEAT_PERIOD_S && promise == s->beat_buf[r]) return;
    s->beat_buf[r] = promise;
    s->beat_at[r] = now;
    if (promise < 0) s->final_sent[r] = 1;
    MPI_Isend(&s->beat_buf[r], 1, MPI_DOUBLE, r, T_BEAT, s->msg, &s->beat_req[r]);
}

static void beat_fire(serve_ranks *s, double now) {
    const dist *d = s->d;
    char who[512] = "";
    size_t at = 0;
    double silent_max = 0, limit = 0;
    int n_dead = 0;
    for (int r = 0; r < d->world_size; r++) {
        double silent;
        if (!beat_peer_of(s, r) || !serve_beat_dead(&s->peer[r], now, s->idle_bound, &silent)) continue;
        if (at < sizeof who - 1)
            at += (size_t)snprintf(who + at, sizeof who - at, "%s%d (node %s)", n_dead ? ", " : "", r,
                                   s->host[r][0] ? s->host[r] : "unknown");
        if (silent > silent_max) silent_max = silent, limit = serve_beat_limit(&s->peer[r], s->idle_bound);
        n_dead++;
    }
    if (!n_dead) return;
    fprintf(stderr, "tpgen: error: rank %d: no heartbeat from world rank%s %s for %.0f s while serving idle (the "
            "bound is %.0f s); did a rank die? Ending this rank so that the job ends (set --watchdog S to change the "
            "bound, 0 turns it off)\n", d->world_rank, n_dead > 1 ? "s" : "", who, silent_max, limit);
    fflush(stderr);
    _exit(1);   /* as the watchdog: no MPI call can be trusted with a dead peer; the port closes with the process */
}

/* the heartbeat's turn: take in beats, send what is due, watch the idle
 * peers, end the rank if one of them fell silent */
static void beat_tick(serve_ranks *s) {
    if (!s->peer) return;
    const dist *d = s->d;
    double now = serve_now();
    beat_drain(s, now);
    if (d->world_rank == 0) {
        double promise = SERVE_BEAT_IDLE_PROMISE_S;
        if (s->busy) promise = max2(promise, watchdog_current_bound());   /* it beats only between steps */
        for (int r = 1; r < d->world_size; r++) {
            beat_send(s, r, promise, now);
            int g = r / d->grp;
            int idle = g == 0 ? !s->busy : !s->inflight || !s->inflight[g];
            serve_beat_watch(&s->peer[r], now, idle);
        }
    } else {
        beat_send(s, 0, SERVE_BEAT_IDLE_PROMISE_S, now);
        serve_beat_watch(&s->peer[0], now, s->idle);
    }
    beat_fire(s, now);
}

/* On stop: the final beats are sent (once each peer's is wanted) and the
 * peers' final beats taken in, the peers watched meanwhile; then the last
 * sends complete (bounded: a request still pending is cancelled). */
static void beat_finish(serve_ranks *s) {
    if (!s->peer) return;
    const dist *d = s->d;
    for (;;) {
        int left = 0;
        for (int r = 0; r < d->world_size; r++)
            if (beat_peer_of(s, r) && (!s->final_sent[r] || !s->peer[r].final)) left++;
        if (!left) break;
        beat_tick(s);
        nap();
    }
    double t0 = serve_now();
    for (int r = 0; r < d->world_size; r++) {
        int done = 0;
        while (s->beat_req[r] != MPI_REQUEST_NULL) {
            MPI_Test(&s->beat_req[r], &done, MPI_STATUS_IGNORE);
            if (done) break;
            if (serve_now() - t0 > s->idle_bound) {
                MPI_Cancel(&s->beat_req[r]);
                MPI_Request_free(&s->beat_req[r]);
                break;
            }
            nap();
        }
    }
}

static void beat_free(serve_ranks *s) {
    if (s->peer)
        for (int r = 0; r < s->d->world_size; r++)
            if (s->beat_req[r] != MPI_REQUEST_NULL) {   /* an error path: the beat is abandoned */
                MPI_Cancel(&s->beat_req[r]);
                MPI_Request_free(&s->beat_req[r]);
            }
    free(s->peer), free(s->beat_req), free(s->beat_buf), free(s->beat_at), free(s->final_want), free(s->final_sent);
    free(s->host);
    s->peer = NULL, s->beat_req = NULL, s->beat_buf = s->beat_at = NULL, s->final_want = s->final_sent = NULL;
    s->host = NULL;
}

/* other ranks: entering (on = 1) or leaving an idle wait; entering restarts world rank 0's clock */
static void set_idle(serve_ranks *s, int on) {
    s->idle = on;
    if (s->peer) serve_beat_watch(&s->peer[0], serve_now(), on);
}

/* world rank 0: group g's ranks are idle (on = 1: their clocks restart) or not */
static void beat_watch_group(serve_ranks *s, int g, int on) {
    if (!s->peer) return;
    double now = serve_now();
    for (int r = g * s->d->grp; r < (g + 1) * s->d->grp; r++)
        if (r != 0) serve_beat_watch(&s->peer[r], now, on);
}

/* the final beat to every rank of group g is wanted (world rank 0, after STOP to g) */
static void beat_want_final_group(serve_ranks *s, int g) {
    if (!s->peer) return;
    for (int r = g * s->d->grp; r < (g + 1) * s->d->grp; r++)
        if (r != 0) s->final_want[r] = 1;
}

/* a request completed, with the heartbeat going on meanwhile */
static void wait_request(serve_ranks *s, MPI_Request *r) {
    int done = 0;
    for (;;) {
        MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (done) return;
        beat_tick(s);
        nap();
    }
}

void serve_ranks_beat(serve_ranks *s) {
    if (!s->peer) return;
    if (s->d->world_rank == 0) beat_tick(s);
    else beat_drain(s, serve_now());
}

/* ---- the group: leader broadcasts a job or STOP ---- */

static void group_send(serve_ranks *s, int type, const uint8_t *p, size_t n) {
    int64_t hdr[2] = {type, (int64_t)n};
    MPI_Request r;
    MPI_Ibcast(hdr, 2, MPI_INT64_T, 0, s->d->grp_comm, &r);
    wait_request(s, &r);
    if (n) dist_bcast_large((void *)p, n, MPI_BYTE, 1, 0, s->d->grp_comm);
}

static int group_recv(serve_ranks *s, uint8_t **p, size_t *n) {
    int64_t hdr[2];
    MPI_Request r;
    set_idle(s, 1);   /* waiting for work: world rank 0 is watched */
    MPI_Ibcast(hdr, 2, MPI_INT64_T, 0, s->d->grp_comm, &r);
    wait_request(s, &r);
    set_idle(s, 0);
    *n = (size_t)hdr[1];
    *p = NULL;
    if (hdr[1] > 0) {
        *p = xmalloc(*n);   /* the group's protocol cannot go on without it: a clear exit */
        dist_bcast_large(*p, *n, MPI_BYTE, 1, 0, s->d->grp_comm);
    }
    return (int)hdr[0];
}

static void render_job(serve_ranks *s, serve_job *j) {
    j->status = 500;
    serve_error_set(&j->err, 500, "server_error", NULL, "the job was not rendered");
    j->timing = (serve_timing){.cache_hit = -1};
    s->render(s->ctx, &j->req, j);
}

/* ---- world rank 0 ---- */

/* The job as a message; NULL when out of memory, the job then answered 500. */
static uint8_t *pack_or_fail(serve_ranks *s, serve_job *j, size_t *n) {
    uint8_t *p = serve_request_pack(&j->req, j->id, n);
    if (!p) {
        j->status = 500;
        serve_error_set(&j->err, 500, "server_error", NULL, "out of memory packing the job");
        serve_job_finish(s->queue, j);
    }
    return p;
}

/* One point-to-point message of n bytes, of any size (dist_bytes_of), not
 * MPI_Send: a peer that died would block it for good, so it is watched
 * while it goes out (wait_request takes the beats meanwhile). */
static void send_bytes(serve_ranks *s, const void *p, size_t n, int to, int tag) {
    dist_bytes b = dist_bytes_of(n);
    MPI_Request r;
    MPI_Isend(p, b.count, b.type, to, tag, s->msg, &r);
    wait_request(s, &r);
    dist_bytes_free(&b);
}

/* Receive the probed message st, of any size: malloc'ed (one byte more,
 * never NULL), its size in *n. */
static uint8_t *recv_bytes(serve_ranks *s, const MPI_Status *st, size_t *n) {
    *n = dist_probed_bytes(st);
    uint8_t *p = xmalloc(*n + 1);
    dist_bytes b = dist_bytes_of(*n);
    MPI_Recv(p, b.count, b.type, st->MPI_SOURCE, st->MPI_TAG, s->msg, MPI_STATUS_IGNORE);
    dist_bytes_free(&b);
    return p;
}

static int leader_of(const serve_ranks *s, int g) { return g * s->d->grp; }

/* Stopping (the stop flag, or the queue closed by the HTTP side): the
 * queue is closed (503 to the queued and to new requests), no group gets
 * another job, and each idle group gets STOP. */
static void check_stop(serve_ranks *s) {
    const dist *d = s->d;
    if (!s->stopping && (*s->stop || serve_queue_closed(s->queue))) {
        s->stopping = 1;
        serve_queue_close(s->queue);
    }
    if (!s->stopping) return;
    for (int g = 1; g < d->dp; g++)
        if (!s->stopped[g] && !s->inflight[g] && s->ready[g]) {
            MPI_Send(NULL, 0, MPI_BYTE, leader_of(s, g), T_STOP, s->msg);
            beat_want_final_group(s, g);
            s->stopped[g] = 1;
            s->n_stopped++;
        }
}

void serve_ranks_service(serve_ranks *s) {
    const dist *d = s->d;
    if (d->world_rank != 0 || !s->inflight) return;
    beat_tick(s);
    int flag;
    MPI_Status st;
    while (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, s->msg, &flag, &st), flag) {
        if (st.MPI_TAG == T_BEAT) {
            beat_recv(s, st.MPI_SOURCE, serve_now());
            continue;
        }
        int g = st.MPI_SOURCE / d->grp;
        size_t cnt = 0;
        uint8_t *buf = recv_bytes(s, &st, &cnt);
        if (st.MPI_TAG == T_READY) {
            s->ready[g] = 1;
        } else if (st.MPI_TAG == T_EVENT && s->inflight[g]) {
            event_deliver(s->inflight[g], buf, cnt);
        } else if (st.MPI_TAG == T_RESULT && s->inflight[g]) {
            serve_job *j = s->inflight[g];
            if (result_unpack(buf, cnt, j)) {
                serve_job_free_result(j);
                j->status = 500;
                serve_error_set(&j->err, 500, "server_error", NULL, "the result of TP group %d could not be decoded", g);
            }
            if (s->metrics) serve_metrics_add_job(s->metrics, j);
            s->inflight[g] = NULL;
            s->cancel_sent[g] = 0;
            beat_watch_group(s, g, 1);   /* idle again: their clocks restart */
            serve_job_finish(s->queue, j);
        }
        free(buf);
    }
    check_stop(s);
    /* a job of another group that nobody waits for: its leader stops it at its next step */
    double now = serve_now();
    for (int g = 1; g < d->dp; g++) {
        int why = s->inflight[g] && !s->cancel_sent[g] ? serve_job_abandoned(s->inflight[g], now) : 0;
        if (!why) continue;
        int64_t msg[2] = {(int64_t)s->inflight[g]->id, why};
        MPI_Send(msg, 2, MPI_INT64_T, leader_of(s, g), T_CANCEL, s->msg);
        s->cancel_sent[g] = 1;
    }
    for (int g = 1; g < d->dp && !s->stopping; g++) {
        if (!s->ready[g] || s->inflight[g]) continue;
        serve_job *j = serve_queue_take(s->queue, 0);
        if (!j) break;
        size_t n = 0;
        uint8_t *p = pack_or_fail(s, j, &n);
        if (!p) continue;
        send_bytes(s, p, n, leader_of(s, g), T_JOB);   /* the group stays watched until the job is out */
        free(p);
        s->ready[g] = 0;
        s->inflight[g] = j;
        beat_watch_group(s, g, 0);
    }
}

void serve_ranks_event(serve_ranks *s, serve_job *j, int completed, int image, const uint8_t *png, size_t n) {
    const dist *d = s->d;
    if (d->grp_rank != 0 || !j->req.stream) return;   /* the job group's first rank holds the decoded image */
    if (d->world_rank == 0) {   /* the job itself is here */
        serve_stream_image(j->stream, completed, image, png, n);
        return;
    }
    uint8_t *p = xmalloc(EVENT_HDR + n);
    int64_t h[3] = {(int64_t)j->id, completed, image};
    memcpy(p, h, sizeof h);
    memcpy(p + EVENT_HDR, png, n);
    /* MPI keeps the order of one sender's messages: the events arrive before the job's T_RESULT */
    send_bytes(s, p, EVENT_HDR + n, 0, T_EVENT);
    free(p);
}

int serve_ranks_cancel_wanted(serve_ranks *s, const serve_job *j) {
    const dist *d = s->d;
    if (d->world_rank != 0 && s->peer) beat_drain(s, serve_now());   /* world rank 0's beats, kept few */
    if (d->grp_rank != 0) return 0;
    if (d->world_rank == 0) {
        serve_ranks_service(s);   /* feed the other TP groups between steps */
        return serve_job_abandoned(j, serve_now());
    }
    int flag, why = 0;
    MPI_Status st;
    while (MPI_Iprobe(0, T_CANCEL, s->msg, &flag, &st), flag) {
        int64_t msg[2];
        MPI_Recv(msg, 2, MPI_INT64_T, 0, T_CANCEL, s->msg, MPI_STATUS_IGNORE);
        if ((uint64_t)msg[0] == j->id) why = (int)msg[1];
    }
    return why;
}

static int run_world_rank0(serve_ranks *s) {
    const dist *d = s->d;
    s->inflight = xcalloc((size_t)d->dp, sizeof *s->inflight);
    s->ready = xcalloc((size_t)d->dp, sizeof *s->ready);
    s->stopped = xcalloc((size_t)d->dp, sizeof *s->stopped);
    s->cancel_sent = xcalloc((size_t)d->dp, sizeof *s->cancel_sent);
    s->n_stopped = 1;   /* group 0 is stopped last */
    for (;;) {
        serve_ranks_service(s);
        if (s->stopping) {
            if (s->n_stopped == d->dp) break;
            nap();
            continue;
        }
        serve_job *j = serve_queue_take(s->queue, 0.005);
        if (!j) continue;
        size_t n = 0;
        uint8_t *p = pack_or_fail(s, j, &n);
        if (!p) continue;
        group_send(s, MSG_JOB, p, n);   /* group 0's ranks watched while it goes out */
        free(p);
        s->busy = 1;   /* group 0's ranks are not idle now; the beats carry the watchdog's bound */
        beat_watch_group(s, 0, 0);
        render_job(s, j);
        s->busy = 0;
        beat_watch_group(s, 0, 1);
        if (s->metrics) serve_metrics_add_job(s->metrics, j);
        serve_job_finish(s->queue, j);
    }
    group_send(s, MSG_STOP, NULL, 0);
    beat_want_final_group(s, 0);
    beat_finish(s);
    free(s->stopped);
    free(s->cancel_sent);
    free(s->inflight);
    free(s->ready);
    s->inflight = NULL;
    s->ready = NULL;
    s->stopped = s->cancel_sent = NULL;
    return 0;
}

/* ---- other ranks ---- */

static int run_group_rank(serve_ranks *s) {
    const dist *d = s->d;
    int leader = d->grp_rank == 0;
    for (;;) {
        uint8_t *p = NULL;
        size_t n = 0;
        int type;
        if (leader) {
            MPI_Send(NULL, 0, MPI_BYTE, 0, T_READY, s->msg);
            MPI_Status st;
            int flag = 0;
            set_idle(s, 1);   /* waiting for work: world rank 0 is watched */
            for (;;) {
                MPI_Iprobe(0, MPI_ANY_TAG, s->msg, &flag, &st);
                if (flag && st.MPI_TAG == T_CANCEL) {   /* for a job already finished */
                    int64_t stale[2];
                    MPI_Recv(stale, 2, MPI_INT64_T, 0, T_CANCEL, s->msg, MPI_STATUS_IGNORE);
                    continue;
                }
                if (flag && st.MPI_TAG == T_BEAT) {
                    beat_recv(s, 0, serve_now());
                    continue;
                }
                if (flag) break;
                beat_tick(s);
                nap();
            }
            set_idle(s, 0);
            p = recv_bytes(s, &st, &n);
            type = st.MPI_TAG == T_STOP ? MSG_STOP : MSG_JOB;
            group_send(s, type, p, n);
        } else {
            type = group_recv(s, &p, &n);
        }
        if (type == MSG_STOP) {
            free(p);
            if (s->peer) s->final_want[0] = 1;
            set_idle(s, 1);   /* leaving: world rank 0 watched until its final beat */
            beat_finish(s);
            return 0;
        }
        serve_job j = {0};
        int rc = serve_request_unpack(p, n, &j.req, &j.id);
        free(p);
        if (rc) return -1;   /* every rank of the group got the same bytes: all fail alike */
        render_job(s, &j);
        if (leader && d->world_rank != 0) {
            uint8_t *r = result_pack(&j, &n);
            if (!r) {   /* still answer, so that rank 0 never waits forever */
                serve_job_free_result(&j);
                j.status = 500;
                serve_error_set(&j.err, 500, "server_error", NULL, "out of memory sending the result");
                r = result_pack(&j, &n);
            }
            set_idle(s, 1);   /* a dead world rank 0 is seen while the result goes out */
            send_bytes(s, r, r ? n : 0, 0, T_RESULT);
            set_idle(s, 0);
            free(r);
        }
        serve_job_free_result(&j);
        serve_request_free(&j.req);
    }
}

int serve_ranks_run(serve_ranks *s) {
    MPI_Comm_dup(s->d->world, &s->msg);
    beat_setup(s);
    int rc = s->d->world_rank == 0 ? run_world_rank0(s) : run_group_rank(s);
    beat_free(s);
    MPI_Comm_free(&s->msg);
    return rc;
}
