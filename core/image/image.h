/* Reference images for editing (FLUX.2 multi-reference generation): reading
 * PNG/JPEG files (stb_image) as PIL's Image.open(...).convert("RGB") sees
 * them, the checks and the preprocessing of diffusers'
 * Flux2ImageProcessor / Flux2(Klein)Pipeline (pipelines/flux2/
 * image_processor.py at the golden's commit):
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

/* Largest decoded image accepted, in pixels (beyond it the decode alone
 * would take gigabytes): 64 Mpx, e.g. 8192 x 8192. */
#define IMAGE_MAX_PIXELS ((int64_t)64 << 20)
#define IMAGE_REF_MIN_SIDE 64
#define IMAGE_REF_MAX_ASPECT 8
#define IMAGE_REF_MAX_AREA (1024 * 1024)

/* Header only: size of the image in `path`, with every check that needs no
 * decoding (readable, a PNG/JPEG stb_image understands, the pixel limit).
 * -1 + tp_error naming the file otherwise. */
int image_probe(const char *path, int *w, int *h);

/* Decode to 8-bit RGB (rows top to bottom, w·3 bytes each; *rgb malloc'ed),
 * as PIL's convert("RGB") does: greyscale replicated, alpha dropped (no
 * compositing), palettes expanded, 16-bit samples reduced to their high
 * byte, except 16-bit greyscale, which PIL opens as mode "I" and clips to
 * 255. Truncated or corrupt files are errors naming the file. */
int image_read_rgb(const char *path, uint8_t **rgb, int *w, int *h);

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

/* A whole reference: read, check, resize, crop, normalise. *pixels
 * (malloc'ed) is [3, ph, pw] in [-1, 1]. */
int image_load_reference(const char *path, float **pixels, int *pw, int *ph);

#endif
