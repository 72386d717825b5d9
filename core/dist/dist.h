/* Distributed setup: world, tensor-parallel and data-parallel groups, the
 * node-local rank, and error agreement.
 *
 * world = dp x tp. TP groups are blocks of consecutive world ranks
 * (ranks [g*tp, (g+1)*tp) form TP group g), so with one TP group per node
 * and ranks placed by node, all-reduces stay inside a node. */
#ifndef TPGEN_DIST_H
#define TPGEN_DIST_H
#include <mpi.h>

typedef struct dist {
    int world_rank, world_size;
    int tp, tp_rank;         /* tensor-parallel degree and rank inside the group */
    int dp, dp_rank;         /* number of TP groups and this rank's group */
    int local_rank, local_size; /* rank among the processes on this node */
    MPI_Comm world, tp_comm, dp_comm, local_comm;
} dist;

/* MPI_Init (works as a single process without mpirun) and the node-local
 * rank; tp defaults to the world size. */
int dist_init(int *argc, char ***argv, dist *d);
/* Split the world into TP groups of size tp (0: whole world). Fails with a
 * clear message when tp does not divide the world size. Collective. */
int dist_set_tp(dist *d, int tp);
void dist_finalize(dist *d);

/* Error agreement, collective over `c`: every rank passes its status (0 or
 * -1 with tp_error() set). Returns 0 when every rank succeeded. Otherwise
 * returns -1 on every rank, with tp_error() set everywhere to the message of
 * the lowest failing rank, prefixed by "rank R: " (its world rank) when the
 * group has more than one rank and the message was not agreed yet. The rank
 * is kept apart from the text (tp_error_rank), so an error agreed inside a
 * TP group, with contexts added since, keeps its one prefix in front when
 * the world agrees: "rank 1: encoding the prompts: text encoder: ...". */
int dist_agree(MPI_Comm c, int status);

/* Lockstep sections (kernels/fault.h). A phase allocates its workspaces in
 * a prepare step, then calls this with the step's status: the status is
 * agreed over `c` (dist_agree), and when every rank succeeded the section
 * begins. Inside it, on a group of more than one rank, a failed backend
 * allocation ends the job at once (MPI_Abort) with "tpgen: error: rank R:
 * CAUSE, in the middle of the PHASE phase ..." on stderr, instead of
 * returning into a half-finished sequence of collectives, where the peers
 * would wait forever. On one rank (or c == MPI_COMM_NULL) the failure is
 * returned as usual. Returns the agreed status; a 0 return must be paired
 * with dist_lockstep_end. */
int dist_lockstep_begin(MPI_Comm c, int status);
void dist_lockstep_end(void);

/* MPI_Bcast of `count` elements of `type` (each `elem_size` bytes) from
 * `root`, for counts past INT_MAX (MPI 3 counts are int; the installed Open
 * MPI has no MPI-4 large-count calls): sent in pieces of at most
 * DIST_CHUNK_BYTES, the same pieces on every rank. */
#define DIST_CHUNK_BYTES ((size_t)1 << 30)
void dist_bcast_large(void *buf, size_t count, MPI_Datatype type, size_t elem_size, int root, MPI_Comm c);

/* test hook: the piece size in bytes (0: DIST_CHUNK_BYTES); the same on every rank */
void dist_set_chunk_bytes(size_t bytes);

/* Print the current error once, by rank 0 of `c`, as "tpgen: error: ..."
 * on stderr. Call after dist_agree over the same communicator. */
void dist_report_error(MPI_Comm c);

#endif
