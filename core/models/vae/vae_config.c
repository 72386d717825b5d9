/* vae/config.json: parse what the decoder needs and refuse what it cannot
 * serve, with the key and the file named. */
#include "vae_internal.h"
#include "kernels/err.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* no VAE field means anything above this (channels are at most a few hundred) */
#define VAE_MAX_INT (1 << 20)

static int int_key(const json_t *j, const char *key, int def, int *out, const char *where) {
    json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    /* range-checked before the int cast (2^32 + 4 must not become 4) */
    if (!json_is_integer(v) || json_integer_value(v) < -VAE_MAX_INT || json_integer_value(v) > VAE_MAX_INT)
        return tp_error("%s: \"%s\" must be an integer from -%d to %d", where, key, VAE_MAX_INT, VAE_MAX_INT);
    *out = (int)json_integer_value(v);
    return 0;
}

static int bool_key(const json_t *j, const char *key, int def, int *out, const char *where) {
    json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_boolean(v)) return tp_error("%s: \"%s\" must be true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

static int channels_key(const json_t *arr, const char *key, vae_config *c, const char *where) {
    if (!json_is_array(arr) || json_array_size(arr) < 1 || json_array_size(arr) > VAE_MAX_BLOCKS)
        return tp_error("%s: \"%s\" must be a list of 1 to %d channel counts", where, key, VAE_MAX_BLOCKS);
    c->n_blocks = (int)json_array_size(arr);
    for (int i = 0; i < c->n_blocks; i++) {
        json_t *e = json_array_get(arr, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) <= 0 || json_integer_value(e) > VAE_MAX_INT)
            return tp_error("%s: \"%s\"[%d] must be an integer from 1 to %d", where, key, i, VAE_MAX_INT);
        c->block_out[i] = (int)json_integer_value(e);
    }
    return 0;
}

/* Everything the decoder implements: plain up blocks, SiLU, group norms,
 * a 2x2 patch. Anything else is refused rather than decoded wrongly. */
static int check_supported(const json_t *j, const vae_config *c, const char *where) {
    const char *act = json_string_value(json_object_get(j, "act_fn"));
    if (act && strcmp(act, "silu"))
        return tp_error("%s: act_fn \"%s\" is not supported by the decoder (only silu)", where, act);
    json_t *types = json_object_get(j, "up_block_types");
    for (size_t i = 0; json_is_array(types) && i < json_array_size(types); i++) {
        const char *t = json_string_value(json_array_get(types, i));
        if (!t || strcmp(t, "UpDecoderBlock2D"))
            return tp_error("%s: up_block_types[%zu] \"%s\" is not supported (only UpDecoderBlock2D)", where, i,
                            t ? t : "?");
    }
    json_t *ps = json_object_get(j, "patch_size");
    if (ps && !json_is_null(ps)) {
        if (!json_is_array(ps) || json_array_size(ps) != 2 ||
            json_integer_value(json_array_get(ps, 0)) != 2 || json_integer_value(json_array_get(ps, 1)) != 2)
            return tp_error("%s: patch_size must be [2, 2] (the FLUX.2 latent packing)", where);
    }
    if (c->out_channels != 3)
        return tp_error("%s: out_channels is %d; the decoder writes RGB images and needs 3", where, c->out_channels);
    if (c->latent_channels <= 0) return tp_error("%s: latent_channels must be positive", where);
    if (c->layers_per_block < 0 || c->layers_per_block + 1 > VAE_MAX_BLOCKS)
        return tp_error("%s: layers_per_block %d is out of range (0..%d)", where, c->layers_per_block,
                        VAE_MAX_BLOCKS - 1);
    if (c->norm_groups <= 0) return tp_error("%s: norm_num_groups must be positive", where);
    for (int i = 0; i < c->n_blocks; i++)
        if (c->block_out[i] % c->norm_groups)
            return tp_error("%s: norm_num_groups %d does not divide decoder channel count %d", where,
                            c->norm_groups, c->block_out[i]);
    return 0;
}

