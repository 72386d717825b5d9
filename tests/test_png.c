/* PNG output: pixels and the parameters chunk read back by an independent
 * decoder (libpng, through image_read_rgb) and chunk walker, CRCs checked with zlib; atomic
 * writes that fail leave nothing behind and never clobber a file. */
#include "test.h"
#include "core/image/png.h"
#include "kernels/err.h"
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/image/image.h"

static uint8_t *random_image(int w, int h) {
    uint8_t *p = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h * 3; i++) p[i] = (uint8_t)(rand() >> 7);
    return p;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    b[*n] = 0;
    return b;
}

/* every chunk's CRC is right, and the chunk types in order */
static int chunks_ok(const uint8_t *b, size_t n, char *types, size_t cap) {
    types[0] = 0;
    for (size_t off = 8; off + 12 <= n;) {
        uint32_t len = (uint32_t)b[off] << 24 | b[off + 1] << 16 | b[off + 2] << 8 | b[off + 3];
        if (off + 12 + len > n) return 0;
        const uint8_t *c = b + off + 8 + len;
        uint32_t crc = (uint32_t)c[0] << 24 | c[1] << 16 | c[2] << 8 | c[3];
        if (crc32(crc32(0, NULL, 0), b + off + 4, len + 4) != crc) return 0;
        strncat(types, (const char *)b + off + 4, 4 < cap - strlen(types) - 1 ? 4 : 0);
        strncat(types, " ", cap - strlen(types) - 1);
        off += 12 + len;
    }
    return 1;
}

static void roundtrip(const char *text, const char *want_chunk) {
    int w = 37, h = 21;
    uint8_t *img = random_image(w, h);
    char path[512];
    snprintf(path, sizeof path, "%s/rt.png", test_tmp_dir());
    REQUIRE(png_write_rgb(path, img, w, h, "parameters", text) == 0, "%s", tp_error_msg());
    int rw, rh;
    uint8_t *px = NULL;
    REQUIRE(image_read_rgb(path, &px, &rw, &rh) == 0, "libpng cannot decode the file: %s", tp_error_msg());
    CHECK(rw == w && rh == h, "size %dx%d", rw, rh);
    CHECK(!memcmp(px, img, (size_t)w * h * 3), "pixels differ");
    free(px);
    size_t n;
    char *file = slurp(path, &n);
    char types[256];
    CHECK(chunks_ok((uint8_t *)file, n, types, sizeof types), "bad chunk CRC or length");
    CHECK(strstr(types, want_chunk) == types + 5, "chunks '%s': %s not right after IHDR", types, want_chunk);
    char *got = NULL;
    CHECK(png_read_text(path, "parameters", &got) == 0, "text chunk not found");
    CHECK(got && !strcmp(got, text), "text read back '%s'", got ? got : "(null)");
    CHECK(png_read_text(path, "other", &got) == 1 || !got, "a missing key was found");
    free(got);
    free(file);
    free(img);
}

TEST(png_text_ascii_roundtrip) { roundtrip("prompt: a red fox\nseed: 42\nsteps: 4\ntpgen: 0.1.0", "tEXt"); }
TEST(png_text_utf8_roundtrip) { roundtrip("prompt: caf\xc3\xa9 \xe2\x98\x95 \xe6\x9d\xb1\xe4\xba\xac\nseed: 7", "iTXt"); }

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* A write that fails part-way (file size limit) leaves the old file as it
 * was and no temporary file. */
TEST(png_failed_write_keeps_old_file) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/atomic", test_tmp_dir());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/img.png", dir);
    const char old[] = "previous image";
    REQUIRE(file_write_atomic(path, old, sizeof old) == 0, "%s", tp_error_msg());
    int w = 256, h = 256;
    uint8_t *img = random_image(w, h);   /* incompressible: ~200 KB */
    struct rlimit saved, small;
    getrlimit(RLIMIT_FSIZE, &saved);
    small = saved;
    small.rlim_cur = 4096;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &small);
    int rc = png_write_rgb(path, img, w, h, "parameters", "seed: 1");
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev);
    CHECK(rc == -1, "the write should have failed under a 4 KB file size limit");
    CHECK(strstr(tp_error_msg(), path) != NULL, "message does not name the file: %s", tp_error_msg());
    size_t n;
    char *now = slurp(path, &n);
    CHECK(now && n == sizeof old && !memcmp(now, old, n), "the existing file was changed");
    CHECK(count_entries(dir) == 1, "a temporary file was left behind (%d entries)", count_entries(dir));
    free(now);
    /* and the same write succeeds without the limit, replacing the file */
    CHECK(png_write_rgb(path, img, w, h, "parameters", "seed: 1") == 0, "%s", tp_error_msg());
    CHECK(count_entries(dir) == 1, "entries after success: %d", count_entries(dir));
    free(img);
}

TEST(png_missing_directory_is_an_error) {
    char path[600];
    snprintf(path, sizeof path, "%s/no/such/dir/x.png", test_tmp_dir());
    uint8_t px[3] = {1, 2, 3};
    CHECK(png_write_rgb(path, px, 1, 1, "parameters", "x") == -1, "write into a missing directory succeeded");
    CHECK(strstr(tp_error_msg(), "no/such/dir/x.png") != NULL, "message: %s", tp_error_msg());
    struct stat st;
    CHECK(stat(path, &st) != 0, "file exists");
}
