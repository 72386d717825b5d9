/* What each part of a probed model is and where it came from (tpgen
 * inspect --components): the path, its source (pipeline folder, a file or
 * folder given by flag, the family's default), the naming detected
 * (diffusers / BFL / GGUF, the text encoder's HF prefix), the dtypes (fp8,
 * GGUF block types) and where its config came from. Headers only. */
#include "tp_pipe.h"
#include "core/formats/checkpoint.h"
#include "core/formats/fp8.h"
#include "core/models/llm/llm.h"
#include "core/models/llm/textenc.h"
#include "core/models/vae/vae.h"
#include "kernels/err.h"
#include "kernels/quant.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "BF16 x41, F8_E4M3 x12" over the checkpoint's tensors; GGUF blocks by their ggml type */
static json_t *dtype_counts(const checkpoint *c) {
    json_t *o = json_object();
    for (int k = 0; k < c->n; k++) {
        const st_tensor_info *t = c->infos[k];
        const char *n = t->dtype == DT_GGML ? quant_type_name(t->qtype) : dtype_name(t->dtype);
        json_t *v = json_object_get(o, n);
        json_object_set_new(o, n, json_integer(v ? json_integer_value(v) + 1 : 1));
    }
    return o;
}

static const char *file_format(const checkpoint *c) {
    const char *p = c->n_files ? c->files[0]->path : "";
    size_t n = strlen(p);
    return n > 5 && !strcmp(p + n - 5, ".gguf") ? "gguf" : "safetensors";
}

static json_t *part(const char *name, const char *path, const char *src) {
    return json_pack("{s:s,s:s?,s:s?}", "component", name, "path", path, "from", src);
}

static void add_ckpt(json_t *o, const checkpoint *c) {
    json_object_set_new(o, "format", json_string(file_format(c)));
    json_object_set_new(o, "files", json_integer(c->n_files));
    json_object_set_new(o, "tensors", json_integer(c->n));
    json_object_set_new(o, "dtypes", dtype_counts(c));
    if (c->fp8) json_object_set_new(o, "fp8_weights", json_integer(c->fp8->n_fp8));
    if (c->prefix) {   /* a ComfyUI / stable-diffusion.cpp diffusion model: names read behind the prefix */
        json_object_set_new(o, "name_prefix", json_string(c->prefix));
        json_object_set_new(o, "tensors_outside_prefix_ignored", json_integer(c->n_other));
    }
}

static json_t *describe_transformer(const tp_pipe_info *g) {
    json_t *o = part("transformer", g->transformer_dir, g->transformer_src);
    checkpoint *c = NULL;
    if (checkpoint_open(g->transformer_dir, &c)) {
        json_object_set_new(o, "error", json_string(tp_error_msg()));
        return o;
    }
    add_ckpt(o, c);
    int bfl = checkpoint_is_bfl(c);
    json_object_set_new(o, "naming", json_string(bfl ? "BFL" : "diffusers"));
    char *cfg = path_is_dir(g->transformer_dir) ? xasprintf("%s/config.json", g->transformer_dir) : NULL;
    json_object_set_new(o, "config", cfg && path_is_file(cfg) ? json_string(cfg)
                                     : json_string(bfl ? "derived from the BFL tensor shapes"
                                                       : "derived from the diffusers tensor shapes"));
    free(cfg);
    checkpoint_close(c);
    return o;
}

static json_t *describe_text_encoder(const tp_pipe_info *g) {
    json_t *o = part("text_encoder", g->te_path, g->has_text_encoder ? g->te_src : "none");
    if (!g->has_text_encoder) return o;
    checkpoint *c = NULL;
    if (checkpoint_open(g->te_path, &c)) {
        json_object_set_new(o, "error", json_string(tp_error_msg()));
        return o;
    }
    add_ckpt(o, c);
    textenc_source src = tp_pipe_text_source(g);
    char *cfg = path_is_dir(g->te_path) ? xasprintf("%s/config.json", g->te_path) : NULL;
    if (!cfg) {   /* a file: the config.json beside it */
        const char *slash = strrchr(g->te_path, '/');
        cfg = slash ? xasprintf("%.*s/config.json", (int)(slash - g->te_path), g->te_path) : xstrdup("config.json");
    }
    llm_config lc;
    int have_cfg = path_is_file(cfg), rc;
    if (have_cfg) {
        json_t *j = json_load_file(cfg, 0, NULL);
        rc = j ? llm_config_parse(j, cfg, &lc) : tp_error("%s: not valid JSON", cfg);
        if (!rc) rc = llm_config_resolve_prefix(&lc, c);
        json_decref(j);
    } else {
        rc = textenc_config_derive(c, src.dev, &lc);
    }
    char *derived = xasprintf("derived from the tensor shapes for %s", src.dev ? "FLUX.2-dev (Mistral)" : "klein (Qwen3)");
    json_object_set_new(o, "config", json_string(have_cfg ? cfg : derived));
    free(derived);
    if (!rc) {
        json_object_set_new(o, "naming", json_sprintf("HF, prefix '%s'", lc.prefix));
        json_object_set_new(o, "architecture", json_sprintf("%s: %d layers, hidden %d, %d/%d heads of %d, ffn %d, vocab "
                                                            "%d, rope_theta %g, eps %g", llm_arch_name(lc.arch),
                                                            lc.n_layers, lc.hidden, lc.n_heads, lc.n_kv_heads,
                                                            lc.head_dim, lc.ffn, lc.vocab, lc.rope_theta, lc.eps));
    } else {
        json_object_set_new(o, "error", json_string(tp_error_msg()));
    }
    char *tok = textenc_tokenizer_dir(&src);
    json_object_set_new(o, "tokenizer", tok ? json_string(tok) : json_sprintf("none: %s", tp_error_msg()));
    free(tok), free(cfg);
    checkpoint_close(c);
    return o;
}

static json_t *describe_vae(const tp_pipe_info *g) {
    json_t *o = part("vae", g->vae_dir, g->has_vae ? g->vae_src : "none");
    if (!g->has_vae) return o;
    checkpoint *c = NULL;
    if (checkpoint_open(g->vae_dir, &c)) {
        json_object_set_new(o, "error", json_string(tp_error_msg()));
        return o;
    }
    add_ckpt(o, c);
    int bfl = checkpoint_find(c, "decoder.mid.attn_1.q.weight", NULL) || checkpoint_find(c, "decoder.norm_out.weight", NULL);
    json_object_set_new(o, "naming", json_string(bfl ? "BFL/LDM" : "diffusers"));
    char *cfg = vae_config_path(g->vae_dir);
    json_object_set_new(o, "config", path_is_file(cfg) ? json_string(cfg)
                                     : json_string("FLUX.2 default (AutoencoderKLFlux2; no config.json)"));
    free(cfg);
    checkpoint_close(c);
    return o;
}

json_t *flux2_components_describe(const tp_pipe_info *g) {
    json_t *a = json_array();
    json_t *f = json_pack("{s:s,s:s,s:s?}", "component", "family", "name", g->family_name, "from", g->family_src);
    json_array_append_new(a, f);
    json_array_append_new(a, describe_transformer(g));
    json_array_append_new(a, describe_text_encoder(g));
    json_array_append_new(a, describe_vae(g));
    json_array_append_new(a, json_pack("{s:s,s:s}", "component", "scheduler", "from",
                                       "FLUX.2's FlowMatchEulerDiscreteScheduler (fixed; scheduler/ is not read)"));
    return a;
}
