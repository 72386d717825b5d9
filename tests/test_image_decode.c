/* Image decoding (core/image: libpng, libjpeg-turbo, EXIF orientation)
 * against what PIL makes of the same files: tests/data/image, written by
 * tests/tools/mkimages.py with ImageOps.exif_transpose(Image.open(f))
 * .convert("RGB") as the reference (diffusers' load_image). Then the
 * limits, the EXIF parser on hand-built streams, and every truncation and
 * thousands of byte flips of every file (run these under ASan too). */
#include "test.h"
#include "kernels/err.h"
#include "core/image/image.h"
#include "core/image/decode.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define DATA "tests/data/image"

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static json_t *manifest(void) {
    json_t *m = json_load_file(DATA "/manifest.json", 0, NULL);
    return m ? m : NULL;
}

TEST(image_decode_matches_pil) {
    json_t *m = manifest();
    REQUIRE(m, "cannot read " DATA "/manifest.json");
    json_t *files = json_object_get(m, "files");
    REQUIRE(json_array_size(files) >= 20, "manifest lists %zu files", json_array_size(files));
    int worst_all = 0;
    for (size_t i = 0; i < json_array_size(files); i++) {
        json_t *e = json_array_get(files, i);
        const char *name = json_string_value(json_object_get(e, "file"));
        int ww = (int)json_integer_value(json_object_get(e, "width")), wh = (int)json_integer_value(json_object_get(e, "height"));
        char path[256], ref[272];
        snprintf(path, sizeof path, DATA "/%s", name);
        snprintf(ref, sizeof ref, "%s.rgb", path);
        size_t rn = 0;
        uint8_t *want = slurp(ref, &rn), *got = NULL;
        int w = 0, h = 0, pw = 0, ph = 0;
        CHECK(image_probe(path, &pw, &ph) == 0 && pw == ww && ph == wh, "%s: probe %dx%d, PIL %dx%d (%s)", name, pw, ph,
              ww, wh, tp_error_msg());
        int rc = image_read_rgb(path, &got, &w, &h);
        CHECK(rc == 0, "%s: %s", name, tp_error_msg());
        if (!rc && want && w == ww && h == wh && rn == (size_t)w * h * 3) {
            int worst = 0;
            size_t off = 0;
            for (size_t k = 0; k < rn; k++) {
                int d = abs((int)got[k] - (int)want[k]);
                off += d != 0;
                if (d > worst) worst = d;
            }
            if (worst > worst_all) worst_all = worst;
            printf("# %s: %dx%d, max diff to PIL %d (%zu of %zu samples differ)\n", name, w, h, worst, off, rn);
            CHECK(worst <= 3, "%s: differs from PIL by up to %d levels", name, worst);
        } else if (!rc) {
            CHECK(0, "%s: decoded %dx%d, PIL %dx%d (reference %zu bytes)", name, w, h, ww, wh, rn);
        }
        free(got), free(want);
    }
    printf("# %zu files (Pillow %s): worst difference %d levels\n", json_array_size(files),
           json_string_value(json_object_get(m, "pillow")), worst_all);
    json_decref(m);
}

/* PIL's 8 results differ from each other, so the comparison above would see a wrong transpose */
TEST(image_orientations_are_distinct) {
    uint8_t *px[8];
    size_t n[8];
    for (int o = 0; o < 8; o++) {
        char p[128];
        snprintf(p, sizeof p, DATA "/orient%d.jpg.rgb", o + 1);
        px[o] = slurp(p, &n[o]);
        REQUIRE(px[o], "missing %s", p);
    }
    for (int a = 0; a < 8; a++)
        for (int b = a + 1; b < 8; b++)
            CHECK(n[a] != n[b] || memcmp(px[a], px[b], n[a]), "PIL's orientations %d and %d give the same pixels", a + 1, b + 1);
    for (int o = 0; o < 8; o++) free(px[o]);
}

/* ---- the EXIF parser on streams built here ---- */

static void put16(uint8_t *b, size_t *k, int le, uint32_t v) {
    v &= 0xFFFF;
    b[(*k)++] = (uint8_t)(le ? v & 255 : v >> 8);
    b[(*k)++] = (uint8_t)(le ? v >> 8 : v & 255);
}
static void put32(uint8_t *b, size_t *k, int le, uint32_t v) {
    put16(b, k, le, le ? v : v >> 16);
    put16(b, k, le, le ? v >> 16 : v);
}

/* a TIFF stream with IFD0 = n entries (SHORT values inline, others 32-bit) */
static size_t tiff(uint8_t *b, int le, int n, const uint16_t *tags, const uint16_t *types, const uint32_t *counts,
                   const uint32_t *vals) {
    size_t k = 0;
    b[k++] = le ? 'I' : 'M', b[k++] = le ? 'I' : 'M';
    put16(b, &k, le, 42);
    put32(b, &k, le, 8);
    put16(b, &k, le, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        put16(b, &k, le, tags[i]);
        put16(b, &k, le, types[i]);
        put32(b, &k, le, counts[i]);
        if (types[i] == 3) put16(b, &k, le, vals[i]), put16(b, &k, le, 0);
        else put32(b, &k, le, vals[i]);
    }
    put32(b, &k, le, 0);
    return k;
}

