/* The FLUX.2 denoising loop (docs/spec/flux2-transformer.md §6.4): per step one transformer forward
 * (two with CFG) and a flow-match Euler step x += (σ[i+1] − σ[i])·v. Every
 * rank of the TP group runs it in lockstep on identical inputs, and every
 * rank gets the same model output, so no broadcast is needed.
 *
 * bf16 mode reproduces the eager-PyTorch rounding of the reference
 * pipeline: the latents are bf16, the timestep passed to the model is
 * bf16(bf16(t)/1000), dt·v is rounded to bf16 before it is added to the
 * fp32-upcast sample, and the sum is rounded to bf16. */
#include "pipeline.h"
#include "core/dist/dist.h"
#include "core/dist/watchdog.h"
#include "kernels/comm.h"
#include "kernels/err.h"
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
    if (p->ref_tokens && (!p->ref_ids || p->R < 1))
        return tp_error("denoise: reference tokens need their ids and count");
    if (p->kv_refs && p->ref_tokens && p->neg_embeds)
        return tp_error("denoise: KV-cached references with CFG are not supported (Flux2KleinKVPipeline runs one "
                        "pass per step); use --guidance 1");
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

/* The model input: the latents, then the reference tokens (if any). */
typedef struct step_input {
    float *x;          /* [N + R, C]: rows [0, N) are the latents being denoised */
    int32_t *ids;      /* [N + R, 4] */
    float *v_full;     /* [N + R, C] model output */
    int64_t rows;
} step_input;

static void step_input_init(step_input *in, const denoise_params *p, size_t C) {
    in->rows = p->N + (p->ref_tokens ? p->R : 0);
    in->x = xmalloc((size_t)in->rows * C * sizeof *in->x);
    in->v_full = xmalloc((size_t)in->rows * C * sizeof *in->v_full);
    in->ids = xmalloc((size_t)in->rows * 4 * sizeof *in->ids);
    memcpy(in->ids, p->img_ids, (size_t)p->N * 4 * sizeof *in->ids);
    if (p->ref_tokens) {
        memcpy(in->x + (size_t)p->N * C, p->ref_tokens, (size_t)p->R * C * sizeof *in->x);
        memcpy(in->ids + p->N * 4, p->ref_ids, (size_t)p->R * 4 * sizeof *in->ids);
    }
}

static void step_input_free(step_input *in) { free(in->x), free(in->ids), free(in->v_full); }

/* one velocity prediction for the current latents (rows [0, N) of in->x) */
static int predict(flux2_model *m, const denoise_params *p, step_input *in, const float *txt, int64_t L,
                   const int32_t *txt_ids, float tin, float *v, size_t n) {
    int rc = flux2_forward(m, in->x, in->rows, in->ids, txt, L, txt_ids, tin, p->guidance, in->v_full);
    if (!rc) memcpy(v, in->v_full, n * sizeof *v);
    return rc;
}

/* KV-cached references: step 0 on [refs; latents] (extract), later steps
 * on the latents alone (cached); kin/kids hold the extract input */
static int predict_kv(flux2_model *m, const denoise_params *p, flux2_kv_cache *kv, int step, const float *x,
                      float *kin, int32_t *kids, size_t C, float tin, float *v, int bf16) {
    if (step > 0)
        return flux2_forward_kv(m, FLUX2_KV_CACHED, kv, x, p->N, 0, p->img_ids, p->prompt_embeds, p->L, p->txt_ids,
                                tin, p->guidance, p->ref_timestep, v);
    size_t nr = (size_t)p->R * C;
    for (size_t i = 0; i < nr; i++) kin[i] = bf16 ? bf16r(p->ref_tokens[i]) : p->ref_tokens[i];
    memcpy(kin + nr, x, (size_t)p->N * C * sizeof *kin);
    memcpy(kids, p->ref_ids, (size_t)p->R * 4 * sizeof *kids);
    memcpy(kids + p->R * 4, p->img_ids, (size_t)p->N * 4 * sizeof *kids);
    return flux2_forward_kv(m, FLUX2_KV_EXTRACT, kv, kin, p->R + p->N, p->R, kids, p->prompt_embeds, p->L,
                            p->txt_ids, tin, p->guidance, p->ref_timestep, v);
}

