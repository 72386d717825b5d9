/* The shared sampling loop (sampler.h). */
#include "sampler.h"
#include "core/dist/dist.h"
#include "core/dist/watchdog.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "kernels/tensor.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

/* v = vn + gs·(v − vn), with a rounding after each op in bf16 */
static void apply_cfg(float *v, const float *vn, size_t n, float gs, int bf16) {
    for (size_t i = 0; i < n; i++) {
        if (bf16) v[i] = bf16r(vn[i] + bf16r(gs * bf16r(v[i] - vn[i])));
        else v[i] = vn[i] + gs * (v[i] - vn[i]);
    }
}

static void euler_step(float *x, const float *v, size_t n, float dt, int bf16) {
    for (size_t i = 0; i < n; i++) {
        if (bf16) x[i] = bf16r(x[i] + bf16r(dt * v[i]));
        else x[i] = x[i] + dt * v[i];
    }
}

/* NaN/Inf never recovers and would decode to a black image: stop at the step
 * it appears (every rank holds the same latents, so all ranks fail here
 * together) */
static int check_finite(const float *x, size_t n, int C, int step, int steps) {
    int64_t bad = first_nonfinite_f32(x, n);
    if (bad < 0) return 0;
    return tp_error("denoising step %d of %d: the latents became %s at token %lld, channel %lld (the transformer "
                    "output is not finite: a transformer weight or the prompt embeddings hold NaN/Inf; find the "
                    "weight with 'tpgen inspect --model DIR --scan-weights')", step + 1, steps,
                    x[bad] != x[bad] ? "NaN" : "infinite", (long long)(bad / C), (long long)(bad % C));
}

static int check_params(const sampler_params *p) {
    if (!p->latents || !p->sigmas || !p->predict)
        return tp_error("denoise: latents, sigmas and a model are required");
    if (p->steps < 1) return tp_error("denoise: steps must be at least 1 (got %d)", p->steps);
    if (p->N < 1 || p->C < 1) return tp_error("denoise: the image needs at least one token");
    for (int i = 0; i <= p->steps; i++)
        if (!(p->sigmas[i] == p->sigmas[i])) return tp_error("denoise: sigma[%d] is NaN", i);
    return 0;
}

/* The step's velocity v [N, C] (and vn, the unconditional one, with CFG).
 * On a CFG-parallel group each half predicts its own branch into its half
 * of [v; vn]; the halves agree on the status (so that a failure on one half
 * never leaves the other waiting in the exchange), then all-gather. */
static int predict_step(const sampler_params *p, int step, const float *x, float *v, float *vn) {
    if (!p->cfg) return p->predict(p->model, step, 0, x, v);
    comm *c = p->cfg_comm;
    if (!c || c->size == 1) {
        int rc = p->predict(p->model, step, 0, x, v);
        return rc ? rc : p->predict(p->model, step, 1, x, vn);
    }
    size_t n = (size_t)p->N * (size_t)p->C;
    int rc = dist_agree(c->mpi, p->predict(p->model, step, c->rank, x, c->rank ? vn : v));
    if (rc) return rc;
    tensor both = tensor_wrap(NULL, DT_F32, 2, (int64_t)n, v);   /* v and vn are one buffer: [v; vn] */
    return comm_allgather(c, &both);
}

int sampler_run(const sampler_params *p, float *out) {
    if (check_params(p)) return -1;
    size_t n = (size_t)p->N * (size_t)p->C;
    float *x = xmalloc(n * sizeof *x), *v = xmalloc((p->cfg ? 2 : 1) * n * sizeof *v), *vn = p->cfg ? v + n : NULL;
    for (size_t i = 0; i < n; i++) x[i] = p->bf16 ? bf16r(p->latents[i]) : p->latents[i];
    int rc = 0;
    for (int i = 0; i < p->steps && !rc; i++) {
        double t0 = MPI_Wtime();
        rc = predict_step(p, i, x, v, vn);
        if (!rc && vn) apply_cfg(v, vn, n, p->cfg_scale, p->bf16);
        if (rc) {
            tp_error_context("denoising step %d of %d", i + 1, p->steps);
            break;
        }
        euler_step(x, v, n, p->sigmas[i + 1] - p->sigmas[i], p->bf16);
        if ((rc = check_finite(x, n, p->C, i, p->steps))) break;
        watchdog_step(MPI_Wtime() - t0);   /* a progress point for the rank's watchdog */
        if (p->on_step && p->on_step(i, p->steps, MPI_Wtime() - t0, v, x, p->sigmas[i + 1], p->ctx))
            rc = tp_error("denoising stopped at step %d of %d", i + 1, p->steps);
    }
    if (!rc) memcpy(out, x, n * sizeof *out);
    free(x), free(v);
    return rc;
}
