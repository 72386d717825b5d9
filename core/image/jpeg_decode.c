/* JPEG decoding with libjpeg-turbo (decode.h), as PIL's Image.open(...)
 * .convert("RGB") sees the file: PIL decodes with libjpeg too (accurate
 * integer IDCT, fancy upsampling: libjpeg's defaults, kept here), so RGB
 * and greyscale files come out the same; CMYK and YCCK (Adobe) files are
 * read as CMYK, inverted as PIL's "CMYK;I" rawmode assumes, and converted
 * with PIL's cmyk2rgb. Hostile files are refused: libjpeg's errors and its
 * corrupt-data warnings (a bad Huffman code, a truncated file, a bogus
 * progression) end the decode, the pixel limit is checked on the frame
 * header before anything is allocated, and a progress monitor caps the
 * number of scans (progressive files) and the decode time. */
#include "decode.h"
#include "kernels/err.h"
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

/* One decode's state, on the heap: the pointer to it is set before setjmp
 * and never changed, so everything libjpeg and the loop below change is
 * still valid after the longjmp (no automatic variable is involved). */
typedef struct jctx {
    struct jpeg_decompress_struct d;
    struct jpeg_error_mgr pub;
    struct jpeg_progress_mgr progress;
    jmp_buf jb;
    const image_limits *lim;
    const char *name;
    double t0;
    uint8_t *out, *row;
} jctx;

static jctx *ctx_of(j_common_ptr c) { return (jctx *)((char *)c->err - offsetof(jctx, pub)); }

/* every error is recorded before the jump, so the setjmp branch only cleans up */
__attribute__((noreturn)) static void on_error(j_common_ptr c) {
    char m[JMSG_LENGTH_MAX];
    c->err->format_message(c, m);
    tp_error("reference image %s: cannot decode it (%s); the file is truncated or corrupt", ctx_of(c)->name, m);
    longjmp(ctx_of(c)->jb, 1);
}

/* Warnings of corrupt data end the decode (PIL would paint over the damage
 * or, for a truncated file, refuse it); the harmless ones are ignored. */
static void on_message(j_common_ptr c, int level) {
    if (level >= 0) return;   /* trace messages */
    int code = c->err->msg_code;
    if (code == JWRN_EXTRANEOUS_DATA || code == JWRN_ADOBE_XFORM || code == JWRN_JFIF_MAJOR || code == JWRN_BOGUS_ICC) return;
    on_error(c);
}

static void on_progress(j_common_ptr c) {
    jctx *x = ctx_of(c);
    if (x->d.input_scan_number > x->lim->max_scans) {
        tp_error("reference image %s: the JPEG has more than %d scans; refused (a progressive photo has about 10; "
                 "thousands make decoding take minutes)", x->name, x->lim->max_scans);
        longjmp(x->jb, 1);
    }
    if (image_clock() - x->t0 > x->lim->max_seconds) {
        tp_error("reference image %s: decoding took more than %.0f s; refused (a JPEG this slow to decode is built "
                 "to be)", x->name, x->lim->max_seconds);
        longjmp(x->jb, 1);
    }
}

__attribute__((noreturn)) static void fail(jctx *x, const char *why) {
    tp_error("reference image %s: cannot decode it (%s); the file is truncated or corrupt", x->name, why);
    longjmp(x->jb, 1);
}

/* PIL's cmyk2rgb on PIL's (inverted) CMYK: r = 255-k' - c'·(255-k')/255,
 * with its MULDIV255 rounding */
static inline uint8_t cmyk_channel(int c, int k) {
    int cp = 255 - c, nk = k;   /* c' = 255 - c, 255 - k' = k */
    int t = cp * nk + 128, m = ((t >> 8) + t) >> 8, v = nk - m;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

int jpeg_decode(const uint8_t *data, size_t size, const char *name, const image_limits *lim, uint8_t **rgb, int *w,
                int *h, int *orientation) {
    jctx *const x = calloc(1, sizeof *x);
    if (!x) return tp_error("reference image %s: out of memory starting the JPEG decoder", name);
    x->lim = lim, x->name = name;
    struct jpeg_decompress_struct *const d = &x->d;
    d->err = jpeg_std_error(&x->pub);
    x->pub.error_exit = on_error;
    x->pub.emit_message = on_message;
    if (setjmp(x->jb)) {
        jpeg_destroy_decompress(d);
        free(x->out), free(x->row), free(x);
        return -1;
    }
    jpeg_create_decompress(d);
    x->progress.progress_monitor = on_progress;
    d->progress = &x->progress;
    /* what libjpeg may allocate in all: the largest image's buffers, with room for its coefficients */
    d->mem->max_memory_to_use = (long)(lim->max_pixels * 16 + (64 << 20));
    jpeg_mem_src(d, data, (unsigned long)size);
    jpeg_read_header(d, TRUE);
    if ((int64_t)d->image_width * d->image_height > lim->max_pixels) {
        image_too_many_pixels(name, (int)d->image_width, (int)d->image_height, lim);
        longjmp(x->jb, 1);
    }
    *orientation = jpeg_orientation(data, size);
    *w = (int)d->image_width, *h = (int)d->image_height;
    if (!rgb) {
        jpeg_destroy_decompress(d);
        free(x);
        return 0;
    }
    int cmyk = d->num_components == 4;
    d->out_color_space = d->num_components == 1 ? JCS_GRAYSCALE : cmyk ? JCS_CMYK : JCS_RGB;
    x->t0 = image_clock();
    jpeg_start_decompress(d);   /* a progressive file's scans are all read here, under the monitor */
    int oc = d->output_components;
    if ((int)d->output_width != *w || (int)d->output_height != *h || (oc != 1 && oc != 3 && oc != 4))
        fail(x, "unexpected output size or components");
    size_t np = (size_t)*w * (size_t)*h;
    x->out = malloc(np * 3);
    x->row = malloc((size_t)*w * (size_t)oc);
    if (!x->out || !x->row) {
        tp_error("reference image %s: out of memory decoding %dx%d pixels", name, *w, *h);
        longjmp(x->jb, 1);
    }
    while (d->output_scanline < d->output_height) {
        JSAMPROW r = x->row;
        uint8_t *o = x->out + (size_t)d->output_scanline * (size_t)*w * 3;
        if (jpeg_read_scanlines(d, &r, 1) != 1) fail(x, "a scanline is missing");
        for (int k = 0; k < *w; k++, o += 3) {
            const uint8_t *s = x->row + (size_t)k * oc;
            if (oc == 1) o[0] = o[1] = o[2] = s[0];
            else if (oc == 3) memcpy(o, s, 3);
            else o[0] = cmyk_channel(s[0], s[3]), o[1] = cmyk_channel(s[1], s[3]), o[2] = cmyk_channel(s[2], s[3]);
        }
    }
    jpeg_finish_decompress(d);
    jpeg_destroy_decompress(d);
    *rgb = x->out;
    free(x->row), free(x);
    return 0;
}
