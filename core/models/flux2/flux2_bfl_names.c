/* Diffusers -> BFL tensor names of a FLUX.2 transformer
 * (core/models/flux2/flux2_bfl_names.h): the table of diffusers'
 * convert_flux2_transformer_checkpoint_to_diffusers (diffusers 0.42.1,
 * loaders/single_file_utils.py) read backwards. */
#include "core/models/flux2/flux2_bfl_names.h"
#include "kernels/err.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One BFL tensor stem (no ".weight"): the diffusers stems it is made of
 * ("%d" = block), stacked along dim 0; swap exchanges the row halves. */
typedef struct bfl_rule {
    int scope;                 /* 0 top level, 1 per double block, 2 per single block */
    const char *bfl, *src[3];
    int swap, norm;            /* norm: BFL ".scale" for diffusers ".weight", no bias */
} bfl_rule;

static const bfl_rule k_rules[] = {
    {0, "img_in", {"x_embedder"}, 0, 0},
    {0, "txt_in", {"context_embedder"}, 0, 0},
    {0, "time_in.in_layer", {"time_guidance_embed.timestep_embedder.linear_1"}, 0, 0},
    {0, "time_in.out_layer", {"time_guidance_embed.timestep_embedder.linear_2"}, 0, 0},
    {0, "guidance_in.in_layer", {"time_guidance_embed.guidance_embedder.linear_1"}, 0, 0},
    {0, "guidance_in.out_layer", {"time_guidance_embed.guidance_embedder.linear_2"}, 0, 0},
    {0, "double_stream_modulation_img.lin", {"double_stream_modulation_img.linear"}, 0, 0},
    {0, "double_stream_modulation_txt.lin", {"double_stream_modulation_txt.linear"}, 0, 0},
    {0, "single_stream_modulation.lin", {"single_stream_modulation.linear"}, 0, 0},
    {0, "final_layer.linear", {"proj_out"}, 0, 0},
    {0, "final_layer.adaLN_modulation.1", {"norm_out.linear"}, 1, 0},
    {1, "double_blocks.%d.img_attn.qkv",
     {"transformer_blocks.%d.attn.to_q", "transformer_blocks.%d.attn.to_k", "transformer_blocks.%d.attn.to_v"}, 0, 0},
    {1, "double_blocks.%d.txt_attn.qkv",
     {"transformer_blocks.%d.attn.add_q_proj", "transformer_blocks.%d.attn.add_k_proj",
      "transformer_blocks.%d.attn.add_v_proj"}, 0, 0},
    {1, "double_blocks.%d.img_attn.norm.query_norm", {"transformer_blocks.%d.attn.norm_q"}, 0, 1},
    {1, "double_blocks.%d.img_attn.norm.key_norm", {"transformer_blocks.%d.attn.norm_k"}, 0, 1},
    {1, "double_blocks.%d.txt_attn.norm.query_norm", {"transformer_blocks.%d.attn.norm_added_q"}, 0, 1},
    {1, "double_blocks.%d.txt_attn.norm.key_norm", {"transformer_blocks.%d.attn.norm_added_k"}, 0, 1},
    {1, "double_blocks.%d.img_attn.proj", {"transformer_blocks.%d.attn.to_out.0"}, 0, 0},
    {1, "double_blocks.%d.txt_attn.proj", {"transformer_blocks.%d.attn.to_add_out"}, 0, 0},
    {1, "double_blocks.%d.img_mlp.0", {"transformer_blocks.%d.ff.linear_in"}, 0, 0},
    {1, "double_blocks.%d.img_mlp.2", {"transformer_blocks.%d.ff.linear_out"}, 0, 0},
    {1, "double_blocks.%d.txt_mlp.0", {"transformer_blocks.%d.ff_context.linear_in"}, 0, 0},
    {1, "double_blocks.%d.txt_mlp.2", {"transformer_blocks.%d.ff_context.linear_out"}, 0, 0},
    {2, "single_blocks.%d.linear1", {"single_transformer_blocks.%d.attn.to_qkv_mlp_proj"}, 0, 0},
    {2, "single_blocks.%d.linear2", {"single_transformer_blocks.%d.attn.to_out"}, 0, 0},
    {2, "single_blocks.%d.norm.query_norm", {"single_transformer_blocks.%d.attn.norm_q"}, 0, 1},
    {2, "single_blocks.%d.norm.key_norm", {"single_transformer_blocks.%d.attn.norm_k"}, 0, 1},
};
#define N_RULES ((int)(sizeof k_rules / sizeof k_rules[0]))

static int find_index(const checkpoint *c, const char *name) {
    int lo = 0, hi = c->n - 1;
    while (lo <= hi) {   /* infos are sorted by name (strcmp) */
        int mid = (lo + hi) / 2, r = strcmp(c->infos[mid]->name, name);
        if (!r) return mid;
        if (r < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    for (int k = 0; k < c->n; k++)
        if (!strcmp(c->infos[k]->name, name)) return k;
    return -1;
}

int flux2_bfl_is_diffusers(const checkpoint *c) {
    return c && find_index(c, "x_embedder.weight") >= 0 &&
           find_index(c, "double_stream_modulation_img.linear.weight") >= 0 &&
           find_index(c, "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight") >= 0;
}

/* blocks of a scope: 1 + the largest N of "<prefix>N." among c's names */
static int count_blocks(const checkpoint *c, const char *prefix) {
    size_t lp = strlen(prefix);
    int n = 0;
    for (int k = 0; k < c->n; k++) {
        const char *s = c->infos[k]->name;
        if (strncmp(s, prefix, lp)) continue;
        char *end;
        long b = strtol(s + lp, &end, 10);
        if (end != s + lp && *end == '.' && b >= 0 && b < 100000 && b + 1 > n) n = (int)b + 1;
    }
    return n;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const flux2_bfl_tensor *)a)->name, ((const flux2_bfl_tensor *)b)->name);
}

