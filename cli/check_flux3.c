/* `tpgen check` for a FLUX.3 transformer (cmd_check.c dispatches here when
 * the folder's config.json names Flux3Transformer2DModel).
 *
 * With --cases, every caseK group (hidden_states, encoder_hidden_states,
 * timestep, img_ids, txt_ids, optional image_cond_hidden_states +
 * image_cond_ids, target_timestep for flow-map models, output) is run
 * through the TP forward and compared with caseK.output. Without, seeded
 * random inputs (one case without, one with reference tokens) are compared
 * with an unsharded copy of the model on rank 0. Output lines as for
 * FLUX.2: "caseK rel_err=E", then "max_rel_err=E tol=T PASS|FAIL". */
#include "check_flux3.h"
#include "check_rng.h"
#include "core/dist/dist.h"
#include "core/formats/lora.h"
#include "core/formats/safetensors.h"
#include "core/models/flux3/flux3.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct f3_case {
    float *x, *txt, *cond, *ref, ts, tt;
    int32_t *img_ids, *txt_ids, *cond_ids;
    int64_t N, L, R;
} f3_case;

static void case_free(f3_case *c) {
    free(c->x), free(c->txt), free(c->cond), free(c->ref), free(c->img_ids), free(c->txt_ids), free(c->cond_ids);
    memset(c, 0, sizeof *c);
}

/* a float tensor whose last dimension is `width`; its row count in *rows */
static int read_rows(const st_file *f, const char *key, int64_t width, float **out, int64_t *rows) {
    const st_tensor_info *info;
    if (st_read_f32(f, key, out, &info)) return -1;
    int64_t n = st_numel(info);
    if (info->ndim < 1 || info->shape[info->ndim - 1] != width || n % width || n == 0)
        return tp_error("%s: %s must have last dimension %lld (the model's width)", f->path, key, (long long)width);
    *rows = n / width;
    return 0;
}

static int read_ids(const st_file *f, const char *key, int64_t n, int32_t **out) {
    int64_t *v;
    const st_tensor_info *info;
    if (st_read_i64(f, key, &v, &info)) return -1;
    int rc = 0;
    if (st_numel(info) != n * 4)
        rc = tp_error("%s: %s has %lld values, expected %lld x 4", f->path, key, (long long)st_numel(info),
                      (long long)n);
    for (int64_t i = 0; !rc && i < n * 4; i++)
        if (v[i] < -(1 << 24) || v[i] > (1 << 24))   /* positions an f32 holds exactly */
            rc = tp_error("%s: %s holds position %lld, out of range", f->path, key, (long long)v[i]);
    if (!rc) {
        *out = xmalloc((size_t)(n * 4) * sizeof **out);
        for (int64_t i = 0; i < n * 4; i++) (*out)[i] = (int32_t)v[i];
    }
    free(v);
    return rc;
}

static int read_scalar(const st_file *f, const char *key, float *out) {
    float *t;
    int64_t n;
    if (read_rows(f, key, 1, &t, &n)) return -1;
    *out = t[0];
    free(t);
    return n == 1 ? 0 : tp_error("%s: %s must hold one value (batch 1)", f->path, key);
}

static int read_case(const st_file *f, int k, const flux3_config *cfg, f3_case *c) {
    char key[64];
    int64_t rows;
#define KEY(s) (snprintf(key, sizeof key, "case%d.%s", k, s), key)
    if (read_rows(f, KEY("hidden_states"), cfg->in_channels, &c->x, &c->N) ||
        read_rows(f, KEY("encoder_hidden_states"), cfg->joint_dim, &c->txt, &c->L) ||
        read_rows(f, KEY("output"), cfg->in_channels, &c->ref, &rows) || read_scalar(f, KEY("timestep"), &c->ts) ||
        read_ids(f, KEY("img_ids"), c->N, &c->img_ids) || read_ids(f, KEY("txt_ids"), c->L, &c->txt_ids))
        goto fail;
    if (rows != c->N) {
        tp_error("%s: case%d.output has %lld tokens but hidden_states has %lld", f->path, k, (long long)rows,
                 (long long)c->N);
        goto fail;
    }
    if (st_find(f, KEY("image_cond_hidden_states")) &&
        (read_rows(f, key, cfg->cond_in_channels, &c->cond, &c->R) || read_ids(f, KEY("image_cond_ids"), c->R, &c->cond_ids)))
        goto fail;
    if (cfg->flow_map && read_scalar(f, KEY("target_timestep"), &c->tt)) goto fail;
    if (!cfg->flow_map && st_find(f, KEY("target_timestep"))) {
        tp_error("%s: %s is given but the model is not a flow map (flow_map false): the cases are of another model",
                 f->path, key);
        goto fail;
    }
#undef KEY
    return 0;
fail:
    case_free(c);
    return -1;
}

