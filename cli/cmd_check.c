/* `tpgen check`: is the tensor-parallel transformer right?
 *
 *   mpirun -np K tpgen check --model DIR [--cases FILE] [--precision f32|bf16]
 *                            [--tol X] [--backend cpu|cuda] [--seed S] [--unfused]
 *
 * With --cases, every caseK.* group of a safetensors file (hidden_states,
 * encoder_hidden_states, timestep, optional guidance, img_ids, txt_ids,
 * output) is run through the TP forward and compared with caseK.output.
 * Without, seeded random inputs are run through the TP forward and through
 * an unsharded copy of the model on rank 0 (which loads the full weights for
 * this check only). One line per case "caseK rel_err=E", then
 * "max_rel_err=E tol=T PASS|FAIL"; exit 0 iff every case passes. A FLUX.3
 * transformer (config.json's _class_name) goes to cli/check_flux3.c. */
#include "commands.h"
#include "check_rng.h"
#include "check_flux3.h"
#include "core/formats/checkpoint.h"
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "core/formats/lora.h"
#include "core/models/flux2/flux2.h"
#include "core/models/flux3/flux3.h"
#include "core/pipeline.h"
#include "core/formats/safetensors.h"
#include "kernels/ops.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct check_opts {
    const char *model, *cases, *backend;
    const char *outputs, *prefix;   /* expected outputs from another file: <prefix>.caseK.output */
    const char *against;            /* without --cases: the unsharded reference is this model, without adapters */
    lora_spec loras[LORA_MAX_ADAPTERS];
    int n_loras;
    dtype_t precision;
    int quantize_fp8;
    double tol;
    uint64_t seed;
    int unfused;
} check_opts;

typedef struct check_case {
    float *x, *txt, *ref;           /* ref: golden output or NULL */
    int32_t *img_ids, *txt_ids;
    int64_t N, L;
    float timestep, guidance;
    int has_guidance;
} check_case;

static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np K tpgen check --model DIR [--cases FILE] [--precision f32|bf16] [--tol X]\n"
               "                          [--backend cpu|cuda] [--comm mpi|nccl] [--seed S] [--unfused] [--lora FILE[:W]]...\n"
               "                          [--outputs FILE --prefix NAME] [--against DIR] [--quantize fp8]\n"
               "  --model DIR      pipeline folder (with transformer/) or the transformer folder itself\n"
               "  --cases FILE     golden cases (caseK.*); without it, compare with an unsharded run on rank 0\n"
               "  --precision P    f32 (default, reference) or bf16\n"
               "  --tol X          relative L2 tolerance (default 1e-4 for f32, 3e-2 for bf16)\n"
               "  --backend B      cpu, cuda or auto (default auto)\n"
               "  --comm C         mpi, nccl or auto (default: nccl on GPUs, mpi on CPUs); mpi on GPUs stages\n"
               "                   through the host, so several ranks may share one GPU (TPGEN_COMM too)\n"
               "  --seed S         seed of the random inputs (default 0)\n"
               "  --unfused        one all-reduce per stream instead of one per sub-layer\n"
               "  --lora FILE[:W]  merge a LoRA adapter at weight W (default 1) into each rank's shard at load;\n"
               "                   repeatable (docs/lora.md)\n"
               "  --outputs FILE   with --cases: expected outputs from FILE's <NAME>.caseK.output (--prefix NAME)\n"
               "  --against DIR    without --cases: compare with an unsharded run of DIR's transformer on rank 0,\n"
               "                   without the adapters (is a merged checkpoint the same as base + --lora?)\n"
               "  --quantize fp8   quantise the sharded linears to fp8 at load (the unsharded reference too)\n");
}

