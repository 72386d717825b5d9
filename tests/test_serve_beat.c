/* The heartbeat of idle serve ranks (cli/serve_ranks.h): the liveness logic
 * on made-up clocks. Every limit is recomputed here from the rule the header
 * states: max(the last beat's promise + SERVE_BEAT_MARGIN_S, the idle bound),
 * the idle bound being --watchdog S, else WATCHDOG_FLOOR_S, and 0 (off) for
 * --watchdog 0. */
#include "test.h"
#include "cli/serve_ranks.h"
#include "core/dist/watchdog.h"

static double fmax2(double a, double b) { return a > b ? a : b; }

TEST(serve_heartbeat_idle_bound_from_watchdog) {
    CHECK(serve_beat_idle_bound(10) == 10, "--watchdog 10: %g", serve_beat_idle_bound(10));
    CHECK(serve_beat_idle_bound(0) == 0, "--watchdog 0 turns it off: %g", serve_beat_idle_bound(0));
    CHECK(serve_beat_idle_bound(-1) == WATCHDOG_FLOOR_S, "automatic: the watchdog's floor, %g", serve_beat_idle_bound(-1));
}

TEST(serve_heartbeat_expiry_of_an_idle_peer) {
    double bound = 10, silent;
    serve_beat_peer p = {.heard = 0, .promise = SERVE_BEAT_IDLE_PROMISE_S};
    serve_beat_watch(&p, 100, 1);   /* becomes idle at t = 100: its clock starts there */
    CHECK(p.watched && p.heard == 100, "watch: watched %d heard %g", p.watched, p.heard);
    double limit = fmax2(SERVE_BEAT_IDLE_PROMISE_S + SERVE_BEAT_MARGIN_S, bound);
    CHECK(serve_beat_limit(&p, bound) == limit, "limit %g, want %g", serve_beat_limit(&p, bound), limit);
    CHECK(!serve_beat_dead(&p, 100 + limit - 0.1, bound, &silent), "dead before the limit");
    CHECK(serve_beat_dead(&p, 100 + limit + 0.1, bound, &silent) && fabs(silent - (limit + 0.1)) < 1e-9,
          "alive after the limit (silent %g)", silent);
    /* beats every second keep it alive for as long as they come */
    for (int t = 101; t < 200; t++) serve_beat_heard(&p, t, SERVE_BEAT_IDLE_PROMISE_S);
    CHECK(!serve_beat_dead(&p, 199 + limit - 0.1, bound, &silent), "dead while beating");
    CHECK(serve_beat_dead(&p, 199 + limit + 0.1, bound, &silent), "alive %g s after its last beat", limit + 0.1);
    /* the automatic bound: 60 s */
    double b60 = serve_beat_idle_bound(-1);
    CHECK(!serve_beat_dead(&p, 199 + b60 - 0.1, b60, &silent) && serve_beat_dead(&p, 199 + b60 + 0.1, b60, &silent),
          "automatic bound: expiry at %g s", b60);
    /* off: never */
    CHECK(serve_beat_limit(&p, 0) == 0 && !serve_beat_dead(&p, 1e9, 0, &silent), "--watchdog 0: expired");
}

TEST(serve_heartbeat_promise_extends_the_limit) {
    /* world rank 0 renders: its beats promise its watchdog's bound (here 1800 s, a decode) */
    double bound = 10, silent;
    serve_beat_peer p = {0};
    serve_beat_watch(&p, 0, 1);
    serve_beat_heard(&p, 50, 1800);
    double limit = fmax2(1800 + SERVE_BEAT_MARGIN_S, bound);
    CHECK(serve_beat_limit(&p, bound) == limit, "limit %g, want %g", serve_beat_limit(&p, bound), limit);
    CHECK(!serve_beat_dead(&p, 50 + 100, bound, &silent), "a promise of 1800 s expired after 100 s");
    CHECK(!serve_beat_dead(&p, 50 + limit - 1, bound, &silent) && serve_beat_dead(&p, 50 + limit + 1, bound, &silent),
          "expiry around %g", limit);
    /* a short promise later (back to idle) shortens it again, and the idle bound is the floor */
    serve_beat_heard(&p, 2000, 3);
    CHECK(serve_beat_limit(&p, bound) == bound, "promise 3 s: limit %g, want the idle bound %g", serve_beat_limit(&p, bound),
          bound);
    serve_beat_heard(&p, 2000, 8);
    CHECK(serve_beat_limit(&p, bound) == 8 + SERVE_BEAT_MARGIN_S, "promise 8 s: limit %g", serve_beat_limit(&p, bound));
}

TEST(serve_heartbeat_busy_peers_are_not_checked) {
    double bound = 10, silent;
    serve_beat_peer p = {.promise = SERVE_BEAT_IDLE_PROMISE_S};
    serve_beat_watch(&p, 0, 1);
    serve_beat_watch(&p, 5, 0);   /* a job dispatched to its group at t = 5 */
    CHECK(!p.watched && !serve_beat_dead(&p, 5000, bound, &silent), "a busy peer expired (silent %g)", silent);
    /* its result arrives at t = 5000: idle again, the clock restarts at 5000, not at its last beat */
    serve_beat_watch(&p, 5000, 1);
    CHECK(p.heard == 5000 && !serve_beat_dead(&p, 5000 + bound - 0.1, bound, &silent), "reset on becoming idle: heard %g",
          p.heard);
    CHECK(serve_beat_dead(&p, 5000 + bound + 0.1, bound, &silent), "not expired %g s after becoming idle", bound + 0.1);
    /* watching an already watched peer does not restart its clock */
    serve_beat_watch(&p, 5005, 1);
    CHECK(p.heard == 5000, "a second watch restarted the clock: %g", p.heard);
}

TEST(serve_heartbeat_final_beat) {
    double bound = 10, silent;
    serve_beat_peer p = {.promise = SERVE_BEAT_IDLE_PROMISE_S};
    serve_beat_watch(&p, 0, 1);
    serve_beat_heard(&p, 3, -1);   /* its final beat: it stopped cleanly */
    CHECK(p.final && !p.watched, "final: final %d watched %d", p.final, p.watched);
    serve_beat_watch(&p, 4, 1);
    CHECK(!p.watched && !serve_beat_dead(&p, 1e6, bound, &silent), "a peer that said goodbye is watched again");
}
