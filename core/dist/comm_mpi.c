/* MPI communicator for host tensors. bf16 has no MPI datatype: it travels
 * as 16-bit words and is summed by a user-defined op that rounds each
 * pairwise sum to bf16, which is what NCCL does on GPUs. Tensors of a GPU
 * backend (TPGEN_COMM=mpi: ranks sharing one GPU, for correctness runs) are
 * staged through a host buffer. */
#include "kernels/comm.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <stdlib.h>
#include <limits.h>
#include <string.h>

/* Branch-free so that the compiler vectorises it (a scalar loop reached a
 * quarter of MPI's f32 sum): widen, add in fp32, round to nearest even;
 * a NaN sum stays a quiet NaN. */
__attribute__((optimize("O3"))) static void bf16_sum_op(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    int n = *len;
    for (int i = 0; i < n; i++) {
        uint32_t ua = (uint32_t)a[i] << 16, ub = (uint32_t)b[i] << 16, u;
        float fa, fb, f;
        memcpy(&fa, &ua, 4);
        memcpy(&fb, &ub, 4);
        f = fa + fb;
        memcpy(&u, &f, 4);
        uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        uint32_t q = (u >> 16) | 0x40u;
        b[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
    }
}

/* Tensors travel on a duplicate of the group's communicator: error
 * agreements (dist_agree over c->mpi) never match a tensor collective, even
 * when a rank is one collective behind its peers */
typedef struct { MPI_Op bf16_sum; MPI_Comm tensors; } mpi_impl;

/* the tensor's bytes in host memory: t->data itself, or a staged copy of a
 * device tensor (NULL + tp_error when the download failed) */
static int on_device(const tensor *t) { return t->be && t->be->kind != BACKEND_CPU; }
static void *host_view(tensor *t) {
    if (!on_device(t)) return t->data;
    void *h = xmalloc(tensor_nbytes(t) ? tensor_nbytes(t) : 1);
    if (be_sync(t->be) || be_download(t->be, h, t->data, tensor_nbytes(t))) {
        free(h);
        return NULL;
    }
    return h;
}
/* back to the device (when staged), waited for */
static int host_done(tensor *t, void *h, int ok) {
    if (!on_device(t)) return 0;
    int rc = ok && (be_upload(t->be, t->data, h, tensor_nbytes(t)) || be_sync(t->be)) ? -1 : 0;
    free(h);
    return rc;
}

static int mpi_allreduce(comm *c, tensor *t) {
    if (!tensor_contiguous(t)) tp_fatal("comm allreduce: tensor must be contiguous");
    if (c->size == 1) return 0;
    mpi_impl *m = c->impl;
    double t0 = MPI_Wtime();
    int n = (int)tensor_numel(t), rc;
    if (t->dtype != DT_F32 && t->dtype != DT_BF16) tp_fatal("comm allreduce: dtype %s", dtype_name(t->dtype));
    void *h = host_view(t);
    if (!h) tp_fatal("comm allreduce: staging a device tensor through the host failed: %s", tp_error_msg());
    if (t->dtype == DT_F32) rc = MPI_Allreduce(MPI_IN_PLACE, h, n, MPI_FLOAT, MPI_SUM, m->tensors);
    else rc = MPI_Allreduce(MPI_IN_PLACE, h, n, MPI_UINT16_T, m->bf16_sum, m->tensors);
    if (host_done(t, h, rc == MPI_SUCCESS)) tp_fatal("comm allreduce: staging back to the device failed: %s", tp_error_msg());
    c->allreduce_seconds += MPI_Wtime() - t0;
    c->n_allreduce++;
    c->allreduce_bytes += tensor_nbytes(t);
    return rc == MPI_SUCCESS ? 0 : tp_error("MPI_Allreduce failed (code %d)", rc);
}

static int mpi_bcast(comm *c, tensor *t, int root) {
    if (!tensor_contiguous(t)) tp_fatal("comm bcast: tensor must be contiguous");
    mpi_impl *m = c->impl;
    void *h = host_view(t);
    if (!h) tp_fatal("comm bcast: staging a device tensor through the host failed: %s", tp_error_msg());
    int rc = MPI_Bcast(h, (int)tensor_nbytes(t), MPI_BYTE, root, m->tensors);
    if (host_done(t, h, rc == MPI_SUCCESS)) tp_fatal("comm bcast: staging back to the device failed: %s", tp_error_msg());
    return rc == MPI_SUCCESS ? 0 : tp_error("MPI_Bcast failed (code %d)", rc);
}

/* the byte count of one of size parts (the parts must be equal and whole elements) */
static size_t part_bytes(const comm *c, const tensor *t, const char *what) {
    size_t n = tensor_nbytes(t), es = dtype_size(t->dtype);
    if (!tensor_contiguous(t)) tp_fatal("comm %s: tensor must be contiguous", what);
    if (n % ((size_t)c->size * es)) tp_fatal("comm %s: %zu bytes do not split into %d parts", what, n, c->size);
    if (n / (size_t)c->size > (size_t)INT_MAX) tp_fatal("comm %s: a part of %zu bytes is too large for MPI", what, n);
    return n / (size_t)c->size;
}

static int mpi_allgather(comm *c, tensor *t) {
    size_t part = part_bytes(c, t, "all-gather");
    if (c->size == 1) return 0;
    mpi_impl *m = c->impl;
    void *h = host_view(t);
    if (!h) tp_fatal("comm all-gather: staging a device tensor through the host failed: %s", tp_error_msg());
    int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, h, (int)part, MPI_BYTE, m->tensors);
    if (host_done(t, h, rc == MPI_SUCCESS)) tp_fatal("comm all-gather: staging back to the device failed: %s", tp_error_msg());
    return rc == MPI_SUCCESS ? 0 : tp_error("MPI_Allgather failed (code %d)", rc);
}

