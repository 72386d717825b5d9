/* `tpgen bench forward`: one FLUX.2 transformer forward with klein-4B widths
 * (D 3072, 24 heads x 128, Jt 7680) but few blocks, random weights made in
 * memory, under mpirun for tp > 1. Reports per precision: time per forward,
 * achieved GFLOP/s, GEMM time against plain OpenBLAS sgemm of exactly the
 * same shapes, and the share of time in all-reduce and attention, with
 * fused (one all-reduce per sub-layer) and unfused all-reduces. */
#include "core/models/flux2/flux2_impl.h"
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "core/formats/fp8.h"
#include "kernels/quant.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_gemm_qdot.h"
#include <cblas.h>
#include <omp.h>
#include <time.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench_opts {
    int n_img, n_txt, n_double, n_single, iters, warmup, prec_mask;
    int no_baseline;            /* --sgemm-baseline 0: skip the plain-sgemm comparison (slow at large shapes) */
    int sp;                     /* --sp S: Ulysses sequence parallelism, tp = ranks / S */
    int dev;                    /* --widths dev: FLUX.2-dev's widths (D 6144, 48 heads, Jt 15360) */
    int fp8;                    /* --quantize fp8: the block linears as E4M3 + per-row scales */
    int qtype;                  /* --quantize Q8_0/Q4_K/...: the block linears as random ggml blocks (-1: none) */
    int gemm_only;              /* --gemm-only R: no forward; the block linears' GEMMs alone, R rounds (see gemm_only) */
    const char *backend;
} bench_opts;

typedef struct gemm_shapes { int64_t (*s)[3]; int n, cap; } gemm_shapes;

static void log_shape(void *ctx, int64_t m, int64_t n, int64_t k) {
    gemm_shapes *g = ctx;
    if (g->n == g->cap) g->s = xrealloc(g->s, (size_t)(g->cap = g->cap ? 2 * g->cap : 64) * sizeof *g->s);
    g->s[g->n][0] = m, g->s[g->n][1] = n, g->s[g->n][2] = k;
    g->n++;
}

static int parse(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.n_img = 1024, .n_txt = 128, .n_double = 2, .n_single = 2, .iters = 2, .warmup = 1,
                      .prec_mask = 3, .qtype = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!v) return tp_error("bench forward: option %s needs a value", a);
        i++;
        if (!strcmp(a, "--image-tokens")) o->n_img = atoi(v);
        else if (!strcmp(a, "--text-tokens")) o->n_txt = atoi(v);
        else if (!strcmp(a, "--double")) o->n_double = atoi(v);
        else if (!strcmp(a, "--single")) o->n_single = atoi(v);
        else if (!strcmp(a, "--iters")) o->iters = atoi(v);
        else if (!strcmp(a, "--warmup")) o->warmup = atoi(v);
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--gemm-only")) o->gemm_only = atoi(v);
        else if (!strcmp(a, "--sp")) o->sp = atoi(v);
        else if (!strcmp(a, "--sgemm-baseline")) o->no_baseline = !atoi(v);
        else if (!strcmp(a, "--widths")) {
            if (strcmp(v, "klein-4b") && strcmp(v, "dev")) return tp_error("bench forward: --widths klein-4b|dev (got '%s')", v);
            o->dev = !strcmp(v, "dev");
        }
        else if (!strcmp(a, "--quantize")) {
            for (int id = 0; id < 64 && o->qtype < 0; id++)
                if (quant_supported(id) && quant_type_get(id)->block > 1 && !strcmp(v, quant_type_name(id))) o->qtype = id;
            if (strcmp(v, "fp8") && o->qtype < 0)
                return tp_error("bench forward: --quantize takes fp8 or a ggml block type (%s; got '%s')",
                                quant_supported_list(), v);
            o->fp8 = o->qtype < 0;
        }
        else if (!strcmp(a, "--precision"))
            o->prec_mask = !strcmp(v, "f32") ? 1 : !strcmp(v, "bf16") ? 2 : !strcmp(v, "both") ? 3 : 0;
        else return tp_error("bench forward: unknown option '%s'", a);
    }
    if (o->n_img < 1 || o->n_txt < 1 || o->n_double < 0 || o->n_single < 0 || o->iters < 1 || o->warmup < 0 ||
        !o->prec_mask)
        return tp_error("bench forward: token counts and --iters must be positive, --precision f32|bf16|both");
    return 0;
}