void flux2_bfl_names_free(flux2_bfl_tensor *t, int n) {
    for (int i = 0; t && i < n; i++) free(t[i].name);
    free(t);
}

/* rule r at block blk with diffusers suffix sfx: 1 added, 0 absent (all
 * sources missing, allowed for biases and guidance_in), -1 error */
static int add_one(const checkpoint *c, const bfl_rule *r, int blk, const char *sfx, int optional, char *used,
                   flux2_bfl_tensor *t) {
    int idx[3], n = 0, found = 0;
    char names[3][192];
    for (; n < 3 && r->src[n]; n++) {
        char stem[160];
        snprintf(stem, sizeof stem, r->src[n], blk);
        snprintf(names[n], sizeof names[n], "%s.%s", stem, sfx);
        idx[n] = find_index(c, names[n]);
        found += idx[n] >= 0;
    }
    if (!found && optional) return 0;
    for (int i = 0; i < n; i++)
        if (idx[i] < 0)
            return tp_error("not a diffusers FLUX.2 transformer: tensor '%s' is missing (give a complete diffusers "
                            "FLUX.2 transformer, or --names keep)", names[i]);
    const st_tensor_info *a = c->infos[idx[0]];
    memset(t, 0, sizeof *t);
    t->ndim = a->ndim;
    memcpy(t->shape, a->shape, sizeof t->shape);
    for (int i = 0; i < n; i++) {
        const st_tensor_info *b = c->infos[idx[i]];
        if (used[idx[i]]) return tp_error("diffusers tensor '%s' is used twice (internal)", b->name);
        if (b->ndim < 1 || b->ndim != a->ndim || memcmp(b->shape + 1, a->shape + 1, (size_t)(a->ndim - 1) * sizeof *a->shape))
            return tp_error("diffusers tensor '%s' (%d dims) cannot be stacked with '%s' (%d dims): the trailing "
                            "dimensions differ", b->name, b->ndim, a->name, a->ndim);
        if (i) t->shape[0] += b->shape[0];
        t->src[i] = idx[i];
    }
    if (r->swap && t->shape[0] % 2)
        return tp_error("diffusers tensor '%s' has %lld rows, not two halves (shift, scale)", a->name,
                        (long long)t->shape[0]);
    for (int i = 0; i < n; i++) used[idx[i]] = 1;
    char stem[160], name[200];
    snprintf(stem, sizeof stem, r->bfl, blk);
    snprintf(name, sizeof name, "%s.%s", stem, r->norm ? "scale" : sfx);
    t->name = xstrdup(name);
    t->n_src = n;
    t->swap = r->swap;
    return 1;
}

int flux2_bfl_names(const checkpoint *c, flux2_bfl_tensor **out, int *n_out) {
    *out = NULL, *n_out = 0;
    if (!flux2_bfl_is_diffusers(c)) {
        int flux3 = 0;
        for (int k = 0; k < c->n && !flux3; k++)
            flux3 = !strncmp(c->infos[k]->name, "early_stream_modulations.", 25) ||
                    !strncmp(c->infos[k]->name, "txt_mode_blocks.", 16);
        return tp_error("not a diffusers FLUX.2 transformer (%s): BFL names are written for FLUX.2 only; use --names "
                        "keep", flux3 ? "a FLUX.3 transformer, which has no BFL layout"
                                      : "no x_embedder.weight, double_stream_modulation_img.linear.weight and "
                                        "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight");
    }
    int counts[3] = {1, count_blocks(c, "transformer_blocks."), count_blocks(c, "single_transformer_blocks.")};
    char *used = xcalloc((size_t)c->n + 1, 1);
    int cap = 2 * c->n + 8, n = 0, rc = 0;
    flux2_bfl_tensor *t = xcalloc((size_t)cap, sizeof *t);
    for (int i = 0; i < N_RULES && !rc; i++)
        for (int blk = 0; blk < counts[k_rules[i].scope] && !rc; blk++)
            for (int b = 0; b < 2 && !rc; b++) {
                if (b && k_rules[i].norm) continue;
                int optional = b || !strncmp(k_rules[i].bfl, "guidance_in.", 12);
                int r = add_one(c, &k_rules[i], blk, b ? "bias" : "weight", optional, used, &t[n]);
                if (r < 0) rc = -1;
                else if (r > 0 && ++n == cap) rc = tp_error("internal: too many BFL tensors");
            }
    for (int k = 0; k < c->n && !rc; k++)
        if (!used[k])
            rc = tp_error("not a diffusers FLUX.2 transformer: tensor '%s' has no BFL name (FLUX.2's diffusers "
                          "converter does not know it); use --names keep", c->infos[k]->name);
    free(used);
    if (rc) {
        flux2_bfl_names_free(t, n);
        return -1;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_name);
    *out = t, *n_out = n;
    return 0;
}
