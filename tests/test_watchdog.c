/* The watchdog's timing logic (core/dist/watchdog.h) on made-up clocks:
 * each bound is recomputed here from the rule the header states. */
#include "test.h"
#include "core/dist/watchdog.h"

static double fmax2(double a, double b) { return a > b ? a : b; }

TEST(watchdog_automatic_bounds) {
    watchdog_state w = {.fixed_s = 0, .phase = WD_STARTUP, .last = 100};
    double silent;
    /* loading and the first step: the startup bound */
    CHECK(watchdog_bound(&w) == WATCHDOG_STARTUP_S, "startup bound %g", watchdog_bound(&w));
    CHECK(!watchdog_expired(&w, 100 + WATCHDOG_STARTUP_S - 1, &silent), "expired before the startup bound");
    CHECK(watchdog_expired(&w, 100 + WATCHDOG_STARTUP_S + 1, &silent) && silent == WATCHDOG_STARTUP_S + 1,
          "not expired after the startup bound (silent %g)", silent);
    watchdog_set_phase(&w, 200, WD_STEPS);
    CHECK(watchdog_bound(&w) == WATCHDOG_STARTUP_S && w.last == 200, "the first step keeps the startup bound");
    /* fast steps: the floor */
    watchdog_note_step(&w, 201, 0.5);
    CHECK(watchdog_bound(&w) == WATCHDOG_FLOOR_S, "floor: %g", watchdog_bound(&w));
    CHECK(!watchdog_expired(&w, 201 + WATCHDOG_FLOOR_S - 0.5, &silent), "expired inside the floor");
    CHECK(watchdog_expired(&w, 201 + WATCHDOG_FLOOR_S + 0.5, &silent), "not expired past the floor");
    /* a slow step raises the bound to 10x the slowest; a faster one later does not lower it */
    watchdog_note_step(&w, 300, 17.0);
    watchdog_note_step(&w, 301, 1.0);
    double want = fmax2(WATCHDOG_FLOOR_S, WATCHDOG_STEP_FACTOR * 17.0);
    CHECK(watchdog_bound(&w) == want, "bound %g, want %g", watchdog_bound(&w), want);
    CHECK(!watchdog_expired(&w, 301 + want - 1, &silent) && watchdog_expired(&w, 301 + want + 1, &silent),
          "expiry around %g", want);
    /* waiting for other groups: 2x the slowest job when that is larger */
    watchdog_note_job(&w, 400, 200.0);
    watchdog_set_phase(&w, 400, WD_WAIT_GROUPS);
    want = fmax2(want, WATCHDOG_JOB_FACTOR * 200.0);
    CHECK(watchdog_bound(&w) == want, "wait bound %g, want %g", watchdog_bound(&w), want);
    /* disarmed */
    watchdog_set_phase(&w, 500, WD_OFF);
    CHECK(watchdog_bound(&w) == 0 && !watchdog_expired(&w, 1e9, &silent), "WD_OFF expired");
}

TEST(watchdog_wait_without_a_job) {
    /* a group with no job yet waits for the others: the startup bound, never the step floor */
    watchdog_state w = {.fixed_s = 0, .phase = WD_WAIT_GROUPS, .last = 0, .steps_seen = 3, .slowest_step = 1};
    CHECK(watchdog_bound(&w) == WATCHDOG_STARTUP_S, "bound %g", watchdog_bound(&w));
}

TEST(watchdog_fixed_and_off) {
    watchdog_state w = {.fixed_s = 5, .phase = WD_STEPS, .last = 10};
    double silent;
    CHECK(watchdog_bound(&w) == fmax2(5, WATCHDOG_STARTUP_S), "fixed bound before the first step: %g",
          watchdog_bound(&w));
    watchdog_note_step(&w, 10, 100.0);   /* a slow step does not move a fixed bound */
    CHECK(watchdog_bound(&w) == 5, "fixed bound %g", watchdog_bound(&w));
    CHECK(!watchdog_expired(&w, 14.9, &silent) && watchdog_expired(&w, 15.1, &silent), "fixed expiry");
    watchdog_state big = {.fixed_s = 4000, .phase = WD_STARTUP};
    CHECK(watchdog_bound(&big) == 4000, "a fixed bound above the startup bound applies to loading: %g",
          watchdog_bound(&big));
    watchdog_state off = {.fixed_s = -1, .phase = WD_STEPS, .steps_seen = 1};
    CHECK(watchdog_bound(&off) == 0 && !watchdog_expired(&off, 1e12, &silent), "off");
}
