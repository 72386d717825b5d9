/* The watchdog (watchdog.h): pure timing logic, and one thread per rank. */
#include "watchdog.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double max2(double a, double b) { return a > b ? a : b; }

double watchdog_bound(const watchdog_state *w) {
    if (w->fixed_s < 0 || w->phase == WD_OFF) return 0;
    double startup = max2(w->fixed_s, WATCHDOG_STARTUP_S);
    if (w->phase == WD_STARTUP || (w->phase == WD_STEPS && w->steps_seen == 0)) return startup;
    if (w->fixed_s > 0) return w->fixed_s;
    double b = max2(WATCHDOG_FLOOR_S, WATCHDOG_STEP_FACTOR * w->slowest_step);
    if (w->phase == WD_WAIT_GROUPS) {
        /* the other groups may still have a whole job to run: without one
         * measured yet, the startup bound */
        b = w->slowest_job > 0 ? max2(b, WATCHDOG_JOB_FACTOR * w->slowest_job) : startup;
    }
    return b;
}

int watchdog_expired(const watchdog_state *w, double now, double *silent) {
    double b = watchdog_bound(w);
    *silent = now - w->last;
    return b > 0 && *silent > b;
}

void watchdog_note_step(watchdog_state *w, double now, double step_seconds) {
    if (step_seconds > w->slowest_step) w->slowest_step = step_seconds;
    w->steps_seen++;
    w->last = now;
}

void watchdog_note_job(watchdog_state *w, double now, double job_seconds) {
    if (job_seconds > w->slowest_job) w->slowest_job = job_seconds;
    w->last = now;
}

void watchdog_set_phase(watchdog_state *w, double now, watchdog_phase ph) {
    w->phase = ph;
    w->last = now;
}

/* ---- the thread ---- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wake = PTHREAD_COND_INITIALIZER;
static pthread_t g_thread;
static int g_running, g_stop;
static watchdog_state g_w;
static const char *g_what = "starting";
static int g_rank, g_group, g_first, g_size;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fire(double silent, double bound) {
    char peers[64];
    if (g_size > 1) snprintf(peers, sizeof peers, "world ranks %d-%d", g_first, g_first + g_size - 1);
    else snprintf(peers, sizeof peers, "world rank %d", g_first);
    fprintf(stderr, "tpgen: error: rank %d: no progress in job group %d (%s) for %.0f s while %s (the "
            "bound is %.0f s); did a rank die or a link go down? Ending this rank so that the job ends (--watchdog S "
            "sets the bound, 0 turns it off)\n", g_rank, g_group, peers, silent, g_what, bound);
    fflush(stderr);
    _exit(1);   /* no MPI call from this thread (MPI_THREAD_FUNNELED), no atexit handlers */
}

static void *watch(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_lock);
    while (!g_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&g_wake, &g_lock, &ts);
        double silent;
        if (!g_stop && watchdog_expired(&g_w, now_s(), &silent)) fire(silent, watchdog_bound(&g_w));
    }
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

void watchdog_start(int world_rank, int tp_group, int group_first, int group_size, double seconds) {
    pthread_mutex_lock(&g_lock);
    int start = !g_running && seconds != 0;
    if (!g_running) {
        g_rank = world_rank, g_group = tp_group, g_first = group_first, g_size = group_size;
        memset(&g_w, 0, sizeof g_w);
        g_w.fixed_s = seconds > 0 ? seconds : seconds == 0 ? -1 : 0;   /* the state's convention */
        g_w.phase = WD_STARTUP;
        g_w.last = now_s();
        g_what = "starting";
        g_stop = 0;
    }
    if (start && pthread_create(&g_thread, NULL, watch, NULL) == 0) g_running = 1;
    pthread_mutex_unlock(&g_lock);
}

void watchdog_stop(void) {
    pthread_mutex_lock(&g_lock);
    int running = g_running;
    g_stop = 1;
    g_running = 0;
    pthread_cond_signal(&g_wake);
    pthread_mutex_unlock(&g_lock);
    if (running) pthread_join(g_thread, NULL);
}

void watchdog_phase_set(watchdog_phase ph, const char *what) {
    pthread_mutex_lock(&g_lock);
    watchdog_set_phase(&g_w, now_s(), ph);
    if (what) g_what = what;
    pthread_mutex_unlock(&g_lock);
}

void watchdog_step(double step_seconds) {
    pthread_mutex_lock(&g_lock);
    watchdog_note_step(&g_w, now_s(), step_seconds);
    pthread_mutex_unlock(&g_lock);
}

void watchdog_job(double job_seconds) {
    pthread_mutex_lock(&g_lock);
    watchdog_note_job(&g_w, now_s(), job_seconds);
    pthread_mutex_unlock(&g_lock);
}

double watchdog_current_bound(void) {
    pthread_mutex_lock(&g_lock);
    double b = watchdog_bound(&g_w);
    pthread_mutex_unlock(&g_lock);
    return b;
}
