/* What every decoder checks (decode.h): the pixel limit's error and the
 * clock of the decode deadline. Kept apart from image.c so that the
 * decoders, which image.c calls, do not call it back. */
#include "decode.h"
#include "kernels/err.h"
#include <time.h>

double image_clock(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int image_too_many_pixels(const char *name, int w, int h, const image_limits *lim) {
    double mpx = (double)lim->max_pixels / (1 << 20);
    if (lim->knob)
        return tp_error("reference image %s: %dx%d pixels is more than the %.4g Mpx this server decodes (%s); scale "
                        "it down first (it is resized to 1 Mpx anyway)", name, w, h, mpx, lim->knob);
    return tp_error("reference image %s: %dx%d pixels is more than the %.4g Mpx tpgen decodes (it would be resized to "
                    "1 Mpx anyway); scale it down first", name, w, h, mpx);
}
