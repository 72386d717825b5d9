/* The FLUX.2 VAE decoder (diffusers AutoencoderKLFlux2, decode path) and the
 * pipeline tail that feeds it (docs/spec/flux2-text-vae.md §6, docs/spec/flux2-transformer.md
 * §6.5): packed latents [N, 4·lc] -> unpack to the token grid -> undo the
 * latent BatchNorm -> unpatchify 2x2 -> post_quant_conv -> decoder -> 8-bit RGB.
 *
 * Every size comes from vae/config.json; the decoder runs on one rank or
 * patch-parallel across a TP group (vae_decode_latent_group), through the op interface (kernels/ops.h), so any backend can run it.
 * Activations are [channels, height*width] matrices. */
#ifndef TPGEN_VAE_H
#define TPGEN_VAE_H
#include "kernels/tensor.h"
#include "kernels/ops.h"
#include <jansson.h>
#include <mpi.h>
#include <stdint.h>

#define VAE_MAX_BLOCKS 8

typedef struct vae_config {
    int latent_channels;          /* lc: channels of the decoder input */
    int n_blocks;                 /* len(block_out_channels) */
    int block_out[VAE_MAX_BLOCKS];/* decoder_block_out_channels when given, else block_out_channels */
    int layers_per_block;         /* the decoder runs layers_per_block + 1 resnets per up block */
    int norm_groups;              /* norm_num_groups */
    int out_channels;             /* must be 3 (RGB) */
    int mid_attention;            /* mid_block_add_attention */
    int post_quant_conv;          /* use_post_quant_conv */
    float bn_eps;                 /* batch_norm_eps (latent BatchNorm) */
    float norm_eps;               /* GroupNorm eps inside the decoder: 1e-6 in diffusers */
    /* encoder side (reference images) */
    int in_channels;              /* must be 3 (RGB) for the encoder */
    int enc_n_blocks;             /* len(block_out_channels) */
    int enc_block_out[VAE_MAX_BLOCKS]; /* block_out_channels (the encoder ignores decoder_block_out_channels) */
    int quant_conv;               /* use_quant_conv */
    int enc_blocks_ok;            /* down_block_types are all DownEncoderBlock2D (or absent) */
} vae_config;

/* Parse and check a vae/config.json object; `where` names the file in errors. */
int vae_config_parse(const json_t *j, const char *where, vae_config *out);
/* Spatial factor of the decoder alone: 2^(n_blocks-1) (8 for FLUX.2). */
static inline int vae_upscale(const vae_config *c) { return 1 << (c->n_blocks - 1); }
/* Pixels per latent token: the 2x2 patch times the decoder factor (16 for FLUX.2). */
static inline int vae_pixels_per_token(const vae_config *c) { return 2 * vae_upscale(c); }

typedef struct vae_model vae_model;

/* Which halves of the autoencoder to load (vae_load_parts). */
enum { VAE_DECODER = 1, VAE_ENCODER = 2 };

/* Load the decoder from a vae/ folder (config.json + safetensors) onto be,
 * weights held in `precision` (DT_F32 or DT_BF16; activations use the same
 * dtype). Only decoder.*, post_quant_conv.* and bn.running_* are read. */
int vae_load(const char *vae_dir, backend *be, dtype_t precision, vae_model **out);
/* The same for the parts named by `parts` (VAE_DECODER and/or VAE_ENCODER);
 * the encoder reads encoder.*, quant_conv.* and bn.running_*. A folder
 * without encoder tensors fails with an error naming the missing tensor. */
int vae_load_parts(const char *vae_dir, backend *be, dtype_t precision, int parts, vae_model **out);
/* vae_dir may be a folder or one checkpoint file (.safetensors/.gguf), in
 * the diffusers AutoencoderKLFlux2 names or the BFL/LDM names (ComfyUI's
 * flux2-vae.safetensors; mapped in vae_bfl_names.c). Its config is the
 * folder's config.json, or the one beside the file, else FLUX.2's own
 * (vae_flux2_config), every tensor's shape checked against it.
 * vae_config_path: where that config.json is looked for (malloc'ed). */
char *vae_config_path(const char *vae_path);
/* A decoder with random weights in backend memory (benchmarks): no file is read. */
int vae_create_random(const vae_config *cfg, backend *be, dtype_t precision, unsigned seed,
                      vae_model **out);
/* The same with the parts named by `parts` (benchmarks of the encoder). */
int vae_create_random_parts(const vae_config *cfg, backend *be, dtype_t precision, unsigned seed, int parts,
                            vae_model **out);
void vae_free(vae_model *v);
const vae_config *vae_get_config(const vae_model *v);
/* Bytes of backend memory the weights occupy. */
size_t vae_weight_bytes(const vae_model *v);
/* Cap on the per-band buffers of the banded upsampling convolutions (bytes;
 * default 64 MB). Smaller caps mean more, thinner row bands. */
void vae_set_band_bytes(vae_model *v, size_t bytes);
/* Per-op time accounting (bench vae --profile): seconds[VAE_PROF_N], added
 * to by every decode/encode until set to NULL; the caller owns the array. */
