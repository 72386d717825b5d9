/* Reference-image tokens for editing (diffusers Flux2Pipeline /
 * Flux2KleinPipeline prepare_image_latents + _prepare_image_ids): each
 * reference is preprocessed (core/image/image.h), VAE-encoded (vae_encode_image:
 * argmax latents, patchify, BatchNorm normalisation) and packed to
 * row-major tokens; the references' tokens are concatenated in order, and
 * reference k's token (y, x) gets the position id (10 + 10k, y, x, 0). The
 * denoising loop appends them after the noise tokens (core/pipeline.h). */
#ifndef TPGEN_REFS_H
#define TPGEN_REFS_H
#include "core/models/vae/vae.h"
#include <mpi.h>
#include <stdint.h>

typedef struct ref_set {
    int n;                 /* references */
    int64_t R;             /* tokens, all references */
    int C;                 /* channels per token (4 x latent channels) */
    float *tokens;         /* [R, C] */
    int32_t *ids;          /* [R, 4] */
    int *grid;             /* [n][2]: token grid (h, w) of each reference */
} ref_set;

/* The time coordinate of reference k: 10 + 10·k. */
static inline int32_t refs_time_coord(int k) { return 10 + 10 * k; }

/* Read, preprocess and encode the n references (paths in order) with v
 * (loaded with VAE_ENCODER). -1 + tp_error naming the file on failure. */
int refs_encode(vae_model *v, char *const *paths, int n, ref_set *out);
/* The same over a TP group (collective): the group's first rank reads and
 * preprocesses each image and broadcasts its pixels, every rank encodes a
 * row band (vae_encode_image_group; each holds the encoder), and the
 * tokens land in `out` on the first rank only (out stays empty on the
 * others). Errors are agreed over the group. */
int refs_encode_group(vae_model *v, MPI_Comm group, char *const *paths, int n, ref_set *out);
/* The same with another preprocessing: load reads path and returns its
 * pixels [3, ph, pw] in [-1, 1] (sides multiples of 16), as
 * image_load_reference does for FLUX.2 (FLUX.3's single-reference "fill":
 * flux3_load_reference). */
typedef int (*refs_load_fn)(const char *path, float **pixels, int *pw, int *ph);
int refs_encode_group_with(vae_model *v, MPI_Comm group, char *const *paths, int n, refs_load_fn load, ref_set *out);
void refs_free(ref_set *r);

#endif
