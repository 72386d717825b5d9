/* The original Black Forest Labs / LDM names of the FLUX.2 VAE (ComfyUI's
 * vae/flux2-vae.safetensors) against the diffusers AutoencoderKLFlux2
 * names the VAE binds (vae_internal.h: vae_bfl_name). The map is
 * diffusers 0.42.1's convert_ldm_vae_checkpoint (loaders/single_file_utils.py:
 * DIFFUSERS_TO_LDM_MAPPING["vae"], update_vae_resnet_ldm_to_diffusers,
 * update_vae_attentions_ldm_to_diffusers) read backwards, plus the FLUX.2
 * latent BatchNorm, which has the same name in both (`bn.running_mean`,
 * `bn.running_var`; that converter predates it and drops it):
 *
 *   {en,de}coder.conv_norm_out.*                -> {en,de}coder.norm_out.*
 *   encoder.down_blocks.I.resnets.J.*           -> encoder.down.I.block.J.*
 *   encoder.down_blocks.I.downsamplers.0.conv.* -> encoder.down.I.downsample.conv.*
 *   decoder.up_blocks.I.resnets.J.*             -> decoder.up.(N-1-I).block.J.*   (N up blocks)
 *   decoder.up_blocks.I.upsamplers.0.conv.*     -> decoder.up.(N-1-I).upsample.conv.*
 *   *.mid_block.resnets.K.*                     -> *.mid.block_(K+1).*
 *   *.mid_block.attentions.0.{group_norm,to_q,to_k,to_v,to_out.0}.*
 *                                               -> *.mid.attn_1.{norm,q,k,v,proj_out}.*
 *   resnet conv_shortcut.*                      -> nin_shortcut.*
 *   conv_in, conv_out, quant_conv, post_quant_conv, norm1/2, conv1/2, bn.*: unchanged
 *
 * The attention projections are 1x1 convolutions [C, C, 1, 1] in the BFL
 * file and [C, C] in diffusers; the loader's matrix view is the same. */
#include "vae_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* a resnet's or attention's own part of the name */
static int map_leaf(const char *rest, int attn, char *out, size_t n) {
    static const char *k_attn[][2] = {{"group_norm.", "norm."}, {"to_q.", "q."}, {"to_k.", "k."}, {"to_v.", "v."},
                                      {"to_out.0.", "proj_out."}};
    if (attn) {
        for (size_t i = 0; i < sizeof k_attn / sizeof k_attn[0]; i++)
            if (starts(rest, k_attn[i][0])) return snprintf(out, n, "%s%s", k_attn[i][1], rest + strlen(k_attn[i][0])) < (int)n;
        return 0;
    }
    if (starts(rest, "conv_shortcut.")) return snprintf(out, n, "nin_shortcut.%s", rest + 14) < (int)n;
    return snprintf(out, n, "%s", rest) < (int)n;
}

int vae_bfl_name(const char *name, int n_up_blocks, char *out, size_t n) {
    char leaf[128];
    int i, j, used = 0;
    const char *side = starts(name, "encoder.") ? "encoder" : starts(name, "decoder.") ? "decoder" : NULL;
    if (!side) return snprintf(out, n, "%s", name) < (int)n;   /* quant_conv, post_quant_conv, bn */
    const char *r = name + 8;
    if (starts(r, "conv_norm_out.")) return snprintf(out, n, "%s.norm_out.%s", side, r + 14) < (int)n;
    if (sscanf(r, "down_blocks.%d.resnets.%d.%n", &i, &j, &used) == 2 && used)
        return map_leaf(r + used, 0, leaf, sizeof leaf) && snprintf(out, n, "encoder.down.%d.block.%d.%s", i, j, leaf) < (int)n;
    used = 0;
    if (sscanf(r, "down_blocks.%d.downsamplers.0.%n", &i, &used) == 1 && used)
        return snprintf(out, n, "encoder.down.%d.downsample.%s", i, r + used) < (int)n;
    used = 0;
    if (sscanf(r, "up_blocks.%d.resnets.%d.%n", &i, &j, &used) == 2 && used)
        return map_leaf(r + used, 0, leaf, sizeof leaf) &&
               snprintf(out, n, "decoder.up.%d.block.%d.%s", n_up_blocks - 1 - i, j, leaf) < (int)n;
    used = 0;
    if (sscanf(r, "up_blocks.%d.upsamplers.0.%n", &i, &used) == 1 && used)
        return snprintf(out, n, "decoder.up.%d.upsample.%s", n_up_blocks - 1 - i, r + used) < (int)n;
    used = 0;
    if (sscanf(r, "mid_block.resnets.%d.%n", &i, &used) == 1 && used)
        return map_leaf(r + used, 0, leaf, sizeof leaf) && snprintf(out, n, "%s.mid.block_%d.%s", side, i + 1, leaf) < (int)n;
    if (starts(r, "mid_block.attentions.0."))
        return map_leaf(r + 23, 1, leaf, sizeof leaf) && snprintf(out, n, "%s.mid.attn_1.%s", side, leaf) < (int)n;
    return snprintf(out, n, "%s", name) < (int)n;   /* conv_in, conv_out */
}

int vae_checkpoint_is_bfl(const checkpoint *ck) {
    static const char *probes[] = {"decoder.mid.attn_1.q.weight", "decoder.up.0.block.0.conv1.weight",
                                   "encoder.down.0.block.0.conv1.weight", "decoder.norm_out.weight"};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
        if (checkpoint_find(ck, probes[i], NULL)) return 1;
    return 0;
}
