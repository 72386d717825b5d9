#include "dist.h"
#include "kernels/err.h"
#include "kernels/fault.h"
#include <stdlib.h>
#include "affinity.h"
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

int dist_init(int *argc, char ***argv, dist *d) {
    memset(d, 0, sizeof *d);
    affinity_early();
    /* A rank writing to a dead peer's TCP socket gets EPIPE, which Open MPI
     * reports (and the watchdog or the job's error path then ends the rank,
     * naming the group), instead of dying silently of SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return tp_error("MPI initialisation failed");
    }
    d->world = MPI_COMM_WORLD;
    MPI_Comm_rank(d->world, &d->world_rank);
    MPI_Comm_size(d->world, &d->world_size);
    MPI_Comm_split_type(d->world, MPI_COMM_TYPE_SHARED, d->world_rank, MPI_INFO_NULL, &d->local_comm);
    MPI_Comm_rank(d->local_comm, &d->local_rank);
    MPI_Comm_size(d->local_comm, &d->local_size);
    d->tp_comm = d->dp_comm = d->sp_comm = d->cfg_comm = d->grp_comm = MPI_COMM_NULL;
    if (tp_fault_init(d->world_rank)) return -1;   /* the same environment on every rank */
    affinity_setup(d);   /* before any OpenMP thread starts */
    return dist_set_tp(d, 0);
}

int dist_mesh_degrees(int world, int *tp, int sp, int cfg) {
    if (cfg != 1 && cfg != 2) return tp_error("the CFG degree must be 1 or 2 (got %d)", cfg);
    if (sp < 1) return tp_error("--sp must be at least 1 (got %d)", sp);
    if (*tp <= 0) {
        if (world % (cfg * sp))
            return tp_error("%s%s%d does not divide the number of MPI ranks (%d): a job group holds %s%d sequence-"
                            "parallel positions, so run a multiple of %d ranks", cfg == 2 ? "--cfg-parallel x " : "",
                            "--sp ", sp, world, cfg == 2 ? "two CFG halves of " : "", sp, cfg * sp);
        *tp = world / (cfg * sp);
        return 0;
    }
    if (cfg == 1 && sp == 1) {
        if (world % *tp)
            return tp_error("--tp %d does not divide the number of MPI ranks (%d): the world is split into "
                            "data-parallel groups of tp ranks each, so use a tp that divides %d",
                            *tp, world, world);
        return 0;
    }
    int grp = cfg * sp * *tp;
    if (world % grp) {
        char fits[256] = "";
        size_t at = 0;
        for (int t = 1; t <= world && at < sizeof fits - 16; t++)
            if (world % (cfg * sp * t) == 0) at += (size_t)snprintf(fits + at, sizeof fits - at, "%s%d", at ? ", " : "", t);
        if (!*fits)
            return tp_error("the mesh %s--sp %d x --tp %d needs groups of %d ranks, which does not divide the number "
                            "of MPI ranks (%d): the world is dp x cfg x sp x tp; run a multiple of %d ranks",
                            cfg == 2 ? "--cfg-parallel (2) x " : "", sp, *tp, grp, world, grp);
        return tp_error("the mesh %s--sp %d x --tp %d needs groups of %d ranks, which does not divide the number of "
                        "MPI ranks (%d): the world is dp x cfg x sp x tp; with these, --tp %s fit%s",
                        cfg == 2 ? "--cfg-parallel (2) x " : "", sp, *tp, grp, world, fits, strchr(fits, ',') ? "" : "s");
    }
    return 0;
}

static void free_comm(MPI_Comm *c) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    *c = MPI_COMM_NULL;
}

void dist_mesh_split(MPI_Comm group, int tp, int sp, int cfg, dist_mesh *m) {
    int r;
    MPI_Comm_rank(group, &r);
    *m = (dist_mesh){.tp = tp, .sp = sp, .cfg = cfg, .tp_rank = r % tp, .sp_rank = (r / tp) % sp,
                     .cfg_rank = r / (tp * sp), .cfg_comm = MPI_COMM_NULL};
    MPI_Comm_split(group, r / tp, m->tp_rank, &m->tp_comm);
    MPI_Comm_split(group, m->cfg_rank * tp + m->tp_rank, m->sp_rank, &m->sp_comm);
    /* every rank of the group joins each split; without CFG parallelism no rank keeps the cfg one */
    MPI_Comm_split(group, cfg == 2 ? r % (tp * sp) : MPI_UNDEFINED, m->cfg_rank, &m->cfg_comm);
}

void dist_mesh_free(dist_mesh *m) {
    free_comm(&m->tp_comm);
    free_comm(&m->sp_comm);
    free_comm(&m->cfg_comm);
}

int dist_set_tp(dist *d, int tp) { return dist_set_mesh(d, tp, 1, 1); }

int dist_set_mesh(dist *d, int tp, int sp, int cfg) {
    if (dist_mesh_degrees(d->world_size, &tp, sp, cfg)) return -1;
    free_comm(&d->tp_comm), free_comm(&d->sp_comm), free_comm(&d->cfg_comm);
    free_comm(&d->grp_comm), free_comm(&d->dp_comm);
    d->grp = cfg * sp * tp;
    d->dp = d->world_size / d->grp;
    d->dp_rank = d->world_rank / d->grp;
    d->grp_rank = d->world_rank % d->grp;
    MPI_Comm_split(d->world, d->dp_rank, d->grp_rank, &d->grp_comm);
    MPI_Comm_split(d->world, d->grp_rank, d->dp_rank, &d->dp_comm);
    dist_mesh m;
    dist_mesh_split(d->grp_comm, tp, sp, cfg, &m);
    d->tp = tp, d->sp = sp, d->cfg = cfg;
    d->tp_rank = m.tp_rank, d->sp_rank = m.sp_rank, d->cfg_rank = m.cfg_rank;
    d->tp_comm = m.tp_comm, d->sp_comm = m.sp_comm, d->cfg_comm = m.cfg_comm;
    return 0;
}

