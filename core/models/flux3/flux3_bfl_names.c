/* Diffusers -> BFL tensor names of a FLUX.3 transformer, as recipes for
 * `tpgen quantize --names bfl` (flux3_bfl_names.h). The names come from
 * flux3_bfl_name (core/models/flux3/flux3.c: the loader's own inverse of diffusers
 * 0.42.1's convert_flux3_transformer_checkpoint_to_diffusers, which
 * tests/test_flux3_bfl.c and tests/tools/flux3_bfl_testdata.py prove); this
 * file only checks that every tensor is a FLUX.3 one and lists them. */
#include "flux3_bfl_names.h"
#include "flux3.h"
#include "kernels/err.h"
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define NORM_OUT "norm_out.linear.weight"

static const char *const k_exact[] = {
    "timestep_embedder.linear_1.weight", "timestep_embedder.linear_2.weight",
    "target_timestep_embedder.linear_1.weight", "target_timestep_embedder.linear_2.weight",
    "context_embedder.weight", "x_embedders.image.weight", "x_embedders.image_cond.weight",
    NORM_OUT, "proj_out.weight",
    "early_stream_modulations.txt.linear.weight", "early_stream_modulations.image.linear.weight",
    "early_stream_modulations.image_cond.linear.weight", "single_stream_modulations.txt.linear.weight",
    "single_stream_modulations.image.linear.weight", "single_stream_modulations.image_cond.linear.weight"};
static const char *const k_blocks[] = {"txt_mode_blocks.", "mode_blocks.image.", "mode_blocks.image_cond.",
                                       "single_transformer_blocks."};
static const char *const k_block_tensors[] = {"attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight",
                                              "attn.to_out.0.weight", "attn.norm_q.weight", "attn.norm_k.weight",
                                              "ff.linear_in.weight", "ff.linear_out.weight"};

/* a tensor name of diffusers' Flux3Transformer2DModel */
static int is_flux3_name(const char *n) {
    for (size_t i = 0; i < sizeof k_exact / sizeof k_exact[0]; i++)
        if (!strcmp(n, k_exact[i])) return 1;
    for (size_t i = 0; i < sizeof k_blocks / sizeof k_blocks[0]; i++) {
        size_t l = strlen(k_blocks[i]);
        if (strncmp(n, k_blocks[i], l) || !isdigit((unsigned char)n[l])) continue;
        const char *p = n + l;
        while (isdigit((unsigned char)*p)) p++;
        if (*p++ != '.') continue;
        for (size_t j = 0; j < sizeof k_block_tensors / sizeof k_block_tensors[0]; j++)
            if (!strcmp(p, k_block_tensors[j])) return 1;
    }
    return 0;
}

int flux3_bfl_is_diffusers(const checkpoint *c) {
    const char *bfl;
    return c && flux3_checkpoint_names(c, &bfl) && !bfl;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const flux2_bfl_tensor *)a)->name, ((const flux2_bfl_tensor *)b)->name);
}

int flux3_bfl_names(const checkpoint *c, flux2_bfl_tensor **out, int *n_out) {
    *out = NULL, *n_out = 0;
    if (!flux3_bfl_is_diffusers(c))
        return tp_error("%s: not a diffusers-named FLUX.3 transformer (no early_stream_modulations.image.linear."
                        "weight)", c ? c->dir : "(none)");
    flux2_bfl_tensor *t = xcalloc((size_t)(c->n ? c->n : 1), sizeof *t);
    for (int k = 0; k < c->n; k++) {
        const st_tensor_info *ti = c->infos[k];
        if (!is_flux3_name(ti->name)) {
            flux2_bfl_names_free(t, k);
            return tp_error("%s: tensor '%s' is not a tensor of diffusers' Flux3Transformer2DModel; no BFL name "
                            "maps to it (use --names keep to write the names as they are)", c->dir, ti->name);
        }
        char name[256];
        flux3_bfl_name(ti->name, "", name, sizeof name);
        t[k].name = xstrdup(name);
        t[k].n_src = 1;
        t[k].src[0] = k;
        t[k].swap = !strcmp(ti->name, NORM_OUT);   /* diffusers [scale; shift] -> BFL [shift; scale] */
        t[k].ndim = ti->ndim;
        memcpy(t[k].shape, ti->shape, sizeof t[k].shape);
        if (t[k].swap && (ti->ndim != 2 || ti->shape[0] % 2)) {
            flux2_bfl_names_free(t, k + 1);
            return tp_error("%s: tensor '%s' must be [2D, D] to swap its halves (has %d dimensions, %lld rows)",
                            c->dir, ti->name, ti->ndim, ti->ndim ? (long long)ti->shape[0] : 0LL);
        }
    }
    qsort(t, (size_t)c->n, sizeof *t, cmp_name);
    *out = t, *n_out = c->n;
    return 0;
}
