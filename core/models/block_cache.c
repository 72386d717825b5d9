/* Block caching, the wrapper around the block loops (block_cache.h;
 * docs/spec/block-cache.md). The cache state lives on the host in f32: the
 * Fn residual of the last computed step, the Mn residual (or its TaylorSeer
 * ladder). The stream crosses to the host three times per group and call
 * (block_cache_run): small next to the blocks a cached step skips, and the
 * same code on every backend. */
#include "block_cache.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the decision (spec §3), pure ---- */

double bc_threshold(const bc_spec *s, int g) {
    return g == BC_SINGLE && s->threshold_single >= 0 ? s->threshold_single : s->threshold;
}

int bc_decide(const bc_spec *s, double thr, const bc_counts *c, int step, double *code) {
    *code = NAN;
    if (step < s->warmup) return BC_COMPUTE;                                    /* 1. warmup */
    if (s->max_cached >= 0 && c->n_cached >= s->max_cached) return BC_COMPUTE;  /* 3. max_cached */
    if (s->max_continuous >= 0 && c->cont >= s->max_continuous) return BC_COMPUTE;   /* 4. max_continuous */
    if (thr <= 0) return BC_COMPUTE;                                            /* 6. */
    if (!c->have_prev) return BC_COMPUTE;                                       /* 7. no reference yet */
    if (thr >= 1.0) return *code = -1, BC_CACHE;                                /* 8. */
    if (!c->same_shape) return *code = -2, BC_COMPUTE;                          /* 9. */
    return BC_MEASURE;                                                          /* 10. diff < thr */
}

double bc_ratio(double sum_absdiff, double sum_absprev, int64_t count, MPI_Comm sp) {
    /* Sequence parallelism: the ranks of an SP group hold different token
     * rows, so their sums and counts add up over sp (in f64, the same
     * reduction on every rank: the same ratio everywhere). Tensor
     * parallelism needs nothing: every TP rank holds the whole stream. */
    double v[3] = {sum_absdiff, sum_absprev, (double)count};
    if (sp != MPI_COMM_NULL && MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_DOUBLE, MPI_SUM, sp) != MPI_SUCCESS) return NAN;
    if (v[2] <= 0) return NAN;
    double a = v[0] / v[2], d = v[1] / v[2];
    return a / d;
}

/* ---- TaylorSeer (spec §5) ---- */

static void taylor_reset(bc_taylor *t, int k, int64_t n) {
    if (t->n != n || t->k != k) {
        free(t->dy);
        t->dy = xmalloc((size_t)(k + 1) * (size_t)n * sizeof *t->dy);
    }
    t->k = k, t->n = n, t->levels = 0, t->last = -1;
}

void bc_taylor_update(bc_taylor *t, const float *y, int64_t n, int step) {
    if (t->n != n || !t->dy) taylor_reset(t, t->k, n);
    /* a derivative forms from step 3 on (the calibrator's counter starts
     * one step late), level i+1 only where the old ladder had level i */
    int deriv = t->last >= 0 && step >= 3;
    int levels = deriv ? 1 + (t->levels < t->k ? t->levels : t->k) : 1;
    float w = (float)(step - t->last);
    for (int64_t j = 0; j < n; j++) {
        float nv = y[j];
        for (int i = 0; i + 1 < levels; i++) {
            float old = t->dy[(size_t)i * n + j];
            t->dy[(size_t)i * n + j] = nv;
            nv = (nv - old) / w;
        }
        t->dy[(size_t)(levels - 1) * n + j] = nv;
    }
    t->levels = levels, t->last = step;
}

void bc_taylor_approx(const bc_taylor *t, int step, float *out) {
    float e = (float)(step - t->last), c[3] = {1.0f, 1.0f, 0.5f};
    memcpy(out, t->dy, (size_t)t->n * sizeof *out);
    for (int i = 1; i < t->levels; i++) {
        float ei = i == 1 ? e : e * e;   /* e^i, an exact small integer */
        const float *d = t->dy + (size_t)i * t->n;
        for (int64_t j = 0; j < t->n; j++) out[j] = out[j] + (c[i] * d[j]) * ei;
    }
}

/* ---- state ---- */

