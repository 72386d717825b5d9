/* Diffusers -> BFL tensor names of a FLUX.2 transformer (the layout of BFL
 * single files and ComfyUI-GGUF files; docs/spec/flux2-transformer.md Appendix A,
 * diffusers' convert_flux2_transformer_checkpoint_to_diffusers read
 * backwards). Each BFL tensor is a recipe: one to three diffusers tensors
 * concatenated along rows (dim 0: the fused double-block qkv), then, for
 * final_layer.adaLN_modulation.1, its two row halves exchanged (BFL shift,
 * scale vs diffusers' norm_out scale, shift). Used by `tpgen quantize
 * --names bfl` (cli/cmd_quantize.c). */
#ifndef TPGEN_FLUX2_BFL_NAMES_H
#define TPGEN_FLUX2_BFL_NAMES_H
#include "core/formats/checkpoint.h"

typedef struct flux2_bfl_tensor {
    char *name;                  /* BFL name */
    int n_src;                   /* 1..3 */
    int src[3];                  /* indices into the checkpoint's infos, in row order */
    int swap;                    /* exchange the two row halves of the concatenation */
    int ndim;
    int64_t shape[ST_MAX_DIMS];  /* shape[0] = the sum of the sources' rows */
} flux2_bfl_tensor;

/* 1 when c has diffusers FLUX.2 transformer names (x_embedder, FLUX.2's
 * stream modulations and single-block to_qkv_mlp_proj). */
int flux2_bfl_is_diffusers(const checkpoint *c);

/* The BFL tensors of the diffusers FLUX.2 checkpoint c, sorted by name
 * (block counts from the names; guidance_in and biases when present). Every
 * tensor of c must be used exactly once (fp8 scale tensors aside: they stay
 * with their weights) and every source of a recipe must exist with matching
 * trailing dimensions; otherwise a clear error naming the tensor. */
int flux2_bfl_names(const checkpoint *c, flux2_bfl_tensor **out, int *n_out);
void flux2_bfl_names_free(flux2_bfl_tensor *t, int n);

#endif
