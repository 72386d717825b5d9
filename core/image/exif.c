/* EXIF orientation as PIL's ImageOps.exif_transpose finds and applies it
 * (decode.h): Image.getexif reads the Orientation tag of IFD0 from the
 * JPEG's APP1 "Exif" segments (concatenated) or the PNG's eXIf chunk (or a
 * tEXt "exif" / "Raw profile type exif" text chunk), and only when that tag
 * is absent a tiff:Orientation in the XMP packet. Every read is bounded by
 * the bytes given; a stream PIL could not read either counts as no tag. */
#include "decode.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static uint32_t rd16(const uint8_t *p, int le) { return le ? p[0] | (uint32_t)p[1] << 8 : (uint32_t)p[0] << 8 | p[1]; }
static uint32_t rd32(const uint8_t *p, int le) {
    return le ? p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
              : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The first value of an IFD entry as the integer PIL compares with 1..8:
 * integer types as they are, rationals and floats only when they are a
 * whole number (PIL's IFDRational(6, 1) and 6.0 equal 6). -1: not one. */
static int entry_value(const uint8_t *v, int type, int le) {
    switch (type) {
    case 3: return (int)rd16(v, le);                       /* SHORT */
    case 8: return (int)(int16_t)rd16(v, le);              /* SSHORT */
    case 4: { uint32_t x = rd32(v, le); return x > 65535 ? -1 : (int)x; }   /* LONG */
    case 9: { int32_t x = (int32_t)rd32(v, le); return x < -1 || x > 65535 ? -1 : x; }
    case 6: return (int)(int8_t)v[0];                      /* SBYTE; BYTE (1) is bytes to PIL, never equal */
    case 5: case 10: {                                      /* (S)RATIONAL */
        int64_t a = type == 5 ? (int64_t)rd32(v, le) : (int64_t)(int32_t)rd32(v, le);
        int64_t b = type == 5 ? (int64_t)rd32(v + 4, le) : (int64_t)(int32_t)rd32(v + 4, le);
        if (b == 0 || a % b) return -1;
        int64_t q = a / b;
        return q < 0 || q > 65535 ? -1 : (int)q;
    }
    case 11: { uint32_t u = rd32(v, le); float f; memcpy(&f, &u, 4); return f >= 0 && f <= 65535 && f == (int)f ? (int)f : -1; }
    case 12: {
        uint64_t u = (uint64_t)rd32(v, le) << (le ? 0 : 32) | (uint64_t)rd32(v + 4, le) << (le ? 32 : 0);
        double d;
        memcpy(&d, &u, 8);
        return d >= 0 && d <= 65535 && d == (int)d ? (int)d : -1;
    }
    default: return -1;
    }
}

static int type_size(int type) {
    static const int sz[] = {0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8, 4};
    return type >= 1 && type <= 13 ? sz[type] : type == 16 || type == 17 || type == 18 ? 8 : 0;
}

int exif_orientation(const uint8_t *p, size_t n) {
    for (int k = 0; k < 2 && n >= 6 && !memcmp(p, "Exif\0\0", 6); k++) p += 6, n -= 6;
    if (n < 8) return -1;
    int le;
    if (p[0] == 'I' && p[1] == 'I') le = 1;
    else if (p[0] == 'M' && p[1] == 'M') le = 0;
    else return -1;
    /* PIL accepts the magic 42 in either byte order (its PREFIXES); BigTIFF's 43 it cannot read from an Exif block */
    if (!((p[2] == 42 && p[3] == 0) || (p[2] == 0 && p[3] == 42))) return -1;
    uint32_t off = rd32(p + 4, le);
    if (off > n || n - off < 2) return -1;
    uint32_t count = rd16(p + off, le);
    int found = -1;
    for (uint32_t i = 0; i < count; i++) {
        size_t e = (size_t)off + 2 + (size_t)i * 12;
        if (e + 12 > n) break;   /* PIL keeps the entries read before the end */
        if (rd16(p + e, le) != 0x0112) continue;
        int type = (int)rd16(p + e + 2, le), sz = type_size(type);
        uint32_t cnt = rd32(p + e + 4, le);
        if (!sz) continue;                      /* an unknown type is skipped */
        if (cnt == 0) { found = -1; continue; } /* PIL fails on it; treated as absent */
        const uint8_t *v = p + e + 8;
        uint64_t bytes = (uint64_t)cnt * (uint64_t)sz;
        if (bytes > 4) {
            uint32_t at = rd32(p + e + 8, le);
            if (at > n || n - at < bytes) continue;   /* PIL: "Possibly corrupt EXIF data", skipped */
            v = p + at;
        }
        found = entry_value(v, type, le);       /* a later duplicate wins, as in PIL's dict */
        if (found < 0) found = 0;               /* present but never 2..8: no transpose, no XMP */
    }
    return found;
}

int xmp_orientation(const uint8_t *p, size_t n) {
    static const char key[] = "tiff:Orientation";
    const size_t kl = sizeof key - 1;
    for (size_t i = 0; i + kl < n; i++) {
        if (p[i] != 't' || memcmp(p + i, key, kl)) continue;
        size_t j = i + kl;
        if (j + 1 < n && p[j] == '=' && p[j + 1] == '"' && j + 2 < n && p[j + 2] >= '0' && p[j + 2] <= '9') return p[j + 2] - '0';
        if (p[j] == '>' && j + 1 < n && p[j + 1] >= '0' && p[j + 1] <= '9') return p[j + 1] - '0';
    }
    return -1;
}

int jpeg_orientation(const uint8_t *d, size_t n) {
    static const char ns[] = "http://ns.adobe.com/xap/1.0/";
    size_t total = 0, nexif = 0;
    const uint8_t *xmp = NULL;
    size_t xmp_n = 0;
    /* pass 1: the Exif bytes in all and the last XMP packet; pass 2: the Exif segments concatenated (PIL: the
     * first whole, later ones without their 6-byte prefix) */
    uint8_t *buf = NULL, *q = NULL;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t p = 2; p + 4 <= n;) {
            if (d[p] != 0xFF) { p++; continue; }   /* PIL skips junk between segments */
            int m = d[p + 1];
            if (m == 0xFF) { p++; continue; }      /* fill byte */
            if (m == 0xDA || m == 0xD9) break;     /* the first scan, or the end */
            if (m == 0x00 || m == 0x01 || (m >= 0xD0 && m <= 0xD8)) { p += 2; continue; }
            size_t len = (size_t)d[p + 2] << 8 | d[p + 3];
            if (len < 2 || len > n - p - 2) break;
            const uint8_t *seg = d + p + 4;
            size_t sl = len - 2;
            if (m == 0xE1 && sl >= 6 && !memcmp(seg, "Exif\0\0", 6)) {
                size_t skip = nexif++ ? 6 : 0;
                if (pass == 0) total += sl - skip;
                else memcpy(q, seg + skip, sl - skip), q += sl - skip;
            } else if (pass == 0 && m == 0xE1 && sl >= sizeof ns && !memcmp(seg, ns, sizeof ns)) {
                xmp = seg + sizeof ns, xmp_n = sl - sizeof ns;
            }
            p += 2 + len;
        }
        if (pass == 1 || !total) break;
        if (!(buf = q = malloc(total))) return 1;
        nexif = 0;
    }
    int o = buf ? exif_orientation(buf, (size_t)(q - buf)) : -1;
    free(buf);
    if (o < 0 && xmp) o = xmp_orientation(xmp, xmp_n);
    return o < 0 ? 1 : o;
}