enum { VAE_PROF_CONV3, VAE_PROF_CONV1, VAE_PROF_CONV_DOWN, VAE_PROF_NORM, VAE_PROF_ATTN, VAE_PROF_UPSAMPLE,
       VAE_PROF_OTHER, VAE_PROF_N };
void vae_set_profile(vae_model *v, double *seconds);

/* The host-side pipeline tail. packed [hl*wl, 4·lc] tokens in row-major grid
 * order -> x [lc, 2hl, 2wl]. The optional outputs receive the intermediates
 * [4·lc, hl, wl] after unpacking and after the BatchNorm inverse. In bf16
 * precision the BatchNorm inverse rounds as the bf16 reference pipeline does. */
void vae_unpack_bn_unpatchify(const vae_model *v, const float *packed, int hl, int wl,
                              float *after_unpack, float *after_bn, float *x);
/* Decoder: x [lc, h, w] (host f32) -> image [3, h·s, w·s] (host f32, s =
 * vae_upscale) and/or 8-bit RGB [h·s, w·s, 3]; either output may be NULL. */
int vae_decode_latent(vae_model *v, const float *x, int h, int w, float *image_chw, uint8_t *rgb);
/* Patch-parallel decode over the ranks of `group` (collective): each rank
 * decodes one band of latent rows (bands differ by at most one row; ranks
 * past the h-th sit out) with one halo row exchanged per 3x3 convolution,
 * GroupNorm statistics summed over the group and the mid attention over
 * the gathered mid activation; the image is gathered on rank 0 of group,
 * the only rank whose outputs are written (others may pass NULL). Every
 * rank passes the same x and holds the whole decoder. The result equals
 * vae_decode_latent's to rounding (f32: ~1e-6 relative); a group of one
 * is vae_decode_latent. Errors are agreed: -1 on every rank. */
int vae_decode_latent_group(vae_model *v, MPI_Comm group, const float *x, int h, int w, float *image_chw,
                            uint8_t *rgb);
int vae_decode_packed_group(vae_model *v, MPI_Comm group, const float *packed, int hl, int wl, float *image_chw,
                            uint8_t *rgb);
/* The whole tail: packed latents of a hl x wl token grid -> image of
 * (hl·16) x (wl·16) pixels (for FLUX.2). */
int vae_decode_packed(vae_model *v, const float *packed, int hl, int wl, float *image_chw, uint8_t *rgb);
/* Map decoded values to 8-bit as diffusers' postprocess does:
 * clamp(x/2 + 0.5, 0, 1) (in bf16 when bf16 != 0), x255, round half to even;
 * chw [3, h, w] -> rgb [h, w, 3]. */
void vae_to_rgb8(const float *chw, int h, int w, int bf16, uint8_t *rgb);

/* ---- the encoder (vae_encode.c; reference images for editing) ---- */

/* Encode preprocessed pixels [3, H, W] (host f32 in [-1, 1], H and W
 * multiples of 16) as the Flux2 pipelines' _encode_vae_image does: encoder
 * -> quant_conv -> the mean half (sample_mode "argmax") -> patchify 2x2 ->
 * (z - running_mean) / sqrt(running_var + eps). Outputs (each optional):
 *   mode     [lc, H/8, W/8]       latent_dist.mode()
 *   latents  [4·lc, H/16, W/16]   after patchify and the normalisation
 *   packed   [(H/16)·(W/16), 4·lc] the same as row-major tokens
 * In bf16 precision the normalisation rounds as the bf16 pipeline does.
 * Needs a model loaded with VAE_ENCODER. */
int vae_encode_image(vae_model *v, const float *pixels, int H, int W, float *mode, float *latents, float *packed);
/* The same patch-parallel over `group` (collective; every rank passes the
 * same pixels and holds the encoder): bands of 8 pixel rows (one latent-mode
 * row) per rank, a halo row per 3x3 convolution and the bottom halo of each
 * stride-2 one, GroupNorm statistics summed over the group, the mid
 * attention over the gathered activation; the outputs on rank 0 of group
 * only. A group of one is vae_encode_image. Errors are agreed. */
int vae_encode_image_group(vae_model *v, MPI_Comm group, const float *pixels, int H, int W, float *mode,
                           float *latents, float *packed);

/* Write a tiny random VAE folder (config.json + diffusion_pytorch_model.safetensors,
 * BF16, blocks [32,32,64,64], 8 latent channels, 8 groups, mid attention,
 * non-trivial BatchNorm statistics) for `tpgen make-tiny` and the tests.
 * The folder is created when missing. Decoder and encoder tensors (the
 * decoder's values do not depend on the encoder being there). */
int vae_write_tiny(const char *vae_dir, unsigned seed);
/* The same at FLUX.2's real widths (128/256/512/512, 32 latent channels,
 * 2 layers per block: 84 M parameters, 168 MB). */
int vae_write_flux2(const char *vae_dir, unsigned seed);
/* FLUX.2's AutoencoderKLFlux2 configuration (docs/spec/flux2-text-vae.md §6.1). */
void vae_flux2_config(vae_config *c);

#endif
