/* Reference images: reading the files (the decoders are png_decode.c and
 * jpeg_decode.c, the orientation exif.c), diffusers' checks, PIL's LANCZOS
 * resize, the centre crop and the normalisation (image.h). */
#include "image.h"
#include "decode.h"
#include "kernels/err.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static image_limits g_limits = {IMAGE_MAX_PIXELS, IMAGE_MAX_SCANS, IMAGE_MAX_SECONDS, NULL};

image_limits image_default_limits(void) { return g_limits; }

void image_set_max_pixels(int64_t max_pixels, const char *knob) {
    g_limits.max_pixels = max_pixels;
    g_limits.knob = knob;
}

/* the whole file (*data malloc'ed) */
static int read_file(const char *path, uint8_t **data, size_t *size) {
    *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return tp_error("reference image %s: cannot open it (%s); check the path", path, strerror(errno));
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return tp_error("reference image %s: cannot read it (not a regular file?)", path);
    }
    if ((int64_t)n > IMAGE_MAX_FILE_BYTES) {
        fclose(f);
        return tp_error("reference image %s: the file is %.1f GB, more than the %lld GB tpgen reads; scale it down "
                        "first", path, (double)n / (1 << 30), (long long)(IMAGE_MAX_FILE_BYTES >> 30));
    }
    uint8_t *d = malloc((size_t)n + 1);
    if (!d) {
        fclose(f);
        return tp_error("reference image %s: out of memory reading its %ld bytes", path, n);
    }
    size_t got = fread(d, 1, (size_t)n, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != (size_t)n) {
        free(d);
        return tp_error("reference image %s: cannot read it (%s)", path, err ? strerror(errno) : "it changed size");
    }
    *data = d, *size = (size_t)n;
    return 0;
}

/* the decoder for the bytes, by their signature; rgb NULL: the header only */
static int decode(const uint8_t *data, size_t size, const char *name, const image_limits *lim, uint8_t **rgb, int *w,
                  int *h) {
    int sw = 0, sh = 0, o = 1, rc;
    if (size >= 8 && !memcmp(data, "\x89PNG\r\n\x1a\n", 8))
        rc = png_decode(data, size, name, lim, rgb, &sw, &sh, &o);
    else if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
        rc = jpeg_decode(data, size, name, lim, rgb, &sw, &sh, &o);
    else
        return tp_error("reference image %s: not a PNG or JPEG image that can be read (its first bytes are neither "
                        "signature)", name);
    if (rc) return -1;
    if (sw <= 0 || sh <= 0) {
        if (rgb) free(*rgb), *rgb = NULL;
        return tp_error("reference image %s: it has no pixels (%dx%d)", name, sw, sh);
    }
    if (rgb && image_orient(o, rgb, sw, sh, name)) {
        free(*rgb), *rgb = NULL;
        return -1;
    }
    image_oriented_size(o, sw, sh, w, h);
    return 0;
}

int image_probe_mem(const uint8_t *data, size_t size, const char *name, const image_limits *lim, int *w, int *h) {
    return decode(data, size, name, lim, NULL, w, h);
}

int image_decode_rgb(const uint8_t *data, size_t size, const char *name, const image_limits *lim, uint8_t **rgb,
                     int *w, int *h) {
    *rgb = NULL;
    return decode(data, size, name, lim, rgb, w, h);
}

int image_probe(const char *path, int *w, int *h) {
    uint8_t *d;
    size_t n;
    if (read_file(path, &d, &n)) return -1;
    image_limits lim = image_default_limits();
    int rc = image_probe_mem(d, n, path, &lim, w, h);
    free(d);
    return rc;
}

int image_read_rgb(const char *path, uint8_t **rgb, int *w, int *h) {
    *rgb = NULL;
    uint8_t *d;
    size_t n;
    if (read_file(path, &d, &n)) return -1;
    image_limits lim = image_default_limits();
    int rc = image_decode_rgb(d, n, path, &lim, rgb, w, h);
    free(d);
    return rc;
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

int image_fit_crop_reference(uint8_t *rgb, int w, int h, const char *name, float **pixels, int *pw, int *ph) {
    int rw, rh;
    image_target_area_size(w, h, &rw, &rh);
    if (rw != w || rh != h) {
        uint8_t *r = malloc((size_t)rw * rh * 3);
        if (!r) {
            free(rgb);
            return tp_error("reference image %s: out of memory resizing it to %dx%d", name, rw, rh);
        }
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

/* read, checked, resized and cropped: the part after decoding */
static int reference_from_rgb(uint8_t *rgb, int w, int h, const char *name, float **pixels, int *pw, int *ph) {
    if (image_check_reference(name, w, h)) { free(rgb); return -1; }
    return image_fit_crop_reference(rgb, w, h, name, pixels, pw, ph);
}

int image_reference_mem(const uint8_t *data, size_t size, const char *name, const image_limits *lim, float **pixels,
                        int *pw, int *ph) {
    *pixels = NULL;
    uint8_t *rgb = NULL;
    int w, h;
    if (image_decode_rgb(data, size, name, lim, &rgb, &w, &h)) return -1;
    return reference_from_rgb(rgb, w, h, name, pixels, pw, ph);
}

int image_load_reference(const char *path, float **pixels, int *pw, int *ph) {
    *pixels = NULL;
    uint8_t *rgb = NULL;
    int w, h;
    if (image_read_rgb(path, &rgb, &w, &h)) return -1;
    return reference_from_rgb(rgb, w, h, path, pixels, pw, ph);
}
