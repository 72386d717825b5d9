/* psnr A.png B.png [--max]: peak signal-to-noise ratio of two 8-bit images
 * in dB over all RGB samples ("inf" when identical); with --max, the
 * largest difference of one sample in levels instead. Exit 0 on success, 2 when a
 * file cannot be read or the sizes differ. Built by scripts/regress.sh:
 *   cc -O2 -o build/psnr scripts/psnr.c -lm */
#include <math.h>
#include <stdio.h>
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#include <stb/stb_image.h>

int main(int argc, char **argv) {
    int want_max = argc == 4 && argv[3][0] == '-' && argv[3][1] == '-' && argv[3][2] == 'm';
    if (argc != 3 && !want_max) {
        fprintf(stderr, "usage: psnr A.png B.png [--max]\n");
        return 2;
    }
    int w[2], h[2], c;
    unsigned char *px[2];
    for (int i = 0; i < 2; i++) {
        px[i] = stbi_load(argv[i + 1], &w[i], &h[i], &c, 3);
        if (!px[i]) {
            fprintf(stderr, "psnr: cannot read %s: %s\n", argv[i + 1], stbi_failure_reason());
            return 2;
        }
    }
    if (w[0] != w[1] || h[0] != h[1]) {
        fprintf(stderr, "psnr: sizes differ: %dx%d vs %dx%d\n", w[0], h[0], w[1], h[1]);
        return 2;
    }
    double se = 0, mx = 0;
    size_t n = (size_t)w[0] * h[0] * 3;
    for (size_t i = 0; i < n; i++) {
        double d = (double)px[0][i] - (double)px[1][i];
        se += d * d;
        if (fabs(d) > mx) mx = fabs(d);
    }
    if (want_max) printf("%.0f\n", mx);
    else if (se == 0) printf("inf\n");
    else printf("%.2f\n", 10.0 * log10(255.0 * 255.0 / (se / (double)n)));
    return 0;
}
