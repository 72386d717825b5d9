/* `tpgen serve`: the bounded job queue between the HTTP threads (which
 * parse, submit and wait) and world rank 0's render loop (which takes jobs
 * and hands them to the TP groups), and the server's counters for
 * GET /metrics. Thread-safe; no MPI here. */
#ifndef TPGEN_SERVE_QUEUE_H
#define TPGEN_SERVE_QUEUE_H
#include "serve_api.h"
#include <pthread.h>
#include <stdint.h>

/* What a render took, reported with its result (GET /metrics). */
typedef struct serve_timing {
    int steps;
    double step_seconds;         /* summed over the steps */
    double encode_seconds, denoise_seconds, decode_seconds;
    int cache_hit;               /* 1 hit, 0 miss, -1 no lookup */
    int cancelled;               /* stopped at a step boundary (client gone, deadline) */
    int block_steps[2][2];       /* --cache: [double/mode, single][computed, cached] block-group steps */
} serve_timing;

struct serve_stream;

/* A job's life, one owner at a time:
 *
 *   JOB_NEW        the HTTP request's, being built (a refused one is freed by it)
 *   JOB_QUEUED     the queue's, under its lock (serve_queue_submit)
 *   JOB_RENDERING  the render loop's on world rank 0 (serve_queue_take)
 *   JOB_FINISHING  the result is final and its waiter woken; the finisher
 *                  (render loop, or the queue dropping or closing it) is
 *                  still telling on_done (serve_job_finish)
 *   JOB_DONE       handed back to the HTTP request, which answers and frees it
 *
 * The HTTP request may let go before the end (its client left, MHD stops):
 * it sets the flag JOB_RELEASED beside the state, and the job goes on to
 * JOB_DONE without anyone waiting. The two hand-overs that can race, the
 * finisher's move to JOB_DONE and the request's flag, are one atomic
 * operation each, and whoever comes second frees the job
 * (serve_job_release, serve_job_finish). No other party frees one. */
typedef enum serve_job_state {
    JOB_NEW = 0, JOB_QUEUED, JOB_RENDERING, JOB_FINISHING, JOB_DONE,
    JOB_RELEASED = 8   /* a flag: the HTTP request has let go */
} serve_job_state;
#define JOB_STATE(s) ((s) & ~JOB_RELEASED)

typedef struct serve_job {
    serve_request req;
    /* "stream": true: the events go here, on world rank 0 (serve_stream.h);
     * NULL otherwise and on the other ranks */
    struct serve_stream *stream;
    uint64_t id;                 /* set by serve_queue_submit */
    double t_submitted;
    /* the result, set by the render side before serve_job_finish */
    int status;                  /* 200, or the error's HTTP status */
    serve_error err;
    uint8_t **pngs;              /* req.n PNG files (malloc'ed each) */
    size_t *png_sizes;
    int n_pngs;
    serve_timing timing;
    _Atomic int state;           /* serve_job_state, | JOB_RELEASED: who owns it */
    /* set by the waiting side: when the job is finished (by the render
     * side, or by the queue: 503 at close, 499/504 when dropped), outside
     * the queue's lock; NULL: serve_job_wait only */
    void (*on_done)(struct serve_job *j, void *arg);
    void *on_done_arg;
    _Atomic int gone;            /* the client has gone (set by the HTTP side) */
    double deadline;             /* monotonic seconds (serve_now) after which nobody waits; 0: none */
    struct serve_job *next, *done_next;
} serve_job;

/* Monotonic seconds (CLOCK_MONOTONIC). */
double serve_now(void);
/* Is nobody waiting for this job any more (client gone, deadline passed)?
 * 0, or the status it is answered with: 499 gone, 504 past its deadline. */
int serve_job_abandoned(const serve_job *j, double now);

void serve_job_free_result(serve_job *j);
/* A malloc'ed job that never reached the queue (JOB_NEW), with everything
 * it holds (result, request, stream). */
void serve_job_free(serve_job *j);
/* Is the result final (JOB_FINISHING or later)? Any thread, no lock. */
int serve_job_finished(const serve_job *j);
/* The HTTP request lets go of a malloc'ed job it submitted (answered, or
 * its request ended): freed now if the finisher has let go, else by the
 * finisher. A job not finished yet is marked gone first. */
void serve_job_release(serve_job *j);

typedef struct serve_queue {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    serve_job *head, *tail;
    int depth, cap;
    int closing;
    uint64_t next_id;
} serve_queue;

int serve_queue_init(serve_queue *q, int cap);
void serve_queue_destroy(serve_queue *q);
/* Queue a job: 0, or -1 with e = 429 (queue full) or 503 (shutting down). */
int serve_queue_submit(serve_queue *q, serve_job *j, serve_error *e);
/* The next job, waiting up to timeout_s; NULL on time-out, or when the
 * queue is closed and empty. Abandoned jobs (serve_job_abandoned) on the
 * way are finished, never returned. */
serve_job *serve_queue_take(serve_queue *q, double timeout_s);
/* Publish a job's result (status, err / pngs filled) and wake its waiter. */
void serve_job_finish(serve_queue *q, serve_job *j);
/* Block until the job is finished. */
void serve_job_wait(serve_queue *q, serve_job *j);
/* Refuse new jobs and answer every queued one with 503; the job being
 * rendered is not touched and finishes normally. */
void serve_queue_close(serve_queue *q);
int serve_queue_closed(serve_queue *q);
/* Finish and remove every queued job nobody waits for; how many. */
int serve_queue_drop_abandoned(serve_queue *q);
int serve_queue_depth(serve_queue *q);
/* Copies (strdup) of the prompts of up to max waiting jobs, in queue order;
 * returns how many. */
int serve_queue_peek_prompts(serve_queue *q, char **out, int max);

/* Counters behind GET /metrics. */
typedef enum {
    OUT_OK = 0, OUT_BAD_REQUEST, OUT_UNAUTHORIZED, OUT_NOT_FOUND, OUT_TOO_LARGE, OUT_QUEUE_FULL, OUT_UNAVAILABLE,
    OUT_FAILED, OUT_ABANDONED, OUT_TIMEOUT, OUT_COUNT
} serve_outcome;

#define SERVE_MAX_RANKS 1024

typedef struct serve_metrics {
    pthread_mutex_t mu;
    uint64_t requests[OUT_COUNT];
    uint64_t images;
    uint64_t steps;
    double step_seconds;          /* summed over steps */
    double encode_seconds, denoise_seconds, decode_seconds, load_seconds;
    uint64_t cache_hits, cache_misses;
    uint64_t connections_refused;  /* past --max-connections: 503 and closed at accept */
    uint64_t jobs_cancelled;       /* stopped at a step boundary: client gone or deadline */
    uint64_t block_steps[2][2];    /* --cache: block-group steps [double, single][computed, cached] */
    int open_connections;
    int n_ranks;
    uint64_t resident_bytes[SERVE_MAX_RANKS];
} serve_metrics;

void serve_metrics_init(serve_metrics *m, int n_ranks);
void serve_metrics_count(serve_metrics *m, serve_outcome o);
/* Add a finished job's images and timings. */
void serve_metrics_add_job(serve_metrics *m, const serve_job *j);
/* The outcome a finished request's status counts as. */
serve_outcome serve_outcome_of(int status);
/* Prometheus text exposition format (version 0.0.4), malloc'ed. */
char *serve_metrics_text(serve_metrics *m, int queue_depth);

#endif