int flux2_denoise(flux2_model *m, const denoise_params *p, float *out) {
    if (check_params(m, p)) return -1;
    int bf16 = flux2_precision(m) == DT_BF16;
    size_t C = (size_t)flux2_get_config(m)->in_channels, n = (size_t)p->N * C;
    float *v = xmalloc(n * sizeof *v), *vn = p->neg_embeds ? xmalloc(n * sizeof *vn) : NULL;
    step_input in;
    step_input_init(&in, p, C);
    float *x = in.x;
    memmove(x, p->latents, n * sizeof *x);
    if (bf16)
        for (size_t i = 0; i < (size_t)in.rows * C; i++) x[i] = bf16r(x[i]);
    int rc = 0, kv_on = p->kv_refs && p->ref_tokens;
    flux2_kv_cache *kv = kv_on ? flux2_kv_new() : NULL;
    float *kin = kv_on ? xmalloc((size_t)(p->R + p->N) * C * sizeof *kin) : NULL;
    int32_t *kids = kv_on ? xmalloc((size_t)(p->R + p->N) * 4 * sizeof *kids) : NULL;
    /* the prepare step: the activations, agreed before the first collective */
    comm *cm = flux2_comm(m);
    rc = dist_lockstep_begin(cm ? cm->mpi : MPI_COMM_NULL,
                             flux2_prepare(m, kv_on ? p->R + p->N : in.rows, kv_on ? NULL : in.ids, p->prompt_embeds,
                                           p->L, p->txt_ids, p->neg_embeds, p->Ln));
    int lockstep = !rc;
    for (int i = 0; i < p->steps && !rc; i++) {
        double t0 = MPI_Wtime();
        float tin = model_timestep(p->sigmas[i], bf16);
        if (kv_on) rc = predict_kv(m, p, kv, i, x, kin, kids, C, tin, v, bf16);
        else rc = predict(m, p, &in, p->prompt_embeds, p->L, p->txt_ids, tin, v, n);
        if (!rc && vn) {
            rc = predict(m, p, &in, p->neg_embeds, p->Ln, p->neg_txt_ids, tin, vn, n);
            if (!rc) apply_cfg(v, vn, n, p->cfg_scale, bf16);
        }
        if (rc) {
            tp_error_context("denoising step %d of %d", i + 1, p->steps);
            break;
        }
        euler_step(x, v, n, p->sigmas[i + 1] - p->sigmas[i], bf16);
        /* NaN/Inf never recovers and would decode to a black image: stop at
         * the step it appears (every rank holds the same latents, so all
         * ranks fail here together) */
        int64_t bad = first_nonfinite_f32(x, n);
        if (bad >= 0) {
            rc = tp_error("denoising step %d of %d: the latents became %s at token %lld, channel %lld (the "
                          "transformer output is not finite: a transformer weight or the prompt embeddings hold "
                          "NaN/Inf; find the weight with 'tpgen inspect --model DIR --scan-weights')", i + 1,
                          p->steps, x[bad] != x[bad] ? "NaN" : "infinite", (long long)(bad / (int64_t)C),
                          (long long)(bad % (int64_t)C));
            break;
        }
        watchdog_step(MPI_Wtime() - t0);   /* a progress point for the rank's watchdog */
        if (p->on_step && p->on_step(i, p->steps, MPI_Wtime() - t0, v, x, p->ctx))
            rc = tp_error("denoising stopped at step %d of %d", i + 1, p->steps);
    }
    if (lockstep) dist_lockstep_end();
    if (!rc) memcpy(out, x, n * sizeof *out);
    flux2_kv_free(kv);
    free(kin), free(kids);
    step_input_free(&in);
    free(v);
    free(vn);
    return rc;
}
