/* Image output: PNG encoding with a text chunk carrying the generation
 * parameters, and atomic file writes (a temporary file in the same
 * directory, then rename), so a failed or interrupted write never leaves a
 * half-written file or clobbers an existing one. */
#ifndef TPGEN_PNG_H
#define TPGEN_PNG_H
#include <stddef.h>
#include <stdint.h>

/* Write n bytes to path atomically. -1 + tp_error naming the path on any
 * failure (the temporary file is removed; an existing file is untouched). */
int file_write_atomic(const char *path, const void *data, size_t n);

/* Encode an 8-bit RGB image (rows top to bottom, width*3 bytes each) as PNG
 * in memory and insert a text chunk key=text right after IHDR: tEXt when
 * the text is ASCII, iTXt (UTF-8) otherwise. text may be NULL (no chunk).
 * *out is malloc'ed. */
int png_encode_rgb(const uint8_t *rgb, int width, int height, const char *key, const char *text,
                   uint8_t **out, size_t *out_len);

/* png_encode_rgb + file_write_atomic */
int png_write_rgb(const char *path, const uint8_t *rgb, int width, int height, const char *key,
                  const char *text);

/* Read the text chunk `key` (tEXt or uncompressed iTXt) of a PNG file:
 * *out malloc'ed. Returns 0 when found, 1 when the file has no such chunk,
 * -1 + tp_error when the file is not a readable PNG. */
int png_read_text(const char *path, const char *key, char **out);

#endif
