/* The serve job queue and counters (serve_queue.h). */
#include "serve_queue.h"
#include "serve_stream.h"
#include <stdatomic.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double serve_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int serve_job_abandoned(const serve_job *j, double now) {
    if (j->gone) return 499;
    if (j->deadline > 0 && now > j->deadline) return 504;
    return 0;
}

/* A state change that only one party can make: anything else is a bug in
 * the server, never a client's doing, and ends it before memory is shared
 * by two owners. */
static void move(serve_job *j, serve_job_state from, serve_job_state to) {
    int cur = atomic_load(&j->state);
    do {
        if (JOB_STATE(cur) != (int)from) {
            fprintf(stderr, "tpgen: internal error: serve job %llu moved to state %d from %d, not from %d\n",
                    (unsigned long long)j->id, (int)to, JOB_STATE(cur), (int)from);
            abort();
        }
    } while (!atomic_compare_exchange_weak(&j->state, &cur, (cur & JOB_RELEASED) | (int)to));
}

int serve_job_finished(const serve_job *j) { return JOB_STATE(atomic_load(&j->state)) >= JOB_FINISHING; }

/* Under q->mu: publish j's result (the waiter may read it from now on) and
 * put it on *chain, to be told and let go after the lock (notify). */
static void finish_locked(serve_queue *q, serve_job *j, serve_job_state from, serve_job **chain) {
    move(j, from, JOB_FINISHING);
    j->next = NULL;
    j->done_next = *chain;
    *chain = j;
    (void)q;
}

/* After the queue's lock: on_done, then the finisher lets go (a request
 * that let go first left the job to be freed here). */
static void notify(serve_job *chain) {
    while (chain) {
        serve_job *next = chain->done_next;   /* read before: the job may be freed below */
        if (chain->on_done) chain->on_done(chain, chain->on_done_arg);
        /* FINISHING -> DONE in one step, the flag kept: set before, the request has gone */
        if (atomic_fetch_add(&chain->state, JOB_DONE - JOB_FINISHING) & JOB_RELEASED) serve_job_free(chain);
        chain = next;
    }
}

/* Under q->mu: unlink and finish the abandoned jobs of the queue. */
static int drop_locked(serve_queue *q, serve_job **chain) {
    double now = serve_now();
    int n = 0;
    serve_job **pp = &q->head, *prev = NULL;
    while (*pp) {
        serve_job *j = *pp;
        int st = serve_job_abandoned(j, now);
        if (!st) {
            prev = j;
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        if (q->tail == j) q->tail = prev;
        q->depth--;
        j->status = st;
        if (st == 499) serve_error_set(&j->err, 499, "invalid_request_error", NULL, "the client closed the connection");
        else serve_error_set(&j->err, 504, "server_error", NULL,
                             "the request waited in the queue past this server's --request-timeout");
        finish_locked(q, j, JOB_QUEUED, chain);
        n++;
    }
    return n;
}

void serve_job_free_result(serve_job *j) {
    for (int i = 0; i < j->n_pngs; i++) free(j->pngs[i]);
    free(j->pngs);
    free(j->png_sizes);
    j->pngs = NULL;
    j->png_sizes = NULL;
    j->n_pngs = 0;
}

void serve_job_free(serve_job *j) {
    if (!j) return;
    serve_job_free_result(j);
    serve_request_free(&j->req);
    serve_stream_free(j->stream);
    free(j);
}

void serve_job_release(serve_job *j) {
    if (!j) return;
    if (!serve_job_finished(j)) j->gone = 1;   /* nobody waits: the queue drops it, the render stops it */
    int was = atomic_fetch_or(&j->state, JOB_RELEASED);
    if (was == JOB_DONE || was == JOB_NEW) serve_job_free(j);   /* the finisher let go before (or never had it) */
}

int serve_queue_init(serve_queue *q, int cap) {
    memset(q, 0, sizeof *q);
    q->cap = cap;
    q->next_id = 1;
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->work, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&q->done, NULL);
    return 0;
}

void serve_queue_destroy(serve_queue *q) {
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->done);
}

