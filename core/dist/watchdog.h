/* A per-rank watchdog for peers that die or fall silent.
 *
 * A rank blocked in a collective whose peer is gone may never return: under
 * srun with one task per node nothing kills it (Slurm's PMIx error handler
 * needs another local task, KillOnBadExit is off by default, and Open MPI's
 * TCP transport never fails the pending send). So every rank runs a thread
 * that watches the time since the last progress point (a denoising step, a
 * phase boundary: encode, load, a job). When it exceeds the bound, the rank
 * prints
 *
 *   tpgen: error: rank R: no progress in job group G (world ranks A-B) for N s while W;
 *   did a rank die? ...
 *
 * and exits with status 1, which ends the job under any launcher (mpirun
 * kills the others, srun sees the step's tasks end).
 *
 * The bound follows what the run has measured: 10x the slowest step so far
 * (and 2x the slowest whole job while waiting for other data-parallel
 * groups), at least 60 s; loading and the first step get their own
 * generous bound (1800 s). --watchdog S (run-spec key `watchdog`) fixes the
 * bound to S seconds (the startup bound becomes max(S, 1800)); 0 turns the
 * watchdog off. Idle waits that are not progress (a server rank waiting for
 * work) disarm it. */
#ifndef TPGEN_WATCHDOG_H
#define TPGEN_WATCHDOG_H

#define WATCHDOG_FLOOR_S 60.0
#define WATCHDOG_STARTUP_S 1800.0
#define WATCHDOG_STEP_FACTOR 10.0
#define WATCHDOG_JOB_FACTOR 2.0

typedef enum {
    WD_OFF = 0,       /* disarmed: idle waits */
    WD_STARTUP,       /* encode, load, the first step of a run */
    WD_STEPS,         /* denoising: steps come every step time */
    WD_WAIT_GROUPS,   /* waiting for the other data-parallel groups to finish their jobs */
} watchdog_phase;

/* The timing logic, pure (tests/test_watchdog.c drives it with made-up
 * clocks). */
typedef struct watchdog_state {
    double fixed_s;          /* > 0: the user's bound; 0: automatic; < 0: off */
    double slowest_step, slowest_job;
    double last;             /* time of the last progress point */
    int steps_seen;
    watchdog_phase phase;
} watchdog_state;

/* The bound of the current phase in seconds (0 when disarmed). */
double watchdog_bound(const watchdog_state *w);
/* 1 when `now` is past the bound; *silent = seconds since the last progress. */
int watchdog_expired(const watchdog_state *w, double now, double *silent);
void watchdog_note_step(watchdog_state *w, double now, double step_seconds);
void watchdog_note_job(watchdog_state *w, double now, double job_seconds);
void watchdog_set_phase(watchdog_state *w, double now, watchdog_phase ph);

/* ---- the process's watchdog (a thread) ---- */

/* Start the thread for this rank (world rank, its TP group and the group's
 * first world rank and size, for the message). seconds: --watchdog: > 0 a
 * fixed bound, 0 off, < 0 automatic. Idempotent; watchdog_stop joins it. */
void watchdog_start(int world_rank, int tp_group, int group_first, int group_size, double seconds);
void watchdog_stop(void);
/* Progress points. `what` says what the rank does until the next one
 * (kept by pointer: a string literal). */
void watchdog_phase_set(watchdog_phase ph, const char *what);
void watchdog_step(double step_seconds);
void watchdog_job(double job_seconds);
/* The bound of the process's watchdog in its current phase, in seconds (0:
 * disarmed or off). cli/serve_ranks.c sends it in world rank 0's heartbeat
 * while it renders. */
double watchdog_current_bound(void);

#endif
