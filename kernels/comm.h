/* Communicator: the collectives the TP forward needs, with MPI behind it on
 * CPU ranks and NCCL on GPUs. Tensors passed in live on the communicator's
 * backend and must be contiguous. */
#ifndef TPGEN_COMM_H
#define TPGEN_COMM_H
#include "tensor.h"
#include <mpi.h>
#include <stddef.h>

struct backend;
typedef struct comm comm;

typedef struct comm_vtable {
    const char *name;
    /* in-place sum over the group; bf16 is summed pairwise in fp32 and
     * rounded to bf16 after each addition (as NCCL does) */
    int (*allreduce_sum)(comm *, tensor *t);
    int (*bcast)(comm *, tensor *t, int root);
    void (*destroy)(comm *);
    /* in place: t holds size equal parts, rank r's own in part r on entry,
     * every part on return */
    int (*allgather)(comm *, tensor *t);
    /* in holds size equal parts: part j goes to rank j; out (same size)
     * receives rank i's part in its part i (MPI_Alltoall; NCCL: grouped
     * send/recv) */
    int (*alltoall)(comm *, const tensor *in, tensor *out);
} comm_vtable;

struct comm {
    const comm_vtable *vt;
    MPI_Comm mpi;          /* the group's MPI communicator (always present) */
    int rank, size;
    struct backend *be;
    void *impl;
    /* statistics */
    long n_allreduce;
    double allreduce_seconds;
    size_t allreduce_bytes;
    /* bytes this rank sends in collectives (all-reduce, all-gather, all-to-all),
     * counted with the ring formulas over the whole buffer S of p ranks:
     * all-reduce 2·S·(p−1)/p, all-gather and all-to-all S·(p−1)/p (comm_sent_bytes) */
    double sent_bytes;
};

/* The ring formula's bytes sent per rank: an all-reduce of S bytes over p
 * ranks (2·S·(p−1)/p); an all-gather, reduce-scatter or all-to-all of the
 * whole buffer S (S·(p−1)/p). */
double comm_ring_allreduce_bytes(double S, int p);
double comm_ring_gather_bytes(double S, int p);

/* MPI communicator over `group` for tensors in host memory (CPU backend). */
comm *comm_create_mpi(MPI_Comm group, struct backend *be);
/* NCCL communicator over `group` (unique id sent with MPI_Bcast); NULL +
 * tp_error when NCCL is not built in. */
comm *comm_create_nccl(MPI_Comm group, struct backend *be);
/* The right communicator for the backend (NCCL for CUDA, MPI for CPU). */
comm *comm_create(MPI_Comm group, struct backend *be);

int comm_allreduce_sum(comm *c, tensor *t);
int comm_bcast(comm *c, tensor *t, int root);
int comm_allgather(comm *c, tensor *t);
int comm_alltoall(comm *c, const tensor *in, tensor *out);
void comm_destroy(comm *c);

#endif