static flux2_config klein4b_widths(const bench_opts *o) {
    flux2_config c = {.patch_size = 1, .in_channels = 128, .out_channels = 128, .num_layers = o->n_double,
                      .num_single_layers = o->n_single, .head_dim = 128, .heads = 24, .joint_dim = 7680,
                      .time_channels = 256, .mlp_ratio = 3.0, .n_axes = 4, .axes_dims = {32, 32, 32, 32},
                      .rope_theta = 2000, .eps = 1e-6f, .guidance_embeds = 0};
    c.D = 3072, c.M = 9216, c.out_dim = 128;
    if (o->dev) c.heads = 48, c.joint_dim = 15360, c.D = 6144, c.M = 18432;   /* FLUX.2-dev */
    return c;
}

/* Seconds for plain sgemm (row-major y = x wᵀ) over the logged shapes. */
static double sgemm_seconds(const gemm_shapes *g) {
    size_t mx = 0, wx = 0, yx = 0;
    for (int i = 0; i < g->n; i++) {
        size_t m = (size_t)g->s[i][0], n = (size_t)g->s[i][1], k = (size_t)g->s[i][2];
        if (m * k > mx) mx = m * k;
        if (n * k > wx) wx = n * k;
        if (m * n > yx) yx = m * n;
    }
    float *x = xmalloc(mx * 4), *w = xmalloc(wx * 4), *y = xmalloc(yx * 4);
    for (size_t i = 0; i < mx; i++) x[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < wx; i++) w[i] = (float)(i % 5) * 0.1f;
    double t0 = MPI_Wtime();
    for (int i = 0; i < g->n; i++) {
        int m = (int)g->s[i][0], n = (int)g->s[i][1], k = (int)g->s[i][2];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
    }
    double t = MPI_Wtime() - t0;
    free(x), free(w), free(y);
    return t;
}

/* max over ranks of a per-rank value */
static double max_all(const dist *d, double v) {
    double r;
    MPI_Allreduce(&v, &r, 1, MPI_DOUBLE, MPI_MAX, d->grp_comm);
    return r;
}

/* mean over ranks of a per-rank value */
static double mean_all(const dist *d, double v) {
    double r;
    MPI_Allreduce(&v, &r, 1, MPI_DOUBLE, MPI_SUM, d->grp_comm);
    return r / d->grp;
}

typedef struct bench_inputs { float *x, *txt, *out; int32_t *img_ids, *txt_ids; int64_t N, L; } bench_inputs;

static void inputs_make(const bench_opts *o, int64_t Jt, bench_inputs *in) {
    int64_t N = in->N = o->n_img, L = in->L = o->n_txt;
    in->x = xmalloc((size_t)(N * 128) * 4), in->txt = xmalloc((size_t)(L * Jt) * 4);
    in->out = xmalloc((size_t)(N * 128) * 4);
    in->img_ids = xcalloc((size_t)N * 4, 4), in->txt_ids = xcalloc((size_t)L * 4, 4);
    for (int64_t i = 0; i < N * 128; i++) in->x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int64_t i = 0; i < L * Jt; i++) in->txt[i] = (float)((i * 13) % 97) / 48.0f - 1.0f;
    int side = 1;
    while ((side + 1) * (side + 1) <= N) side++;
    for (int64_t i = 0; i < N; i++) in->img_ids[i * 4 + 1] = (int32_t)(i / side), in->img_ids[i * 4 + 2] = (int32_t)(i % side);
    for (int64_t l = 0; l < L; l++) in->txt_ids[l * 4 + 3] = (int32_t)l;
}

static void inputs_free(bench_inputs *in) {
    free(in->x), free(in->txt), free(in->out), free(in->img_ids), free(in->txt_ids);
}

/* Run warmup + iters forwards; *best gets the counters of the fastest
 * iteration (max time over ranks decides), which is the least disturbed
 * by other load on a shared machine. */
/* bytes this rank sends in collectives (kernels/comm.h's ring formulas), per forward in the report */
static double g_sent;
static double sent_bytes(const flux2_model *m) {
    return (m->comm ? m->comm->sent_bytes : 0) + (m->sp_comm ? m->sp_comm->sent_bytes : 0);
}