typedef struct bc_state {
    int n_cached, last_cached, cont;
    float *fn_prev;              /* the Fn residual of the last computed step */
    int64_t fn_n;                /* its element count (0 also on a rank whose SP slice has no measured row) */
    int have_prev;               /* a computed step stored it (the same on every rank of the group) */
    float *res;                  /* the Mn residual of the last computed step (no TaylorSeer) */
    int64_t res_n;
    bc_taylor taylor;
} bc_state;

struct block_cache {
    bc_spec spec;
    MPI_Comm agree, sp;
    int step, branch;
    bc_state st[BC_GROUPS][BC_BRANCHES];
    bc_log log;
    float *probe, *before, *cur;   /* scratch: the Fn input rows, the Mn input, the stream */
    int64_t probe_cap, before_cap, cur_cap;
    uint64_t bytes;                /* the most host memory held (state and scratch) */
};

block_cache *block_cache_new(const bc_spec *s, int steps, int branches, MPI_Comm agree, MPI_Comm sp) {
    if (!s || !s->on) return NULL;
    block_cache *bc = xcalloc(1, sizeof *bc);
    bc->spec = *s, bc->agree = agree, bc->sp = sp;
    bc->log.steps = steps, bc->log.branches = branches;
    for (int b = 0; b < branches; b++)
        for (int g = 0; g < BC_GROUPS; g++) {
            bc->log.dec[b][g] = xcalloc((size_t)steps + 1, 1);
            memset(bc->log.dec[b][g], '-', (size_t)steps);
            bc->log.diff[b][g] = xmalloc((size_t)steps * sizeof(double));
            for (int i = 0; i < steps; i++) bc->log.diff[b][g][i] = NAN;
            bc->st[g][b].last_cached = -2;
            bc->st[g][b].taylor.k = s->taylorseer, bc->st[g][b].taylor.last = -1;
        }
    return bc;
}

int block_cache_share_branches(block_cache *bc, MPI_Comm cfg) {
    if (!bc || cfg == MPI_COMM_NULL || bc->log.branches < 2) return 0;
    int r, n = bc->log.steps;
    MPI_Comm_rank(cfg, &r);
    int ok = 1;
    for (int g = 0; g < BC_GROUPS; g++) {
        ok &= MPI_Sendrecv(bc->log.dec[r][g], n, MPI_CHAR, 1 - r, 0, bc->log.dec[1 - r][g], n, MPI_CHAR, 1 - r, 0, cfg,
                           MPI_STATUS_IGNORE) == MPI_SUCCESS;
        ok &= MPI_Sendrecv(bc->log.diff[r][g], n, MPI_DOUBLE, 1 - r, 1, bc->log.diff[1 - r][g], n, MPI_DOUBLE, 1 - r, 1,
                           cfg, MPI_STATUS_IGNORE) == MPI_SUCCESS;
    }
    int dis = bc->log.disagreements;
    ok &= MPI_Allreduce(&dis, &bc->log.disagreements, 1, MPI_INT, MPI_SUM, cfg) == MPI_SUCCESS;
    return ok ? 0 : tp_error("block cache: exchanging the CFG halves' records failed");
}

void bc_log_free(bc_log *l) {
    for (int b = 0; b < BC_BRANCHES; b++)
        for (int g = 0; g < BC_GROUPS; g++) free(l->dec[b][g]), free(l->diff[b][g]);
    memset(l, 0, sizeof *l);
}

int bc_log_cached(const bc_log *l, int g) {
    int n = 0;
    for (int b = 0; b < l->branches; b++)
        for (const char *p = l->dec[b][g]; p && *p; p++) n += *p == 'K';
    return n;
}

void block_cache_free(block_cache *bc) {
    if (!bc) return;
    for (int g = 0; g < BC_GROUPS; g++)
        for (int b = 0; b < BC_BRANCHES; b++) {
            bc_state *s = &bc->st[g][b];
            free(s->fn_prev), free(s->res), free(s->taylor.dy);
        }
    free(bc->probe), free(bc->before), free(bc->cur);
    bc_log_free(&bc->log);
    free(bc);
}

void block_cache_call(block_cache *bc, int step, int branch) {
    if (bc) bc->step = step, bc->branch = branch;
}

