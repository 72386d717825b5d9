/* Diffusers -> BFL tensor names of a FLUX.3 transformer for `tpgen quantize
 * --names bfl` (docs/flux3.md "GGUF"): the inverse of diffusers 0.42.1's
 * convert_flux3_transformer_checkpoint_to_diffusers, one source per BFL
 * tensor (FLUX.3 fuses nothing), final_layer.image.adaLN_modulation.1 =
 * norm_out.linear with its two row halves exchanged. The recipes are
 * flux2_bfl_tensor's (flux2_bfl_names.h), freed with flux2_bfl_names_free. */
#ifndef TPGEN_FLUX3_BFL_NAMES_H
#define TPGEN_FLUX3_BFL_NAMES_H
#include "core/formats/checkpoint.h"
#include "core/models/flux2/flux2_bfl_names.h"

/* 1 when c has diffusers FLUX.3 transformer names (flux3_checkpoint_names). */
int flux3_bfl_is_diffusers(const checkpoint *c);

/* The BFL tensors of the diffusers FLUX.3 checkpoint c, sorted by name.
 * Every tensor of c must be one of Flux3Transformer2DModel's (else an error
 * naming it). */
int flux3_bfl_names(const checkpoint *c, flux2_bfl_tensor **out, int *n_out);

#endif