static int timed_forwards(const bench_opts *o, const dist *d, flux2_model *m, bench_inputs *in, gemm_shapes *shapes,
                          flux2_stats *best) {
    double best_t = 1e300;
    for (int it = 0; it < o->warmup + o->iters; it++) {
        flux2_reset_stats(m);
        m->gemm_log = (shapes && it == o->warmup) ? log_shape : NULL;
        m->gemm_log_ctx = shapes;
        MPI_Barrier(d->grp_comm);
        double sent0 = sent_bytes(m);
        int rc = flux2_forward(m, in->x, in->N, in->img_ids, in->txt, in->L, in->txt_ids, 0.5f, NULL, in->out);
        double sent = sent_bytes(m) - sent0;
        if (dist_agree(d->grp_comm, rc)) return -1;
        flux2_stats s;
        flux2_get_stats(m, &s);
        double t = max_all(d, s.seconds);
        if (it >= o->warmup && t < best_t) best_t = t, *best = s, g_sent = sent;
    }
    m->gemm_log = NULL;
    return 0;
}

static int g_fp8, g_qtype = -1;   /* the report's label */
static void report(const dist *d, dtype_t prec, int fused, const flux2_stats *s, const gemm_shapes *shapes) {
    double t = max_all(d, s->seconds), ar = mean_all(d, s->allreduce_seconds);
    double at = mean_all(d, s->attention_seconds), gt = mean_all(d, s->gemm_seconds);
    double flops = s->gemm_flops + s->attention_flops, all_flops;
    MPI_Allreduce(&flops, &all_flops, 1, MPI_DOUBLE, MPI_SUM, d->grp_comm);
    /* baseline: the fastest of two passes of plain sgemm over the same shapes */
    double sg = 0;
    if (shapes) {
        double a = sgemm_seconds(shapes), b = sgemm_seconds(shapes);
        sg = mean_all(d, a < b ? a : b);
    }
    if (d->grp_rank) return;
    char label[32];
    snprintf(label, sizeof label, "%s%s%s", prec == DT_F32 ? "f32" : "bf16",
             g_fp8 ? "+fp8w" : g_qtype >= 0 ? "+" : "", g_qtype >= 0 ? quant_type_name(g_qtype) : "");
    printf("%-4s tp=%d sp=%d %-7s %8.3f s/forward %8.1f GFLOP/s (all ranks)  all-reduce %5.1f%% (%ld calls, %.1f MB)"
           "  attention %5.1f%%  gemm %5.1f%%  sent %.2f MB/rank\n",
           label, d->tp, d->sp, fused ? "fused" : "unfused", t, all_flops / t * 1e-9, 100 * ar / t,
           s->allreduces, s->allreduce_bytes / 1e6, 100 * at / t, 100 * gt / t, g_sent / 1e6);
    if (shapes)
        printf("     gemm: %.3f s in the forward (%.1f GFLOP/s per rank) vs %.3f s plain OpenBLAS sgemm of the same %d "
               "shapes (%.1f GFLOP/s): efficiency %.0f%%\n",
               gt, s->gemm_flops / gt * 1e-9, sg, shapes->n, s->gemm_flops / sg * 1e-9, 100 * sg / gt);
    fflush(stdout);
}

/* The all-reduce pattern of one double-block sub-layer alone: one call on
 * the joint [S, D] partial (fused) against two calls on the text [L, D] and
 * image [N, D] row ranges (unfused); best of `reps` each, in seconds. */
static int allreduce_pattern(const dist *d, backend *be, comm *c, dtype_t dt, int64_t N, int64_t L, int64_t D,
                             double *fused, double *unfused) {
    tensor *t = tensor_new(be, dt, N + L, D);
    if (dist_agree(d->grp_comm, t ? 0 : -1)) return -1;
    be->vt->memset0(be, t->data, tensor_nbytes(t));
    tensor txt = tensor_rows(t, 0, L), img = tensor_rows(t, L, N);
    *fused = *unfused = 1e300;
    int rc = 0;
    for (int rep = 0; rep < 10 && !rc; rep++) {
        MPI_Barrier(d->grp_comm);
        double t0 = MPI_Wtime();
        rc |= comm_allreduce_sum(c, t);
        be_sync(be);
        double t1 = MPI_Wtime();
        MPI_Barrier(d->grp_comm);
        double t2 = MPI_Wtime();
        rc |= comm_allreduce_sum(c, &img);
        rc |= comm_allreduce_sum(c, &txt);
        be_sync(be);
        double t3 = MPI_Wtime();
        if (t1 - t0 < *fused) *fused = t1 - t0;
        if (t3 - t2 < *unfused) *unfused = t3 - t2;
    }
    tensor_free(t);
    *fused = max_all(d, *fused), *unfused = max_all(d, *unfused);
    return dist_agree(d->grp_comm, rc);
}

