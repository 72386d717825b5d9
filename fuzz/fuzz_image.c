/* libFuzzer harness: the bytes as an uploaded reference image, through
 * tpgen's own path for editing: image_probe_mem (header and orientation),
 * then image_reference_mem (libpng / libjpeg-turbo decode, EXIF transpose,
 * diffusers' checks, PIL's LANCZOS resize, the centre crop, normalising);
 * and the metadata parsers (EXIF IFD0, XMP, the PNG chunk walk) on the raw
 * bytes. The pixel limit is lowered to 2 Mpx, so that a header alone
 * cannot make one input cost seconds, while the resize path (over 1 Mpx)
 * stays reachable. */
#include "core/image/image.h"
#include "core/image/decode.h"
#include "kernels/err.h"
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    image_limits lim = image_default_limits();
    lim.max_pixels = (int64_t)2 << 20;
    lim.max_seconds = 5;
    int w, h;
    if (image_probe_mem(data, size, "fuzz", &lim, &w, &h) == 0) {
        float *px = NULL;
        int pw, ph;
        if (image_reference_mem(data, size, "fuzz", &lim, &px, &pw, &ph) == 0) {
            int sw, sh;
            image_reference_size(w, h, &sw, &sh);
            if (sw != pw || sh != ph) abort();   /* the probe and the decode disagree on the size */
            free(px);
        }
    }
    (void)exif_orientation(data, size);
    (void)xmp_orientation(data, size);
    if (size >= 8) (void)png_orientation(data, size);
    return 0;
}