int serve_queue_submit(serve_queue *q, serve_job *j, serve_error *e) {
    pthread_mutex_lock(&q->mu);
    int rc = 0;
    if (q->closing) {
        rc = serve_error_set(e, 503, "server_error", NULL, "the server is shutting down; retry against another instance");
    } else if (q->depth >= q->cap) {
        rc = serve_error_set(e, 429, "rate_limit_error", NULL,
                             "the queue is full (%d requests waiting); retry later", q->depth);
    } else {
        j->id = q->next_id++;
        j->t_submitted = serve_now();
        move(j, JOB_NEW, JOB_QUEUED);
        j->next = NULL;
        if (q->tail) q->tail->next = j;
        else q->head = j;
        q->tail = j;
        q->depth++;
        pthread_cond_signal(&q->work);
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

serve_job *serve_queue_take(serve_queue *q, double timeout_s) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    double s = floor(timeout_s);
    until.tv_sec += (time_t)s;
    until.tv_nsec += (long)((timeout_s - s) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    serve_job *chain = NULL;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        drop_locked(q, &chain);
        if (q->head || q->closing) break;
        if (pthread_cond_timedwait(&q->work, &q->mu, &until) == ETIMEDOUT) {
            drop_locked(q, &chain);
            break;
        }
    }
    if (chain) pthread_cond_broadcast(&q->done);
    serve_job *j = q->head;
    if (j) {
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        q->depth--;
        j->next = NULL;
        move(j, JOB_QUEUED, JOB_RENDERING);
    }
    pthread_mutex_unlock(&q->mu);
    notify(chain);
    return j;
}

void serve_job_finish(serve_queue *q, serve_job *j) {
    serve_job *chain = NULL;
    pthread_mutex_lock(&q->mu);
    finish_locked(q, j, JOB_RENDERING, &chain);
    pthread_cond_broadcast(&q->done);
    pthread_mutex_unlock(&q->mu);
    notify(chain);
}

int serve_queue_drop_abandoned(serve_queue *q) {
    serve_job *chain = NULL;
    pthread_mutex_lock(&q->mu);
    int n = drop_locked(q, &chain);
    if (n) pthread_cond_broadcast(&q->done);
    pthread_mutex_unlock(&q->mu);
    notify(chain);
    return n;
}

int serve_queue_closed(serve_queue *q) {
    pthread_mutex_lock(&q->mu);
    int c = q->closing;
    pthread_mutex_unlock(&q->mu);
    return c;
}

void serve_job_wait(serve_queue *q, serve_job *j) {
    pthread_mutex_lock(&q->mu);
    while (!serve_job_finished(j)) pthread_cond_wait(&q->done, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

void serve_queue_close(serve_queue *q) {
    serve_job *chain = NULL;
    pthread_mutex_lock(&q->mu);
    q->closing = 1;
    for (serve_job *j = q->head, *next; j; j = next) {
        next = j->next;
        j->status = 503;
        serve_error_set(&j->err, 503, "server_error", NULL,
                        "the server is shutting down; this request was queued and not rendered");
        finish_locked(q, j, JOB_QUEUED, &chain);
    }
    q->head = q->tail = NULL;
    q->depth = 0;
    pthread_cond_broadcast(&q->done);
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->mu);
    notify(chain);
}

int serve_queue_depth(serve_queue *q) {
    pthread_mutex_lock(&q->mu);
    int d = q->depth;
    pthread_mutex_unlock(&q->mu);
    return d;
}

int serve_queue_peek_prompts(serve_queue *q, char **out, int max) {
    int n = 0;
    pthread_mutex_lock(&q->mu);
    for (serve_job *j = q->head; j && n < max; j = j->next)
        if (j->req.prompt && (out[n] = strdup(j->req.prompt))) n++;
    pthread_mutex_unlock(&q->mu);
    return n;
}

/* ---- metrics ---- */

void serve_metrics_init(serve_metrics *m, int n_ranks) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->n_ranks = n_ranks < SERVE_MAX_RANKS ? n_ranks : SERVE_MAX_RANKS;
}

void serve_metrics_count(serve_metrics *m, serve_outcome o) {
    pthread_mutex_lock(&m->mu);
    m->requests[o]++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_add_job(serve_metrics *m, const serve_job *j) {
    pthread_mutex_lock(&m->mu);
    if (j->status == 200) m->images += (uint64_t)j->n_pngs;
    m->steps += (uint64_t)j->timing.steps;
    m->step_seconds += j->timing.step_seconds;
    m->encode_seconds += j->timing.encode_seconds;
    m->denoise_seconds += j->timing.denoise_seconds;
    m->decode_seconds += j->timing.decode_seconds;
    if (j->timing.cache_hit == 1) m->cache_hits++;
    if (j->timing.cache_hit == 0) m->cache_misses++;
    if (j->timing.cancelled) m->jobs_cancelled++;
    for (int g = 0; g < 2; g++)
        for (int k = 0; k < 2; k++) m->block_steps[g][k] += (uint64_t)j->timing.block_steps[g][k];
    pthread_mutex_unlock(&m->mu);
}

serve_outcome serve_outcome_of(int status) {
    switch (status) {
    case 200: return OUT_OK;
    case 400: case 405: return OUT_BAD_REQUEST;
    case 401: return OUT_UNAUTHORIZED;
    case 404: return OUT_NOT_FOUND;
    case 413: return OUT_TOO_LARGE;
    case 429: return OUT_QUEUE_FULL;
    case 501: case 503: return OUT_UNAVAILABLE;
    case 499: return OUT_ABANDONED;
    case 504: return OUT_TIMEOUT;
    default: return OUT_FAILED;
    }
}

static const char *k_outcome[OUT_COUNT] = {"ok", "bad_request", "unauthorized", "not_found", "too_large",
                                           "queue_full", "unavailable", "failed", "abandoned", "timeout"};

typedef struct { char *s; size_t n, cap; int bad; } sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) { b->bad = 1; return; }
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
        char *s = realloc(b->s, cap);
        if (!s) { b->bad = 1; return; }
        b->s = s;
        b->cap = cap;
    }
}