/* ---- PNG: the text and eXIf chunks ---- */

/* all the text that inflating may produce in one file, over every chunk:
 * PIL refuses a text chunk over 1 MB decompressed */
#define PNG_TEXT_MAX ((size_t)1 << 20)

/* zlib data -> at most PNG_TEXT_MAX bytes (*out malloc'ed); -1 if more or corrupt */
static int inflate_text(const uint8_t *p, size_t n, uint8_t **out, size_t *on, size_t *budget) {
    size_t cap = PNG_TEXT_MAX < *budget ? PNG_TEXT_MAX : *budget;
    uint8_t *buf = malloc(cap + 1);
    if (!buf) return -1;
    z_stream z = {0};
    if (inflateInit(&z) != Z_OK) { free(buf); return -1; }
    z.next_in = (Bytef *)p, z.avail_in = (uInt)(n > UINT32_MAX ? UINT32_MAX : n);
    z.next_out = buf, z.avail_out = (uInt)(cap + 1);
    int rc = inflate(&z, Z_FINISH);
    size_t got = z.total_out;
    inflateEnd(&z);
    *budget -= got > *budget ? *budget : got;
    if (rc != Z_STREAM_END || got > cap) { free(buf); return -1; }
    *out = buf, *on = got;
    return 0;
}

/* bytes.fromhex("".join(text.split("\n")[3:])): whitespace ignored, else only hex pairs */
static int raw_profile_bytes(const uint8_t *t, size_t n, uint8_t **out, size_t *on) {
    size_t i = 0;
    for (int nl = 0; nl < 3 && i < n; i++)
        if (t[i] == '\n') nl++;
    uint8_t *b = malloc(n / 2 + 1);
    if (!b) return -1;
    size_t k = 0;
    int half = -1;
    for (; i < n; i++) {
        int c = t[i], v;
        if (c == '\n') continue;   /* removed by the join */
        if (c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f') {
            if (half >= 0) { free(b); return -1; }   /* fromhex: whitespace only between pairs */
            continue;
        }
        if (c >= '0' && c <= '9') v = c - '0';
        else if ((c | 32) >= 'a' && (c | 32) <= 'f') v = (c | 32) - 'a' + 10;
        else { free(b); return -1; }
        if (half < 0) half = v;
        else b[k++] = (uint8_t)(half << 4 | v), half = -1;
    }
    if (half >= 0) { free(b); return -1; }
    *out = b, *on = k;
    return 0;
}

