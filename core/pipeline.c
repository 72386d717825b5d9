/* The FLUX.2 denoising loop (docs/spec/flux2-transformer.md §6.4): FLUX.2's prediction (its forward,
 * its timestep, its reference tokens, the KV-cached references) inside the
 * shared loop of core/sampler.c, which does CFG, the Euler step, the bf16
 * rounding and the NaN check. Every rank of the TP group runs it in
 * lockstep on identical inputs, and every rank gets the same model output,
 * so no broadcast is needed.
 *
 * bf16 mode reproduces the eager-PyTorch rounding of the reference
 * pipeline: the timestep passed to the model is bf16(bf16(t)/1000); the
 * latents' rounding is the sampler's. */
#include "pipeline.h"
#include "core/dist/dist.h"
#include "kernels/comm.h"
#include "kernels/err.h"
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
    const char *groups[2] = {"double blocks", "single blocks"};
    if (p->cache && bc_spec_check_model(p->cache, c->num_layers, c->num_single_layers, groups)) return -1;
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

/* FLUX.2's part of the shared loop (core/sampler.c): the model input is the
 * latents, then the reference tokens (if any), with their ids */
typedef struct flux2_step {
    flux2_model *m;
    const denoise_params *p;
    int bf16;
    size_t C;
    float *in;         /* [N + R, C]: rows [0, N) the current latents, then the references */
    int32_t *ids;      /* [N + R, 4] */
    float *v_full;     /* [N + R, C] model output */
    int64_t rows;
    flux2_kv_cache *kv;   /* KV-cached references, else NULL */
    block_cache *bc;      /* --cache: this image's block cache, else NULL */
} flux2_step;

static void step_init(flux2_step *s, flux2_model *m, const denoise_params *p) {
    s->m = m, s->p = p;
    s->bf16 = flux2_precision(m) == DT_BF16;
    size_t C = s->C = (size_t)flux2_get_config(m)->in_channels;
    int refs = p->ref_tokens != NULL, kv = p->kv_refs && refs;
    /* KV-cached: step 0 runs [refs; latents] (extract), later steps the latents alone (cached) */
    s->rows = p->N + (refs ? p->R : 0);
    s->in = xmalloc((size_t)s->rows * C * sizeof *s->in);
    s->v_full = kv ? NULL : xmalloc((size_t)s->rows * C * sizeof *s->v_full);
    s->ids = xmalloc((size_t)s->rows * 4 * sizeof *s->ids);
    s->kv = kv ? flux2_kv_new() : NULL;
    /* the latents' slot is filled at each prediction; the references are bf16 like the latents */
    int64_t r0 = kv ? 0 : p->N, n0 = kv ? p->R : 0;
    memcpy(s->ids + n0 * 4, p->img_ids, (size_t)p->N * 4 * sizeof *s->ids);
    if (refs) {
        size_t nr = (size_t)p->R * C;
        float *dst = s->in + (size_t)r0 * C;
        for (size_t i = 0; i < nr; i++) dst[i] = s->bf16 ? bf16r(p->ref_tokens[i]) : p->ref_tokens[i];
        memcpy(s->ids + r0 * 4, p->ref_ids, (size_t)p->R * 4 * sizeof *s->ids);
    }
}

static void step_free(flux2_step *s) {
    flux2_kv_free(s->kv);
    free(s->in), free(s->ids), free(s->v_full);
}

static int flux2_predict(void *ctx, int step, int neg, const float *x, float *v) {
    flux2_step *s = ctx;
    const denoise_params *p = s->p;
    float tin = model_timestep(p->sigmas[step], s->bf16);
    size_t n = (size_t)p->N * s->C;
    block_cache_call(s->bc, step, neg);   /* the cache state is per step and CFG branch */
    if (s->kv) {
        if (step > 0)
            return flux2_forward_kv(s->m, FLUX2_KV_CACHED, s->kv, x, p->N, 0, p->img_ids, p->prompt_embeds, p->L,
                                    p->txt_ids, tin, p->guidance, p->ref_timestep, v);
        memcpy(s->in + (size_t)p->R * s->C, x, n * sizeof *x);
        return flux2_forward_kv(s->m, FLUX2_KV_EXTRACT, s->kv, s->in, p->R + p->N, p->R, s->ids, p->prompt_embeds,
                                p->L, p->txt_ids, tin, p->guidance, p->ref_timestep, v);
    }
    memcpy(s->in, x, n * sizeof *x);
    int rc = flux2_forward(s->m, s->in, s->rows, s->ids, neg ? p->neg_embeds : p->prompt_embeds, neg ? p->Ln : p->L,
                           neg ? p->neg_txt_ids : p->txt_ids, tin, p->guidance, s->v_full);
    if (!rc) memcpy(v, s->v_full, n * sizeof *v);   /* only the first N outputs are the velocity */
    return rc;
}

int flux2_denoise(flux2_model *m, const denoise_params *p, float *out) {
    if (check_params(m, p)) return -1;
    flux2_step s;
    step_init(&s, m, p);
    sampler_params sp = {.latents = p->latents, .N = p->N, .C = (int)s.C, .sigmas = p->sigmas, .steps = p->steps,
                         .cfg = p->neg_embeds != NULL, .cfg_scale = p->cfg_scale, .bf16 = s.bf16,
                         .predict = flux2_predict, .model = &s, .on_step = p->on_step, .ctx = p->ctx,
                         .cfg_comm = p->cfg_comm};
    /* the prepare step: the activations, agreed before the first collective (core/dist: lockstep) */
    comm *cm = flux2_comm(m);
    MPI_Comm group = cm ? cm->mpi : MPI_COMM_NULL;
    int rc = dist_lockstep_begin(p->group ? *p->group : group,
                                 flux2_prepare(m, s.rows, s.kv ? p->R : 0, s.kv ? NULL : s.ids, p->prompt_embeds,
                                               p->L, p->txt_ids, p->neg_embeds, p->Ln));
    if (!rc) {
        /* a fresh block cache for every image (spec block-cache.md §4) */
        comm *spc = flux2_sp_comm(m);
        s.bc = block_cache_new(p->cache, p->steps, sp.cfg ? 2 : 1, group, spc && spc->size > 1 ? spc->mpi : MPI_COMM_NULL);
        flux2_set_block_cache(m, s.bc);
        rc = sampler_run(&sp, out);
        flux2_set_block_cache(m, NULL);
        if (!rc && p->cfg_comm && p->cfg_comm->size == 2) rc = block_cache_share_branches(s.bc, p->cfg_comm->mpi);
        if (s.bc && p->cache_log) block_cache_take_log(s.bc, p->cache_log);
        block_cache_free(s.bc);
        dist_lockstep_end();
    }
    step_free(&s);
    return rc;
}
