/* comm_allreduce_sum over MPI against an independent computation: every
 * rank can generate every rank's data from the seed, so each rank computes
 * the exact (double) sum itself. f32 sums may be associated in any order
 * (relative error ~1e-6); bf16 rounds after each pairwise addition as NCCL
 * does, so the result may be off by (ranks-1) roundings. */
#include "test.h"
#include <limits.h>
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* value i of rank r, a deterministic function of the test seed */
static float value_of(unsigned seed, int r, size_t i) {
    uint64_t z = ((uint64_t)seed << 32) ^ ((uint64_t)r << 48) ^ (uint64_t)i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 8.0 - 4.0);
}

static void allreduce_case(comm *c, dtype_t dt, size_t n) {
    unsigned seed = test_seed();
    tensor *t = tensor_new(c->be, dt, 1, (int64_t)n);
    float *mine = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) mine[i] = dt == DT_BF16 ? bf16r(value_of(seed, c->rank, i)) : value_of(seed, c->rank, i);
    tensor_upload_f32(t, mine);
    int rc = comm_allreduce_sum(c, t);
    CHECK(rc == 0, "allreduce %s n=%zu returned %d", dtype_name(dt), n, rc);
    tensor_download_f32(t, got);
    size_t bad = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double exact = 0, mag = 0;
        for (int r = 0; r < c->size; r++) {
            double v = dt == DT_BF16 ? bf16r(value_of(seed, r, i)) : value_of(seed, r, i);
            exact += v;
            mag += fabs(v);
        }
        /* f32: a few fp32 roundings; bf16: (size-1) pairwise roundings of
         * partial sums bounded by mag, at most one ulp (2^-8 relative) each */
        double tol = dt == DT_BF16 ? (c->size - 1) * mag * (1.0 / 256) + 1e-30 : mag * 4e-7 * c->size + 1e-30;
        double err = fabs(got[i] - exact);
        if (!(err <= tol)) { if (!bad) first = i; bad++; }
        if (err > worst) worst = err;
    }
    CHECK(bad == 0, "allreduce %s n=%zu ranks=%d: %zu wrong elements, first %zu (worst error %g)", dtype_name(dt), n,
          c->size, bad, first, worst);
    free(mine);
    free(got);
    tensor_free(t);
}

TEST_MPI(comm_allreduce_sum_f32_bf16) {
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_WORLD, be);
    const size_t sizes[] = {1, 7, 1000, 65537, 1 << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        allreduce_case(c, DT_F32, sizes[k]);
        allreduce_case(c, DT_BF16, sizes[k]);
    }
    CHECK(c->n_allreduce == (c->size > 1 ? 10 : 0), "n_allreduce %ld", c->n_allreduce);
    comm_destroy(c);
    backend_destroy(be);
}

TEST_MPI(comm_allreduce_sum_subgroup) { /* over a split communicator (tp groups of 2) */
    int wr, ws;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    MPI_Comm g;
    MPI_Comm_split(MPI_COMM_WORLD, wr / 2, wr, &g);
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(g, be);
    CHECK(c->size == (ws - (wr / 2) * 2 >= 2 ? 2 : 1), "subgroup size %d", c->size);
    allreduce_case(c, DT_F32, 4099);
    allreduce_case(c, DT_BF16, 4099);
    comm_destroy(c);
    backend_destroy(be);
    MPI_Comm_free(&g);
}

/* Nested agreements with contexts added between them (as the text encoder
 * inside generate does): the message keeps exactly one "rank R: " prefix,
 * in front, naming the failing world rank, and the contexts follow it. */
TEST_MPI(error_rank_prefix_once) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int failing = size - 1;
    MPI_Comm half;   /* groups of 2 (the TP groups of tp 2), or the lone rank */
    MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &half);
    int rc = rank == failing ? tp_error("qwen3 text encoder: bad token") : 0;
    int in_group = rank / 2 == failing / 2;
    if (in_group) {
        rc = dist_agree(half, rc);
        if (rc) tp_error_context("text encoder");
        rc = dist_agree(half, rc);
        if (rc) tp_error_context("encoding the prompts");
    }
    rc = dist_agree(MPI_COMM_WORLD, rc);
    CHECK(rc == -1, "rank %d: agreement returned %d", rank, rc);
    char want[160];
    if (size > 1) snprintf(want, sizeof want, "rank %d: encoding the prompts: text encoder: qwen3 text encoder: bad token", failing);
    else snprintf(want, sizeof want, "encoding the prompts: text encoder: qwen3 text encoder: bad token");
    CHECK(!strcmp(tp_error_msg(), want), "rank %d: message '%s', expected '%s'", rank, tp_error_msg(), want);
    /* a new error drops the old prefix */
    tp_error("fresh");
    CHECK(!strcmp(tp_error_msg(), "fresh") && tp_error_rank() == -1, "new error kept a prefix: '%s'", tp_error_msg());
    tp_error_clear();
    MPI_Comm_free(&half);
}