static int parse_args(int argc, char **argv, check_opts *o) {
    memset(o, 0, sizeof *o);
    o->precision = DT_F32;
    o->tol = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = strcmp(a, "--unfused") != 0;
        if (takes && !v) return tp_error("check: option %s needs a value (see 'tpgen check --help')", a);
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--cases")) o->cases = v;
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--comm")) {   /* read by comm_create (core/dist/comm_mpi.c) */
            if (strcmp(v, "mpi") && strcmp(v, "nccl") && strcmp(v, "auto"))
                return tp_error("check: --comm must be mpi, nccl or auto (got '%s')", v);
            setenv("TPGEN_COMM", v, 1);
        }
        else if (!strcmp(a, "--unfused")) o->unfused = 1;
        else if (!strcmp(a, "--outputs")) o->outputs = v;
        else if (!strcmp(a, "--prefix")) o->prefix = v;
        else if (!strcmp(a, "--against")) o->against = v;
        else if (!strcmp(a, "--lora")) {
            if (o->n_loras == LORA_MAX_ADAPTERS) return tp_error("check: at most %d --lora flags", LORA_MAX_ADAPTERS);
            if (lora_spec_parse(v, &o->loras[o->n_loras])) return -1;
            o->n_loras++;
        } else if (!strcmp(a, "--quantize")) {
            if (strcmp(v, "fp8")) return tp_error("check: --quantize takes fp8 (got '%s')", v);
            o->quantize_fp8 = 1;
        }
        else if (!strcmp(a, "--precision")) {
            if (!strcmp(v, "f32")) o->precision = DT_F32;
            else if (!strcmp(v, "bf16")) o->precision = DT_BF16;
            else return tp_error("check: --precision must be f32 or bf16 (got '%s')", v);
        } else if (!strcmp(a, "--tol")) {
            char *end;
            o->tol = strtod(v, &end);
            if (*end || !(o->tol > 0)) return tp_error("check: --tol must be a positive number (got '%s')", v);
        } else if (!strcmp(a, "--seed")) {
            char *end;
            o->seed = strtoull(v, &end, 10);
            if (*end || !*v) return tp_error("check: --seed must be a non-negative integer (got '%s')", v);
        } else return tp_error("check: unknown option '%s' (see 'tpgen check --help')", a);
        i += takes;
    }
    if (!o->model) return tp_error("check: --model DIR is required (see 'tpgen check --help')");
    if ((o->outputs != NULL) != (o->prefix != NULL) || (o->outputs && !o->cases))
        return tp_error("check: --outputs FILE and --prefix NAME go together, with --cases");
    if (o->against && o->cases)
        return tp_error("check: --against DIR replaces the golden outputs of --cases; give one of them");
    if (o->tol < 0) o->tol = o->precision == DT_F32 ? 1e-4 : 3e-2;
    return 0;
}

/* DIR/transformer when DIR is a pipeline folder, else DIR itself */
static char *transformer_dir(const char *model) {
    char *sub = xasprintf("%s/transformer", model);   /* a BFL transformer/ may have no config.json */
    struct stat s;
    int is_pipeline = stat(sub, &s) == 0 && S_ISDIR(s.st_mode);
    free(sub);
    return is_pipeline ? xasprintf("%s/transformer", model) : xstrdup(model);
}

static void case_free(check_case *c) {
    free(c->x), free(c->txt), free(c->ref), free(c->img_ids), free(c->txt_ids);
    memset(c, 0, sizeof *c);
}

/* ---- golden cases ---- */

static int read_ids(const st_file *f, const char *name, int64_t n, int32_t **out) {
    int64_t *v;
    const st_tensor_info *info;
    if (st_read_i64(f, name, &v, &info)) return -1;
    if (st_numel(info) != n * 4) {
        free(v);
        return tp_error("%s: %s has %lld values, expected %lld x 4", f->path, name, (long long)st_numel(info),
                        (long long)n);
    }
    *out = xmalloc((size_t)n * 4 * sizeof **out);
    for (int64_t i = 0; i < n * 4; i++) (*out)[i] = (int32_t)v[i];
    free(v);
    return 0;
}