int vae_config_parse(const json_t *j, const char *where, vae_config *c) {
    memset(c, 0, sizeof *c);
    if (!json_is_object(j)) return tp_error("%s: not a JSON object", where);
    json_t *dec = json_object_get(j, "decoder_block_out_channels");
    json_t *blocks = dec && !json_is_null(dec) ? dec : json_object_get(j, "block_out_channels");
    if (!blocks) return tp_error("%s: \"block_out_channels\" is missing; is this a VAE config?", where);
    if (channels_key(blocks, blocks == dec ? "decoder_block_out_channels" : "block_out_channels", c, where))
        return -1;
    if (int_key(j, "latent_channels", 32, &c->latent_channels, where) ||
        int_key(j, "layers_per_block", 2, &c->layers_per_block, where) ||
        int_key(j, "norm_num_groups", 32, &c->norm_groups, where) ||
        int_key(j, "out_channels", 3, &c->out_channels, where) ||
        bool_key(j, "mid_block_add_attention", 1, &c->mid_attention, where) ||
        bool_key(j, "use_post_quant_conv", 1, &c->post_quant_conv, where))
        return -1;
    /* the encoder's channels are block_out_channels even when the decoder has its own */
    json_t *enc = json_object_get(j, "block_out_channels");
    if (enc && !json_is_null(enc)) {
        vae_config tmp = {0};
        if (channels_key(enc, "block_out_channels", &tmp, where)) return -1;
        c->enc_n_blocks = tmp.n_blocks;
        memcpy(c->enc_block_out, tmp.block_out, sizeof tmp.block_out);
    }
    if (int_key(j, "in_channels", 3, &c->in_channels, where) ||
        bool_key(j, "use_quant_conv", 1, &c->quant_conv, where))
        return -1;
    c->enc_blocks_ok = 1;
    json_t *dtypes = json_object_get(j, "down_block_types");
    for (size_t i = 0; json_is_array(dtypes) && i < json_array_size(dtypes); i++) {
        const char *t = json_string_value(json_array_get(dtypes, i));
        if (!t || strcmp(t, "DownEncoderBlock2D")) c->enc_blocks_ok = 0;
    }
    json_t *eps = json_object_get(j, "batch_norm_eps");
    if (eps && !json_is_number(eps)) return tp_error("%s: \"batch_norm_eps\" must be a number", where);
    c->bn_eps = eps ? (float)json_number_value(eps) : 1e-4f;
    c->norm_eps = 1e-6f;   /* diffusers' Decoder fixes the GroupNorm eps; it is not in the config */
    return check_supported(j, c, where);
}

static json_t *int_array(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

int vae_config_write(const vae_config *c, const char *path) {
    json_t *j = json_object();
    json_object_set_new(j, "_class_name", json_string("AutoencoderKLFlux2"));
    json_object_set_new(j, "in_channels", json_integer(3));
    json_object_set_new(j, "out_channels", json_integer(c->out_channels));
    json_t *down = json_array(), *up = json_array();
    for (int i = 0; i < c->n_blocks; i++) {
        json_array_append_new(down, json_string("DownEncoderBlock2D"));
        json_array_append_new(up, json_string("UpDecoderBlock2D"));
    }
    json_object_set_new(j, "down_block_types", down);
    json_object_set_new(j, "up_block_types", up);
    json_object_set_new(j, "block_out_channels", int_array(c->block_out, c->n_blocks));
    json_object_set_new(j, "decoder_block_out_channels", json_null());
    json_object_set_new(j, "layers_per_block", json_integer(c->layers_per_block));
    json_object_set_new(j, "act_fn", json_string("silu"));
    json_object_set_new(j, "latent_channels", json_integer(c->latent_channels));
    json_object_set_new(j, "norm_num_groups", json_integer(c->norm_groups));
    json_object_set_new(j, "use_quant_conv", json_true());
    json_object_set_new(j, "use_post_quant_conv", json_boolean(c->post_quant_conv));
    json_object_set_new(j, "mid_block_add_attention", json_boolean(c->mid_attention));
    json_object_set_new(j, "batch_norm_eps", json_real(c->bn_eps));
    json_object_set_new(j, "batch_norm_momentum", json_real(0.1));
    int ps[2] = {2, 2};
    json_object_set_new(j, "patch_size", int_array(ps, 2));
    char *tmp = xasprintf("%s.tmp", path);
    int rc = json_dump_file(j, tmp, JSON_INDENT(2));
    json_decref(j);
    if (rc || rename(tmp, path)) {
        remove(tmp);
        free(tmp);
        return tp_error("could not write %s; check that the folder is writable", path);
    }
    free(tmp);
    return 0;
}

/* FLUX.2's AutoencoderKLFlux2 (docs/spec/flux2-text-vae.md §6.1): also the config
 * of a VAE file without config.json (vae.c) */
void vae_flux2_config(vae_config *c) {
    memset(c, 0, sizeof *c);
    int blocks[4] = {128, 256, 512, 512};
    c->n_blocks = c->enc_n_blocks = 4;
    memcpy(c->block_out, blocks, sizeof blocks);
    memcpy(c->enc_block_out, blocks, sizeof blocks);
    c->latent_channels = 32;
    c->layers_per_block = 2;
    c->norm_groups = 32;
    c->out_channels = 3;
    c->in_channels = 3;
    c->mid_attention = 1;
    c->post_quant_conv = 1;
    c->quant_conv = 1;
    c->enc_blocks_ok = 1;
    c->bn_eps = 1e-4f;
    c->norm_eps = 1e-6f;
}
