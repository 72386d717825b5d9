/* Allocation failures that cannot be agreed, and their injection.
 *
 * The phase: the pipeline names the phase it is in ("load", "encode",
 * "denoise", "decode"); messages and the fault injection use it.
 *
 * Lockstep: between the agreement that ends a phase's prepare step and the
 * phase's closing agreement, the ranks of a group run a fixed sequence of
 * collectives. A backend allocation that fails there cannot be returned as
 * an error: the failing rank would skip collectives its peers wait in. So
 * inside a lockstep section (tp_lockstep_enter) a failed allocation calls
 * the section's handler, which does not return (core/dist ends the job with
 * MPI_Abort and a message naming the rank, the phase and the cause).
 *
 * Injection (tests): TPGEN_FAIL_ALLOC=RANK:N:PHASE makes the N-th backend
 * allocation (be_alloc) of world rank RANK during PHASE fail as an
 * out-of-memory would, once. Unset: nothing happens. */
#ifndef TPGEN_FAULT_H
#define TPGEN_FAULT_H
#include <stddef.h>

/* Set the current phase (a static string; NULL: none); returns the previous one. */
const char *tp_phase_set(const char *phase);
const char *tp_phase(void);   /* "" when none */

/* Read TPGEN_FAIL_ALLOC for world rank `world_rank`: 0, or -1 with
 * tp_error() when it is set but malformed. */
int tp_fault_init(int world_rank);

/* Called by be_alloc before each allocation: 1 when this one must fail
 * (tp_error is set to the out-of-memory message), else 0. */
int tp_fault_alloc_fails(size_t bytes);

typedef void (*tp_lockstep_fn)(const char *cause);
/* Enter / leave a lockstep section (nestable; fn may be NULL: a section of
 * one rank); inside, tp_alloc_failed() calls the innermost non-NULL fn of
 * the open sections with the current error message. */
void tp_lockstep_enter(tp_lockstep_fn fn);
void tp_lockstep_leave(void);
int tp_lockstep_depth(void);
/* Called by be_alloc when an allocation failed (tp_error set). */
void tp_alloc_failed(void);

#endif
