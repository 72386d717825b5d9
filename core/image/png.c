/* PNG output (see png.h). stb_image_write encodes, zlib compresses and
 * computes the chunk CRC; the text chunk is spliced in after IHDR. */
#include "png.h"
#include "kernels/err.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static unsigned char *zlib_compress_for_stb(unsigned char *data, int len, int *out_len, int quality) {
    uLongf n = compressBound((uLong)len);
    unsigned char *out = malloc(n);
    if (!out) return NULL;
    if (compress2(out, &n, data, (uLong)len, quality > 9 ? 9 : quality) != Z_OK) {
        free(out);
        return NULL;
    }
    *out_len = (int)n;
    return out;
}

#define STB_IMAGE_WRITE_STATIC   /* private copy: other files may embed stb too */
#define STBIW_ZLIB_COMPRESS zlib_compress_for_stb
#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

int file_write_atomic(const char *path, const void *data, size_t n) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base) return tp_error("cannot write %s: the path names a directory, not a file", path);
    /* same directory as the target, so that rename() is atomic */
    char *tmp = slash ? xasprintf("%.*s/.%s.tmp-XXXXXX", (int)(slash - path), path, base)
                      : xasprintf(".%s.tmp-XXXXXX", base);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return tp_error("cannot write %s: %s (does the directory exist and is it writable?)", path,
                        strerror(e));
    }
    const uint8_t *p = data;
    size_t left = n;
    int err = 0;
    while (left > 0 && !err) {
        ssize_t k = write(fd, p, left);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) err = k < 0 ? errno : EIO;
        else p += k, left -= (size_t)k;
    }
    /* an image file is meant to be shared: the usual umask-based mode */
    mode_t um = umask(0);
    umask(um);
    if (!err && fchmod(fd, 0666 & ~um) != 0) err = errno;
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        unlink(tmp);
        free(tmp);
        return tp_error("cannot write %s: %s (nothing was written; an existing file is unchanged)",
                        path, strerror(err));
    }
    free(tmp);
    return 0;
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}
static uint32_t get_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int is_ascii(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80) return 0;
    return 1;
}

/* the chunk (length, type, data, CRC) of a text entry */
static uint8_t *text_chunk(const char *key, const char *text, size_t *len) {
    int itxt = !is_ascii(text);
    size_t kl = strlen(key), tl = strlen(text);
    /* iTXt: key\0 compression-flag compression-method language\0 translated-key\0 text */
    size_t dl = kl + 1 + (itxt ? 4 : 0) + tl;
    uint8_t *c = xmalloc(dl + 12);
    put_be32(c, (uint32_t)dl);
    memcpy(c + 4, itxt ? "iTXt" : "tEXt", 4);
    uint8_t *d = c + 8;
    memcpy(d, key, kl + 1);
    d += kl + 1;
    if (itxt) memset(d, 0, 4), d += 4;
    memcpy(d, text, tl);
    put_be32(c + 8 + dl, (uint32_t)crc32(crc32(0, NULL, 0), c + 4, (uInt)(dl + 4)));
    *len = dl + 12;
    return c;
}

int png_encode_rgb(const uint8_t *rgb, int width, int height, const char *key, const char *text,
                   uint8_t **out, size_t *out_len) {
    if (width <= 0 || height <= 0) return tp_error("cannot encode an empty %dx%d image", width, height);
    int n = 0;
    uint8_t *png = stbi_write_png_to_mem(rgb, width * 3, width, height, 3, &n);
    if (!png) return tp_error("PNG encoding of a %dx%d image failed (out of memory?)", width, height);
    if (!text) {
        *out = png, *out_len = (size_t)n;
        return 0;
    }
    size_t cl;
    uint8_t *chunk = text_chunk(key, text, &cl);
    const size_t after_ihdr = 8 + 25;     /* signature + IHDR chunk */
    uint8_t *res = xmalloc((size_t)n + cl);
    memcpy(res, png, after_ihdr);
    memcpy(res + after_ihdr, chunk, cl);
    memcpy(res + after_ihdr + cl, png + after_ihdr, (size_t)n - after_ihdr);
    free(chunk);
    free(png);
    *out = res, *out_len = (size_t)n + cl;
    return 0;
}

int png_write_rgb(const char *path, const uint8_t *rgb, int width, int height, const char *key,
                  const char *text) {
    uint8_t *png;
    size_t n;
    if (png_encode_rgb(rgb, width, height, key, text, &png, &n)) return -1;
    int rc = file_write_atomic(path, png, n);
    free(png);
    return rc;
}

static int read_whole(const char *path, uint8_t **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return tp_error("cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = xmalloc(cap);
    size_t k;
    while ((k = fread(b + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) b = xrealloc(b, cap *= 2);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        return tp_error("cannot read %s", path);
    }
    *out = b, *len = n;
    return 0;
}

int png_read_text(const char *path, const char *key, char **out) {
    uint8_t *b = NULL;
    size_t n = 0;
    if (read_whole(path, &b, &n)) return -1;
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n < 8 || memcmp(b, sig, 8)) {
        free(b);
        return tp_error("%s is not a PNG file", path);
    }
    size_t kl = strlen(key);
    for (size_t off = 8; off + 12 <= n;) {
        size_t dl = get_be32(b + off);
        if (dl > n - off - 12) break;
        const uint8_t *type = b + off + 4, *d = b + off + 8;
        int t = !memcmp(type, "tEXt", 4), it = !memcmp(type, "iTXt", 4);
        if ((t || it) && dl > kl && !memcmp(d, key, kl) && d[kl] == 0) {
            const uint8_t *p = d + kl + 1, *end = d + dl;
            if (it) { /* flag, method, language\0, translated key\0 */
                if (end - p < 2 || p[0] != 0) break;   /* compressed iTXt: not written by tpgen */
                p += 2;
                for (int skip = 0; skip < 2 && p < end; p++)
                    if (*p == 0) skip++;
            }
            size_t tl = (size_t)(end - p);
            *out = xmalloc(tl + 1);
            memcpy(*out, p, tl);
            (*out)[tl] = 0;
            free(b);
            return 0;
        }
        off += dl + 12;
    }
    free(b);
    return 1;
}
