/* `tpgen bench forward3`: one FLUX.3 transformer forward at the default
 * widths (D 3072 = 24 heads x 128, joint dim 20480, in/cond 128) with few
 * blocks, random weights made in memory, under mpirun for tp > 1. Reports
 * per precision the time per forward (best of --iters, max over ranks),
 * the achieved GFLOP/s of all ranks and the all-reduce share. Compare with
 * `tpgen bench forward` (FLUX.2, klein-4B widths) at the same token counts;
 * unlike FLUX.2 this forward recomputes the context projection each time. */
#include "core/models/flux3/flux3.h"
#include "core/dist/dist.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench3_opts {
    int n_img, n_txt, n_ref, n_mode, n_single, iters, warmup, prec_mask, flow_map;
    const char *backend;
} bench3_opts;

static int parse(int argc, char **argv, bench3_opts *o) {
    *o = (bench3_opts){.n_img = 1024, .n_txt = 128, .n_mode = 2, .n_single = 2, .iters = 2, .warmup = 1,
                       .prec_mask = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!strcmp(a, "--flow-map")) { o->flow_map = 1; continue; }
        if (!v) return tp_error("bench forward3: option %s is unknown or needs a value (see --help)", a);
        i++;
        if (!strcmp(a, "--image-tokens")) o->n_img = atoi(v);
        else if (!strcmp(a, "--text-tokens")) o->n_txt = atoi(v);
        else if (!strcmp(a, "--ref-tokens")) o->n_ref = atoi(v);
        else if (!strcmp(a, "--mode")) o->n_mode = atoi(v);
        else if (!strcmp(a, "--single")) o->n_single = atoi(v);
        else if (!strcmp(a, "--iters")) o->iters = atoi(v);
        else if (!strcmp(a, "--warmup")) o->warmup = atoi(v);
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--precision"))
            o->prec_mask = !strcmp(v, "f32") ? 1 : !strcmp(v, "bf16") ? 2 : !strcmp(v, "both") ? 3 : 0;
        else return tp_error("bench forward3: unknown option '%s'", a);
    }
    if (o->n_img < 1 || o->n_txt < 1 || o->n_ref < 0 || o->n_mode < 0 || o->n_single < 0 || o->iters < 1 ||
        o->warmup < 0 || !o->prec_mask || o->n_img > (1 << 20) || o->n_txt > (1 << 20) || o->n_ref > (1 << 20))
        return tp_error("bench forward3: token counts and --iters must be positive (at most 2^20 tokens), "
                        "--precision f32|bf16|both");
    return 0;
}

static flux3_config default_widths(const bench3_opts *o) {
    flux3_config c = {.in_channels = 128, .cond_in_channels = 128, .num_layers = o->n_mode,
                      .num_single_layers = o->n_single, .head_dim = 128, .heads = 24, .joint_dim = 20480,
                      .time_channels = 256, .mlp_ratio = 3.0, .n_axes = 4, .axes_dims = {32, 32, 32, 32},
                      .rope_theta = 10000, .eps = 1e-6f, .flow_map = o->flow_map};
    c.D = 3072, c.M = 9216;
    return c;
}

/* deterministic inputs: an image grid, text positions on l, references at (10, h, w, -1) */
static float *ramp(int64_t n, int mul, int mod) {
    float *v = xmalloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (float)((i * mul) % mod) / (float)(mod / 2) - 1.0f;
    return v;
}

static int32_t *grid(int64_t n, int t, int l) {
    int side = 1;
    while ((int64_t)(side + 1) * (side + 1) <= n) side++;
    int32_t *ids = xcalloc((size_t)n * 4, sizeof *ids);
    for (int64_t i = 0; i < n; i++) ids[4 * i] = t, ids[4 * i + 1] = (int32_t)(i / side),
                                     ids[4 * i + 2] = (int32_t)(i % side), ids[4 * i + 3] = l;
    return ids;
}

static double max_all(const dist *d, double v) {
    double r;
    MPI_Allreduce(&v, &r, 1, MPI_DOUBLE, MPI_MAX, d->tp_comm);
    return r;
}