/* dist_bcast_large at a forced small piece size (the hook; 1 GiB pieces in
 * use): every element of the root's buffer arrives on every rank, whatever
 * the piece size against the element size and the count, from a root other
 * than 0 where there is one. */
TEST_MPI(dist_bcast_large_pieces) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int root = size - 1;
    static const size_t piece[] = {1, 3, 7, 64, 4096, 0};
    static const size_t count[] = {0, 1, 5, 1003};
    for (size_t pi = 0; pi < sizeof piece / sizeof *piece; pi++)
        for (size_t ci = 0; ci < sizeof count / sizeof *count; ci++) {
            size_t n = count[ci];
            dist_set_chunk_bytes(piece[pi]);
            float *f = malloc((n ? n : 1) * sizeof *f);
            unsigned char *b = malloc(n ? n : 1);
            for (size_t i = 0; i < n; i++) f[i] = value_of(11, rank, i), b[i] = (unsigned char)(rank * 31 + i * 7);
            dist_bcast_large(f, n, MPI_FLOAT, sizeof *f, root, MPI_COMM_WORLD);
            dist_bcast_large(b, n, MPI_BYTE, 1, root, MPI_COMM_WORLD);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += f[i] != value_of(11, root, i) || b[i] != (unsigned char)(root * 31 + i * 7);
            CHECK(bad == 0, "dist_bcast_large piece %zu bytes, %zu elements, rank %d: %zu wrong", piece[pi], n, rank,
                  bad);
            free(f), free(b);
        }
    dist_set_chunk_bytes(0);
}

/* One point-to-point message of any size (dist_bytes_of, dist_probed_bytes:
 * serve's jobs, results and events): rank 0 to the last rank, probed and
 * received as serve does, at forced small piece sizes (the derived type's
 * whole pieces and rest) and at the real one; then, at np 2, one message
 * past INT_MAX bytes, which an int count cannot carry. */
/* byte i of a message: a period of 4093 bytes (a prime: a piece put at the
 * wrong offset shows), filled and compared by whole periods */
#define P2P_PERIOD 4093
static void p2p_pattern(unsigned char *per, unsigned salt) {
    for (size_t i = 0; i < P2P_PERIOD; i++) per[i] = (unsigned char)(i * 131 + salt);
}

static size_t p2p_case(size_t n, int rank, int last, unsigned salt) {
    unsigned char per[P2P_PERIOD], *b = malloc(n ? n : 1);
    p2p_pattern(per, salt);
    size_t bad = 0;
    if (rank == 0) {
        for (size_t i = 0; i < n; i += P2P_PERIOD) memcpy(b + i, per, n - i < P2P_PERIOD ? n - i : P2P_PERIOD);
        dist_bytes t = dist_bytes_of(n);
        MPI_Send(b, t.count, t.type, last, 5, MPI_COMM_WORLD);
        dist_bytes_free(&t);
    } else if (rank == last) {
        MPI_Status st;
        MPI_Probe(0, 5, MPI_COMM_WORLD, &st);
        size_t got = dist_probed_bytes(&st);
        dist_bytes t = dist_bytes_of(got);
        MPI_Recv(b, t.count, t.type, 0, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        dist_bytes_free(&t);
        bad += got != n;
        for (size_t i = 0; i < n && got == n; i += P2P_PERIOD)
            bad += memcmp(b + i, per, n - i < P2P_PERIOD ? n - i : P2P_PERIOD) != 0;
    }
    free(b);
    return bad;
}

TEST_MPI(dist_bytes_any_size) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) return;
    static const size_t piece[] = {7, 1000, 0};
    static const size_t count[] = {0, 1, 999, 1000, 10007};
    for (size_t pi = 0; pi < sizeof piece / sizeof *piece; pi++)
        for (size_t ci = 0; ci < sizeof count / sizeof *count; ci++) {
            dist_set_chunk_bytes(piece[pi]);
            size_t bad = p2p_case(count[ci], rank, size - 1, (unsigned)(pi * 5 + ci));
            CHECK(bad == 0, "p2p piece %zu, %zu bytes, rank %d: %zu wrong periods", piece[pi], count[ci], rank, bad);
        }
    dist_set_chunk_bytes(0);
    dist_bytes t = dist_bytes_of(1000);
    CHECK(t.type == MPI_BYTE && t.count == 1000, "a small message is plain bytes");
    if (size != 2) return;   /* the 2 GiB case once, at np 2 (4.3 GB between the two ranks) */
    size_t big = (size_t)INT_MAX + 4099;
    size_t bad = p2p_case(big, rank, 1, 77);
    CHECK(bad == 0, "p2p of %zu bytes (past INT_MAX), rank %d: %zu wrong periods", big, rank, bad);
}

