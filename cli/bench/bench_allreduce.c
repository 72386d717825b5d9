/* `tpgen bench allreduce`: bandwidth of the communicator's in-place sum
 * (MPI on CPU ranks, NCCL on GPUs) for message sizes 1 KB .. 64 MB, f32 and
 * bf16, in the style of nccl-tests: time per call, algorithm bandwidth
 * (bytes / time) and bus bandwidth (algbw * 2(n-1)/n, comparable across
 * rank counts). Each size is also checked: every rank contributes rank+1,
 * so every element must come back as n(n+1)/2 (exact in bf16 while that
 * is at most 256, i.e. up to 22 ranks); the "wrong" column counts misses. */
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t min_bytes, max_bytes;
    int iters;            /* 0: automatic, about 256 MB moved per size */
    int f32, bf16;
    const char *backend;
} ar_opts;

static int usage(int rank, int rc) {
    if (rank == 0)
        fprintf(rc ? stderr : stdout,
                "usage: mpirun -np N tpgen bench allreduce [--min BYTES] [--max BYTES] [--iters N]\n"
                "                                          [--dtype f32|bf16|both] [--backend cpu|cuda|auto]\n"
                "  All-reduce (sum) bandwidth over all ranks, sizes from --min to --max (default 1K..64M,\n"
                "  x4 steps; K/M suffixes allowed). Prints time per call, algbw and busbw in GB/s.\n");
    return rc;
}

static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) return -1;
    if (*end == 'K' || *end == 'k') v *= 1024, end++;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024, end++;
    if (*end) return -1;
    *out = (size_t)v;
    return 0;
}

static int parse(int argc, char **argv, ar_opts *o) {
    *o = (ar_opts){.min_bytes = 1024, .max_bytes = 64u << 20, .f32 = 1, .bf16 = 1, .backend = "cpu"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!v) return tp_error("bench allreduce: option '%s' is unknown or needs a value", a);
        i++;
        if (!strcmp(a, "--min")) { if (parse_size(v, &o->min_bytes)) return tp_error("bench allreduce: bad --min '%s'", v); }
        else if (!strcmp(a, "--max")) { if (parse_size(v, &o->max_bytes)) return tp_error("bench allreduce: bad --max '%s'", v); }
        else if (!strcmp(a, "--iters")) { o->iters = atoi(v); if (o->iters <= 0) return tp_error("bench allreduce: --iters must be positive"); }
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--dtype")) {
            o->f32 = !strcmp(v, "f32") || !strcmp(v, "both");
            o->bf16 = !strcmp(v, "bf16") || !strcmp(v, "both");
            if (!o->f32 && !o->bf16) return tp_error("bench allreduce: --dtype must be f32, bf16 or both, not '%s'", v);
        } else return tp_error("bench allreduce: unknown option '%s' (see --help)", a);
    }
    if (o->min_bytes > o->max_bytes) return tp_error("bench allreduce: --min is larger than --max");
    return 0;
}

/* one message size: returns seconds per call, *wrong = elements off */
static int run_size(comm *c, dtype_t dt, size_t n, int iters, double *sec, long *wrong) {
    tensor *t = tensor_new(c->be, dt, 1, (int64_t)n);
    float *host = malloc(n * sizeof(float));
    int rc = t && host ? 0 : -1;
    if (!host) tp_error("bench allreduce: out of host memory for %zu elements", n);
    if (!rc) {
        for (size_t i = 0; i < n; i++) host[i] = (float)(c->rank + 1);
        rc = tensor_upload_f32(t, host) || comm_allreduce_sum(c, t) || be_sync(c->be) ? -1 : 0; /* warm-up + check */
    }
    *wrong = 0;
    if (!rc && !(rc = tensor_download_f32(t, host))) {
        float want = (float)c->size * (c->size + 1) / 2;
        for (size_t i = 0; i < n; i++) *wrong += host[i] != want;
    }
    if (dist_agree(c->mpi, rc)) { tensor_free(t); free(host); return -1; }
    MPI_Barrier(c->mpi);
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters && !rc; k++) rc = comm_allreduce_sum(c, t);
    if (!rc) rc = be_sync(c->be);
    double el = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &el, 1, MPI_DOUBLE, MPI_MAX, c->mpi); /* the slowest rank sets the pace */
    MPI_Allreduce(MPI_IN_PLACE, wrong, 1, MPI_LONG, MPI_SUM, c->mpi);
    *sec = el / iters;
    tensor_free(t);
    free(host);
    return dist_agree(c->mpi, rc);
}

int bench_allreduce(int argc, char **argv) {
    dist d;
    if (dist_init(&argc, &argv, &d)) { fprintf(stderr, "tpgen: error: %s\n", tp_error_msg()); return 1; }
    ar_opts o;
    int prc = parse(argc, argv, &o);
    if (prc) {
        if (prc < 0 && d.world_rank == 0) fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        dist_finalize(&d);
        return usage(d.world_rank, prc < 0 ? 2 : 0);
    }
    backend *be = NULL;
    int rc = dist_agree(d.world, backend_select(o.backend, d.local_rank, d.local_size, &be));
    comm *c = rc ? NULL : comm_create(d.world, be);
    rc = dist_agree(d.world, rc || c ? 0 : -1);
    if (!rc && d.world_rank == 0) {
        printf("# all-reduce (sum, in place), %d ranks, communicator %s, backend %s\n", d.world_size, c->vt->name,
               be->vt->name);
        printf("%6s %12s %12s %12s %12s %8s\n", "dtype", "bytes", "time (us)", "algbw GB/s", "busbw GB/s", "wrong");
    }
    const dtype_t dts[2] = {DT_F32, DT_BF16};
    for (int di = 0; di < 2 && !rc; di++) {
        if ((di == 0 && !o.f32) || (di == 1 && !o.bf16)) continue;
        size_t es = dtype_size(dts[di]);
        for (size_t bytes = o.min_bytes; bytes <= o.max_bytes && !rc; bytes *= 4) {
            size_t n = bytes / es ? bytes / es : 1;
            int iters = o.iters ? o.iters : (int)((256u << 20) / (n * es));
            iters = iters < 5 ? 5 : iters > 1000 ? 1000 : iters;
            double sec;
            long wrong;
            rc = run_size(c, dts[di], n, iters, &sec, &wrong);
            if (!rc && d.world_rank == 0) {
                double alg = (double)(n * es) / sec * 1e-9, bus = alg * 2.0 * (d.world_size - 1) / d.world_size;
                printf("%6s %12zu %12.1f %12.3f %12.3f %8ld\n", dts[di] == DT_F32 ? "f32" : "bf16", n * es, sec * 1e6,
                       alg, bus, wrong);
                fflush(stdout);
            }
            if (bytes > SIZE_MAX / 4) break;
        }
    }
    if (rc) dist_report_error(d.world);
    comm_destroy(c);
    backend_destroy(be);
    dist_finalize(&d);
    return rc ? 1 : 0;
}