static int run_one(const bench3_opts *o, const dist *d, backend *be, comm *c, dtype_t prec) {
    flux3_config cfg = default_widths(o);
    flux3_model *m = NULL;
    size_t before = be->bytes_in_use;
    be->peak_bytes = be->bytes_in_use;
    if (dist_agree(d->tp_comm, flux3_init_random(&cfg, be, c, prec, 1234, &m))) return -1;
    double weights_mb = (double)(be->bytes_in_use - before) / 1e6;
    int64_t N = o->n_img, L = o->n_txt, R = o->n_ref;
    float tt = 0.25f, *out = xmalloc((size_t)(N * 128) * sizeof *out);
    float *x = ramp(N * 128, 37, 101), *txt = ramp(L * 20480, 13, 97), *cond = R ? ramp(R * 128, 29, 89) : NULL;
    int32_t *img_ids = grid(N, 0, 0), *cond_ids = R ? grid(R, 10, -1) : NULL, *txt_ids = xcalloc((size_t)L * 4, 4);
    for (int64_t i = 0; i < L; i++) txt_ids[4 * i + 3] = (int32_t)i;
    flux3_inputs in = {.x = x, .img_ids = img_ids, .N = N, .txt = txt, .txt_ids = txt_ids, .L = L, .cond = cond,
                       .cond_ids = cond_ids, .R = R, .timestep = 0.5f, .target_timestep = o->flow_map ? &tt : NULL};
    double best = 1e300;
    flux3_stats s = {0};
    int rc = 0;
    for (int it = 0; it < o->warmup + o->iters && !rc; it++) {
        flux3_reset_stats(m);
        MPI_Barrier(d->tp_comm);
        rc = dist_agree(d->tp_comm, flux3_forward(m, &in, out));
        flux3_stats si;
        flux3_get_stats(m, &si);
        double t = rc ? 0 : max_all(d, si.seconds);
        if (!rc && it >= o->warmup && t < best) best = t, s = si;
    }
    if (!rc) {
        double flops = s.gemm_flops + s.attention_flops, all, ar = max_all(d, s.allreduce_seconds);
        double mem[2] = {weights_mb, (double)(be->peak_bytes - before) / 1e6}, mx[2];
        MPI_Allreduce(&flops, &all, 1, MPI_DOUBLE, MPI_SUM, d->tp_comm);
        MPI_Allreduce(mem, mx, 2, MPI_DOUBLE, MPI_MAX, d->tp_comm);
        if (d->tp_rank == 0)
            printf("%-4s tp=%d %8.3f s/forward %8.1f GFLOP/s (all ranks, %.1f GFLOP)  all-reduce %5.1f%% (%ld calls, "
                   "%.1f MB)  weights %.0f MB/rank, peak %.0f MB/rank\n",
                   prec == DT_F32 ? "f32" : "bf16", d->tp, best, all / best * 1e-9, all * 1e-9, 100 * ar / best,
                   s.allreduces, s.allreduce_bytes / 1e6, mx[0], mx[1]);
        fflush(stdout);
    }
    free(out), free(x), free(txt), free(cond), free(img_ids), free(cond_ids), free(txt_ids);
    flux3_free(m);
    return rc;
}

int bench_forward3(int argc, char **argv) {
    dist d;
    if (dist_init(&argc, &argv, &d)) return fprintf(stderr, "tpgen: error: %s\n", tp_error_msg()), 1;
    bench3_opts o;
    backend *be = NULL;
    int rc = parse(argc, argv, &o);
    if (rc == 1) {
        if (d.world_rank == 0)
            printf("usage: mpirun -np TP tpgen bench forward3 [--precision f32|bf16|both] [--image-tokens 1024]\n"
                   "       [--text-tokens 128] [--ref-tokens 0] [--mode 2] [--single 2] [--flow-map] [--iters 2]\n"
                   "       [--warmup 1] [--backend cpu|cuda]\n");
        dist_finalize(&d);
        return 0;
    }
    if (!rc) rc = backend_select(o.backend, d.local_rank, d.local_size, &be);
    comm *c = rc ? NULL : comm_create(d.tp_comm, be);
    if (dist_agree(d.world, rc || !c ? -1 : 0)) {
        dist_report_error(d.world);
        rc = 1;
    } else {
        if (d.world_rank == 0)
            printf("# bench forward3: FLUX.3 widths (D 3072, 24 heads x 128, joint dim 20480), %d mode blocks per mode "
                   "+ %d single blocks%s, %d image + %d text + %d reference tokens, random weights, backend %s "
                   "(%d threads/rank), tp %d\n", o.n_mode, o.n_single, o.flow_map ? ", flow map" : "", o.n_img,
                   o.n_txt, o.n_ref, be->vt->name, be->threads, d.tp);
        for (int p = 0; p < 2 && !rc; p++)
            if (o.prec_mask & (1 << p)) rc = run_one(&o, &d, be, c, p ? DT_BF16 : DT_F32) ? 1 : 0;
        if (rc) dist_report_error(d.tp_comm);
    }
    comm_destroy(c);
    backend_destroy(be);
    dist_finalize(&d);
    return rc;
}
