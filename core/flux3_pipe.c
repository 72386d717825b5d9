/* The FLUX.3 sampling pipeline (flux3_pipe.h): noise, ids, and the
 * denoising loop over flux3_forward, as diffusers 0.42.1's modular
 * pipelines run them; and the FLUX.3 family's table for the pipeline
 * object (family.h). */
#include "flux3_pipe.h"
#include "family.h"
#include "core/models/llm/textenc.h"
#include "core/dist/dist.h"
#include "kernels/comm.h"
#include "core/image/image.h"
#include "kernels/err.h"
#include "kernels/tensor.h"
#include "rng.h"
#include "schedule.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int flux3_default_steps(int flow_map) { return flow_map ? 16 : 50; }
double flux3_default_guidance(int flow_map) { return flow_map ? 1.0 : FLUX3_GUIDANCE; }
int flux3_uses_cfg(int flow_map, double g) {
    return !flow_map && !(fabs(g - 1.0) <= 1e-9 * fmax(fabs(g), 1.0));
}

float *flux3_noise_packed(uint64_t seed, int C, int h, int w) {
    size_t n = (size_t)C * (size_t)h * (size_t)w, hw = (size_t)h * (size_t)w;
    float *raw = xmalloc(n * sizeof *raw), *x = xmalloc(n * sizeof *x);
    tp_rng rng;
    rng_seed(&rng, seed);
    rng_randn_f32(&rng, raw, n);
    for (size_t c = 0; c < (size_t)C; c++)
        for (size_t t = 0; t < hw; t++) x[t * (size_t)C + c] = raw[c * hw + t];
    free(raw);
    return x;
}

void flux3_image_ids(int64_t h, int64_t w, int32_t l, int32_t *ids) {
    for (int64_t y = 0; y < h; y++)
        for (int64_t x = 0; x < w; x++) {
            int32_t *id = ids + (y * w + x) * 4;
            id[0] = 0, id[1] = (int32_t)y, id[2] = (int32_t)x, id[3] = l;
        }
}

void flux3_ref_ids(ref_set *rs) {
    int64_t t0 = 0;
    for (int k = 0; k < rs->n; k++) {
        int64_t hl = rs->grid[2 * k], wl = rs->grid[2 * k + 1];
        flux3_image_ids(hl, wl, -(1 + k), rs->ids + t0 * 4);
        t0 += hl * wl;
    }
}

void flux3_reference_canvas(int w, int h, int *cw, int *ch, int *left, int *top) {
    int s[2] = {w, h};
    for (int i = 0; i < 2; i++) {
        int r = (s[i] + 15) / 16 * 16;
        s[i] = r < 64 ? 64 : r > 4096 ? 4096 : r;
    }
    *cw = s[0], *ch = s[1];
    *left = (s[0] - w) / 2, *top = (s[1] - h) / 2;
}

void flux3_reference_resized_size(int w, int h, int *rw, int *rh) {
    /* Flux3ImageProcessor._resize_if_canvas_exceeds_area: Python floats, round() half to even (rint) */
    const double area = 4.0 * 1024 * 1024, max_side = 4096;
    double scale = fmin(1.0, fmin(sqrt(area / ((double)w * (double)h)), max_side / (double)(w > h ? w : h)));
    for (;;) {
        double sh = rint((double)h * scale), sw = rint((double)w * scale);
        *rh = sh < 1 ? 1 : (int)sh, *rw = sw < 1 ? 1 : (int)sw;
        int cw, ch, l, t;
        flux3_reference_canvas(*rw, *rh, &cw, &ch, &l, &t);
        if ((double)cw * (double)ch <= area) break;
        scale *= 0.995;
    }
}

int flux3_reference_crop_box(int w, int h, int box[4]) {
    int rw, rh, cw, ch;
    flux3_reference_resized_size(w, h, &rw, &rh);
    flux3_reference_canvas(rw, rh, &cw, &ch, &box[0], &box[1]);
    box[2] = rw, box[3] = rh;
    return cw != rw || ch != rh;
}

void flux3_reference_size(int w, int h, int n_refs, int *pw, int *ph) {
    int l, t, rw, rh;
    if (n_refs == 1) {
        flux3_reference_resized_size(w, h, &rw, &rh);
        flux3_reference_canvas(rw, rh, pw, ph, &l, &t);
    } else {
        image_reference_size(w, h, pw, ph);
    }
}

