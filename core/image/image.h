/* Reference images for editing (FLUX.2 multi-reference generation): reading
 * PNG files (libpng) and JPEG files (libjpeg-turbo) as diffusers'
 * load_image sees them, i.e. PIL's Image.open(...) turned upright by
 * ImageOps.exif_transpose and .convert("RGB"); the checks and the
 * preprocessing of diffusers' Flux2ImageProcessor / Flux2(Klein)Pipeline
 * (pipelines/flux2/image_processor.py at the golden's commit):
 *   check_image_input: both sides >= 64 px, aspect ratio <= 8;
 *   over 1024x1024 px of area: _resize_to_target_area, PIL LANCZOS to
 *     (int(w·s), int(h·s)), s = sqrt(1024²/(w·h)), on the RGB uint8 image;
 *   each side floored to a multiple of 16, then a centre crop
 *     (_resize_and_crop crops only: left = (W-w)//2, top = (H-h)//2);
 *   normalised to [-1, 1]: 2·(u/255) - 1 in float32, CHW. */
#ifndef TPGEN_IMAGE_H
#define TPGEN_IMAGE_H
#include <stddef.h>
#include <stdint.h>

/* Largest decoded image accepted by default, in pixels (beyond it the
 * decode alone would take gigabytes): 64 Mpx, e.g. 8192 x 8192. `tpgen
 * serve` lowers it (--max-ref-pixels). */
#define IMAGE_MAX_PIXELS ((int64_t)64 << 20)
/* progressive JPEG scans accepted (encoders write about 10) */
#define IMAGE_MAX_SCANS 100
/* wall time of one decode, a backstop behind the two limits above */
#define IMAGE_MAX_SECONDS 30.0
/* largest file read (a 64 Mpx 16-bit RGBA PNG of noise is about 512 MB) */
#define IMAGE_MAX_FILE_BYTES ((int64_t)1 << 30)
#define IMAGE_REF_MIN_SIDE 64
#define IMAGE_REF_MAX_ASPECT 8
#define IMAGE_REF_MAX_AREA (1024 * 1024)

/* What one decode may cost. The pixel count (width x height of the file's
 * header) is checked before anything is allocated; knob names the setting
 * in the message ("--max-ref-pixels"), NULL for tpgen's own cap. */
typedef struct image_limits {
    int64_t max_pixels;
    int max_scans;
    double max_seconds;
    const char *knob;
} image_limits;

/* The limits of the path-based calls below: the defaults above, or what a
 * front end set for its process (tpgen serve: image_set_max_pixels). */
image_limits image_default_limits(void);
void image_set_max_pixels(int64_t max_pixels, const char *knob);

/* Header only: size of the image in `path` as it will be decoded (after
 * the EXIF orientation), with every check that needs no decoding
 * (readable, a PNG or JPEG, the pixel limit). -1 + tp_error naming the
 * file otherwise. */
int image_probe(const char *path, int *w, int *h);
int image_probe_mem(const uint8_t *data, size_t size, const char *name, const image_limits *lim, int *w, int *h);

/* Decode to 8-bit RGB (rows top to bottom, w·3 bytes each; *rgb malloc'ed)
 * as diffusers' load_image sees the file: turned upright as PIL's
 * ImageOps.exif_transpose does (all 8 EXIF orientations; a PNG's eXIf or
 * raw-profile text, else an XMP tiff:Orientation), then PIL's
 * convert("RGB"): greyscale replicated, alpha dropped (no compositing),
 * palettes expanded, 16-bit samples reduced to their high byte, except
 * 16-bit greyscale, which PIL opens as mode "I;16" and clips to 255; CMYK
 * and YCCK JPEGs through PIL's inverted-CMYK rule. Truncated or corrupt
 * files, and files over a limit, are errors naming the file (`name` in
 * the _mem form). */
int image_read_rgb(const char *path, uint8_t **rgb, int *w, int *h);
int image_decode_rgb(const uint8_t *data, size_t size, const char *name, const image_limits *lim, uint8_t **rgb,
                     int *w, int *h);

/* diffusers' check_image_input on a w x h image (path for the message). */
int image_check_reference(const char *path, int w, int h);

/* PIL Image.resize((ow, oh), LANCZOS) of an RGB uint8 image: separable,
 * horizontal pass first, support 3 scaled by the reduction factor, 8-bit
 * fixed-point coefficients (22 fractional bits), rounding as PIL does. A
 * dimension whose size does not change is not resampled. */
void image_resize_lanczos(const uint8_t *src, int w, int h, uint8_t *dst, int ow, int oh);

/* The size _resize_to_target_area gives a w x h image (unchanged when the
 * area is at most IMAGE_REF_MAX_AREA). */
void image_target_area_size(int w, int h, int *ow, int *oh);

/* The processed size of a w x h reference: after the area resize, each
 * side floored to a multiple of 16. */
void image_reference_size(int w, int h, int *pw, int *ph);
/* FLUX.2's preprocessing of a decoded reference without its checks: rgb
 * (w x h, consumed) resized under IMAGE_REF_MAX_AREA with PIL LANCZOS,
 * centre-cropped to multiples of 16, as [3, ph, pw] floats in [-1, 1].
 * -1 + tp_error naming name on out-of-memory. */
int image_fit_crop_reference(uint8_t *rgb, int w, int h, const char *name, float **pixels, int *pw, int *ph);

/* A whole reference: read, check, resize, crop, normalise. *pixels
 * (malloc'ed) is [3, ph, pw] in [-1, 1]. The _mem form decodes bytes
 * (`name` for the messages) under the limits given. */
int image_load_reference(const char *path, float **pixels, int *pw, int *ph);
int image_reference_mem(const uint8_t *data, size_t size, const char *name, const image_limits *lim, float **pixels,
                        int *pw, int *ph);

#endif