void block_cache_take_log(block_cache *bc, bc_log *out) {
    *out = bc->log;
    out->peak_bytes = bc->bytes;
    memset(&bc->log, 0, sizeof bc->log);
}

/* scratch buffers grow to the largest stream seen */
static float *grow(float **p, int64_t *cap, int64_t n) {
    if (n > *cap) {
        *p = xrealloc(*p, (size_t)n * sizeof **p);
        *cap = n;
    }
    return *p;
}

static uint64_t state_bytes(const block_cache *bc) {
    uint64_t n = 0;
    for (int g = 0; g < BC_GROUPS; g++)
        for (int b = 0; b < BC_BRANCHES; b++) {
            const bc_state *s = &bc->st[g][b];
            n += (uint64_t)(s->fn_n + s->res_n) * sizeof(float);
            if (s->taylor.dy) n += (uint64_t)(s->taylor.k + 1) * (uint64_t)s->taylor.n * sizeof(float);
        }
    return n;
}

/* ---- the group run (spec §2) ---- */

static int run_range(bc_block_fn run, void *ctx, int from, int to) {
    for (int i = from; i < to; i++)
        if (run(ctx, i)) return -1;
    return 0;
}

/* a - b into out, rounded to bf16 when the stream is bf16 (the tensor
 * arithmetic of the reference) */
static void sub(float *out, const float *a, const float *b, int64_t n, int bf16) {
    for (int64_t i = 0; i < n; i++) out[i] = bf16 ? bf16r(a[i] - b[i]) : a[i] - b[i];
}

/* The decision of this step for state s with the Fn residual r [n]:
 * decided on every rank from the same replicated values, then agreed. */
static int decide(block_cache *bc, int g, bc_state *s, const float *r, int64_t n, int64_t xn, int *cache) {
    double thr = bc_threshold(&bc->spec, g), diff;
    bc_counts c = {.n_cached = s->n_cached, .cont = s->cont, .have_prev = s->have_prev, .same_shape = s->fn_n == n};
    int d = bc_decide(&bc->spec, thr, &c, bc->step, &diff);
    if (d == BC_MEASURE) {
        double sa = 0, sd = 0;
        for (int64_t i = 0; i < n; i++) sa += fabs((double)s->fn_prev[i] - r[i]), sd += fabs((double)s->fn_prev[i]);
        diff = bc_ratio(sa, sd, n, bc->sp);
        d = diff < thr ? BC_CACHE : BC_COMPUTE;   /* strict '<' */
    }
    /* threshold >= 1 caches without comparing shapes: a stored residual of
     * another size cannot be added, so that step computes */
    int64_t held = bc->spec.taylorseer ? s->taylor.n : s->res_n;
    if (d == BC_CACHE && held != xn) d = BC_COMPUTE;
    /* Every rank of a TP group holds the same stream after the block's
     * all-reduce, and the ranks of an SP group share one ratio (bc_ratio),
     * so every rank computed the same d. The agreement below makes that a
     * guarantee, not an assumption: if the ranks ever differ (a backend
     * that all-reduces in another order per rank), all of them compute,
     * and the run goes on in lockstep (the next collective would otherwise
     * hang). Over the TP group first, then over the SP positions: each
     * TP rank's SP group then sees the same TP-agreed values. The two
     * halves of CFG parallelism keep apart, as the serial run's two
     * branches do. */
    MPI_Comm over[2] = {bc->agree, bc->sp};
    for (int k = 0; k < 2; k++) {
        if (over[k] == MPI_COMM_NULL) continue;
        int v[2] = {d, -d};
        if (MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MAX, over[k]) != MPI_SUCCESS)
            return tp_error("block cache: agreeing on the decision failed");
        if (v[0] != -v[1]) d = BC_COMPUTE, bc->log.disagreements++;
    }
    int b = bc->branch, st = bc->step;
    if (st >= 0 && st < bc->log.steps && b < bc->log.branches) {
        bc->log.dec[b][g][st] = d == BC_CACHE ? 'K' : 'C';
        bc->log.diff[b][g][st] = diff;
    }
    *cache = d == BC_CACHE;
    return 0;
}