int flux3_check_reference(const char *path, int w, int h, int n) {
    if (n <= 1) return 0;   /* "fill": any size is downscaled under 4 MP and padded to at least 64 x 64 */
    int pw, ph;
    image_reference_size(w, h, &pw, &ph);
    if (pw < 16 || ph < 16)
        return tp_error("reference image %s is %dx%d: FLUX.3 fits each of several references under 1 megapixel and "
                        "crops it to multiples of 16 pixels, which leaves %dx%d, no token; give a reference at least "
                        "16 pixels on each side", path, w, h, pw, ph);
    return 0;
}

/* numpy.pad index of position i (may be outside [0, n)): "reflect" repeats
 * with period 2(n-1) without the edge, "symmetric" with period 2n */
static int pad_index(int i, int n, int symmetric) {
    if (n == 1) return 0;
    int p = symmetric ? 2 * n : 2 * (n - 1), m = ((i % p) + p) % p;
    return m < n ? m : symmetric ? 2 * n - 1 - m : 2 * (n - 1) - m;
}

/* rgb (consumed) resized to (rw, rh) with PIL's LANCZOS; NULL + tp_error when out of memory */
static uint8_t *resized(uint8_t *rgb, int w, int h, int rw, int rh, const char *name) {
    if (rw == w && rh == h) return rgb;
    uint8_t *r = malloc((size_t)rw * (size_t)rh * 3);
    if (!r) {
        free(rgb);
        tp_error("reference image %s: out of memory resizing it to %dx%d", name, rw, rh);
        return NULL;
    }
    image_resize_lanczos(rgb, w, h, r, rw, rh);
    free(rgb);
    return r;
}

int flux3_reference_from_rgb(uint8_t *rgb, int w, int h, const char *name, float **pixels, int *pw, int *ph) {
    *pixels = NULL;
    int rw, rh;
    flux3_reference_resized_size(w, h, &rw, &rh);
    if (!(rgb = resized(rgb, w, h, rw, rh, name))) return -1;
    w = rw, h = rh;
    int cw, ch, left, top;
    flux3_reference_canvas(w, h, &cw, &ch, &left, &top);
    int sym = (w < h ? w : h) <= 16;   /* an image smaller than one token is mirrored instead */
    size_t np = (size_t)cw * ch;
    float *px = xmalloc(np * 3 * sizeof *px);
    for (int y = 0; y < ch; y++) {
        int sy = pad_index(y - top, h, sym);
        for (int x = 0; x < cw; x++) {
            int sx = pad_index(x - left, w, sym);
            for (int c = 0; c < 3; c++) {
                float u = (float)rgb[((size_t)sy * w + sx) * 3 + c] / 255.0f;
                px[(size_t)c * np + (size_t)y * cw + x] = 2.0f * u - 1.0f;
            }
        }
    }
    free(rgb);
    *pixels = px, *pw = cw, *ph = ch;
    return 0;
}

int flux3_load_reference(const char *path, float **pixels, int *pw, int *ph) {
    *pixels = NULL;
    uint8_t *rgb = NULL;
    int w, h;
    if (image_read_rgb(path, &rgb, &w, &h)) return -1;
    return flux3_reference_from_rgb(rgb, w, h, path, pixels, pw, ph);
}

int flux3_crop_reference_from_rgb(uint8_t *rgb, int w, int h, const char *name, float **pixels, int *pw, int *ph) {
    *pixels = NULL;
    if (flux3_check_reference(name, w, h, 2)) return free(rgb), -1;
    return image_fit_crop_reference(rgb, w, h, name, pixels, pw, ph);
}

int flux3_load_reference_crop(const char *path, float **pixels, int *pw, int *ph) {
    *pixels = NULL;
    uint8_t *rgb = NULL;
    int w, h;
    if (image_read_rgb(path, &rgb, &w, &h)) return -1;
    return flux3_crop_reference_from_rgb(rgb, w, h, path, pixels, pw, ph);
}

/* the model's timestep for a scheduler timestep t (sigma·1000 in f32): t/1000 in the latents' dtype */
static float model_time(float t, int bf16) {
    float v = t / 1000.0f;
    return bf16 ? bf16r(v) : v;
}

