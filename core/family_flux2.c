/* The FLUX.2 family (dev, klein distilled, klein base, klein KV) in the
 * pipeline object's table (family.h): diffusers' defaults, the transformer
 * shard, the bf16 noise of the diffusers pipeline, the dynamic-shift
 * schedule, and the loop of core/pipeline.c (FLUX.2's prediction in the
 * shared sampler). */
#include "family.h"
#include "core/image/image.h"
#include "core/models/flux2/flux2.h"
#include "core/models/llm/textenc.h"
#include "kernels/err.h"
#include "pipeline.h"
#include "rng.h"
#include "schedule.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static int json_int(const json_t *o, const char *key, int def, const char *where, int *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return *out = def, 0;
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 20))
        return tp_error("%s: '%s' must be an integer from 1 to %d", where, key, 1 << 20);
    *out = (int)json_integer_value(v);
    return 0;
}

static int read_config(const json_t *cfg, const char *path, tp_pipe_info *g, int *flow_map) {
    *flow_map = 0;
    int rc = json_int(cfg, "in_channels", 128, path, &g->in_channels);
    if (!rc) rc = json_int(cfg, "joint_attention_dim", 15360, path, &g->joint_dim);
    if (!rc) rc = json_int(cfg, "num_layers", 8, path, &g->n_blocks[0]);
    if (!rc) rc = json_int(cfg, "num_single_layers", 48, path, &g->n_blocks[1]);
    if (!rc) rc = json_int(cfg, "num_attention_heads", 48, path, &g->heads);
    g->cond_in_channels = g->in_channels;
    json_t *ge = json_object_get(cfg, "guidance_embeds");
    g->embedded_guidance = !ge || json_is_true(ge);   /* diffusers' default is true */
    return rc;
}

static int default_steps(model_family f) { return f == FAMILY_KLEIN_DISTILLED ? 4 : 50; }
static double default_guidance(model_family f) { return f == FAMILY_KLEIN_DISTILLED ? 1.0 : 4.0; }
static int uses_cfg(model_family f, double guidance) { return f == FAMILY_KLEIN_BASE && guidance > 1.0; }

static int load(const char *dir, const family_load *x, void **model, load_stats *st) {
    flux2_load_extras e = {.loras = x->loras, .n_loras = x->n_loras, .quantize_fp8 = x->quantize_fp8,
                           .lora_set_out = x->lora_set_out};
    flux2_model *m = NULL;
    int rc = flux2_load_ex(dir, x->be, x->c, x->precision, &e, &m, st);
    if (!rc) rc = flux2_set_sp(m, x->sp);
    *model = m;
    return rc;
}

static void free_model(void *model) { flux2_free(model); }

static refs_load_fn reference_loader(int n) { return image_load_reference; }

float *flux2_latents_pack(const float *nchw, int C, int h, int w) {
    size_t hw = (size_t)h * (size_t)w;
    float *x = xmalloc((size_t)C * hw * sizeof *x);
    for (size_t c = 0; c < (size_t)C; c++)
        for (size_t t = 0; t < hw; t++) x[t * (size_t)C + c] = nchw[c * hw + t];
    return x;
}

float *flux2_noise_packed(uint64_t seed, int C, int h, int w) { return flux2_noise_packed_as(seed, C, h, w, TP_RNG_TORCH2); }

float *flux2_noise_packed_as(uint64_t seed, int C, int h, int w, int rng_kind) {
    size_t n = (size_t)C * (size_t)h * (size_t)w;
    uint16_t *raw = xmalloc(n * sizeof *raw);
    tp_rng rng;
    rng_seed(&rng, seed);
    rng_randn_bf16_as(&rng, raw, n, rng_kind == TP_RNG_TORCH1 ? TP_RNG_TORCH1 : TP_RNG_TORCH2);
    float *x = xmalloc(n * sizeof *x);
    for (int c = 0; c < C; c++)
        for (int t = 0; t < h * w; t++) x[(size_t)t * C + c] = bf16_to_f32(raw[(size_t)c * h * w + t]);
    free(raw);
    return x;
}

static int denoise(void *model, const tp_pipe_info *info, const tp_job *j, const ref_set *rs,
                   const family_mesh *mesh, denoise_step_fn on_step, void *ctx, float *latents) {
    int h = j->height / 16, w = j->width / 16, C = info->in_channels;
    int64_t N = (int64_t)h * w;
    float *noise = xmalloc((size_t)N * (size_t)C * sizeof *noise);
    if (j->init_latents) memcpy(noise, j->init_latents, (size_t)N * (size_t)C * sizeof *noise);
    else {
        free(noise);
        noise = flux2_noise_packed_as(j->seed, C, h, w, j->rng);
    }
    float *sigmas = xmalloc(sizeof(float) * (size_t)(j->steps + 1)), *ts = xmalloc(sizeof(float) * (size_t)j->steps);
    int64_t Ln = j->Ln ? j->Ln : j->L, Lmax = j->L > Ln ? j->L : Ln;   /* the negative prompt's own length */
    int32_t *img_ids = xmalloc(sizeof(int32_t) * 4 * (size_t)N), *txt_ids = xmalloc(sizeof(int32_t) * 4 * (size_t)Lmax);
    flux2_image_ids(h, w, 0, img_ids);
    flux2_text_ids(Lmax, txt_ids);
    float gval = (float)j->guidance;
    denoise_params dp = {
        .latents = noise, .N = N, .img_ids = img_ids,
        .prompt_embeds = j->embeds, .L = j->L, .txt_ids = txt_ids,
        .neg_embeds = j->neg_embeds, .Ln = Ln, .neg_txt_ids = txt_ids, .cfg_scale = gval,
        .sigmas = sigmas, .steps = j->steps, .guidance = info->embedded_guidance ? &gval : NULL,
        .on_step = on_step, .ctx = ctx,
        .ref_tokens = rs->R ? rs->tokens : NULL, .R = rs->R, .ref_ids = rs->ids,
        .kv_refs = info->kv_refs, .ref_timestep = 0.0f, .cfg_comm = mesh->cfg,
        .group = mesh->group, .cache = j->cache, .cache_log = j->cache_log,
    };
    int rc = schedule_flux2(N, j->steps, sigmas, ts);
    if (!rc) rc = flux2_denoise(model, &dp, latents);
    free(noise), free(sigmas), free(ts), free(img_ids), free(txt_ids);
    return rc;
}

static uint64_t kv_cache_bytes(void *model, int64_t *tokens) {
    flux2_stats st;
    flux2_get_stats(model, &st);
    *tokens = st.kv_cache_tokens;
    return st.kv_cache_bytes;
}

const pipe_family family_flux2 = {
    .name = "FLUX.2",
    .read_config = read_config,
    .default_steps = default_steps,
    .default_guidance = default_guidance,
    .uses_cfg = uses_cfg,
    .default_max_sequence_length = 512,
    .text_recipe = "flux2",
    .own_window = 0,
    .pad_multiple = 0,
    .load = load,
    .free_model = free_model,
    .check_reference = NULL,   /* image_load_reference checks (sides >= 64, aspect <= 8) */
    .reference_loader = reference_loader,
    .reference_ids = NULL,     /* refs_encode's (10 + 10k, y, x, 0) */
    .denoise = denoise,
    .kv_cache_bytes = kv_cache_bytes,
};
