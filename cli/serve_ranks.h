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
 * ranks of the group stop at the same step.
 *
 * The heartbeat of idle ranks (the watchdog, core/dist/watchdog.h, is off
 * while a server waits for work): world rank 0 sends a T_BEAT to every other
 * rank about every second from wherever it loops (its idle loop, and
 * serve_ranks_service between its own group's steps), and every other rank
 * sends one to world rank 0 about every second from its idle waits. A beat
 * says "my next beat comes within B seconds": SERVE_BEAT_IDLE_PROMISE_S when
 * idle; while world rank 0 renders, its own watchdog's current bound (it
 * beats only between steps and at the render's phase changes). A rank
 * checks only peers it knows to be idle: world rank 0 checks group g while
 * g has no job in flight, and group 0's other ranks while it does not render
 * itself; the others check world rank 0 while they wait for work. A peer
 * silent for serve_beat_limit() seconds (max(B + SERVE_BEAT_MARGIN_S, the
 * idle bound); the idle bound is --watchdog S, else WATCHDOG_FLOOR_S; 0:
 * no heartbeat at all) ends this rank with status 1 and a message naming
 * the peer and its node, which ends the job under srun as under mpirun, and
 * closes the port. A send is an MPI_Isend with one request per destination,
 * and a new beat goes only once the last one completed: a dead peer never
 * blocks the sender nor piles up requests. On stop every rank sends a final
 * beat (B < 0) to each peer it beats and drains until the peer's final beat
 * arrived (watched all along), so that no beat is left unmatched. */
#ifndef TPGEN_SERVE_RANKS_H
#define TPGEN_SERVE_RANKS_H
#include "serve_queue.h"
#include "core/dist/dist.h"
#include <signal.h>

#define SERVE_BEAT_PERIOD_S 1.0          /* a beat about every second from an idle wait */
#define SERVE_BEAT_IDLE_PROMISE_S 2.0    /* what an idle rank's beat promises */
#define SERVE_BEAT_MARGIN_S 5.0          /* added to a beat's promise */

/* What one rank knows of one peer's heartbeat (pure: tests/test_serve_beat.c
 * drives it with made-up clocks). */
typedef struct serve_beat_peer {
    double heard;      /* when its last beat was taken in, or when watching began */
    double promise;    /* its last beat's B: the next one within B seconds */
    int watched;       /* the peer is known to be idle: silence is checked */
    int final;         /* its final beat arrived: never checked again */
} serve_beat_peer;

/* The idle bound from --watchdog (> 0 fixed, 0 off, < 0 automatic): S, 0, or WATCHDOG_FLOOR_S. */
double serve_beat_idle_bound(double watchdog_s);
/* A beat arrived at `now` promising the next within `promise` s (< 0: the final one). */
void serve_beat_heard(serve_beat_peer *p, double now, double promise);
/* The peer is (on = 1) or is not idle; becoming watched restarts its clock at `now`. */
void serve_beat_watch(serve_beat_peer *p, double now, int on);
/* Seconds of silence allowed now: max(promise + margin, idle bound); 0 when idle_bound is 0. */
double serve_beat_limit(const serve_beat_peer *p, double idle_bound);
/* 1 when the peer is watched and silent past the limit; *silent = seconds since heard. */
int serve_beat_dead(const serve_beat_peer *p, double now, double idle_bound, double *silent);

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
    double watchdog_s;                   /* --watchdog (> 0 fixed, 0 off, < 0 automatic): the heartbeat's bound */
    MPI_Comm msg;                        /* the server's messages (a duplicate of the world) */
    /* world rank 0's state */
    serve_job **inflight;                /* per group: the job it renders, or NULL */
    int *ready;                          /* per group: waiting for a job */
    int *stopped, n_stopped;             /* per group: STOP sent */
    int *cancel_sent;                    /* per group: CANCEL sent for its job */
    int stopping;
    int busy;                            /* world rank 0: rendering its own group's job */
    /* the heartbeat (NULL when off); index: world rank (other ranks use [0], world rank 0) */
    int idle;                            /* other ranks: in an idle wait (world rank 0 is checked) */
    double idle_bound;
    serve_beat_peer *peer;
    MPI_Request *beat_req;
    double *beat_buf, *beat_at;          /* the payload in flight, when it was sent */
    int *final_want, *final_sent;
    char (*host)[64];                    /* every rank's host name */
} serve_ranks;

/* The loop of every rank; returns when the server stops (0), or -1 when a
 * message could not be decoded. Collective over the world. */
int serve_ranks_run(serve_ranks *s);
/* World rank 0, from inside a render (e.g. the step callback): dispatch
 * queued jobs to idle groups and collect finished ones. No-op elsewhere. */
void serve_ranks_service(serve_ranks *s);
/* From inside a render, after the watchdog's phase changed: world rank 0
 * beats at once with its new bound (and checks idle groups); other ranks
 * take in world rank 0's beats. No MPI collective. */
void serve_ranks_beat(serve_ranks *s);

/* At a step boundary, on a group's first rank: should the job being
 * rendered stop? 0, or the status to answer (499 client gone, 504 past
 * its deadline). World rank 0 also services the other groups here and
 * judges its own job; another group's first rank reads world rank 0's
 * CANCEL messages. Other ranks: 0 (the caller broadcasts the answer over
 * the group, so that all ranks stop at the same step). */
int serve_ranks_cancel_wanted(serve_ranks *s, const serve_job *j);

/* On a group's first rank, for a streamed job (req.stream): one of its
 * images, a partial (completed 0) or the final PNG, goes to the job's
 * stream on world rank 0 (directly there, else as a T_EVENT message,
 * which world rank 0 takes in between steps or while idle). No-op on the
 * other ranks and for jobs that do not stream. */
void serve_ranks_event(serve_ranks *s, serve_job *j, int completed, int image, const uint8_t *png, size_t n);

/* A request as bytes, for the messages (malloc'ed; *n its length), and back. */
uint8_t *serve_request_pack(const serve_request *r, uint64_t id, size_t *n);
int serve_request_unpack(const uint8_t *p, size_t n, serve_request *r, uint64_t *id);

#endif