static int read_f32(const st_file *f, const char *key, int64_t width, float **out, int64_t *rows) {
    const st_tensor_info *info;
    if (st_read_f32(f, key, out, &info)) return -1;
    int64_t n = st_numel(info);
    if (info->ndim < 1 || info->shape[info->ndim - 1] != width || n % width)
        return tp_error("%s: %s must have last dimension %lld (the model's width)", f->path, key, (long long)width);
    *rows = n / width;
    return 0;
}

static int read_case(const st_file *f, int k, const flux2_config *cfg, check_case *c) {
    char key[64];
    float *t = NULL;
    int64_t rows, one;
#define KEY(s) (snprintf(key, sizeof key, "case%d.%s", k, s), key)
    if (read_f32(f, KEY("hidden_states"), cfg->in_channels, &c->x, &c->N) ||
        read_f32(f, KEY("encoder_hidden_states"), cfg->joint_dim, &c->txt, &c->L) ||
        read_f32(f, KEY("output"), cfg->out_dim, &c->ref, &rows) || read_f32(f, KEY("timestep"), 1, &t, &one) ||
        read_ids(f, KEY("img_ids"), c->N, &c->img_ids) || read_ids(f, KEY("txt_ids"), c->L, &c->txt_ids))
        goto fail;
    if (rows != c->N) {
        tp_error("%s: case%d.output has %lld tokens but hidden_states has %lld", f->path, k, (long long)rows,
                 (long long)c->N);
        goto fail;
    }
    c->timestep = t[0];
    free(t);
    t = NULL;
    if (st_find(f, KEY("guidance"))) {
        if (read_f32(f, key, 1, &t, &one)) goto fail;
        c->guidance = t[0], c->has_guidance = 1;
        free(t);
    }
    return 0;
#undef KEY
fail:
    free(t);
    case_free(c);
    return -1;
}

/* ---- random cases ---- */

static void random_case(const flux2_config *cfg, uint64_t seed, int k, check_case *c) {
    uint64_t s = seed * 1000003u + (uint64_t)k;
    int64_t h = 3 + k, w = 5;
    c->N = h * w, c->L = 7 + 2 * k;
    c->x = xmalloc((size_t)(c->N * cfg->in_channels) * sizeof(float));
    c->txt = xmalloc((size_t)(c->L * cfg->joint_dim) * sizeof(float));
    for (int64_t i = 0; i < c->N * cfg->in_channels; i++) c->x[i] = check_rng_normal(&s);
    for (int64_t i = 0; i < c->L * cfg->joint_dim; i++) c->txt[i] = check_rng_normal(&s);
    c->img_ids = xmalloc((size_t)c->N * 4 * sizeof(int32_t));
    c->txt_ids = xmalloc((size_t)c->L * 4 * sizeof(int32_t));
    flux2_image_ids(h, w, 0, c->img_ids);
    flux2_text_ids(c->L, c->txt_ids);
    c->timestep = (float)check_rng_unit(&s);
    c->guidance = 1.0f + 4.0f * (float)check_rng_unit(&s);
    c->has_guidance = cfg->guidance_embeds;
}

/* ---- running ---- */

