/* Distributed setup: the parallel mesh (data-parallel groups, each a job
 * group of CFG halves x sequence-parallel positions x TP ranks), the
 * node-local rank, and error agreement.
 *
 * world = dp x cfg x sp x tp, tp innermost:
 *   world_rank = ((dp_rank * cfg + cfg_rank) * sp + sp_rank) * tp + tp_rank
 * A job group (grp = cfg*sp*tp ranks, grp_comm) renders one job at a time;
 * groups are blocks of consecutive world ranks, and so are TP groups, so
 * with ranks placed by node (mpirun --map-by node:PE=.. or ppr:N:node) the
 * TP all-reduces stay inside a node while the SP all-to-alls and the CFG
 * exchange cross nodes. With cfg = sp = 1 the job group is the TP group. */
#ifndef TPGEN_DIST_H
#define TPGEN_DIST_H
#include <mpi.h>

typedef struct dist {
    int world_rank, world_size;
    int tp, tp_rank;         /* tensor-parallel degree and rank inside the TP group */
    int sp, sp_rank;         /* Ulysses sequence-parallel degree and position */
    int cfg, cfg_rank;       /* 2 with CFG parallelism (half 0: conditional, 1: unconditional), else 1 */
    int grp, grp_rank;       /* the job group: cfg*sp*tp ranks, and this rank in it */
    int dp, dp_rank;         /* number of job groups and this rank's group */
    int local_rank, local_size; /* rank among the processes on this node */
    MPI_Comm world, tp_comm, sp_comm, cfg_comm, grp_comm, dp_comm, local_comm;
} dist;

/* The sub-groups of one job group (the mesh inside it), split from the
 * group's communicator: tp (the ranks of one TP group), sp (the SP
 * positions of one TP rank and CFG half), cfg (the two halves' ranks of
 * one position; MPI_COMM_NULL without CFG parallelism). */
typedef struct dist_mesh {
    int tp, sp, cfg;
    int tp_rank, sp_rank, cfg_rank;
    MPI_Comm tp_comm, sp_comm, cfg_comm;
} dist_mesh;
/* Collective over `group` (whose size must be cfg*sp*tp). */
void dist_mesh_split(MPI_Comm group, int tp, int sp, int cfg, dist_mesh *m);
void dist_mesh_free(dist_mesh *m);
/* The degrees of a mesh over `world` ranks: tp 0 takes what is left of the
 * world (world / (cfg*sp)). -1 + tp_error naming the degrees that would
 * work when the mesh does not divide the world, or cfg is not 1 or 2. */
int dist_mesh_degrees(int world, int *tp, int sp, int cfg);

/* MPI_Init (works as a single process without mpirun) and the node-local
 * rank; tp defaults to the world size. */
int dist_init(int *argc, char ***argv, dist *d);
/* Split the world into TP groups of size tp (0: whole world). Fails with a
 * clear message when tp does not divide the world size. Collective. */
int dist_set_tp(dist *d, int tp);
/* The whole mesh: job groups of cfg (1 or 2) x sp x tp ranks (tp 0: the
 * world / (cfg*sp)), the rest data parallel. Fails on every rank with a
 * clear message when the world size is not a multiple. Collective. */
int dist_set_mesh(dist *d, int tp, int sp, int cfg);
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

/* n bytes as the (count, type) of one point-to-point message: (n,
 * MPI_BYTE) while n is at most a piece (DIST_CHUNK_BYTES, or the test
 * hook's), else (1, a committed type of whole pieces and the rest), which
 * dist_bytes_free releases. Both forms have the signature "n bytes", so
 * either matches the other's receive. */
typedef struct dist_bytes {
    int count;
    MPI_Datatype type;
} dist_bytes;
dist_bytes dist_bytes_of(size_t n);
void dist_bytes_free(dist_bytes *b);
/* The bytes of a probed message, past INT_MAX too (MPI_Get_elements_x). */
size_t dist_probed_bytes(const MPI_Status *st);

/* test hook: the piece size in bytes (0: DIST_CHUNK_BYTES); the same on every rank */
void dist_set_chunk_bytes(size_t bytes);

/* Print the current error once, by rank 0 of `c`, as "tpgen: error: ..."
 * on stderr. Call after dist_agree over the same communicator. */
void dist_report_error(MPI_Comm c);

#endif