TEST(image_exif_orientation_parser) {
    uint8_t b[512];
    uint16_t tg[2] = {0x010F, 0x0112}, ty[2] = {2, 3};
    uint32_t ct[2] = {4, 1}, v[2] = {0, 6};
    for (int le = 0; le < 2; le++) {
        size_t n = tiff(b, le, 2, tg, ty, ct, v);
        CHECK(exif_orientation(b, n) == 6, "%s-endian SHORT 6", le ? "little" : "big");
        for (size_t cut = 0; cut < n; cut++)   /* the orientation entry is cut off: no tag */
            CHECK(exif_orientation(b, cut) == (cut >= 8 + 2 + 24 ? 6 : -1), "cut at %zu: %d", cut, exif_orientation(b, cut));
    }
    ty[1] = 4, v[1] = 8;
    size_t n = tiff(b, 1, 2, tg, ty, ct, v);
    CHECK(exif_orientation(b, n) == 8, "LONG 8");
    ty[1] = 1;   /* BYTE: bytes to PIL, present but never a transpose */
    n = tiff(b, 1, 2, tg, ty, ct, v);
    CHECK(exif_orientation(b, n) == 0, "BYTE: %d", exif_orientation(b, n));
    ty[1] = 99;  /* unknown type: skipped as PIL does */
    n = tiff(b, 1, 2, tg, ty, ct, v);
    CHECK(exif_orientation(b, n) == -1, "unknown type: %d", exif_orientation(b, n));
    ty[1] = 3, ct[1] = 3, v[1] = 0xFFFFFF00u;   /* 6 bytes at an offset past the end: skipped */
    n = tiff(b, 1, 2, tg, ty, ct, v);
    CHECK(exif_orientation(b, n) == -1, "value past the end: %d", exif_orientation(b, n));
    b[2] = 43;   /* BigTIFF magic */
    CHECK(exif_orientation(b, n) == -1, "BigTIFF");
    memcpy(b, "Exif\0\0Exif\0\0", 12);
    ct[1] = 1, v[1] = 3;
    n = tiff(b + 12, 1, 2, tg, ty, ct, v);
    CHECK(exif_orientation(b, n + 12) == 3, "two Exif prefixes: %d", exif_orientation(b, n + 12));
    static const char x1[] = "<a tiff:Orientation=\"7\"/>", x2[] = "<tiff:Orientation>4</tiff:Orientation>",
                      x3[] = "tiff:Orientation=\"", x4[] = "tiff:Orientation= \"5\"";
    CHECK(xmp_orientation((const uint8_t *)x1, strlen(x1)) == 7, "XMP attribute");
    CHECK(xmp_orientation((const uint8_t *)x2, strlen(x2)) == 4, "XMP element");
    CHECK(xmp_orientation((const uint8_t *)x3, strlen(x3)) == -1, "XMP cut");
    CHECK(xmp_orientation((const uint8_t *)x4, strlen(x4)) == -1, "XMP not PIL's pattern");
}

/* ---- limits ---- */

static void chunk(uint8_t *b, size_t *k, const char *type, const uint8_t *data, uint32_t n) {
    size_t at = *k;
    put32(b, k, 0, n);
    memcpy(b + *k, type, 4), *k += 4;
    if (n) memcpy(b + *k, data, n), *k += n;
    put32(b, k, 0, (uint32_t)crc32(0, b + at + 4, n + 4));
}

/* a PNG that declares w x h and holds a few zero bytes of pixel data */
static size_t png_header(uint8_t *b, uint32_t w, uint32_t h) {
    size_t k = 8;
    memcpy(b, "\x89PNG\r\n\x1a\n", 8);
    uint8_t ihdr[13], z[64];
    size_t i = 0;
    put32(ihdr, &i, 0, w), put32(ihdr, &i, 0, h);
    ihdr[8] = 8, ihdr[9] = 2, ihdr[10] = ihdr[11] = ihdr[12] = 0;
    chunk(b, &k, "IHDR", ihdr, 13);
    static const uint8_t zeros[16];
    uLongf zn = sizeof z;
    compress(z, &zn, zeros, sizeof zeros);
    chunk(b, &k, "IDAT", z, (uint32_t)zn);
    chunk(b, &k, "IEND", NULL, 0);
    return k;
}