static int check_job(const flux3_model *m, const flux3_job *j) {
    const flux3_config *c = flux3_get_config(m);
    if (!j->embeds || j->L < 1) return tp_error("flux3 pipeline: prompt embeddings are required");
    if (j->steps < 1) return tp_error("flux3 pipeline: steps must be at least 1 (got %d)", j->steps);
    if (j->h < 1 || j->w < 1) return tp_error("flux3 pipeline: the image needs at least one token");
    if (j->neg_embeds && (j->Ln < 1 || c->flow_map))
        return tp_error(c->flow_map ? "flux3 pipeline: a flow-map model samples without CFG (no negative embeddings)"
                                    : "flux3 pipeline: negative embeddings without a length");
    const char *groups[2] = {"mode blocks", "single blocks"};
    if (j->cache && bc_spec_check_model(j->cache, c->num_layers, c->num_single_layers, groups)) return -1;
    if (j->refs && j->refs->R && j->refs->C != c->cond_in_channels)
        return tp_error("reference tokens have %d channels but the transformer's cond_in_channels is %d", j->refs->C,
                        c->cond_in_channels);
    return 0;
}

/* FLUX.3's part of the shared loop (core/sampler.c): one flux3_forward with
 * the step's timestep (and the flow-map's target timestep), the references
 * as conditioning tokens */
typedef struct flux3_step {
    flux3_model *m;
    const flux3_job *j;
    const float *ts;          /* [steps] scheduler timesteps */
    int bf16, flow_map;
    const int32_t *img_ids, *txt_ids;
    const ref_set *rs;        /* NULL: text-to-image */
    block_cache *bc;          /* --cache: this image's block cache, else NULL */
} flux3_step;

static int flux3_predict(void *ctx, int step, int neg, const float *x, float *v) {
    const flux3_step *s = ctx;
    const flux3_job *j = s->j;
    block_cache_call(s->bc, step, neg);   /* the cache state is per step and CFG branch */
    float tt = model_time(step + 1 < j->steps ? s->ts[step + 1] : 0.0f, s->bf16);
    flux3_inputs in = {
        .x = x, .img_ids = s->img_ids, .N = (int64_t)j->h * j->w, .txt = neg ? j->neg_embeds : j->embeds,
        .txt_ids = s->txt_ids, .L = neg ? j->Ln : j->L, .cond = s->rs ? s->rs->tokens : NULL,
        .cond_ids = s->rs ? s->rs->ids : NULL, .R = s->rs ? s->rs->R : 0, .timestep = model_time(s->ts[step], s->bf16),
        .target_timestep = s->flow_map ? &tt : NULL, .image_rope_scale = FLUX3_IMAGE_ROPE_SCALE,
    };
    return flux3_forward(s->m, &in, v);
}

int flux3_denoise(flux3_model *m, const flux3_job *j, float *out) {
    if (check_job(m, j)) return -1;
    const flux3_config *c = flux3_get_config(m);
    int C = c->in_channels, steps = j->steps;
    int64_t N = (int64_t)j->h * j->w, Lmax = j->L > j->Ln ? j->L : j->Ln;
    float *sig = xmalloc(sizeof(float) * (size_t)(steps + 1)), *ts = xmalloc(sizeof(float) * (size_t)steps);
    float *x0 = j->init_latents ? NULL : flux3_noise_packed(j->seed, C, j->h, j->w);   /* drawn in f32, then cast */
    int32_t *img_ids = xmalloc(sizeof(int32_t) * 4 * (size_t)N), *txt_ids = xmalloc(sizeof(int32_t) * 4 * (size_t)Lmax);
    flux3_image_ids(j->h, j->w, 0, img_ids);
    flux2_text_ids(Lmax, txt_ids);   /* (0, 0, 0, l), as FLUX.2's */
    int rc = schedule_constant_shift(steps, FLUX3_SHIFT, sig, ts);
    flux3_step s = {.m = m, .j = j, .ts = ts, .bf16 = flux3_precision(m) == DT_BF16, .flow_map = c->flow_map,
                    .img_ids = img_ids, .txt_ids = txt_ids, .rs = j->refs && j->refs->R ? j->refs : NULL};
    sampler_params sp = {.latents = j->init_latents ? j->init_latents : x0, .N = N, .C = C, .sigmas = sig,
                         .steps = steps, .cfg = j->neg_embeds != NULL, .cfg_scale = (float)j->guidance,
                         .bf16 = s.bf16, .predict = flux3_predict, .model = &s, .on_step = j->on_step, .ctx = j->ctx,
                         .cfg_comm = j->cfg_comm};
    /* the prepare step: the activations, agreed before the first collective (core/dist: lockstep) */
    comm *cm = flux3_comm(m);
    MPI_Comm lc = j->group ? *j->group : cm ? cm->mpi : MPI_COMM_NULL;
    if (!rc) rc = dist_lockstep_begin(lc, flux3_prepare(m, j->L, N, s.rs ? s.rs->R : 0));
    if (!rc) {
        /* a fresh block cache for every image (docs/spec/block-cache.md §4) */
        comm *spc = flux3_sp_comm(m);
        s.bc = block_cache_new(j->cache, steps, sp.cfg ? 2 : 1, cm ? cm->mpi : MPI_COMM_NULL,
                               spc && spc->size > 1 ? spc->mpi : MPI_COMM_NULL);
        flux3_set_block_cache(m, s.bc);
        rc = sampler_run(&sp, out);
        flux3_set_block_cache(m, NULL);
        if (!rc && j->cfg_comm && j->cfg_comm->size == 2) rc = block_cache_share_branches(s.bc, j->cfg_comm->mpi);
        if (s.bc && j->cache_log) block_cache_take_log(s.bc, j->cache_log);
        block_cache_free(s.bc);
        dist_lockstep_end();
    }
    free(sig), free(ts), free(x0), free(img_ids), free(txt_ids);
    return rc;
}