/* --quantize Q4_K etc.: a block linear becomes a DT_GGML weight of random
 * valid blocks (random bytes, small finite f16 scales at the type's scale
 * fields), whole local rows, as a GGUF shard is held; its values are not a
 * quantisation of the random weights (the speed does not depend on them). */
static int ggml_randomize(tensor *t, int qtype, uint64_t seed) {
    static const struct { int type, off[2]; } k_scales[] = {
        {QUANT_Q4_0, {0, -1}}, {QUANT_Q4_1, {0, 2}}, {QUANT_Q5_0, {0, -1}}, {QUANT_Q5_1, {0, 2}},
        {QUANT_Q8_0, {0, -1}}, {QUANT_IQ4_NL, {0, -1}}, {QUANT_Q2_K, {80, 82}}, {QUANT_Q3_K, {108, -1}},
        {QUANT_Q4_K, {0, 2}}, {QUANT_Q5_K, {0, 2}}, {QUANT_Q6_K, {208, -1}}, {QUANT_IQ4_XS, {0, -1}},
    };
    const quant_type *qt = quant_type_get(qtype);
    int64_t pitch = quant_row_bytes(qt, t->cols);
    if (pitch < 0 || t->be->kind != BACKEND_CPU)
        return tp_error("bench forward: %s weights need rows of whole %d-blocks on the CPU backend (got %lld columns)",
                        qt->name, qt->block, (long long)t->cols);
    size_t n = (size_t)(t->rows * pitch);
    uint8_t *b = be_alloc(t->be, n ? n : 1);
    if (!b) return -1;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) x ^= x << 13, x ^= x >> 7, x ^= x << 17, b[i] = (uint8_t)(x >> 24);
    for (size_t k = 0; k < sizeof k_scales / sizeof k_scales[0]; k++) {
        if (k_scales[k].type != qtype) continue;
        for (size_t j = 0; j < n / (size_t)qt->bytes; j++)
            for (int f = 0; f < 2 && k_scales[k].off[f] >= 0; f++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                uint16_t h = f32_to_f16((0.002f + 0.01f * (float)(x % 1000) / 1000.0f) * (x & 1024 ? -1.0f : 1.0f));
                memcpy(b + j * (size_t)qt->bytes + k_scales[k].off[f], &h, 2);
            }
    }
    if (t->owner && t->data) be_free(t->be, t->data);
    t->data = b;
    t->dtype = DT_GGML;
    t->qtype = qtype;
    t->qpitch = pitch;
    t->n_qseg = 1;
    t->qseg[0] = (tensor_qseg){0, t->cols, 0, 0};
    t->owner = 1;
    return 0;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --gemm-only R (with --quantize T, a ggml type; CPU backend, tp 1): the
 * GEMMs of the block linears at klein-4B widths (1 double block: qkv, out,
 * MLP in/out for M = image and M = text tokens; 1 single block: qkv+MLP and
 * out for M = both), bf16 activations, on one thread timed with the process
 * CPU clock (so that other jobs on a shared machine change the figure little).
 * Each shape runs bf16 weights (the default bf16 route), T weights on the
 * int8-dot kernel and T weights dequantised in the packing, one after the
 * other, R rounds, best per shape; totals are sums of the bests. */