char *serve_metrics_text(serve_metrics *m, int queue_depth) {
    sbuf b = {0};
    pthread_mutex_lock(&m->mu);
    put(&b, "# HELP tpgen_requests_total HTTP requests answered, by outcome.\n# TYPE tpgen_requests_total counter\n");
    for (int o = 0; o < OUT_COUNT; o++)
        put(&b, "tpgen_requests_total{outcome=\"%s\"} %llu\n", k_outcome[o], (unsigned long long)m->requests[o]);
    put(&b, "# HELP tpgen_queue_depth Requests waiting to be rendered.\n# TYPE tpgen_queue_depth gauge\n"
            "tpgen_queue_depth %d\n", queue_depth);
    put(&b, "# HELP tpgen_open_connections HTTP connections open now.\n# TYPE tpgen_open_connections gauge\n"
            "tpgen_open_connections %d\n", m->open_connections);
    put(&b, "# HELP tpgen_connections_refused_total Connections refused at accept (over --max-connections).\n"
            "# TYPE tpgen_connections_refused_total counter\ntpgen_connections_refused_total %llu\n",
        (unsigned long long)m->connections_refused);
    put(&b, "# HELP tpgen_jobs_cancelled_total Renders stopped at a step boundary (client gone or deadline).\n"
            "# TYPE tpgen_jobs_cancelled_total counter\ntpgen_jobs_cancelled_total %llu\n",
        (unsigned long long)m->jobs_cancelled);
    put(&b, "# HELP tpgen_images_total Images rendered.\n# TYPE tpgen_images_total counter\ntpgen_images_total %llu\n",
        (unsigned long long)m->images);
    put(&b, "# HELP tpgen_step_seconds Seconds per denoising step.\n# TYPE tpgen_step_seconds summary\n"
            "tpgen_step_seconds_sum %.6f\ntpgen_step_seconds_count %llu\n", m->step_seconds,
        (unsigned long long)m->steps);
    put(&b, "# HELP tpgen_phase_seconds_total Seconds spent per phase, summed over requests.\n"
            "# TYPE tpgen_phase_seconds_total counter\n");
    put(&b, "tpgen_phase_seconds_total{phase=\"load\"} %.6f\n", m->load_seconds);
    put(&b, "tpgen_phase_seconds_total{phase=\"encode\"} %.6f\n", m->encode_seconds);
    put(&b, "tpgen_phase_seconds_total{phase=\"denoise\"} %.6f\n", m->denoise_seconds);
    put(&b, "tpgen_phase_seconds_total{phase=\"decode\"} %.6f\n", m->decode_seconds);
    put(&b, "# HELP tpgen_block_cache_steps_total Block-group steps with --cache / a request's cache: computed, or "
            "served from the block cache (group double: FLUX.2 double or FLUX.3 mode blocks; single: single blocks).\n"
            "# TYPE tpgen_block_cache_steps_total counter\n");
    for (int g = 0; g < 2; g++)
        for (int k = 0; k < 2; k++)
            put(&b, "tpgen_block_cache_steps_total{group=\"%s\",result=\"%s\"} %llu\n", g ? "single" : "double",
                k ? "cached" : "computed", (unsigned long long)m->block_steps[g][k]);
    uint64_t looked = m->cache_hits + m->cache_misses;
    put(&b, "# HELP tpgen_prompt_cache_lookups_total Prompt-embedding cache lookups, by result.\n"
            "# TYPE tpgen_prompt_cache_lookups_total counter\n"
            "tpgen_prompt_cache_lookups_total{result=\"hit\"} %llu\n"
            "tpgen_prompt_cache_lookups_total{result=\"miss\"} %llu\n",
        (unsigned long long)m->cache_hits, (unsigned long long)m->cache_misses);
    put(&b, "# HELP tpgen_prompt_cache_hit_ratio Share of prompt lookups served from the cache.\n"
            "# TYPE tpgen_prompt_cache_hit_ratio gauge\ntpgen_prompt_cache_hit_ratio %.6f\n",
        looked ? (double)m->cache_hits / (double)looked : 0.0);
    put(&b, "# HELP tpgen_resident_bytes Bytes of model weights resident on each rank.\n"
            "# TYPE tpgen_resident_bytes gauge\n");
    for (int r = 0; r < m->n_ranks; r++)
        put(&b, "tpgen_resident_bytes{rank=\"%d\"} %llu\n", r, (unsigned long long)m->resident_bytes[r]);
    pthread_mutex_unlock(&m->mu);
    if (b.bad) {   /* out of memory: answered 500, never a cut text */
        free(b.s);
        return NULL;
    }
    return b.s;
}
