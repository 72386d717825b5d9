/* Reference images: decoding (stb_image), diffusers' checks, PIL's LANCZOS
 * resize, the centre crop and the normalisation (image.h). */
#include "image.h"
#include "kernels/err.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_NO_STDIO_WARNINGS
#pragma GCC diagnostic ignored "-Wunused-function"   /* stb's unused static API (declared, never defined) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

static FILE *open_image(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) tp_error("reference image %s: cannot open it (%s); check the path", path, strerror(errno));
    return f;
}

/* stb_image refuses headers beyond 2^30 bytes of pixels as "unknown image
 * type"; read a PNG's IHDR here so that the message says what is wrong */
static int png_header_size(FILE *f, int *w, int *h) {
    uint8_t b[24];
    rewind(f);
    if (fread(b, 1, sizeof b, f) != sizeof b || memcmp(b, "\x89PNG\r\n\x1a\n", 8) || memcmp(b + 12, "IHDR", 4)) return 0;
    uint32_t W = (uint32_t)b[16] << 24 | (uint32_t)b[17] << 16 | (uint32_t)b[18] << 8 | b[19];
    uint32_t H = (uint32_t)b[20] << 24 | (uint32_t)b[21] << 16 | (uint32_t)b[22] << 8 | b[23];
    if (W == 0 || H == 0 || W > INT32_MAX || H > INT32_MAX) return 0;
    *w = (int)W, *h = (int)H;
    return 1;
}

int image_probe(const char *path, int *w, int *h) {
    FILE *f = open_image(path);
    if (!f) return -1;
    int n = 0;
    int ok = stbi_info_from_file(f, w, h, &n);
    if (!ok && png_header_size(f, w, h) && (int64_t)*w * *h > IMAGE_MAX_PIXELS) ok = 1;   /* reported below */
    fclose(f);
    if (!ok)
        return tp_error("reference image %s: not a PNG or JPEG image that can be read (%s)", path,
                        stbi_failure_reason() ? stbi_failure_reason() : "unknown format");
    if (*w <= 0 || *h <= 0) return tp_error("reference image %s: it has no pixels (%dx%d)", path, *w, *h);
    if ((int64_t)*w * *h > IMAGE_MAX_PIXELS)
        return tp_error("reference image %s: %dx%d pixels is more than the %lld Mpx tpgen decodes (it would be "
                        "resized to 1 Mpx anyway); scale it down first", path, *w, *h,
                        (long long)(IMAGE_MAX_PIXELS >> 20));
    return 0;
}

int image_read_rgb(const char *path, uint8_t **rgb, int *w, int *h) {
    *rgb = NULL;
    if (image_probe(path, w, h)) return -1;
    FILE *f = open_image(path);
    if (!f) return -1;
    int n = 0, iw = 0, ih = 0;
    stbi_info_from_file(f, &iw, &ih, &n);
    int is16 = stbi_is_16_bit_from_file(f);
    size_t np = (size_t)*w * (size_t)*h;
    uint8_t *out = NULL;
    if (is16 && n == 1) {
        /* PIL opens 16-bit greyscale PNGs as mode "I"; convert("RGB") clips each value to 0..255 */
        stbi_us *g = stbi_load_from_file_16(f, &iw, &ih, &n, 1);
        if (g) {
            out = xmalloc(np * 3);
            for (size_t i = 0; i < np; i++) out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = g[i] > 255 ? 255 : (uint8_t)g[i];
            stbi_image_free(g);
        }
    } else {
        /* stb: grey replicated, alpha dropped, palette expanded, 16-bit -> high byte (PIL's rawmodes do the same) */
        uint8_t *p = stbi_load_from_file(f, &iw, &ih, &n, 3);
        if (p) {
            out = xmalloc(np * 3);
            memcpy(out, p, np * 3);
            stbi_image_free(p);
        }
    }
    fclose(f);
    if (!out)
        return tp_error("reference image %s: cannot decode it (%s); the file is truncated or corrupt", path,
                        stbi_failure_reason() ? stbi_failure_reason() : "unknown error");
    if (iw != *w || ih != *h) {
        free(out);
        return tp_error("reference image %s: decoded size %dx%d differs from its header %dx%d", path, iw, ih, *w, *h);
    }
    *rgb = out;
    return 0;
}

