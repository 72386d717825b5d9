/* The FLUX.2 denoising loop (spec §6.4): per step one transformer forward
 * (two with CFG) and a flow-match Euler step x += (σ[i+1] − σ[i])·v. Every
 * rank of the TP group runs it in lockstep on identical inputs, and every
 * rank gets the same model output, so no broadcast is needed.
 *
 * bf16 mode reproduces the eager-PyTorch rounding of the reference
 * pipeline: the latents are bf16, the timestep passed to the model is
 * bf16(bf16(t)/1000), dt·v is rounded to bf16 before it is added to the
 * fp32-upcast sample, and the sum is rounded to bf16. */
#include "pipeline.h"
#include "err.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

void flux2_image_ids(int64_t h, int64_t w, int32_t t, int32_t *ids) {
    for (int64_t y = 0; y < h; y++)
        for (int64_t x = 0; x < w; x++) {
            int32_t *id = ids + (y * w + x) * 4;
            id[0] = t, id[1] = (int32_t)y, id[2] = (int32_t)x, id[3] = 0;
        }
}

void flux2_text_ids(int64_t L, int32_t *ids) {
    for (int64_t l = 0; l < L; l++) {
        int32_t *id = ids + l * 4;
        id[0] = id[1] = id[2] = 0;
        id[3] = (int32_t)l;
    }
}

static int check_params(const flux2_model *m, const denoise_params *p) {
    const flux2_config *c = flux2_get_config(m);
    if (!p->latents || !p->img_ids || !p->prompt_embeds || !p->txt_ids || !p->sigmas)
        return tp_error("denoise: latents, image ids, prompt embeddings, text ids and sigmas are required");
    if (p->steps < 1) return tp_error("denoise: steps must be at least 1 (got %d)", p->steps);
    if (c->out_dim != c->in_channels)
        return tp_error("denoise: the transformer predicts %lld channels per token but takes %d; the Euler "
                        "step needs them equal", (long long)c->out_dim, c->in_channels);
    if (p->neg_embeds && (!p->neg_txt_ids || p->Ln < 1))
        return tp_error("denoise: CFG needs the negative prompt's text ids and length");
    for (int i = 0; i <= p->steps; i++)
        if (!(p->sigmas[i] == p->sigmas[i])) return tp_error("denoise: sigma[%d] is NaN", i);
    return 0;
}

/* The timestep the model receives for sigma s: t = fl32(s·1000) as the
 * scheduler stores it, then "t / 1000" in the latents' dtype. */
static float model_timestep(float sigma, int bf16) {
    float t = sigma * 1000.0f;
    if (!bf16) return t / 1000.0f;
    return bf16r(bf16r(t) / 1000.0f);
}

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

int flux2_denoise(flux2_model *m, const denoise_params *p, float *out) {
    if (check_params(m, p)) return -1;
    int bf16 = flux2_precision(m) == DT_BF16;
    size_t n = (size_t)p->N * (size_t)flux2_get_config(m)->in_channels;
    float *x = out, *v = xmalloc(n * sizeof *v), *vn = p->neg_embeds ? xmalloc(n * sizeof *vn) : NULL;
    memmove(x, p->latents, n * sizeof *x);
    if (bf16)
        for (size_t i = 0; i < n; i++) x[i] = bf16r(x[i]);
    int rc = 0;
    for (int i = 0; i < p->steps && !rc; i++) {
        double t0 = MPI_Wtime();
        float tin = model_timestep(p->sigmas[i], bf16);
        rc = flux2_forward(m, x, p->N, p->img_ids, p->prompt_embeds, p->L, p->txt_ids, tin, p->guidance, v);
        if (!rc && vn) {
            rc = flux2_forward(m, x, p->N, p->img_ids, p->neg_embeds, p->Ln, p->neg_txt_ids, tin, p->guidance, vn);
            if (!rc) apply_cfg(v, vn, n, p->cfg_scale, bf16);
        }
        if (rc) {
            tp_error_context("denoising step %d of %d", i + 1, p->steps);
            break;
        }
        euler_step(x, v, n, p->sigmas[i + 1] - p->sigmas[i], bf16);
        if (p->on_step && p->on_step(i, p->steps, MPI_Wtime() - t0, v, x, p->ctx))
            rc = tp_error("denoising stopped at step %d of %d", i + 1, p->steps);
    }
    free(v);
    free(vn);
    return rc;
}