/* ---- the FLUX.3 family in the pipeline object's table (family.h) ---- */

/* every field checked by the transformer's own parser */
static int family_read_config(const json_t *cfg, const char *path, tp_pipe_info *g, int *flow_map) {
    flux3_config c3 = {0};
    int rc = flux3_config_parse(cfg, path, &c3);
    g->in_channels = c3.in_channels, g->joint_dim = c3.joint_dim, g->cond_in_channels = c3.cond_in_channels;
    g->heads = c3.heads;
    *flow_map = c3.flow_map;
    g->n_blocks[0] = c3.num_layers, g->n_blocks[1] = c3.num_single_layers;
    g->embedded_guidance = 0;
    return rc;
}

static int family_steps(model_family f) { return flux3_default_steps(f == FAMILY_FLUX3_FLOWMAP); }
static double family_guidance(model_family f) { return flux3_default_guidance(f == FAMILY_FLUX3_FLOWMAP); }
static int family_cfg(model_family f, double g) { return flux3_uses_cfg(f == FAMILY_FLUX3_FLOWMAP, g); }

static int family_load_model(const char *dir, const family_load *x, void **model, load_stats *st) {
    flux3_load_extras e = {.quantize_fp8 = x->quantize_fp8, .loras = x->loras, .n_loras = x->n_loras,
                           .lora_set_out = x->lora_set_out};
    flux3_model *m = NULL;
    int rc = flux3_load_ex(dir, x->be, x->c, x->precision, &e, &m, st);
    if (!rc) rc = flux3_set_sp(m, x->sp);
    *model = m;
    return rc;
}

static void family_free_model(void *model) { flux3_free(model); }

/* one reference "fill" (downscaled under 4 MP, reflect-padded to its canvas), several "crop" (FLUX.2's
 * preprocessing without its checks) */
static refs_load_fn family_reference_loader(int n) { return n == 1 ? flux3_load_reference : flux3_load_reference_crop; }

static int family_denoise(void *model, const tp_pipe_info *info, const tp_job *j, const ref_set *rs,
                          const family_mesh *mesh, denoise_step_fn on_step, void *ctx, float *latents) {
    flux3_job f = {.seed = j->seed, .init_latents = j->init_latents, .steps = j->steps, .guidance = j->guidance,
                   .h = j->height / 16, .w = j->width / 16, .embeds = j->embeds, .L = j->L,
                   .neg_embeds = j->neg_embeds, .Ln = j->Ln ? j->Ln : j->L, .refs = rs, .on_step = on_step,
                   .ctx = ctx, .cache = j->cache, .cache_log = j->cache_log, .cfg_comm = mesh->cfg,
                   .group = mesh->group};
    return flux3_denoise(model, &f, latents);
}

const pipe_family family_flux3 = {
    .name = "FLUX.3",
    .read_config = family_read_config,
    .default_steps = family_steps,
    .default_guidance = family_guidance,
    .uses_cfg = family_cfg,
    /* each prompt padded to its own window, at most 8192 tokens (the modular pipeline's cap) */
    .default_max_sequence_length = TEXTENC_FLUX3_MAX_LEN,
    .text_recipe = "qwen3vl",
    .own_window = 1,
    .pad_multiple = TEXTENC_FLUX3_PAD_MULTIPLE,
    .load = family_load_model,
    .free_model = family_free_model,
    .check_reference = flux3_check_reference,
    .reference_loader = family_reference_loader,
    .reference_ids = flux3_ref_ids,   /* (0, y, x, -(1+k)) */
    .denoise = family_denoise,
};
