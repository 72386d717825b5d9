/* NCCL communicator for GPU ranks (kernels/comm.h). The unique id travels from
 * group rank 0 with MPI_Bcast, together with a status word so that a failure
 * on rank 0 fails every rank instead of leaving them waiting. Collectives run
 * on the backend's compute stream, so they are ordered with the ops around
 * them and need no extra synchronisation.
 *
 * Statistics: allreduce_seconds is GPU time measured with CUDA events around
 * each collective; pairs are harvested once their stop event has completed
 * (at the next collective or at destroy), so the figure may lag by the
 * collectives still in flight. */
#include "cuda_internal.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TIMING_PAIRS 64

typedef struct {
    ncclComm_t nccl;
    cudaEvent_t start[TIMING_PAIRS], stop[TIMING_PAIRS];
    int pending[TIMING_PAIRS];
    int next;
} nccl_impl;

static void harvest(comm *c, int wait) {
    nccl_impl *m = c->impl;
    for (int i = 0; i < TIMING_PAIRS; i++) {
        if (!m->pending[i]) continue;
        if (wait) cudaEventSynchronize(m->stop[i]);
        else if (cudaEventQuery(m->stop[i]) != cudaSuccess) { cudaGetLastError(); continue; }
        float ms = 0;
        if (cudaEventElapsedTime(&ms, m->start[i], m->stop[i]) == cudaSuccess) c->allreduce_seconds += ms / 1e3;
        else cudaGetLastError();
        m->pending[i] = 0;
    }
}

static int nccl_error(const char *what, ncclResult_t r) {
    return tp_error("NCCL %s failed: %s", what, ncclGetErrorString(r));
}

static int nccl_allreduce(comm *c, tensor *t) {
    if (!tensor_contiguous(t)) tp_fatal("comm allreduce: tensor must be contiguous");
    if (t->dtype != DT_F32 && t->dtype != DT_BF16) tp_fatal("comm allreduce: dtype %s", dtype_name(t->dtype));
    nccl_impl *m = c->impl;
    cudaStream_t s = cuda_stream(c->be);
    int slot = m->next;
    m->next = (slot + 1) % TIMING_PAIRS;
    if (m->pending[slot]) harvest(c, 1);
    else harvest(c, 0);
    cudaEventRecord(m->start[slot], s);
    ncclResult_t r = ncclAllReduce(t->data, t->data, tensor_numel(t), t->dtype == DT_F32 ? ncclFloat32 : ncclBfloat16,
                                   ncclSum, m->nccl, s);
    cudaEventRecord(m->stop[slot], s);
    m->pending[slot] = 1;
    c->n_allreduce++;
    c->allreduce_bytes += tensor_nbytes(t);
    return r == ncclSuccess ? 0 : nccl_error("all-reduce", r);
}

static int nccl_bcast(comm *c, tensor *t, int root) {
    if (!tensor_contiguous(t)) tp_fatal("comm bcast: tensor must be contiguous");
    if (c->size == 1) return 0;
    nccl_impl *m = c->impl;
    ncclResult_t r = ncclBroadcast(t->data, t->data, tensor_nbytes(t), ncclUint8, root, m->nccl, cuda_stream(c->be));
    return r == ncclSuccess ? 0 : nccl_error("broadcast", r);
}

static size_t nccl_part(const comm *c, const tensor *t, const char *what) {
    size_t n = tensor_nbytes(t);
    if (!tensor_contiguous(t)) tp_fatal("comm %s: tensor must be contiguous", what);
    if (n % ((size_t)c->size * dtype_size(t->dtype))) tp_fatal("comm %s: %zu bytes do not split into %d parts", what, n, c->size);
    return n / (size_t)c->size;
}

/* in place: NCCL's in-place all-gather takes the rank's own part at its offset of the output */
static int nccl_allgather(comm *c, tensor *t) {
    size_t part = nccl_part(c, t, "all-gather");
    if (c->size == 1) return 0;
    nccl_impl *m = c->impl;
    char *base = t->data;
    ncclResult_t r = ncclAllGather(base + (size_t)c->rank * part, base, part, ncclUint8, m->nccl, cuda_stream(c->be));
    return r == ncclSuccess ? 0 : nccl_error("all-gather", r);
}

/* NCCL has no all-to-all: one group of a send and a receive per peer (its own
 * part is a device copy), which NCCL runs as one fused operation */
static int nccl_alltoall(comm *c, const tensor *in, tensor *out) {
    size_t part = nccl_part(c, in, "all-to-all");
    if (tensor_nbytes(out) != tensor_nbytes(in) || !tensor_contiguous(out))
        tp_fatal("comm all-to-all: the output must be contiguous and as large as the input");
    nccl_impl *m = c->impl;
    cudaStream_t s = cuda_stream(c->be);
    const char *src = in->data;
    char *dst = out->data;
    if (cudaMemcpyAsync(dst + (size_t)c->rank * part, src + (size_t)c->rank * part, part, cudaMemcpyDeviceToDevice, s) !=
        cudaSuccess)
        return tp_error("all-to-all: copying the rank's own part failed: %s", cudaGetErrorString(cudaGetLastError()));
    ncclResult_t r = ncclGroupStart();
    for (int peer = 0; peer < c->size && r == ncclSuccess; peer++) {
        if (peer == c->rank) continue;
        r = ncclSend(src + (size_t)peer * part, part, ncclUint8, peer, m->nccl, s);
        if (r == ncclSuccess) r = ncclRecv(dst + (size_t)peer * part, part, ncclUint8, peer, m->nccl, s);
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess) r = e;
    return r == ncclSuccess ? 0 : nccl_error("all-to-all (grouped send/recv)", r);
}

