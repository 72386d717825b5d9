/* Reference tokens for editing (refs.h). */
#include "refs.h"
#include "core/dist/dist.h"
#include "core/image/image.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

void refs_free(ref_set *r) {
    free(r->tokens);
    free(r->ids);
    free(r->grid);
    memset(r, 0, sizeof *r);
}

/* reference k's tokens [t0, t0 + hl*wl): ids (T = refs_time_coord(k), row,
 * column, 0) and its latent grid */
static void place_tokens(ref_set *out, int k, int64_t t0, int hl, int wl) {
    for (int64_t t = 0; t < (int64_t)hl * wl; t++) {
        int32_t *id = out->ids + (t0 + t) * 4;
        id[0] = refs_time_coord(k), id[1] = (int32_t)(t / wl), id[2] = (int32_t)(t % wl), id[3] = 0;
    }
    out->grid[2 * k] = hl;
    out->grid[2 * k + 1] = wl;
}
static int encode_with(vae_model *v, char *const *paths, int n, refs_load_fn load, ref_set *out) {
    memset(out, 0, sizeof *out);
    const vae_config *c = vae_get_config(v);
    out->C = 4 * c->latent_channels;
    out->n = n;
    out->grid = xcalloc((size_t)(n > 0 ? n : 1) * 2, sizeof(int));
    for (int k = 0; k < n; k++) {
        float *px = NULL;
        int pw, ph;
        if (load(paths[k], &px, &pw, &ph)) goto fail;
        int hl = ph / 16, wl = pw / 16;
        int64_t t0 = out->R, nt = (int64_t)hl * wl;
        out->R += nt;
        out->tokens = xrealloc(out->tokens, (size_t)out->R * (size_t)out->C * sizeof(float));
        out->ids = xrealloc(out->ids, (size_t)out->R * 4 * sizeof(int32_t));
        int rc = vae_encode_image(v, px, ph, pw, NULL, NULL, out->tokens + (size_t)t0 * out->C);
        free(px);
        if (rc) {
            tp_error_context("encoding reference image %s", paths[k]);
            goto fail;
        }
        place_tokens(out, k, t0, hl, wl);
    }
    return 0;
fail:
    refs_free(out);
    return -1;
}

int refs_encode(vae_model *v, char *const *paths, int n, ref_set *out) {
    return encode_with(v, paths, n, image_load_reference, out);
}

int refs_encode_group(vae_model *v, MPI_Comm group, char *const *paths, int n, ref_set *out) {
    return refs_encode_group_with(v, group, paths, n, image_load_reference, out);
}

int refs_encode_group_with(vae_model *v, MPI_Comm group, char *const *paths, int n, refs_load_fn load, ref_set *out) {
    int rank, size;
    MPI_Comm_rank(group, &rank);
    MPI_Comm_size(group, &size);
    if (size == 1) return encode_with(v, paths, n, load, out);
    memset(out, 0, sizeof *out);
    const vae_config *c = vae_get_config(v);
    int C = 4 * c->latent_channels;
    if (rank == 0) {
        out->C = C;
        out->n = n;
        out->grid = xcalloc((size_t)(n > 0 ? n : 1) * 2, sizeof(int));
    }
    for (int k = 0; k < n; k++) {
        /* the first rank reads and preprocesses the image; the group encodes it */
        float *px = NULL;
        int sz[2] = {0, 0};
        int rc = rank == 0 ? load(paths[k], &px, &sz[0], &sz[1]) : 0;
        if (dist_agree(group, rc)) goto fail;
        MPI_Bcast(sz, 2, MPI_INT, 0, group);
        int pw = sz[0], ph = sz[1], hl = ph / 16, wl = pw / 16;
        size_t npx = (size_t)3 * (size_t)pw * (size_t)ph;
        if (rank != 0) px = xmalloc(npx * sizeof(float));
        if (npx > (size_t)INT32_MAX) {   /* the same on every rank; image_load_reference caps the area far below */
            free(px);
            tp_error("reference image %s is too large to broadcast", paths[k]);
            goto fail;
        }
        MPI_Bcast(px, (int)npx, MPI_FLOAT, 0, group);
        int64_t t0 = out->R, nt = (int64_t)hl * wl;
        if (rank == 0) {
            out->R += nt;
            out->tokens = xrealloc(out->tokens, (size_t)out->R * (size_t)C * sizeof(float));
            out->ids = xrealloc(out->ids, (size_t)out->R * 4 * sizeof(int32_t));
        }
        rc = vae_encode_image_group(v, group, px, ph, pw, NULL, NULL, rank == 0 ? out->tokens + (size_t)t0 * C : NULL);
        free(px);
        if (rc) {
            tp_error_context("encoding reference image %s", paths[k]);
            goto fail;
        }
        if (rank != 0) continue;
        place_tokens(out, k, t0, hl, wl);
    }
    return 0;
fail:
    refs_free(out);
    return -1;
}
