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
};

/* MPI communicator over `group` for tensors in host memory (CPU backend). */
comm *comm_create_mpi(MPI_Comm group, struct backend *be);
/* NCCL communicator over `group` (unique id sent with MPI_Bcast); NULL +
 * tp_error when NCCL is not built in. */
comm *comm_create_nccl(MPI_Comm group, struct backend *be);
/* The right communicator for the backend (NCCL for CUDA, MPI for CPU). */
comm *comm_create(MPI_Comm group, struct backend *be);

int comm_allreduce_sum(comm *c, tensor *t);
int comm_bcast(comm *c, tensor *t, int root);
void comm_destroy(comm *c);

#endif
