/* kernels/fault.h (the phase marker, TPGEN_FAIL_ALLOC, lockstep sections)
 * and dist_lockstep_begin's agreement. The end-to-end behaviour (abort or
 * agreed failure, serve) is tests/sh/fail_alloc.sh's. */
#include "test.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "kernels/fault.h"
#include "kernels/ops.h"
#include <stdlib.h>
#include <string.h>

/* init from a value of TPGEN_FAIL_ALLOC for world rank `rank` */
static int fault_init_with(const char *value, int rank) {
    if (value) setenv("TPGEN_FAIL_ALLOC", value, 1);
    else unsetenv("TPGEN_FAIL_ALLOC");
    int rc = tp_fault_init(rank);
    unsetenv("TPGEN_FAIL_ALLOC");
    return rc;
}

TEST(fault_alloc_parse) {
    const char *bad[] = {"1", "1:2", "x:1:load", "1:0:load", "-1:1:load", "1:1:render", "1:1:load:", "1:1:Load", "1:2x:decode"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(fault_init_with(bad[i], 0) == -1, "'%s' accepted", bad[i]);
        CHECK(strstr(tp_error_msg(), "expected RANK:N:PHASE"), "'%s': message %s", bad[i], tp_error_msg());
    }
    CHECK(fault_init_with("3:2:decode", 0) == 0, "a valid value refused: %s", tp_error_msg());
    CHECK(fault_init_with(NULL, 0) == 0, "unset refused");
    CHECK(fault_init_with("", 0) == 0, "empty refused");
}

/* the N-th allocation of the phase on the rank, once; other phases and ranks untouched */
TEST(fault_alloc_fires_once) {
    const char *old = tp_phase_set("load");
    REQUIRE(fault_init_with("2:3:denoise", 2) == 0, "init: %s", tp_error_msg());
    for (int i = 0; i < 5; i++) CHECK(!tp_fault_alloc_fails(64), "fired in the load phase");
    tp_phase_set("denoise");
    int fired_at = 0, fired = 0;
    for (int i = 1; i <= 10; i++)
        if (tp_fault_alloc_fails(64)) fired++, fired_at = i;
    CHECK(fired == 1 && fired_at == 3, "fired %d times, last at %d (want once, at 3)", fired, fired_at);
    CHECK(strstr(tp_error_msg(), "out of memory allocating 64 bytes") &&
          strstr(tp_error_msg(), "allocation 3 of the denoise phase"), "message: %s", tp_error_msg());
    REQUIRE(fault_init_with("2:1:denoise", 1) == 0, "init on another rank");
    CHECK(!tp_fault_alloc_fails(64), "fired on rank 1 for rank 2");
    REQUIRE(fault_init_with(NULL, 2) == 0, "unset");
    CHECK(!tp_fault_alloc_fails(64), "fired with the variable unset");
    /* through be_alloc: NULL and the message, the backend untouched */
    backend *be = backend_cpu_create(1);
    REQUIRE(fault_init_with("0:1:denoise", 0) == 0, "init");
    size_t before = be->bytes_in_use;
    void *p = be_alloc(be, 128);
    CHECK(!p && be->bytes_in_use == before, "be_alloc did not fail");
    p = be_alloc(be, 128);
    CHECK(p != NULL, "the injection fired twice");
    be_free(be, p);
    backend_destroy(be);
    tp_phase_set(old);
    tp_error_clear();
}

static int g_calls;
static char g_cause[256];
static void record(const char *cause) {
    g_calls++;
    snprintf(g_cause, sizeof g_cause, "%s", cause);
}

/* the handler runs only inside a section, the innermost non-NULL one */
TEST(fault_lockstep_sections) {
    g_calls = 0;
    tp_error("x");
    tp_alloc_failed();
    CHECK(g_calls == 0, "handler ran outside a section");
    tp_lockstep_enter(NULL);
    tp_alloc_failed();
    CHECK(g_calls == 0, "a one-rank section called a handler");
    tp_lockstep_enter(record);
    tp_lockstep_enter(NULL);
    tp_error("the cause");
    tp_alloc_failed();
    CHECK(g_calls == 1 && !strcmp(g_cause, "the cause"), "calls %d, cause '%s'", g_calls, g_cause);
    CHECK(tp_lockstep_depth() == 3, "depth %d", tp_lockstep_depth());
    tp_lockstep_leave();
    tp_lockstep_leave();
    tp_lockstep_leave();
    tp_alloc_failed();
    CHECK(g_calls == 1 && tp_lockstep_depth() == 0, "handler after leaving: %d calls, depth %d", g_calls,
          tp_lockstep_depth());
    tp_error_clear();
}

/* dist_lockstep_begin agrees: one failing rank fails every rank, with its
 * message, and opens no section; all succeeding opens one */
TEST_MPI(fault_lockstep_agree) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int depth = tp_lockstep_depth();
    int st = rank == size - 1 ? tp_error("prepare failed here") : 0;
    int rc = dist_lockstep_begin(MPI_COMM_WORLD, st);
    CHECK(rc == -1 && tp_lockstep_depth() == depth, "rc %d, depth %d", rc, tp_lockstep_depth());
    CHECK(strstr(tp_error_msg(), "prepare failed here"), "message: %s", tp_error_msg());
    rc = dist_lockstep_begin(MPI_COMM_WORLD, 0);
    CHECK(rc == 0 && tp_lockstep_depth() == depth + 1, "rc %d, depth %d", rc, tp_lockstep_depth());
    if (!rc) dist_lockstep_end();
    CHECK(tp_lockstep_depth() == depth, "depth %d after the end", tp_lockstep_depth());
    rc = dist_lockstep_begin(MPI_COMM_NULL, 0);   /* a single rank: a section without a handler */
    CHECK(rc == 0, "MPI_COMM_NULL");
    if (!rc) dist_lockstep_end();
    tp_error_clear();
}