static int mpi_alltoall(comm *c, const tensor *in, tensor *out) {
    size_t part = part_bytes(c, in, "all-to-all");
    if (tensor_nbytes(out) != tensor_nbytes(in) || !tensor_contiguous(out))
        tp_fatal("comm all-to-all: the output (%zu bytes) must be contiguous and as large as the input (%zu)",
                 tensor_nbytes(out), tensor_nbytes(in));
    mpi_impl *m = c->impl;
    void *hi = host_view((tensor *)in), *ho = on_device(out) ? xmalloc(tensor_nbytes(out) ? tensor_nbytes(out) : 1) : out->data;
    if (!hi) tp_fatal("comm all-to-all: staging a device tensor through the host failed: %s", tp_error_msg());
    int rc = MPI_Alltoall(hi, (int)part, MPI_BYTE, ho, (int)part, MPI_BYTE, m->tensors);
    if (on_device(in)) free(hi);
    if (host_done(out, ho, rc == MPI_SUCCESS)) tp_fatal("comm all-to-all: staging back to the device failed: %s", tp_error_msg());
    return rc == MPI_SUCCESS ? 0 : tp_error("MPI_Alltoall failed (code %d)", rc);
}

static void mpi_destroy(comm *c) {
    mpi_impl *m = c->impl;
    MPI_Op_free(&m->bf16_sum);
    MPI_Comm_free(&m->tensors);
    free(m);
    free(c);
}

static const comm_vtable k_mpi_vt = {.name = "mpi", .allreduce_sum = mpi_allreduce, .bcast = mpi_bcast,
                                     .destroy = mpi_destroy, .allgather = mpi_allgather, .alltoall = mpi_alltoall};

comm *comm_create_mpi(MPI_Comm group, struct backend *be) {
    comm *c = xcalloc(1, sizeof *c);
    mpi_impl *m = xcalloc(1, sizeof *m);
    MPI_Op_create(bf16_sum_op, 1, &m->bf16_sum);
    MPI_Comm_dup(group, &m->tensors);   /* collective over the group, as creating a comm is */
    c->vt = &k_mpi_vt;
    c->mpi = group;
    c->be = be;
    c->impl = m;
    MPI_Comm_rank(group, &c->rank);
    MPI_Comm_size(group, &c->size);
    return c;
}

/* NCCL for GPU tensors unless TPGEN_COMM=mpi (ranks sharing a GPU: MPI
 * through host buffers, for correctness runs such as scripts/gpu-check.sh's) */
comm *comm_create(MPI_Comm group, struct backend *be) {
    const char *e = getenv("TPGEN_COMM");
    if (e && *e && strcmp(e, "mpi") && strcmp(e, "nccl") && strcmp(e, "auto")) {
        tp_error("TPGEN_COMM=%s: use mpi, nccl or auto", e);
        return NULL;
    }
    if (be && be->kind == BACKEND_CUDA && !(e && !strcmp(e, "mpi"))) return comm_create_nccl(group, be);
    return comm_create_mpi(group, be);
}

double comm_ring_allreduce_bytes(double S, int p) { return p > 1 ? 2.0 * S * (p - 1) / p : 0; }
double comm_ring_gather_bytes(double S, int p) { return p > 1 ? S * (p - 1) / p : 0; }

/* the counts are kept here, once for every backend */
int comm_allreduce_sum(comm *c, tensor *t) {
    c->sent_bytes += comm_ring_allreduce_bytes((double)tensor_nbytes(t), c->size);
    return c->vt->allreduce_sum(c, t);
}
int comm_bcast(comm *c, tensor *t, int root) { return c->vt->bcast(c, t, root); }
int comm_allgather(comm *c, tensor *t) {
    c->sent_bytes += comm_ring_gather_bytes((double)tensor_nbytes(t), c->size);
    return c->vt->allgather(c, t);
}
int comm_alltoall(comm *c, const tensor *in, tensor *out) {
    c->sent_bytes += comm_ring_gather_bytes((double)tensor_nbytes(in), c->size);
    return c->vt->alltoall(c, in, out);
}
void comm_destroy(comm *c) { if (c) c->vt->destroy(c); }