/* All-gather and all-to-all (the CFG exchange and Ulysses' head/token
 * swap): rank r's part j holds value_of(seed, r, j*n + i), so every rank
 * knows what it must receive. The bytes sent are counted with the ring
 * formulas, checked here against the formula written out. */
static void exchange_case(comm *c, dtype_t dt, size_t n) {
    unsigned seed = test_seed();
    int p = c->size;
    size_t all = n * (size_t)p;
    float *mine = malloc(all * sizeof(float)), *got = malloc(all * sizeof(float));
    tensor *a = tensor_new(c->be, dt, p, (int64_t)n), *b = tensor_new(c->be, dt, p, (int64_t)n);
    for (size_t k = 0; k < all; k++) mine[k] = bf16r(value_of(seed, c->rank, k));   /* exact in both dtypes */
    tensor_upload_f32(a, mine);
    double sent0 = c->sent_bytes, S = (double)all * (double)dtype_size(dt);
    CHECK(comm_alltoall(c, a, b) == 0, "all-to-all %s n=%zu: %s", dtype_name(dt), n, tp_error_msg());
    tensor_download_f32(b, got);
    size_t bad = 0;
    for (int i = 0; i < p; i++)   /* my part i came from rank i: its part `rank` */
        for (size_t e = 0; e < n; e++)
            bad += got[(size_t)i * n + e] != bf16r(value_of(seed, i, (size_t)c->rank * n + e));
    CHECK(bad == 0, "all-to-all %s n=%zu ranks=%d: %zu wrong elements", dtype_name(dt), n, p, bad);
    double want = S * (p - 1) / p;
    CHECK(fabs(c->sent_bytes - sent0 - want) < 0.5, "all-to-all counted %.1f bytes, the formula S(p-1)/p gives %.1f",
          c->sent_bytes - sent0, want);
    /* all-gather in place: my own part at my offset, the others' parts arrive */
    tensor_upload_f32(a, mine);
    sent0 = c->sent_bytes;
    CHECK(comm_allgather(c, a) == 0, "all-gather %s n=%zu: %s", dtype_name(dt), n, tp_error_msg());
    tensor_download_f32(a, got);
    bad = 0;
    for (int i = 0; i < p; i++)
        for (size_t e = 0; e < n; e++) bad += got[(size_t)i * n + e] != bf16r(value_of(seed, i, (size_t)i * n + e));
    CHECK(bad == 0, "all-gather %s n=%zu ranks=%d: %zu wrong elements", dtype_name(dt), n, p, bad);
    CHECK(fabs(c->sent_bytes - sent0 - want) < 0.5, "all-gather counted %.1f bytes, the formula S(p-1)/p gives %.1f",
          c->sent_bytes - sent0, want);
    /* all-reduce: 2·S·(p−1)/p */
    sent0 = c->sent_bytes;
    CHECK(comm_allreduce_sum(c, a) == 0, "all-reduce: %s", tp_error_msg());
    CHECK(fabs(c->sent_bytes - sent0 - 2 * want) < 0.5, "all-reduce counted %.1f bytes, the formula 2S(p-1)/p gives %.1f",
          c->sent_bytes - sent0, 2 * want);
    tensor_free(a), tensor_free(b);
    free(mine), free(got);
}