TEST(image_pixel_limit_before_decoding) {
    uint8_t b[128];
    size_t n = png_header(b, 5000, 4000);   /* 19 Mpx, no pixel data */
    image_limits lim = image_default_limits();
    int w, h;
    CHECK(image_probe_mem(b, n, "big.png", &lim, &w, &h) == 0 && w == 5000 && h == 4000, "default limit: %s", tp_error_msg());
    lim.max_pixels = (int64_t)16 << 20, lim.knob = "--max-ref-pixels";
    CHECK(image_probe_mem(b, n, "big.png", &lim, &w, &h) == -1 && strstr(tp_error_msg(), "5000x4000 pixels is more than the 16 Mpx") &&
          strstr(tp_error_msg(), "--max-ref-pixels"), "16 Mpx: %s", tp_error_msg());
    uint8_t *rgb = NULL;
    CHECK(image_decode_rgb(b, n, "big.png", &lim, &rgb, &w, &h) == -1 && !rgb, "decode under 16 Mpx");
    lim = image_default_limits();
    CHECK(image_decode_rgb(b, n, "big.png", &lim, &rgb, &w, &h) == -1 && strstr(tp_error_msg(), "truncated or corrupt") && !rgb,
          "19 Mpx declared, 16 bytes of pixels: %s", tp_error_msg());
    n = png_header(b, 65536, 65536);
    lim = image_default_limits();
    CHECK(image_decode_rgb(b, n, "huge.png", &lim, &rgb, &w, &h) == -1 && strstr(tp_error_msg(), "65536x65536") && !rgb,
          "4 Gpx: %s", tp_error_msg());
}

TEST(image_scan_limit) {
    size_t n;
    uint8_t *d = slurp(DATA "/bands88.jpg", &n), *rgb = NULL;
    REQUIRE(d, "missing bands88.jpg");
    image_limits lim = image_default_limits();
    int w, h;
    CHECK(image_decode_rgb(d, n, "bands88.jpg", &lim, &rgb, &w, &h) == 0, "88 scans under the default: %s", tp_error_msg());
    free(rgb), rgb = NULL;
    lim.max_scans = 50;
    CHECK(image_decode_rgb(d, n, "bands88.jpg", &lim, &rgb, &w, &h) == -1 && strstr(tp_error_msg(), "more than 50 scans") && !rgb,
          "50 scans: %s", tp_error_msg());
    lim = image_default_limits();
    lim.max_seconds = 0;   /* the deadline, checked by the same monitor */
    CHECK(image_decode_rgb(d, n, "bands88.jpg", &lim, &rgb, &w, &h) == -1 && strstr(tp_error_msg(), "decoding took more than"),
          "deadline: %s", tp_error_msg());
    free(d);
}

/* ---- damaged copies of every file: a clean error naming the file, or exactly the full file's pixels ---- */

TEST(image_truncations_and_flips_are_safe) {
    json_t *m = manifest();
    REQUIRE(m, "no manifest");
    json_t *files = json_object_get(m, "files");
    unsigned s = test_seed();
    int fails = 0, cases = 0, refused = 0;
    image_limits lim = image_default_limits();
    for (size_t i = 0; i < json_array_size(files) && fails < 5; i++) {
        const char *name = json_string_value(json_object_get(json_array_get(files, i), "file"));
        char path[256];
        snprintf(path, sizeof path, DATA "/%s", name);
        size_t n;
        uint8_t *d = slurp(path, &n), *full = NULL, *got = NULL, *c = malloc(n + 1);
        int fw, fh, w, h;
        REQUIRE(d && image_decode_rgb(d, n, name, &lim, &full, &fw, &fh) == 0, "%s: %s", name, tp_error_msg());
        for (size_t cut = 0; cut < n; cut++) {
            memcpy(c, d, cut);
            cases++;
            if (image_decode_rgb(c, cut, name, &lim, &got, &w, &h) == 0) {
                if (w != fw || h != fh || memcmp(got, full, (size_t)w * h * 3)) {
                    fails++;
                    CHECK(0, "%s cut to %zu bytes: decoded to other pixels", name, cut);
                }
                free(got);
            } else {
                refused++;
                if (!strstr(tp_error_msg(), name)) {
                    fails++;
                    CHECK(0, "%s cut at %zu: message without the name: %s", name, cut, tp_error_msg());
                }
            }
        }
        for (int k = 0; k < 300; k++) {   /* 1 to 4 random bytes changed */
            memcpy(c, d, n);
            int flips = 1 + (int)((s = s * 1103515245u + 12345u) >> 16) % 4;
            for (int f = 0; f < flips; f++) {
                s = s * 1103515245u + 12345u;
                size_t at = (s >> 8) % n;
                s = s * 1103515245u + 12345u;
                c[at] = (uint8_t)(s >> 16);
            }
            cases++;
            if (image_decode_rgb(c, n, name, &lim, &got, &w, &h) == 0) free(got);
            else refused++;
        }
        free(d), free(full), free(c);
    }
    printf("# %d damaged files decoded or refused cleanly (%d refused)\n", cases, refused);
    CHECK(refused > cases / 2, "only %d of %d damaged files refused", refused, cases);
    json_decref(m);
}