void dist_finalize(dist *d) {
    free_comm(&d->tp_comm), free_comm(&d->sp_comm), free_comm(&d->cfg_comm);
    free_comm(&d->grp_comm), free_comm(&d->dp_comm), free_comm(&d->local_comm);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

int dist_agree(MPI_Comm c, int status) {
    int rank, size;
    MPI_Comm_rank(c, &rank);
    MPI_Comm_size(c, &size);
    int mine = status ? rank : INT_MAX, first;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c);
    if (first == INT_MAX) return 0;
    /* the failing rank's body and its rank prefix, if it was agreed before
     * (nested agreements: an error agreed inside a TP group, with contexts
     * added since, keeps that group's rank when the world agrees) */
    struct { int rank; char body[4092]; } m;
    if (rank == first) {
        m.rank = tp_error_rank();
        snprintf(m.body, sizeof m.body, "%s", tp_error_body());
    }
    MPI_Bcast(&m, sizeof m, MPI_BYTE, first, c);
    m.body[sizeof m.body - 1] = 0;
    int wr = m.rank;
    if (wr < 0 && size > 1) {
        wr = first;
        MPI_Group g, wg;
        MPI_Comm_group(c, &g);
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        MPI_Group_translate_ranks(g, 1, &first, wg, &wr);
        MPI_Group_free(&g);
        MPI_Group_free(&wg);
    }
    tp_error("%s", m.body);
    tp_error_set_rank(wr);
    return -1;
}

/* A failure in a lockstep section on a group of several ranks: the peers
 * are inside (or about to enter) a collective that this rank will never
 * join, and no agreement can reach them, so the job ends here. */
static void lockstep_abort(const char *cause) {
    int wr = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    fprintf(stderr, "tpgen: error: rank %d: %s, in the middle of the %s phase, where the other ranks of its group "
            "wait in a collective: this cannot be agreed, so the job ends (free memory on that rank's device, or "
            "use a larger --tp or a smaller image)\n", wr, cause && *cause ? cause : "allocation failed",
            *tp_phase() ? tp_phase() : "current");
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    abort();   /* MPI_Abort does not return */
}

int dist_lockstep_begin(MPI_Comm c, int status) {
    int size = 1;
    if (c != MPI_COMM_NULL) {
        MPI_Comm_size(c, &size);
        if (size > 1) status = dist_agree(c, status);
    }
    if (status) return -1;
    tp_lockstep_enter(size > 1 ? lockstep_abort : NULL);
    return 0;
}

void dist_lockstep_end(void) { tp_lockstep_leave(); }

void dist_report_error(MPI_Comm c) {
    int rank;
    MPI_Comm_rank(c, &rank);
    if (rank == 0) fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
}

static size_t g_chunk_bytes = DIST_CHUNK_BYTES;
void dist_set_chunk_bytes(size_t bytes) { g_chunk_bytes = bytes ? bytes : DIST_CHUNK_BYTES; }

void dist_bcast_large(void *buf, size_t count, MPI_Datatype type, size_t elem_size, int root, MPI_Comm c) {
    size_t per = g_chunk_bytes / elem_size;   /* whole elements per piece, at least one */
    if (per < 1) per = 1;
    if (per > INT_MAX) per = INT_MAX;
    char *p = buf;
    for (size_t done = 0; done < count; done += per) {
        size_t n = count - done < per ? count - done : per;
        MPI_Bcast(p + done * elem_size, (int)n, type, root, c);
    }
}

dist_bytes dist_bytes_of(size_t n) {
    size_t piece = g_chunk_bytes < (size_t)INT_MAX ? g_chunk_bytes : (size_t)INT_MAX;
    if (n <= piece) return (dist_bytes){(int)n, MPI_BYTE};
    size_t k = n / piece, rest = n % piece;
    if (k > (size_t)INT_MAX) tp_fatal("a message of %zu bytes in pieces of %zu is too many pieces for MPI", n, piece);
    MPI_Datatype one, body, t;
    MPI_Type_contiguous((int)piece, MPI_BYTE, &one);
    MPI_Type_contiguous((int)k, one, &body);
    if (rest) {
        int lens[2] = {1, (int)rest};
        MPI_Aint at[2] = {0, (MPI_Aint)(k * piece)};
        MPI_Datatype types[2] = {body, MPI_BYTE};
        MPI_Type_create_struct(2, lens, at, types, &t);
        MPI_Type_free(&body);
    } else {
        t = body;
    }
    MPI_Type_free(&one);
    MPI_Type_commit(&t);
    return (dist_bytes){1, t};
}

void dist_bytes_free(dist_bytes *b) {
    if (b->type != MPI_BYTE) MPI_Type_free(&b->type);
    b->type = MPI_BYTE, b->count = 0;
}

size_t dist_probed_bytes(const MPI_Status *st) {
    MPI_Count n = 0;
    MPI_Get_elements_x(st, MPI_BYTE, &n);
    return n > 0 ? (size_t)n : 0;
}
