/* `tpgen serve`, the ranks: world rank 0 holds the HTTP front and the job
 * queue and dispatches jobs to the TP groups (world = dp x tp); each group's
 * first rank broadcasts its job to the group, the group renders it in
 * lockstep, and the first rank sends the PNGs back to world rank 0.
 *
 *   group leader g > 0  --READY-->  world rank 0  --JOB or STOP-->  leader
 *   leader  --bcast(JOB or STOP) on tp_comm-->  the group's other ranks
 *   leader  --RESULT (status, error, PNGs)-->  world rank 0
 *
 * World rank 0 is also group 0's leader. While it renders, the step
 * callback calls serve_ranks_service(), so the other groups are fed and
 * their results collected between steps, with only the main thread making
 * MPI calls. Idle ranks wait in non-blocking calls with short sleeps, so a
 * resident server does not spin its cores.
 *
 * Shutdown (the stop flag, set by SIGTERM/SIGINT on rank 0, or the queue
 * closed by the HTTP side as soon as it sees the flag): no new jobs are
 * taken, the queued ones are answered 503 (serve_queue_close), idle groups
 * get STOP at once (also while group 0 renders), the jobs being rendered
 * finish and are answered, then every rank leaves the loop.
 *
 * Cancelling: a job nobody waits for (client gone, --request-timeout
 * passed) is stopped at its next denoising step. World rank 0 judges its
 * own group's job and sends CANCEL to another group's leader; the leader
 * broadcasts the decision over its group at every step boundary, so all
 * ranks of the group stop at the same step. */
#ifndef TPGEN_SERVE_RANKS_H
#define TPGEN_SERVE_RANKS_H
#include "serve_queue.h"
#include "core/dist/dist.h"
#include <signal.h>

/* Render one job on every rank of the group in lockstep (same req
 * everywhere). On the group's first rank fill out->status (200 or an error
 * status with out->err) and, on success, out->pngs / png_sizes / n_pngs.
 * A failed job must not break the lockstep: agree inside the group. */
typedef void (*serve_render_fn)(void *ctx, const serve_request *req, serve_job *out);

typedef struct serve_ranks {
    dist *d;
    serve_queue *queue;                  /* world rank 0 only */
    serve_metrics *metrics;              /* world rank 0 only; may be NULL */
    serve_render_fn render;
    void *ctx;
    volatile sig_atomic_t *stop;         /* watched on world rank 0 */
    MPI_Comm msg;                        /* the server's messages (a duplicate of the world) */
    /* world rank 0's state */
    serve_job **inflight;                /* per group: the job it renders, or NULL */
    int *ready;                          /* per group: waiting for a job */
    int *stopped, n_stopped;             /* per group: STOP sent */
    int *cancel_sent;                    /* per group: CANCEL sent for its job */
    int stopping;
} serve_ranks;

/* The loop of every rank; returns when the server stops (0), or -1 when a
 * message could not be decoded. Collective over the world. */
int serve_ranks_run(serve_ranks *s);
/* World rank 0, from inside a render (e.g. the step callback): dispatch
 * queued jobs to idle groups and collect finished ones. No-op elsewhere. */
void serve_ranks_service(serve_ranks *s);

/* At a step boundary, on a group's first rank: should the job being
 * rendered stop? 0, or the status to answer (499 client gone, 504 past
 * its deadline). World rank 0 also services the other groups here and
 * judges its own job; another group's first rank reads world rank 0's
 * CANCEL messages. Other ranks: 0 (the caller broadcasts the answer over
 * the group, so that all ranks stop at the same step). */
int serve_ranks_cancel_wanted(serve_ranks *s, const serve_job *j);

/* A request as bytes, for the messages (malloc'ed; *n its length), and back. */
uint8_t *serve_request_pack(const serve_request *r, uint64_t id, size_t *n);
int serve_request_unpack(const uint8_t *p, size_t n, serve_request *r, uint64_t *id);

#endif