static int gemm_only(const bench_opts *o, backend *be) {
    const int64_t D = 3072, F = 9216, Ni = o->n_img, Nt = o->n_txt;
    const int64_t sh[][3] = {{Ni, 3 * D, D}, {Ni, D, D}, {Ni, 2 * F, D}, {Ni, D, F}, {Nt, 3 * D, D}, {Nt, D, D},
                             {Nt, 2 * F, D}, {Nt, D, F}, {Ni + Nt, 3 * D + 2 * F, D}, {Ni + Nt, D, D + F}};
    const int ns = (int)(sizeof sh / sizeof sh[0]);
    const char *name[3] = {"bf16", "int8", "dequant"};
    double tot[3] = {0, 0, 0}, flops = 0;
    cpu_set_threads(1);
    for (int i = 0; i < ns; i++) {
        int64_t M = sh[i][0], N = sh[i][1], K = sh[i][2];
        tensor *x = tensor_new(be, DT_BF16, M, K), *y = tensor_new(be, DT_BF16, M, N);
        tensor *wb = tensor_new(be, DT_BF16, N, K), *wq = tensor_new(be, DT_BF16, N, K);
        if (!x || !y || !wb || !wq || ggml_randomize(wq, o->qtype, 5 + (uint64_t)i)) return -1;
        uint16_t *xd = x->data, *wd = wb->data;
        uint64_t r = 99 + (uint64_t)i;
        for (int64_t j = 0; j < M * K; j++) r ^= r << 13, r ^= r >> 7, r ^= r << 17, xd[j] = f32_to_bf16((float)(r % 2001) / 1000.0f - 1);
        for (int64_t j = 0; j < N * K; j++) r ^= r << 13, r ^= r >> 7, r ^= r << 17, wd[j] = f32_to_bf16(((float)(r % 2001) / 1000.0f - 1) * 0.02f);
        double best[3] = {1e300, 1e300, 1e300};
        for (int rep = 0; rep < o->gemm_only + 1; rep++)   /* the first round warms up */
            for (int v = 0; v < 3; v++) {
                cpu_gemm_qdot_policy(v == 2 ? -1 : 0);
                double t0 = cpu_now();
                op_gemm(be, y, x, v ? wq : wb, NULL);
                double t = cpu_now() - t0;
                if (rep && t < best[v]) best[v] = t;
            }
        cpu_gemm_qdot_policy(0);
        double f = 2.0 * (double)M * (double)N * (double)K;
        flops += f;
        printf("  gemm %5lld x %5lld x %5lld:", (long long)M, (long long)N, (long long)K);
        for (int v = 0; v < 3; v++) printf("  %s %6.1f GFLOP/s", name[v], f / best[v] / 1e9), tot[v] += best[v];
        printf("  int8 / bf16 %.2fx\n", best[0] / best[1]);
        tensor_free(x), tensor_free(y), tensor_free(wb), tensor_free(wq);
    }
    printf("bf16+%s gemm-only (1 thread, CPU time, best of %d): bf16 %.3f s (%.1f GFLOP/s), %s int8 %.3f s (%.1f GFLOP/s, "
           "%.2fx bf16), %s dequantised %.3f s (%.1f GFLOP/s, %.2fx bf16); int8 kernel %s\n", quant_type_name(o->qtype),
           o->gemm_only, tot[0], flops / tot[0] / 1e9, quant_type_name(o->qtype), tot[1], flops / tot[1] / 1e9,
           tot[0] / tot[1], quant_type_name(o->qtype), tot[2], flops / tot[2] / 1e9, tot[0] / tot[2],
           cpu_gemm_qdot_kernel());
    return 0;
}