static int run_forward(flux2_model *m, const check_case *c, float *out) {
    return flux2_forward(m, c->x, c->N, c->img_ids, c->txt, c->L, c->txt_ids, c->timestep,
                         c->has_guidance ? &c->guidance : NULL, out);
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d, den += (double)b[i] * b[i];
    }
    if (!(num == num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Run one case on every rank; on rank 0 compare with c->ref or with the
 * unsharded model `ref` and return the error in *err. */
static int check_one(flux2_model *m, flux2_model *ref, const dist *d, const check_case *c, double *err) {
    size_t n = (size_t)c->N * (size_t)flux2_get_config(m)->out_dim;
    float *out = xmalloc(n * sizeof *out), *want = c->ref ? c->ref : xmalloc(n * sizeof *want);
    int rc = run_forward(m, c, out);
    if (!rc && ref) rc = run_forward(ref, c, want);
    rc = dist_agree(d->tp_comm, rc);
    if (!rc && d->tp_rank == 0) *err = rel_err(out, want, n);
    free(out);
    if (!c->ref) free(want);
    return rc;
}

static int open_cases(const check_opts *o, const dist *d, st_file **f, int *n_cases) {
    int rc = st_open(o->cases, f);
    *n_cases = 0;
    if (!rc) {
        char key[64];
        while (snprintf(key, sizeof key, "case%d.hidden_states", *n_cases), st_find(*f, key)) (*n_cases)++;
        if (*n_cases == 0) rc = tp_error("%s: no case0.hidden_states: not a transformer cases file", o->cases);
    }
    return dist_agree(d->tp_comm, rc);
}

/* what each rank read and holds: the shard, not the whole model */
static void print_load(const dist *d, const load_stats *ls) {
    double mine[3] = {(double)ls->bytes_read, (double)ls->bytes_held, ls->seconds}, mx[3];
    MPI_Reduce(mine, mx, 3, MPI_DOUBLE, MPI_MAX, 0, d->tp_comm);
    if (d->tp_rank == 0)
        printf("# load: largest rank read %.2f MB and holds %.2f MB of weights (%d tensors, %.2f s)\n", mx[0] / 1e6,
               mx[1] / 1e6, ls->n_tensors, mx[2]);
}

/* a FLUX.3 transformer: golden cases or the unsharded comparison, without
 * the FLUX.2-only options */
static int run_checks_flux3(const check_opts *o, const dist *d, backend *be, comm *c, char *dir) {
    int rc = 0;
    if (o->outputs || o->unfused || o->against)
        rc = dist_agree(d->tp_comm, tp_error("check: %s is a FLUX.3 transformer; --outputs, --against and --unfused are "
                                             "FLUX.2-only so far (with --lora, --cases holds the outputs)", dir));
    rc = rc ? (dist_report_error(d->tp_comm), 1)
            : check_flux3(dir, o->cases, o->precision, o->quantize_fp8, o->loras, o->n_loras, o->tol, o->seed, d, be, c);
    free(dir);
    return rc;
}

static int run_checks(const check_opts *o, const dist *d, backend *be, comm *c) {
    char *dir = transformer_dir(o->model);
    if (flux3_is_transformer_dir(dir)) return run_checks_flux3(o, d, be, c, dir);
    flux2_model *m = NULL, *ref = NULL;
    comm *self = NULL;
    st_file *cases = NULL;
    load_stats ls = {0};
    st_file *outs = NULL;
    flux2_load_extras x = {.loras = o->loras, .n_loras = o->n_loras, .quantize_fp8 = o->quantize_fp8};
    int rc = flux2_load_ex(dir, be, c, o->precision, &x, &m, &ls), n_cases = 2, failed = 0;
    if (!rc && o->outputs) rc = st_open(o->outputs, &outs);
    if (!rc && !o->cases && d->tp_rank == 0) {
        /* --against: another model, without the adapters */
        char *rdir = o->against ? transformer_dir(o->against) : NULL;
        flux2_load_extras rx = {.quantize_fp8 = o->quantize_fp8};
        self = comm_create(MPI_COMM_SELF, be);
        rc = self ? flux2_load_ex(rdir ? rdir : dir, be, self, o->precision, rdir ? &rx : &x, &ref, NULL) : -1;
        if (rc) tp_error_context("unsharded reference on rank 0");
        free(rdir);
    }
    if (dist_agree(d->tp_comm, rc)) { rc = -1; goto done; }   /* every rank reports and exits non-zero */
    print_load(d, &ls);
    if (o->unfused) flux2_set_fused_allreduce(m, 0);
    /* golden outputs are f32 math on unrounded timesteps: compare the bf16
     * compute path on the same inputs (see flux2_set_exact_timestep) */
    if (o->cases && o->precision == DT_BF16) {
        flux2_set_exact_timestep(m, 1);
        if (d->tp_rank == 0) printf("# bf16 against f32 references: timestep and guidance embedded unrounded\n");
    }
    if (o->cases && open_cases(o, d, &cases, &n_cases)) { rc = -1; goto done; }
    double max_err = 0;
    for (int k = 0; k < n_cases; k++) {
        check_case cs = {0};
        if (cases) rc = read_case(cases, k, flux2_get_config(m), &cs);
        else random_case(flux2_get_config(m), o->seed, k, &cs);
        if (!rc && outs) {
            char key[256];
            int64_t rows;
            free(cs.ref);
            cs.ref = NULL;
            snprintf(key, sizeof key, "%s.case%d.output", o->prefix, k);
            rc = read_f32(outs, key, flux2_get_config(m)->out_dim, &cs.ref, &rows);
            if (!rc && rows != cs.N) rc = tp_error("%s: %s has %lld tokens, the case %lld", o->outputs, key,
                                                   (long long)rows, (long long)cs.N);
        }
        double err = 0;
        if (dist_agree(d->tp_comm, rc) || check_one(m, ref, d, &cs, &err)) { rc = -1; case_free(&cs); goto done; }
        case_free(&cs);
        if (d->tp_rank == 0) {
            printf("case%d rel_err=%.3e\n", k, err);
            if (!(err <= o->tol)) failed++;
            if (!(err <= max_err)) max_err = err;
        }
    }
    if (d->tp_rank == 0) {
        printf("max_rel_err=%.3e tol=%g %s\n", max_err, o->tol, failed ? "FAIL" : "PASS");
        fflush(stdout);
        /* a non-finite output: name the weights that hold NaN/Inf */
        if (!isfinite(max_err)) {
            checkpoint *ck = NULL;
            int nb = checkpoint_open(dir, &ck) ? -1 : checkpoint_scan_finite(ck, 1);
            if (nb > 0) printf("# the output is not finite: %d tensor(s) of %s hold NaN/Inf (listed above)\n", nb, dir);
            else if (nb == 0) printf("# the output is not finite, but every weight of %s is finite\n", dir);
            checkpoint_close(ck);
        }
    }
    MPI_Bcast(&failed, 1, MPI_INT, 0, d->tp_comm);
    rc = failed ? 1 : 0;
done:
    if (rc < 0) dist_report_error(d->tp_comm);
    if (cases) st_close(cases);
    if (outs) st_close(outs);
    flux2_free(ref);
    flux2_free(m);
    comm_destroy(self);
    free(dir);
    return rc < 0 ? 1 : rc;
}

int cmd_check(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
    dist d;
    if (dist_init(&argc, &argv, &d)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    check_opts o;
    backend *be = NULL;
    int rc = parse_args(argc, argv, &o);
    if (!rc) rc = backend_select(o.backend, d.local_rank, d.local_size, &be);
    if (dist_agree(d.world, rc)) {
        dist_report_error(d.world);
        backend_destroy(be);
        dist_finalize(&d);
        return 1;
    }
    comm *c = comm_create(d.tp_comm, be);
    if (dist_agree(d.world, c ? 0 : -1)) rc = 1, dist_report_error(d.world);
    else {
        if (d.world_rank == 0)
            printf("# check: tp=%d precision=%s backend=%s %s\n", d.tp, o.precision == DT_F32 ? "f32" : "bf16",
                   be->vt->name, o.cases ? o.cases : "(unsharded reference on rank 0)");
        rc = run_checks(&o, &d, be, c);
    }
    comm_destroy(c);
    backend_destroy(be);
    lora_specs_free(o.loras, o.n_loras);
    dist_finalize(&d);
    return rc;
}
