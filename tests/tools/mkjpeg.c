/* JPEG test files that PIL cannot write, through libjpeg's compressor
 * (test-only tool; tests/sh/image_decode.sh and tests/tools/mkimages.py
 * build it with `cc -O2 -o mkjpeg tests/tools/mkjpeg.c -ljpeg`):
 *
 *   mkjpeg ycck OUT W H          an Adobe YCCK file of a CMYK pattern
 *   mkjpeg scans OUT W H N AL    a progressive RGB photo-like pattern in N
 *                                scans: DC, then per component and per AC
 *                                coefficient a first scan at bit AL and its
 *                                refinements down to bit 0 (any prefix of
 *                                that list is a valid progression)
 *   mkjpeg bands OUT W H B       a complete progression in 1 + 3·B scans: DC,
 *                                then B bands of AC coefficients per component
 *   mkjpeg photo OUT W H Q       a baseline photo-like pattern at quality Q
 *
 * The pattern is smooth gradients with edges and a little noise, so that
 * every coefficient band carries data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

static unsigned char sample(int x, int y, int c, int w, int h) {
    unsigned s = (unsigned)(x * 7919 + y * 104729 + c * 1299709);
    s ^= s >> 13, s *= 0x5bd1e995u, s ^= s >> 15;
    int v = (c == 0 ? x * 255 / (w > 1 ? w - 1 : 1) : c == 1 ? y * 255 / (h > 1 ? h - 1 : 1) : ((x / 32 + y / 32) & 1) * 160 + 40);
    v += (int)(s % 17) - 8;
    if (c == 3) {
        long long dx = x - w / 2, dy = y - h / 2, r = (long long)w * w / 4 + (long long)h * h / 4 + 1;
        v = (int)((dx * dx + dy * dy) * 255 / r);
    }
    return (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: mkjpeg ycck|scans|bands|photo OUT W H [N AL | B | Q]\n");
        return 2;
    }
    const char *mode = argv[1];
    int w = atoi(argv[3]), h = atoi(argv[4]);
    FILE *f = fopen(argv[2], "wb");
    if (!f || w <= 0 || h <= 0) return 2;
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h;
    int ycck = !strcmp(mode, "ycck");
    c.input_components = ycck ? 4 : 3;
    c.in_color_space = ycck ? JCS_CMYK : JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_scan_info *scans = NULL;
    if (ycck) {
        jpeg_set_colorspace(&c, JCS_YCCK);   /* writes the Adobe marker, transform 2 */
        jpeg_set_quality(&c, 95, TRUE);
    } else if (!strcmp(mode, "photo")) {
        jpeg_set_quality(&c, argc > 5 ? atoi(argv[5]) : 90, TRUE);
    } else if (!strcmp(mode, "scans") && argc > 6) {
        int n = atoi(argv[5]), al = atoi(argv[6]), k = 0;
        if (al < 0 || al > 13 || n < 1) return 2;
        int cap = 1 + 3 * 63 * (al + 1);
        if (n > cap) n = cap;
        scans = calloc((size_t)cap, sizeof *scans);
        scans[k].comps_in_scan = 3;
        for (int ci = 0; ci < 3; ci++) scans[k].component_index[ci] = ci;
        k++;   /* DC of all three, whole (Ss = Se = Ah = Al = 0) */
        for (int ci = 0; ci < 3; ci++)
            for (int s = 1; s <= 63; s++)
                for (int a = al; a >= 0; a--) {
                    jpeg_scan_info *p = &scans[k++];
                    p->comps_in_scan = 1, p->component_index[0] = ci;
                    p->Ss = p->Se = s, p->Ah = a == al ? 0 : a + 1, p->Al = a;
                }
        c.scan_info = scans, c.num_scans = n;
        jpeg_set_quality(&c, 95, TRUE);
    } else if (!strcmp(mode, "bands") && argc > 5) {
        int b = atoi(argv[5]), k = 0;
        if (b < 1 || b > 63) return 2;
        scans = calloc((size_t)(1 + 3 * b), sizeof *scans);
        scans[k].comps_in_scan = 3;
        for (int ci = 0; ci < 3; ci++) scans[k].component_index[ci] = ci;
        k++;
        for (int ci = 0; ci < 3; ci++)
            for (int j = 0; j < b; j++) {
                jpeg_scan_info *p = &scans[k++];
                p->comps_in_scan = 1, p->component_index[0] = ci;
                p->Ss = 1 + 63 * j / b, p->Se = 63 * (j + 1) / b;
            }
        c.scan_info = scans, c.num_scans = k;
        jpeg_set_quality(&c, 95, TRUE);
    } else {
        fprintf(stderr, "mkjpeg: unknown mode %s\n", mode);
        return 2;
    }
    jpeg_start_compress(&c, TRUE);
    unsigned char *row = malloc((size_t)w * (size_t)c.input_components);
    while (c.next_scanline < c.image_height) {
        int y = (int)c.next_scanline;
        for (int x = 0; x < w; x++)
            for (int ch = 0; ch < c.input_components; ch++) row[(size_t)x * c.input_components + ch] = sample(x, y, ch, w, h);
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
    free(row), free(scans);
    return 0;
}