static int run_one(const bench_opts *o, const dist *d, backend *be, comm *c, comm *spc, dtype_t prec) {
    flux2_config cfg = klein4b_widths(o);
    flux2_model *m;
    size_t before = be->bytes_in_use;
    be->peak_bytes = be->bytes_in_use;
    if (dist_agree(d->grp_comm, flux2_init_random(&cfg, be, c, prec, 1234, &m))) return -1;
    if (dist_agree(d->grp_comm, flux2_set_sp(m, spc))) return flux2_free(m), -1;
    if (o->qtype >= 0) {   /* the block linears as a GGUF file stores them (the _K_M recipes quantise all of them) */
        int qrc = 0;
        uint64_t seed = 77 + (uint64_t)d->tp_rank;
        for (int i = 0; i < cfg.num_layers && !qrc; i++) {
            flux2_double_w *b = &m->dbl[i];
            const tensor *l[] = {b->to_q, b->to_k, b->to_v, b->to_out, b->add_q, b->add_k, b->add_v, b->to_add_out,
                                 b->ff_in, b->ff_out, b->ffc_in, b->ffc_out};
            for (size_t j = 0; j < sizeof l / sizeof l[0] && !qrc; j++) qrc = ggml_randomize((tensor *)l[j], o->qtype, seed++);
        }
        for (int i = 0; i < cfg.num_single_layers && !qrc; i++)
            qrc = ggml_randomize((tensor *)m->sgl[i].qkv_mlp, o->qtype, seed++) ||
                  ggml_randomize((tensor *)m->sgl[i].to_out, o->qtype, seed++);
        if (dist_agree(d->grp_comm, qrc)) return flux2_free(m), -1;
    }
    if (o->fp8) {   /* the linears a mixed fp8 file stores in fp8 (--quantize fp8's choice) */
        int qrc = 0;
        for (int i = 0; i < cfg.num_layers && !qrc; i++) {
            flux2_double_w *b = &m->dbl[i];
            const tensor *l[] = {b->to_q, b->to_k, b->to_v, b->to_out, b->add_q, b->add_k, b->add_v, b->to_add_out,
                                 b->ff_in, b->ff_out, b->ffc_in, b->ffc_out};
            for (size_t j = 0; j < sizeof l / sizeof l[0] && !qrc; j++) qrc = fp8_quantize_tensor((tensor *)l[j], "double-block linear");
        }
        for (int i = 0; i < cfg.num_single_layers && !qrc; i++)
            qrc = fp8_quantize_tensor((tensor *)m->sgl[i].qkv_mlp, "qkv_mlp") ||
                  fp8_quantize_tensor((tensor *)m->sgl[i].to_out, "to_out");
        if (dist_agree(d->grp_comm, qrc)) return flux2_free(m), -1;
    }
    double weights_mb = (double)(be->bytes_in_use - before) / 1e6;
    flux2_set_profiling(m, 1);
    g_fp8 = o->fp8;
    g_qtype = o->qtype;
    bench_inputs in;
    inputs_make(o, cfg.joint_dim, &in);
    gemm_shapes shapes = {0};
    flux2_stats s = {0};
    int rc = 0;
    for (int fused = 1; fused >= (d->tp > 1 ? 0 : 1) && !rc; fused--) {
        flux2_set_fused_allreduce(m, fused);
        rc = timed_forwards(o, d, m, &in, fused ? &shapes : NULL, &s);
        /* the sgemm baseline is host OpenBLAS: meaningful for the CPU backend only */
        if (!rc) report(d, prec, fused, &s, fused && be->kind == BACKEND_CPU && !o->no_baseline ? &shapes : NULL);
    }
    /* the NaN/Inf checks the generate path adds (core/pipeline.c once per
     * step on the [N, 128] latents, core/models/llm/textenc.c once per prompt on
     * [L, 7680] embeddings), against this forward: best of 20 each */
    if (!rc && d->grp_rank == 0) {
        double best_lat = 1e300, best_txt = 1e300;
        int64_t sink = 0;
        for (int r = 0; r < 20; r++) {
            double t0 = MPI_Wtime();
            sink += first_nonfinite_f32(in.x, (size_t)in.N * 128);
            double t1 = MPI_Wtime();
            sink += first_nonfinite_f32(in.txt, (size_t)in.L * 7680);
            double t2 = MPI_Wtime();
            if (t1 - t0 < best_lat) best_lat = t1 - t0;
            if (t2 - t1 < best_txt) best_txt = t2 - t1;
        }
        printf("     finiteness checks: latents [%lld, 128] %.3f ms = %.4f%% of this forward (once per step); "
               "embeddings [%lld, 7680] %.3f ms (once per prompt)%s\n", (long long)in.N, best_lat * 1e3,
               100 * best_lat / s.seconds, (long long)in.L, best_txt * 1e3, sink == -40 ? "" : " (non-finite input?)");
    }
    double mem[2] = {weights_mb, (double)(be->peak_bytes - before) / 1e6}, mx[2];
    MPI_Reduce(mem, mx, 2, MPI_DOUBLE, MPI_MAX, 0, d->grp_comm);
    if (!rc && d->grp_rank == 0)
        printf("     memory per rank (largest): weights %.0f MB, peak with activations %.0f MB\n", mx[0], mx[1]);
    double fu, un;
    if (!rc && d->tp > 1 && !allreduce_pattern(d, be, c, prec, in.N, in.L, cfg.D, &fu, &un) && d->grp_rank == 0)
        printf("     all-reduce of one sub-layer's partials alone (best of 10): fused %.3f ms (1 call, [%lld, %lld]) "
               "vs unfused %.3f ms (2 calls)\n", fu * 1e3, (long long)(in.N + in.L), (long long)cfg.D, un * 1e3);
    free(shapes.s);
    inputs_free(&in);
    flux2_free(m);
    return rc;
}

