/* Image decoding for outside bytes (internal to core/image; image.h is the
 * API): PNG through libpng, JPEG through libjpeg-turbo, both from memory,
 * with the limits of image_limits checked before anything large is
 * allocated, and the EXIF orientation that PIL's ImageOps.exif_transpose
 * applies (exif.c). */
#ifndef TPGEN_IMAGE_DECODE_H
#define TPGEN_IMAGE_DECODE_H
#include "image.h"
#include <stddef.h>
#include <stdint.h>

/* One decoder call. With rgb == NULL only the header (and the metadata
 * that orientation needs) is read. w, h: the stored size (before the
 * orientation); *orientation: the EXIF value, 1 when there is none.
 * Errors: -1 + tp_error naming `name`. */
int png_decode(const uint8_t *data, size_t size, const char *name, const image_limits *lim, uint8_t **rgb, int *w,
               int *h, int *orientation);
int jpeg_decode(const uint8_t *data, size_t size, const char *name, const image_limits *lim, uint8_t **rgb, int *w,
                int *h, int *orientation);

/* the error every decoder gives for a size over lim->max_pixels */
int image_too_many_pixels(const char *name, int w, int h, const image_limits *lim);
/* seconds since an arbitrary origin (monotonic), for the decode deadline */
double image_clock(void);

/* EXIF and XMP orientation as PIL reads it (Image.getexif):
 *   exif_orientation: the Orientation tag (0x0112) of IFD0 of a TIFF
 *     stream ("Exif\0\0" prefixes, up to two, skipped); -1 when there is
 *     none or the stream cannot be read;
 *   xmp_orientation: the first digit after `tiff:Orientation="` or
 *     `tiff:Orientation>`; -1 when there is none. */
int exif_orientation(const uint8_t *p, size_t n);
int xmp_orientation(const uint8_t *p, size_t n);
/* JPEG: the orientation from the APP1 segments before the first scan (as
 * PIL reads them), found by a marker walk over the bytes: libjpeg's own
 * marker saving appends to a list by walking it, quadratic in the number
 * of markers (2 million empty APP1s: minutes) */
int jpeg_orientation(const uint8_t *data, size_t size);
/* PNG: the orientation from eXIf, tEXt "exif", "Raw profile type exif"
 * and XMP text chunks anywhere in the file (walked here, CRC-checked) */
int png_orientation(const uint8_t *data, size_t size);

/* the size after orientation o, and the transpose itself (a new buffer;
 * -1 + tp_error when it cannot be allocated) */
void image_oriented_size(int o, int w, int h, int *ow, int *oh);
int image_orient(int o, uint8_t **rgb, int w, int h, const char *name);

#endif
