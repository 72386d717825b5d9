/* PNG decoding with libpng (decode.h), as PIL's Image.open(...)
 * .convert("RGB") sees the file: grey replicated, alpha and tRNS dropped
 * (no compositing), palettes expanded, 1/2/4-bit samples scaled to 8 bits
 * (PIL's "L;2" etc. rawmodes), 16-bit samples reduced to their high byte,
 * except 16-bit greyscale, which PIL opens as mode "I;16" and clips to 255.
 * No gamma or colour management, like PIL. Every CRC is checked (PIL
 * refuses a bad one too); the pixel limit is checked on the IHDR before
 * the image is allocated; rows are read one at a time (interlaced images
 * through the pass loop) with the decode deadline checked between them. */
#include "decode.h"
#include "kernels/err.h"
#include <png.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct png_src {
    const uint8_t *data;
    size_t size, at;
    const char *name;   /* for the message */
} png_src;

static void on_read(png_structp png, png_bytep out, size_t n) {
    png_src *s = png_get_io_ptr(png);
    if (n > s->size - s->at) png_error(png, "the file ends early (truncated)");
    memcpy(out, s->data + s->at, n);
    s->at += n;
}

/* the message is recorded here, so that nothing written after setjmp is read after the longjmp */
static void on_error(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    tp_error("reference image %s: cannot decode it (%s); the file is truncated or corrupt", s->name, msg);
    png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }   /* PIL ignores them too */

int png_decode(const uint8_t *data, size_t size, const char *name, const image_limits *lim, uint8_t **rgb, int *w,
               int *h, int *orientation) {
    /* the size straight from IHDR (the first chunk), so that the limit is
     * the error even when a later chunk is broken */
    if (size >= 24 && !memcmp(data + 12, "IHDR", 4)) {
        uint32_t W = (uint32_t)data[16] << 24 | (uint32_t)data[17] << 16 | (uint32_t)data[18] << 8 | data[19];
        uint32_t H = (uint32_t)data[20] << 24 | (uint32_t)data[21] << 16 | (uint32_t)data[22] << 8 | data[23];
        if (W <= INT32_MAX && H <= INT32_MAX && (int64_t)W * H > lim->max_pixels)
            return image_too_many_pixels(name, (int)W, (int)H, lim);
    }
    png_src src = {.data = data, .size = size, .name = name};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, on_error, on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return tp_error("reference image %s: out of memory starting the PNG decoder", name);
    }
    /* changed after setjmp and read after the longjmp: volatile (png and info are not changed; every error is
     * recorded before the jump) */
    uint8_t *volatile out = NULL, *volatile raw = NULL;
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        free(out), free(raw);
        return -1;
    }
    png_set_read_fn(png, &src, on_read);
    png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
    png_set_user_limits(png, 1u << 24, 1u << 24);   /* sides; the pixel count is checked below */
    png_set_chunk_malloc_max(png, 8u << 20);         /* one ancillary chunk, decompressed */
    png_set_chunk_cache_max(png, 1000);
    /* the metadata chunks are skipped (CRC-checked, never buffered): libpng would allocate the length a
     * text chunk declares before reading it, 1.6 GB for a 1 KB file; exif.c reads what orientation needs */
    static const png_byte skip[] = "tEXt\0zTXt\0iTXt\0eXIf\0iCCP\0sPLT\0hIST\0pCAL\0sCAL\0tIME\0bKGD\0cHRM\0gAMA\0"
                                   "sBIT\0sRGB\0pHYs\0oFFs\0";
    png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, skip, (int)(sizeof skip / 5));
    png_read_info(png, info);
    png_uint_32 W = png_get_image_width(png, info), H = png_get_image_height(png, info);
    int depth = png_get_bit_depth(png, info), ctype = png_get_color_type(png, info);
    if ((int64_t)W * H > lim->max_pixels) {
        image_too_many_pixels(name, (int)W, (int)H, lim);
        png_longjmp(png, 1);
    }
    *w = (int)W, *h = (int)H;
    *orientation = png_orientation(data, size);
    if (!rgb) {
        png_destroy_read_struct(&png, &info, NULL);
        return 0;
    }
    int grey16 = depth == 16 && ctype == PNG_COLOR_TYPE_GRAY;
    if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);   /* with a tRNS: RGBA, alpha dropped below */
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16 && !grey16) png_set_strip_16(png);                  /* the high byte */
    if (grey16) png_set_swap(png);                                      /* host order for the clip */
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int ch = png_get_channels(png, info);
    size_t rowbytes = png_get_rowbytes(png, info), np = (size_t)W * H;
    out = malloc(np * 3);
    /* one row, or the whole image when interlaced (its passes fill rows in turn) */
    raw = malloc(passes > 1 ? rowbytes * H : rowbytes);
    if (!out || !raw) {
        tp_error("reference image %s: out of memory decoding %ux%u pixels", name, (unsigned)W, (unsigned)H);
        png_longjmp(png, 1);
    }
    double t0 = image_clock();
    for (int p = 0; p < passes; p++)
        for (png_uint_32 y = 0; y < H; y++) {
            uint8_t *r = passes > 1 ? raw + rowbytes * y : raw;
            png_read_row(png, r, NULL);
            if ((y & 63) == 63 && image_clock() - t0 > lim->max_seconds) {
                tp_error("reference image %s: decoding took more than %.0f s; refused (a PNG this slow to decode is "
                         "built to be)", name, lim->max_seconds);
                png_longjmp(png, 1);
            }
            if (passes > 1 && p < passes - 1) continue;
            uint8_t *o = out + (size_t)y * W * 3;
            for (png_uint_32 x = 0; x < W; x++, o += 3) {
                if (grey16) {
                    uint16_t g = ((const uint16_t *)r)[x];
                    o[0] = o[1] = o[2] = g > 255 ? 255 : (uint8_t)g;
                } else if (ch <= 2) {
                    o[0] = o[1] = o[2] = r[(size_t)x * ch];
                } else {
                    memcpy(o, r + (size_t)x * ch, 3);
                }
            }
        }
    png_destroy_read_struct(&png, &info, NULL);
    free(raw);
    *rgb = out;
    return 0;
}