static void nccl_destroy(comm *c) {
    nccl_impl *m = c->impl;
    cudaStreamSynchronize(cuda_stream(c->be));
    harvest(c, 1);
    for (int i = 0; i < TIMING_PAIRS; i++) {
        cudaEventDestroy(m->start[i]);
        cudaEventDestroy(m->stop[i]);
    }
    ncclCommDestroy(m->nccl);
    free(m);
    free(c);
}

static const comm_vtable k_nccl_vt = {.name = "nccl", .allreduce_sum = nccl_allreduce, .bcast = nccl_bcast,
                                      .destroy = nccl_destroy, .allgather = nccl_allgather,
                                      .alltoall = nccl_alltoall};

/* A GPU's identity: its UUID (what nvidia-smi -L prints), else its PCI bus
 * id. Device numbers do not identify GPUs: under Slurm's --gpus-per-task=1 or
 * per-rank CUDA_VISIBLE_DEVICES every rank sees its own GPU as device 0. */
typedef struct { char id[96]; char host[64]; int device, ok; } gpu_where;

int cuda_gpu_identity(int device, char *out, size_t n) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
        const unsigned char *b = (const unsigned char *)prop.uuid.bytes;
        snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
                 b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        return 0;
    }
    cudaGetLastError();
    char bus[32];
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device) == cudaSuccess) {
        snprintf(out, n, "PCI %s", bus);
        return 0;
    }
    cudaGetLastError();
    return -1;
}

/* NCCL needs one GPU per rank; two ranks of a group on the same GPU would
 * fail inside ncclCommInitRank (or hang). Every rank sees the same gathered
 * table, so all of them reach the same verdict (a rank that could not tell
 * its GPU's identity fails them all too). */
static int check_distinct_gpus(MPI_Comm group, int rank, int size, int device) {
    gpu_where me = {{0}, {0}, device, 0}, *all = xcalloc((size_t)size, sizeof *all);
    gethostname(me.host, sizeof me.host - 1);
    me.ok = cuda_gpu_identity(device, me.id, sizeof me.id) == 0;
    MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, group);
    int rc = 0;
    for (int i = 0; i < size && !rc; i++)
        if (!all[i].ok)
            rc = tp_error("rank %d of the tensor-parallel group could not read the UUID or PCI bus id of its GPU %d on %s",
                          i, all[i].device, all[i].host);
    for (int i = 0; i < size && !rc; i++)
        for (int j = i + 1; j < size && !rc; j++)
            if (!strcmp(all[i].id, all[j].id) && !strcmp(all[i].host, all[j].host))
                rc = tp_error("ranks %d and %d of the tensor-parallel group both use the same GPU (%s, device %d and %d) "
                              "on %s: NCCL needs one GPU per rank; start at most as many ranks per node as it has GPUs, "
                              "or share a GPU with TPGEN_COMM=mpi (device buffers staged through the host; for tests)",
                              i, j, all[i].id, all[i].device, all[j].device, all[i].host);
    free(all);
    (void)rank;
    return rc;
}

/* every rank's status (0 or -1) -> the first failing rank, or -1 when none */
static int first_failing(MPI_Comm group, int st, int rank) {
    int mine = st ? rank : 1 << 30, first;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, group);
    return first == 1 << 30 ? -1 : first;
}

comm *cudaplug_comm_create_nccl(MPI_Comm group, struct backend *be) {
    if (!be || be->kind != BACKEND_CUDA) {
        tp_error("NCCL needs tensors on the CUDA backend; use the MPI communicator for --backend cpu");
        return NULL;
    }
    int rank, size;
    MPI_Comm_rank(group, &rank);
    MPI_Comm_size(group, &size);
    if (check_distinct_gpus(group, rank, size, be->device)) return NULL;
    /* Each step is agreed by every rank before the next collective one: a
     * rank that fails alone (device selection, the unique id) must not leave
     * the others inside ncclCommInitRank until the startup bound. */
    struct { int status; ncclUniqueId id; } msg = {0};
    cudaError_t ce = cudaSetDevice(be->device);
    int st = 0;
    if (ce != cudaSuccess) {
        cudaGetLastError();
        st = tp_error("NCCL setup: selecting GPU %d failed: %s", be->device, cudaGetErrorString(ce));
    }
    if (rank == 0 && !st) {
        ncclResult_t r = ncclGetUniqueId(&msg.id);
        if (r != ncclSuccess) st = nccl_error("unique id creation", r);
    }
    int bad = first_failing(group, st, rank);
    if (bad >= 0) {
        if (!st) tp_error("NCCL setup failed on rank %d of the tensor-parallel group", bad);
        return NULL;
    }
    MPI_Bcast(&msg.id, (int)sizeof msg.id, MPI_BYTE, 0, group);
    nccl_impl *m = xcalloc(1, sizeof *m);
    ncclResult_t r = ncclCommInitRank(&m->nccl, size, msg.id, rank);
    if (r != ncclSuccess)
        st = tp_error("NCCL communicator setup (rank %d of %d, GPU %d) failed: %s", rank, size, be->device,
                      ncclGetErrorString(r));
    bad = first_failing(group, st, rank);
    if (bad >= 0) {  /* the ranks whose communicator exists tear it down */
        if (!st) {
            ncclCommAbort(m->nccl);
            tp_error("NCCL communicator setup failed on rank %d of the tensor-parallel group", bad);
        }
        free(m);
        return NULL;
    }
    for (int i = 0; i < TIMING_PAIRS; i++) {
        cudaEventCreate(&m->start[i]);
        cudaEventCreate(&m->stop[i]);
    }
    comm *c = xcalloc(1, sizeof *c);
    c->vt = &k_nccl_vt;
    c->mpi = group;
    c->be = be;
    c->impl = m;
    c->rank = rank;
    c->size = size;
    return c;
}
