/* st_compare A B TENSOR TOL: compare one F32 tensor of two safetensors
 * files. Prints "rel_l2 X max_abs Y n N" and exits 0 when the shapes match,
 * every value is finite and ||A - B|| / ||B|| <= TOL; 1 when they differ by
 * more (or a value is NaN/Inf, or the shapes differ); 2 on a usage or read
 * error. Used by tests/sh/generate_dev.sh to check that the latents saved at
 * tp 1 and tp 2 agree. Deliberately self-contained (its own small reader of
 * the safetensors layout: u64 header size, JSON header, raw data), so that
 * it is independent of the reader it helps to test and needs no MPI:
 *   cc -std=c17 -O2 -o st_compare tests/tools/st_compare.c -ljansson -lm */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct f32_tensor {
    int ndim;
    long long shape[8];
    size_t n;
    float *v;
} f32_tensor;

/* Read tensor `name` (dtype F32) of the safetensors file at path; 0 or -1 (message on stderr). */
static int read_f32(const char *path, const char *name, f32_tensor *t) {
    FILE *f = fopen(path, "rb");
    if (!f) return fprintf(stderr, "st_compare: cannot open %s\n", path), -1;
    uint8_t len8[8];
    uint64_t hlen = 0;
    int rc = fread(len8, 1, 8, f) == 8 ? 0 : -1;
    for (int i = 7; !rc && i >= 0; i--) hlen = hlen << 8 | len8[i];   /* little-endian */
    if (!rc && (hlen == 0 || hlen > (100u << 20))) rc = -1;
    char *hdr = rc ? NULL : calloc(1, hlen + 1);
    if (!rc && fread(hdr, 1, hlen, f) != hlen) rc = -1;
    json_error_t je;
    json_t *root = rc ? NULL : json_loads(hdr, 0, &je);
    json_t *e = root ? json_object_get(root, name) : NULL;
    json_t *off = e ? json_object_get(e, "data_offsets") : NULL, *shape = e ? json_object_get(e, "shape") : NULL;
    const char *dt = e ? json_string_value(json_object_get(e, "dtype")) : NULL;
    if (rc || !root) {
        fprintf(stderr, "st_compare: %s is not a safetensors file\n", path), rc = -1;
    } else if (!e || !dt || strcmp(dt, "F32") || !json_is_array(shape) || json_array_size(shape) > 8 ||
               json_array_size(off) != 2) {
        fprintf(stderr, "st_compare: %s has no F32 tensor '%s'\n", path, name), rc = -1;
    } else {
        t->ndim = (int)json_array_size(shape);
        t->n = 1;
        for (int d = 0; d < t->ndim; d++) t->shape[d] = json_integer_value(json_array_get(shape, d)), t->n *= t->shape[d];
        long long b = json_integer_value(json_array_get(off, 0)), e_ = json_integer_value(json_array_get(off, 1));
        t->v = malloc(t->n * sizeof(float) + 1);
        if ((size_t)(e_ - b) != t->n * sizeof(float) || fseek(f, (long)(8 + hlen + b), SEEK_SET) ||
            fread(t->v, sizeof(float), t->n, f) != t->n)
            fprintf(stderr, "st_compare: %s: tensor '%s' is truncated or inconsistent\n", path, name), rc = -1;
    }
    json_decref(root);
    free(hdr);
    fclose(f);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: st_compare A.safetensors B.safetensors TENSOR TOLERANCE\n");
        return 2;
    }
    char *end;
    double tol = strtod(argv[4], &end);
    if (*end || !(tol >= 0)) {
        fprintf(stderr, "st_compare: tolerance '%s' is not a non-negative number\n", argv[4]);
        return 2;
    }
    f32_tensor t[2] = {0};
    if (read_f32(argv[1], argv[3], &t[0]) || read_f32(argv[2], argv[3], &t[1])) {
        free(t[0].v), free(t[1].v);
        return 2;
    }
    int rc = 0;
    if (t[0].ndim != t[1].ndim || memcmp(t[0].shape, t[1].shape, sizeof t[0].shape)) {
        printf("shapes differ (%d vs %d dims, %zu vs %zu values)\n", t[0].ndim, t[1].ndim, t[0].n, t[1].n);
        rc = 1;
    } else {
        double num = 0, den = 0, max_abs = 0;
        int finite = 1;
        for (size_t k = 0; k < t[0].n; k++) {
            double a = t[0].v[k], b = t[1].v[k], d = a - b;
            finite &= isfinite(a) && isfinite(b);
            num += d * d, den += b * b;
            if (fabs(d) > max_abs) max_abs = fabs(d);
        }
        double rel = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
        printf("rel_l2 %.3g max_abs %.3g n %zu%s\n", rel, max_abs, t[0].n, finite ? "" : " (non-finite values)");
        rc = finite && t[0].n > 0 && rel <= tol ? 0 : 1;
    }
    free(t[0].v), free(t[1].v);
    return rc;
}
