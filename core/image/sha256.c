/* SHA-256 of a file (sha256.h). */
#include "sha256.h"
#include "kernels/err.h"
#include <errno.h>
#include <nettle/sha2.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int file_sha256(const char *path, char hex[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return tp_error("%s: cannot open it (%s)", path, strerror(errno));
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) sha256_update(&ctx, n, buf);
    int err = ferror(f);
    fclose(f);
    if (err) return tp_error("%s: read error", path);
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(&ctx, sizeof d, d);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return 0;
}