/* a cached step: h (the stream after the Fn blocks, read back) += the Mn
 * residual or its forecast, written back to x */
static int apply_cached(block_cache *bc, bc_state *s, tensor *x, float *h, int64_t n, int bf16) {
    const float *res = s->res;
    if (bc->spec.taylorseer) {
        float *f = grow(&bc->before, &bc->before_cap, n);
        bc_taylor_approx(&s->taylor, bc->step, f);
        res = f;
    }
    for (int64_t i = 0; i < n; i++) h[i] = bf16 ? bf16r(h[i] + res[i]) : h[i] + res[i];
    return tensor_upload_f32(x, h);
}

/* a computed step: run the middle blocks on x (h: x as it is now, read
 * back) and keep their residual */
static int run_middle(block_cache *bc, bc_state *s, tensor *x, int64_t n, int bf16, int from, int to,
                      bc_block_fn run, void *ctx) {
    /* the stream read back after the Fn blocks is the middle's input: keep it, read the output into the other buffer */
    float *before = bc->cur;
    int64_t cap = bc->cur_cap;
    bc->cur = bc->before, bc->cur_cap = bc->before_cap;
    bc->before = before, bc->before_cap = cap;
    float *cur = grow(&bc->cur, &bc->cur_cap, n);
    if (run_range(run, ctx, from, to) || tensor_download_f32(x, cur)) return -1;
    if (bc->spec.taylorseer) {   /* the residual feeds the ladder, which is all TaylorSeer keeps */
        sub(cur, cur, before, n, bf16);
        bc_taylor_update(&s->taylor, cur, n, bc->step);
        return 0;
    }
    if (s->res_n != n) {
        s->res = xrealloc(s->res, (size_t)n * sizeof *s->res);
        s->res_n = n;
    }
    sub(s->res, cur, before, n, bf16);
    return 0;
}

/* The group (spec §2). Per call the stream crosses to the host three times:
 * the measured rows before the Fn blocks, the whole stream after them (the
 * Fn residual's rows are part of it), and the middle's output on a computed
 * step, or the stream plus the residual back on a cached one. */
int block_cache_run(block_cache *bc, int g, int n, tensor *x, int64_t r0, int64_t rows, bc_block_fn run, void *ctx) {
    if (!bc) return run_range(run, ctx, 0, n);
    const bc_spec *sp = &bc->spec;
    bc_state *s = &bc->st[g][bc->branch];
    int bf16 = x->dtype == DT_BF16, cache = 0;
    /* a step after a computed one breaks the streak */
    if (!(s->n_cached && s->last_cached == bc->step - 1)) s->cont = 0;
    tensor probe = tensor_rows(x, r0, rows);
    int64_t pn = rows * x->cols, xn = (int64_t)tensor_numel(x);
    float *x0 = grow(&bc->probe, &bc->probe_cap, 2 * pn), *r = x0 + pn;
    float *h = grow(&bc->cur, &bc->cur_cap, xn);
    if (tensor_download_f32(&probe, x0) || run_range(run, ctx, 0, sp->fn) || tensor_download_f32(x, h)) return -1;
    sub(r, h + r0 * x->cols, x0, pn, bf16);
    if (decide(bc, g, s, r, pn, xn, &cache)) return -1;
    if (cache) {
        s->n_cached++, s->last_cached = bc->step, s->cont++;
        if (apply_cached(bc, s, x, h, xn, bf16)) return -1;
    } else {
        if (s->fn_n != pn) {   /* the reference is refreshed on computed steps only */
            s->fn_prev = xrealloc(s->fn_prev, (size_t)pn * sizeof *s->fn_prev);
            s->fn_n = pn;
        }
        memcpy(s->fn_prev, r, (size_t)pn * sizeof *r);
        s->have_prev = 1;
        if (run_middle(bc, s, x, xn, bf16, sp->fn, n - sp->bn, run, ctx)) return -1;
    }
    uint64_t held = state_bytes(bc) + (uint64_t)(bc->probe_cap + bc->before_cap + bc->cur_cap) * sizeof(float);
    if (held > bc->bytes) bc->bytes = held;
    return run_range(run, ctx, n - sp->bn, n);
}
