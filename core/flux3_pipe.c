/* The FLUX.3 sampling pipeline (flux3_pipe.h): noise, ids, and the
 * denoising loop over flux3_forward, as diffusers 0.42.1's modular
 * pipelines run them. */
#include "flux3_pipe.h"
#include "core/dist/dist.h"
#include "core/dist/watchdog.h"
#include "kernels/comm.h"
#include "core/image/image.h"
#include "kernels/err.h"
#include "kernels/tensor.h"
#include "rng.h"
#include "schedule.h"
#include <math.h>
#include <mpi.h>
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
    if (j->refs && j->refs->R && j->refs->C != c->cond_in_channels)
        return tp_error("reference tokens have %d channels but the transformer's cond_in_channels is %d", j->refs->C,
                        c->cond_in_channels);
    return 0;
}

int flux3_denoise(flux3_model *m, const flux3_job *j, float *out) {
    if (check_job(m, j)) return -1;
    const flux3_config *c = flux3_get_config(m);
    int bf16 = flux3_precision(m) == DT_BF16, C = c->in_channels, steps = j->steps;
    int64_t N = (int64_t)j->h * j->w, Lmax = j->L > j->Ln ? j->L : j->Ln;
    size_t n = (size_t)N * (size_t)C;
    float *sig = xmalloc(sizeof(float) * (size_t)(steps + 1)), *ts = xmalloc(sizeof(float) * (size_t)steps);
    float *x = j->init_latents ? xmalloc(n * sizeof *x) : flux3_noise_packed(j->seed, C, j->h, j->w), *v = xmalloc(n * sizeof *v), *vn = NULL;
    int32_t *img_ids = xmalloc(sizeof(int32_t) * 4 * (size_t)N), *txt_ids = xmalloc(sizeof(int32_t) * 4 * (size_t)Lmax);
    flux3_image_ids(j->h, j->w, 0, img_ids);
    flux2_text_ids(Lmax, txt_ids);   /* (0, 0, 0, l), as FLUX.2's */
    if (j->init_latents) memcpy(x, j->init_latents, n * sizeof *x);
    if (bf16)
        for (size_t i = 0; i < n; i++) x[i] = bf16r(x[i]);   /* drawn in f32, then cast */
    int rc = schedule_constant_shift(steps, FLUX3_SHIFT, sig, ts);
    float gs = (float)j->guidance;
    if (j->neg_embeds) vn = xmalloc(n * sizeof *vn);
    const ref_set *rs = j->refs && j->refs->R ? j->refs : NULL;
    /* the prepare step: the activations, agreed before the first collective */
    comm *cm = flux3_comm(m);
    if (!rc) rc = dist_lockstep_begin(cm ? cm->mpi : MPI_COMM_NULL, flux3_prepare(m, j->L, N, rs ? rs->R : 0));
    int lockstep = !rc;
    for (int i = 0; i < steps && !rc; i++) {
        double t0 = MPI_Wtime();
        float tt = model_time(i + 1 < steps ? ts[i + 1] : 0.0f, bf16);
        flux3_inputs in = {
            .x = x, .img_ids = img_ids, .N = N, .txt = j->embeds, .txt_ids = txt_ids, .L = j->L,
            .cond = rs ? rs->tokens : NULL, .cond_ids = rs ? rs->ids : NULL, .R = rs ? rs->R : 0,
            .timestep = model_time(ts[i], bf16), .target_timestep = c->flow_map ? &tt : NULL,
            .image_rope_scale = FLUX3_IMAGE_ROPE_SCALE,
        };
        rc = flux3_forward(m, &in, v);
        if (!rc && vn) {   /* CFG: the negative pass, then uncond + g (cond - uncond) */
            in.txt = j->neg_embeds, in.L = j->Ln;
            rc = flux3_forward(m, &in, vn);
            for (size_t k = 0; !rc && k < n; k++)
                v[k] = bf16 ? bf16r(vn[k] + bf16r(gs * bf16r(v[k] - vn[k]))) : vn[k] + gs * (v[k] - vn[k]);
        }
        if (rc) break;
        float dt = sig[i + 1] - sig[i];
        for (size_t k = 0; k < n; k++) x[k] = bf16 ? bf16r(x[k] + bf16r(dt * v[k])) : x[k] + dt * v[k];
        double sec = MPI_Wtime() - t0;
        watchdog_step(sec);
        if (j->on_step && j->on_step(i, steps, sec, v, x, j->ctx)) rc = tp_error("denoising stopped at step %d", i + 1);
    }
    if (lockstep) dist_lockstep_end();
    if (!rc) memcpy(out, x, n * sizeof *out);
    free(sig), free(ts), free(x), free(v), free(vn), free(img_ids), free(txt_ids);
    return rc;
}