int bench_forward(int argc, char **argv) {
    dist d;
    if (dist_init(&argc, &argv, &d)) return fprintf(stderr, "tpgen: error: %s\n", tp_error_msg()), 1;
    bench_opts o;
    backend *be = NULL;
    int rc = parse(argc, argv, &o);
    if (rc == 1) {
        if (d.world_rank == 0)
            printf("usage: mpirun -np TP tpgen bench forward [--precision f32|bf16|both] [--image-tokens 1024]\n"
                   "       [--text-tokens 128] [--double 2] [--single 2] [--iters 2] [--warmup 1] [--backend cpu|cuda]\n"
                   "       [--quantize fp8|Q8_0|Q4_K|Q6_K|...] [--sp S] [--widths klein-4b|dev]\n"
                   "  --sgemm-baseline 0  skip the plain OpenBLAS sgemm comparison\n"
                   "  --sp S         Ulysses sequence parallelism over S ranks (tp = ranks / S)\n"
                   "  --widths dev   FLUX.2-dev's widths (D 6144, 48 heads, Jt 15360) instead of klein-4B's\n"
                   "  --quantize T   the block linears as fp8 (E4M3 + per-row scales) or as random ggml blocks of type T\n"
                   "                 (GGUF weights: bf16 runs on the int8-dot kernel, f32 runs decoded in the GEMM's packing)\n"
                   "  --gemm-only R  with --quantize T, tp 1: no forward; the block linears' GEMMs alone on one thread, CPU\n"
                   "                 time, bf16 weights vs T on the int8 kernel vs T dequantised, best of R rounds\n");
        dist_finalize(&d);
        return 0;
    }
    if (!rc) rc = backend_select(o.backend, d.local_rank, d.local_size, &be);
    if (!rc && o.sp > 1) rc = dist_set_mesh(&d, 0, o.sp, 1);   /* tp = world / sp: the TP groups inside the SP group */
    comm *c = rc ? NULL : comm_create(d.tp_comm, be), *spc = !rc && o.sp > 1 ? comm_create(d.sp_comm, be) : NULL;
    if (dist_agree(d.world, rc || !c || (o.sp > 1 && !spc) ? -1 : 0)) {
        dist_report_error(d.world);
        rc = 1;
    } else {
        if (d.world_rank == 0)
            printf("# bench forward: %s widths (D %d, %d heads x 128, Jt %d), %d double + %d single blocks, "
                   "%d image + %d text tokens, random weights, backend %s (%d threads/rank), tp %d x sp %d\n",
                   o.dev ? "FLUX.2-dev" : "klein-4B", o.dev ? 6144 : 3072, o.dev ? 48 : 24, o.dev ? 15360 : 7680,
                   o.n_double, o.n_single, o.n_img, o.n_txt, be->vt->name, be->threads, d.tp, d.sp);
        if (o.gemm_only > 0) {
            if (o.qtype < 0 || d.tp != 1 || be->kind != BACKEND_CPU) {
                tp_error("bench forward: --gemm-only needs --quantize with a ggml block type, tp 1 and the CPU backend");
                rc = 1;
            } else rc = gemm_only(&o, be) ? 1 : 0;
        } else
        for (int p = 0; p < 2 && !rc; p++)
            if (o.prec_mask & (1 << p)) rc = run_one(&o, &d, be, c, spc, p ? DT_BF16 : DT_F32) ? 1 : 0;
        if (rc) dist_report_error(d.grp_comm);
    }
    comm_destroy(c);
    if (spc) comm_destroy(spc);
    backend_destroy(be);
    dist_finalize(&d);
    return rc;
}