int png_orientation(const uint8_t *d, size_t n) {
    int exif = -2, raw = -2, xmp = -1;   /* -2: no such chunk seen */
    size_t budget = 8 * PNG_TEXT_MAX;
    for (size_t at = 8; at + 12 <= n;) {
        uint32_t len = rd32(d + at, 0);
        const uint8_t *type = d + at + 4, *body = d + at + 8;
        if (len > n - at - 12) break;   /* truncated: the decoder says so */
        if (!memcmp(type, "IEND", 4)) break;
        int want = !memcmp(type, "eXIf", 4) || !memcmp(type, "tEXt", 4) || !memcmp(type, "zTXt", 4) || !memcmp(type, "iTXt", 4);
        if (want && (uint32_t)crc32(crc32(0, type, 4), body, len) != rd32(body + len, 0)) break;   /* PIL stops there */
        if (!memcmp(type, "eXIf", 4)) {
            exif = exif_orientation(body, len);
        } else if (want) {
            const uint8_t *z = memchr(body, 0, len);
            size_t kl = z ? (size_t)(z - body) : len;
            const uint8_t *v = z ? z + 1 : body + len;
            size_t vl = (size_t)(body + len - v);
            int is_exif = kl == 4 && !memcmp(body, "exif", 4), is_raw = kl == 21 && !memcmp(body, "Raw profile type exif", 21),
                is_xmp = kl == 17 && !memcmp(body, "XML:com.adobe.xmp", 17);
            if (!is_exif && !is_raw && !is_xmp) goto next;
            uint8_t *txt = NULL;
            size_t tl = 0;
            if (!memcmp(type, "tEXt", 4)) {
                txt = malloc(vl + 1);
                if (txt) memcpy(txt, v, vl), tl = vl;
            } else if (!memcmp(type, "zTXt", 4)) {
                if (is_exif || vl < 1 || v[0] != 0 || inflate_text(v + 1, vl - 1, &txt, &tl, &budget)) goto next;
            } else {   /* iTXt: flag, method, language\0, translated keyword\0, text */
                if (is_exif || vl < 2) goto next;
                int cf = v[0], cm = v[1];
                const uint8_t *s = v + 2, *e = v + vl, *z1 = memchr(s, 0, (size_t)(e - s));
                const uint8_t *z2 = z1 ? memchr(z1 + 1, 0, (size_t)(e - z1 - 1)) : NULL;
                if (!z2) goto next;
                s = z2 + 1;
                if (cf) {
                    if (cm || inflate_text(s, (size_t)(e - s), &txt, &tl, &budget)) goto next;
                } else if ((txt = malloc((size_t)(e - s) + 1))) {
                    memcpy(txt, s, (size_t)(e - s)), tl = (size_t)(e - s);
                }
            }
            if (!txt) goto next;
            if (is_exif) {
                exif = exif_orientation(txt, tl);
            } else if (is_raw) {
                uint8_t *b = NULL;
                size_t bl = 0;
                raw = raw_profile_bytes(txt, tl, &b, &bl) ? -1 : exif_orientation(b, bl);
                free(b);
            } else if (tl) {   /* the last non-empty packet */
                xmp = xmp_orientation(txt, tl);
            }
            free(txt);
        }
    next:
        at += (size_t)len + 12;
    }
    int o = exif != -2 ? exif : raw != -2 ? raw : -1;
    if (o < 0) o = xmp;
    return o < 0 ? 1 : o;
}

/* ---- the transpose: PIL's Image.Transpose for each orientation ---- */

void image_oriented_size(int o, int w, int h, int *ow, int *oh) {
    int swap = o >= 5 && o <= 8;
    *ow = swap ? h : w, *oh = swap ? w : h;
}

int image_orient(int o, uint8_t **rgb, int w, int h, const char *name) {
    if (o < 2 || o > 8) return 0;
    int ow, oh;
    image_oriented_size(o, w, h, &ow, &oh);
    uint8_t *src = *rgb, *dst = malloc((size_t)w * (size_t)h * 3);
    if (!dst) return tp_error("reference image %s: out of memory turning it upright (EXIF orientation %d)", name, o);
    for (int y = 0; y < oh; y++)
        for (int x = 0; x < ow; x++) {
            int sx, sy;   /* the source pixel of output (x, y) */
            switch (o) {
            case 2: sx = w - 1 - x, sy = y; break;                /* FLIP_LEFT_RIGHT */
            case 3: sx = w - 1 - x, sy = h - 1 - y; break;        /* ROTATE_180 */
            case 4: sx = x, sy = h - 1 - y; break;                /* FLIP_TOP_BOTTOM */
            case 5: sx = y, sy = x; break;                        /* TRANSPOSE */
            case 6: sx = y, sy = h - 1 - x; break;                /* ROTATE_270 (90 clockwise) */
            case 7: sx = w - 1 - y, sy = h - 1 - x; break;        /* TRANSVERSE */
            default: sx = w - 1 - y, sy = x; break;               /* 8: ROTATE_90 (counter-clockwise) */
            }
            memcpy(dst + ((size_t)y * ow + x) * 3, src + ((size_t)sy * w + sx) * 3, 3);
        }
    free(src);
    *rgb = dst;
    return 0;
}