/* ---- random cases ---- */

static float *normals(uint64_t *s, int64_t n) {
    float *v = xmalloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = check_rng_normal(s);
    return v;
}

/* (t, h, w, l) of an h x w grid: t = t0, l = l0 */
static int32_t *grid_ids(int64_t h, int64_t w, int t0, int l0) {
    int32_t *ids = xmalloc((size_t)(h * w * 4) * sizeof *ids);
    for (int64_t i = 0; i < h * w; i++)
        ids[4 * i] = t0, ids[4 * i + 1] = (int32_t)(i / w), ids[4 * i + 2] = (int32_t)(i % w), ids[4 * i + 3] = l0;
    return ids;
}

/* case k: an image of (3+k) x 5 tokens, 7 + 2k text tokens; odd k with a
 * 2 x 3 reference at l = -1 */
static void random_case(const flux3_config *cfg, uint64_t seed, int k, f3_case *c) {
    uint64_t s = seed * 1000003u + (uint64_t)k;
    int64_t h = 3 + k, w = 5;
    c->N = h * w, c->L = 7 + 2 * k, c->R = k % 2 ? 6 : 0;
    c->x = normals(&s, c->N * cfg->in_channels);
    c->txt = normals(&s, c->L * cfg->joint_dim);
    c->img_ids = grid_ids(h, w, 0, 0);
    c->txt_ids = xmalloc((size_t)(c->L * 4) * sizeof *c->txt_ids);
    for (int64_t i = 0; i < c->L; i++) c->txt_ids[4 * i] = c->txt_ids[4 * i + 1] = c->txt_ids[4 * i + 2] = 0,
                                       c->txt_ids[4 * i + 3] = (int32_t)i;
    if (c->R) c->cond = normals(&s, c->R * cfg->cond_in_channels), c->cond_ids = grid_ids(2, 3, 10, -1);
    c->ts = (float)check_rng_unit(&s);
    c->tt = c->ts * (float)check_rng_unit(&s);
}

/* ---- running ---- */

static int forward(flux3_model *m, const f3_case *c, float *out) {
    flux3_inputs in = {.x = c->x, .img_ids = c->img_ids, .N = c->N, .txt = c->txt, .txt_ids = c->txt_ids, .L = c->L,
                       .cond = c->cond, .cond_ids = c->cond_ids, .R = c->R, .timestep = c->ts,
                       .target_timestep = flux3_get_config(m)->flow_map ? &c->tt : NULL};
    return flux3_forward(m, &in, out);
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

static int count_cases(const char *path, const dist *d, st_file **f, int *n) {
    int rc = st_open(path, f);
    *n = 0;
    if (!rc) {
        char key[64];
        while (snprintf(key, sizeof key, "case%d.hidden_states", *n), st_find(*f, key)) (*n)++;
        if (*n == 0) rc = tp_error("%s: no case0.hidden_states: not a transformer cases file", path);
    }
    return dist_agree(d->tp_comm, rc);
}

/* rank 0: the adapter bytes (A/B pieces + alphas) each rank read */
static void print_lora_bytes(const lora_set *ls, const dist *d) {
    for (int i = 0; i < LORA_MAX_ADAPTERS && i < (ls ? ls->n : 0); i++) {
        unsigned long long mine = ls->ad[i].bytes_read + ls->ad[i].bytes_alpha;
        unsigned long long *all = xcalloc((size_t)d->tp, sizeof *all);
        MPI_Gather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all, 1, MPI_UNSIGNED_LONG_LONG, 0, d->tp_comm);
        if (d->tp_rank == 0) {
            printf("# lora %s: bytes read per rank", ls->ad[i].path);
            for (int r = 0; r < d->tp; r++) printf(" %llu", all[r]);
            printf("\n");
        }
        free(all);
    }
}