int image_check_reference(const char *path, int w, int h) {
    if (w < IMAGE_REF_MIN_SIDE || h < IMAGE_REF_MIN_SIDE)
        return tp_error("reference image %s: %dx%d is too small; both sides must be at least %d px (diffusers' "
                        "Flux2ImageProcessor.check_image_input)", path, w, h, IMAGE_REF_MIN_SIDE);
    double a = (double)w / h, b = (double)h / w, ratio = a > b ? a : b;
    if (ratio > IMAGE_REF_MAX_ASPECT)
        return tp_error("reference image %s: %dx%d has aspect ratio %.1f:1; at most %d:1 is allowed (diffusers' "
                        "check_image_input); crop it first", path, w, h, ratio, IMAGE_REF_MAX_ASPECT);
    return 0;
}

/* ---- PIL's LANCZOS (libImaging/Resample.c semantics) ---- */

#define PRECISION_BITS (32 - 8 - 2)

static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= M_PI;
    return sin(x) / x;
}

static double lanczos(double x) { return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0; }

typedef struct coeffs {
    int ksize;
    int *bounds;    /* per output index: first input index, count */
    int32_t *k;     /* [out][ksize] fixed point */
} coeffs;

/* The filter is stretched by the reduction factor (support 3·scale when
 * shrinking), normalised to sum 1 in double, then rounded half away from
 * zero to PRECISION_BITS fractional bits. */
static void precompute(int in, int out, coeffs *c) {
    double scale = (double)in / out, fs = scale < 1.0 ? 1.0 : scale, support = 3.0 * fs, ss = 1.0 / fs;
    int ksize = (int)ceil(support) * 2 + 1;
    double *pre = xcalloc((size_t)out * (size_t)ksize, sizeof(double));
    c->ksize = ksize;
    c->bounds = xmalloc((size_t)out * 2 * sizeof(int));
    c->k = xmalloc((size_t)out * (size_t)ksize * sizeof(int32_t));
    for (int xx = 0; xx < out; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in) xmax = in;
        xmax -= xmin;
        double *k = pre + (size_t)xx * ksize;
        for (int x = 0; x < xmax; x++) {
            double wgt = lanczos((x + xmin - center + 0.5) * ss);
            k[x] = wgt;
            ww += wgt;
        }
        for (int x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        c->bounds[2 * xx] = xmin;
        c->bounds[2 * xx + 1] = xmax;
    }
    for (size_t i = 0; i < (size_t)out * (size_t)ksize; i++) {
        double v = pre[i] * (1 << PRECISION_BITS);
        c->k[i] = (int32_t)(pre[i] < 0 ? -0.5 + v : 0.5 + v);
    }
    free(pre);
}

static void coeffs_free(coeffs *c) { free(c->bounds), free(c->k); }

static inline uint8_t clip8(int64_t v) {
    if (v >= ((int64_t)1 << PRECISION_BITS << 8)) return 255;
    if (v <= 0) return 0;
    return (uint8_t)(v >> PRECISION_BITS);
}

/* one pass along x (stride 3 between taps) or y (stride 3·w between taps) */
static void pass_h(const uint8_t *src, int w, int h, uint8_t *dst, int ow, const coeffs *c) {
    for (int y = 0; y < h; y++)
        for (int xx = 0; xx < ow; xx++) {
            int xmin = c->bounds[2 * xx], n = c->bounds[2 * xx + 1];
            const int32_t *k = c->k + (size_t)xx * c->ksize;
            const uint8_t *s = src + ((size_t)y * w + xmin) * 3;
            for (int ch = 0; ch < 3; ch++) {
                int64_t acc = (int64_t)1 << (PRECISION_BITS - 1);
                for (int x = 0; x < n; x++) acc += (int64_t)s[3 * x + ch] * k[x];
                dst[((size_t)y * ow + xx) * 3 + ch] = clip8(acc);
            }
        }
}