TEST_MPI(comm_alltoall_allgather_and_bytes) {
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_WORLD, be);
    const size_t sizes[] = {1, 3, 1000, 40000};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        exchange_case(c, DT_F32, sizes[k]);
        exchange_case(c, DT_BF16, sizes[k]);
    }
    comm_destroy(c);
    backend_destroy(be);
}

/* The mesh: world = dp x cfg x sp x tp with tp innermost. Each rank checks
 * its coordinates against the formula, and that every sub-group holds
 * exactly the ranks the formula puts in it (their world ranks gathered). */
static void check_group(MPI_Comm c, int want_size, int stride, int first, const char *what, int tp, int sp, int cfg) {
    int size = 0;
    MPI_Comm_size(c, &size);
    CHECK(size == want_size, "%s (tp %d sp %d cfg %d): %d ranks, want %d", what, tp, sp, cfg, size, want_size);
    if (size != want_size) return;
    int me, *all = malloc(sizeof(int) * (size_t)size);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Allgather(&me, 1, MPI_INT, all, 1, MPI_INT, c);
    for (int i = 0; i < size; i++)
        CHECK(all[i] == first + i * stride, "%s (tp %d sp %d cfg %d): member %d is world rank %d, want %d", what, tp, sp,
              cfg, i, all[i], first + i * stride);
    free(all);
}

TEST_MPI(dist_mesh_layout_and_refusals) {
    dist d;
    REQUIRE(dist_init(NULL, NULL, &d) == 0, "%s", tp_error_msg());
    int W = d.world_size, w = d.world_rank;
    for (int cfg = 1; cfg <= 2; cfg++)
        for (int sp = 1; sp <= W; sp++)
            for (int tp = 1; tp <= W; tp++) {
                if (W % (cfg * sp * tp)) continue;
                REQUIRE(dist_set_mesh(&d, tp, sp, cfg) == 0, "tp %d sp %d cfg %d: %s", tp, sp, cfg, tp_error_msg());
                int g = cfg * sp * tp;
                CHECK(d.grp == g && d.dp == W / g && d.dp_rank == w / g && d.grp_rank == w % g, "group of %d", w);
                CHECK(d.tp_rank == w % tp && d.sp_rank == (w / tp) % sp && d.cfg_rank == (w / (tp * sp)) % cfg,
                      "rank %d: tp_rank %d sp_rank %d cfg_rank %d (tp %d sp %d cfg %d)", w, d.tp_rank, d.sp_rank,
                      d.cfg_rank, tp, sp, cfg);
                check_group(d.tp_comm, tp, 1, w - d.tp_rank, "tp group", tp, sp, cfg);
                check_group(d.sp_comm, sp, tp, w - d.sp_rank * tp, "sp group", tp, sp, cfg);
                check_group(d.grp_comm, g, 1, w - d.grp_rank, "job group", tp, sp, cfg);
                check_group(d.dp_comm, W / g, g, d.grp_rank, "dp group", tp, sp, cfg);
                if (cfg == 2) check_group(d.cfg_comm, 2, tp * sp, w - d.cfg_rank * tp * sp, "cfg pair", tp, sp, cfg);
                else CHECK(d.cfg_comm == MPI_COMM_NULL, "no CFG parallelism, but a cfg communicator");
            }
    /* tp 0: what cfg and sp leave */
    if (W % 2 == 0) {
        CHECK(dist_set_mesh(&d, 0, 1, 2) == 0 && d.tp == W / 2, "tp 0 with cfg 2: tp %d", d.tp);
    }
    /* refusals: the same verdict on every rank, naming what fits */
    CHECK(dist_set_mesh(&d, 1, W + 1, 1) != 0 && strstr(tp_error_msg(), "run a multiple of"),
          "sp beyond the world: %s", tp_error_msg());
    CHECK(dist_set_mesh(&d, 0, 1, 3) != 0 && strstr(tp_error_msg(), "must be 1 or 2"), "cfg 3: %s", tp_error_msg());
    if (W == 4) {
        CHECK(dist_set_mesh(&d, 3, 1, 2) != 0 && strstr(tp_error_msg(), "--tp 1, 2 fit"), "cfg 2 x tp 3: %s",
              tp_error_msg());
        CHECK(dist_set_mesh(&d, 2, 3, 1) != 0 && strstr(tp_error_msg(), "groups of 6 ranks"), "sp 3 x tp 2: %s",
              tp_error_msg());
    }
    dist_set_tp(&d, 0);
}
