/* The phase marker, the lockstep sections and TPGEN_FAIL_ALLOC (fault.h). */
#include "fault.h"
#include "err.h"
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_phase;

const char *tp_phase_set(const char *phase) {
    const char *old = g_phase;
    g_phase = phase;
    return old;
}
const char *tp_phase(void) { return g_phase ? g_phase : ""; }

/* ---- injection ---- */

static const char *const k_phases[] = {"load", "encode", "denoise", "decode"};
/* the count is atomic: the loader's reader threads may allocate; exactly
 * the allocation that makes it N fails */
static struct { int armed; long n; char phase[16]; } g_fail;
static _Atomic long g_seen;

int tp_fault_init(int world_rank) {
    memset(&g_fail, 0, sizeof g_fail);
    atomic_store(&g_seen, 0);
    const char *e = getenv("TPGEN_FAIL_ALLOC");
    if (!e || !*e) return 0;
    int rank = -1, used = 0;
    long n = 0;
    char phase[16] = "";
    int ok = sscanf(e, "%d:%ld:%15[a-z]%n", &rank, &n, phase, &used) == 3 && !e[used] && rank >= 0 && n >= 1;
    int known = 0;
    for (size_t i = 0; ok && i < sizeof k_phases / sizeof k_phases[0]; i++) known |= !strcmp(phase, k_phases[i]);
    if (!ok || !known)
        return tp_error("TPGEN_FAIL_ALLOC=%s: expected RANK:N:PHASE (world rank >= 0, N >= 1, PHASE one of load, "
                        "encode, denoise, decode), e.g. 1:3:denoise; unset it for a normal run", e);
    if (rank != world_rank) return 0;
    g_fail.armed = 1;
    g_fail.n = n;
    memcpy(g_fail.phase, phase, sizeof phase);
    return 0;
}

int tp_fault_alloc_fails(size_t bytes) {
    if (!g_fail.armed || !g_phase || strcmp(g_phase, g_fail.phase) || atomic_fetch_add(&g_seen, 1) + 1 != g_fail.n)
        return 0;   /* fires once: later allocations count past N */
    tp_error("out of memory allocating %zu bytes (injected by TPGEN_FAIL_ALLOC: allocation %ld of the %s phase)",
             bytes, g_fail.n, g_fail.phase);
    return 1;
}

/* ---- lockstep ---- */

/* a stack, so that a section on one rank (no handler) may sit inside or
 * around one on a group */
#define LOCKSTEP_MAX 8
static int g_depth;
static tp_lockstep_fn g_fn[LOCKSTEP_MAX];

void tp_lockstep_enter(tp_lockstep_fn fn) {
    if (g_depth >= LOCKSTEP_MAX) tp_fatal("lockstep sections nested deeper than %d", LOCKSTEP_MAX);
    g_fn[g_depth++] = fn;
}
void tp_lockstep_leave(void) {
    if (g_depth <= 0) tp_fatal("lockstep section left more often than entered");
    g_fn[--g_depth] = NULL;
}
int tp_lockstep_depth(void) { return g_depth; }

void tp_alloc_failed(void) {
    for (int i = g_depth - 1; i >= 0; i--)
        if (g_fn[i]) g_fn[i](tp_error_msg());
}