int check_flux3(const char *dir, const char *cases_path, dtype_t precision, int quantize_fp8,
                const lora_spec *loras, int n_loras, double tol, uint64_t seed, const dist *d, backend *be,
                comm *c) {
    lora_set *ls = NULL;
    flux3_load_extras x = {.quantize_fp8 = quantize_fp8, .loras = loras, .n_loras = n_loras, .lora_set_out = &ls};
    flux3_load_extras xref = {.quantize_fp8 = quantize_fp8, .loras = loras, .n_loras = n_loras};
    flux3_model *m = NULL, *ref = NULL;
    comm *self = NULL;
    st_file *cases = NULL;
    int rc = flux3_load_ex(dir, be, c, precision, &x, &m, NULL), n_cases = 2, failed = 0;
    if (!rc && !cases_path && d->tp_rank == 0) {
        self = comm_create(MPI_COMM_SELF, be);
        rc = self ? flux3_load_ex(dir, be, self, precision, &xref, &ref, NULL) : -1;
        if (rc) tp_error_context("unsharded reference on rank 0");
    }
    if (dist_agree(d->tp_comm, rc) || (cases_path && count_cases(cases_path, d, &cases, &n_cases))) {
        rc = -1;
        goto done;
    }
    print_lora_bytes(ls, d);
    if (d->tp_rank == 0)
        printf("# FLUX.3 transformer%s\n", flux3_get_config(m)->flow_map ? " (flow map)" : "");
    if (cases_path && precision == DT_BF16) {   /* as for FLUX.2: measure the compute path, not the input rounding */
        flux3_set_exact_timestep(m, 1);
        if (d->tp_rank == 0) printf("# bf16 against f32 references: timesteps embedded unrounded\n");
    }
    const flux3_config *cfg = flux3_get_config(m);
    double max_err = 0;
    for (int k = 0; k < n_cases; k++) {
        f3_case cs = {0};
        if (cases) rc = read_case(cases, k, cfg, &cs);
        else random_case(cfg, seed, k, &cs);
        size_t n = (size_t)cs.N * (size_t)cfg->in_channels;
        float *out = rc ? NULL : xmalloc(n * sizeof *out), *want = cs.ref;
        if (!rc) rc = forward(m, &cs, out);
        if (!rc && ref) rc = forward(ref, &cs, want = xmalloc(n * sizeof *want));
        double err = 0;
        rc = dist_agree(d->tp_comm, rc);
        if (!rc && d->tp_rank == 0) err = rel_err(out, want, n);
        free(out);
        if (want != cs.ref) free(want);
        case_free(&cs);
        if (rc) { rc = -1; goto done; }
        if (d->tp_rank == 0) {
            printf("case%d rel_err=%.3e\n", k, err);
            if (!(err <= tol)) failed++;
            if (!(err <= max_err)) max_err = err;
        }
    }
    if (d->tp_rank == 0) {
        printf("max_rel_err=%.3e tol=%g %s\n", max_err, tol, failed ? "FAIL" : "PASS");
        fflush(stdout);
    }
    MPI_Bcast(&failed, 1, MPI_INT, 0, d->tp_comm);
    rc = failed ? 1 : 0;
done:
    if (rc < 0) dist_report_error(d->tp_comm);
    if (cases) st_close(cases);
    lora_set_free(ls);
    flux3_free(ref);
    flux3_free(m);
    comm_destroy(self);
    return rc < 0 ? 1 : rc;
}
