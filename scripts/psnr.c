/* psnr A.png B.png: peak signal-to-noise ratio of two 8-bit images in dB
 * over all RGB samples ("inf" when identical). Exit 0 on success, 2 when a
 * file cannot be read or the sizes differ. Built by scripts/regress.sh:
 *   cc -O2 -o build/psnr scripts/psnr.c -lpng -lm */
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the file as 8-bit RGB through libpng's simplified API (NULL on failure) */
static unsigned char *load_rgb(const char *path, int *w, int *h, char *why, size_t nwhy) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&im, path)) {
        snprintf(why, nwhy, "%s", im.message);
        return NULL;
    }
    im.format = PNG_FORMAT_RGB;
    unsigned char *px = malloc(PNG_IMAGE_SIZE(im));
    if (!px || !png_image_finish_read(&im, NULL, px, 0, NULL)) {
        snprintf(why, nwhy, "%s", px ? im.message : "out of memory");
        png_image_free(&im);
        free(px);
        return NULL;
    }
    *w = (int)im.width, *h = (int)im.height;
    return px;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: psnr A.png B.png\n");
        return 2;
    }
    int w[2], h[2];
    unsigned char *px[2];
    for (int i = 0; i < 2; i++) {
        char why[256];
        px[i] = load_rgb(argv[i + 1], &w[i], &h[i], why, sizeof why);
        if (!px[i]) {
            fprintf(stderr, "psnr: cannot read %s: %s\n", argv[i + 1], why);
            return 2;
        }
    }
    if (w[0] != w[1] || h[0] != h[1]) {
        fprintf(stderr, "psnr: sizes differ: %dx%d vs %dx%d\n", w[0], h[0], w[1], h[1]);
        return 2;
    }
    double se = 0;
    size_t n = (size_t)w[0] * h[0] * 3;
    for (size_t i = 0; i < n; i++) {
        double d = (double)px[0][i] - (double)px[1][i];
        se += d * d;
    }
    if (se == 0) printf("inf\n");
    else printf("%.2f\n", 10.0 * log10(255.0 * 255.0 / (se / (double)n)));
    return 0;
}