static void pass_v(const uint8_t *src, int w, uint8_t *dst, int oh, const coeffs *c) {
    size_t row = (size_t)w * 3;
    for (int yy = 0; yy < oh; yy++) {
        int ymin = c->bounds[2 * yy], n = c->bounds[2 * yy + 1];
        const int32_t *k = c->k + (size_t)yy * c->ksize;
        for (size_t i = 0; i < row; i++) {
            int64_t acc = (int64_t)1 << (PRECISION_BITS - 1);
            for (int y = 0; y < n; y++) acc += (int64_t)src[(size_t)(ymin + y) * row + i] * k[y];
            dst[(size_t)yy * row + i] = clip8(acc);
        }
    }
}

void image_resize_lanczos(const uint8_t *src, int w, int h, uint8_t *dst, int ow, int oh) {
    const uint8_t *cur = src;
    uint8_t *tmp = NULL;
    int cw = w;
    if (ow != w) {
        coeffs c;
        precompute(w, ow, &c);
        uint8_t *out = oh != h ? (tmp = xmalloc((size_t)ow * h * 3)) : dst;
        pass_h(src, w, h, out, ow, &c);
        coeffs_free(&c);
        cur = out;
        cw = ow;
    }
    if (oh != h) {
        coeffs c;
        precompute(h, oh, &c);
        pass_v(cur, cw, dst, oh, &c);
        coeffs_free(&c);
    } else if (ow == w) {
        memcpy(dst, src, (size_t)w * h * 3);
    }
    free(tmp);
}

void image_target_area_size(int w, int h, int *ow, int *oh) {
    if ((int64_t)w * h <= IMAGE_REF_MAX_AREA) { *ow = w, *oh = h; return; }
    /* Python: math.sqrt(target / (w * h)), then int() truncates */
    double s = sqrt((double)IMAGE_REF_MAX_AREA / ((double)w * (double)h));
    *ow = (int)(w * s);
    *oh = (int)(h * s);
}

void image_reference_size(int w, int h, int *pw, int *ph) {
    int rw, rh;
    image_target_area_size(w, h, &rw, &rh);
    *pw = rw / 16 * 16;
    *ph = rh / 16 * 16;
}

int image_load_reference(const char *path, float **pixels, int *pw, int *ph) {
    *pixels = NULL;
    uint8_t *rgb = NULL;
    int w, h;
    if (image_read_rgb(path, &rgb, &w, &h)) return -1;
    if (image_check_reference(path, w, h)) { free(rgb); return -1; }
    int rw, rh;
    image_target_area_size(w, h, &rw, &rh);
    if (rw != w || rh != h) {
        uint8_t *r = xmalloc((size_t)rw * rh * 3);
        image_resize_lanczos(rgb, w, h, r, rw, rh);
        free(rgb);
        rgb = r;
    }
    int cw = rw / 16 * 16, chh = rh / 16 * 16, left = (rw - cw) / 2, top = (rh - chh) / 2;
    size_t np = (size_t)cw * chh;
    float *px = xmalloc(np * 3 * sizeof(float));
    for (int y = 0; y < chh; y++)
        for (int x = 0; x < cw; x++)
            for (int c = 0; c < 3; c++) {
                float u = (float)rgb[((size_t)(top + y) * rw + left + x) * 3 + c] / 255.0f;
                px[(size_t)c * np + (size_t)y * cw + x] = 2.0f * u - 1.0f;
            }
    free(rgb);
    *pixels = px;
    *pw = cw;
    *ph = chh;
    return 0;
}

