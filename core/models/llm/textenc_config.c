/* The text encoder's configuration when its checkpoint comes without a
 * config.json (ComfyUI's text_encoders/qwen_3_4b.safetensors,
 * mistral_3_small_flux2_*.safetensors): derived from the tensor shapes and
 * the family's known architecture (textenc.h: textenc_config_derive).
 *
 *   layers        1 + the largest N of <prefix>layers.N.*
 *   hidden, vocab embed_tokens.weight [vocab, hidden]
 *   ffn           layers.0.mlp.gate_proj.weight rows
 *   Qwen3 (klein) head_dim = layers.0.self_attn.q_norm.weight length,
 *                 heads = q_proj rows / head_dim, kv heads = k_proj rows / head_dim,
 *                 rope_theta 1e6, rms_norm_eps 1e-6 (Qwen3-4B/8B's config.json)
 *   Mistral (dev) head_dim 128 (Mistral Small 3.x: 32 q / 8 kv heads of 128 at
 *                 hidden 5120, so hidden / heads does not give it), heads and
 *                 kv heads from q_proj / k_proj rows, rope_theta 1e9,
 *                 rms_norm_eps 1e-5, no sliding window (docs/spec/flux2-text-vae.md §8)
 *
 * The result goes through llm_config_parse, so its checks apply; shapes the
 * family does not fit are refused naming the file and the tensor. */
#include "textenc.h"
#include "llm_internal.h"
#include "core/formats/checkpoint.h"
#include "kernels/err.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const st_tensor_info *find(const checkpoint *ck, const char *prefix, const char *rest) {
    char name[192];
    snprintf(name, sizeof name, "%s%s", prefix, rest);
    return checkpoint_find(ck, name, NULL);
}

int textenc_config_derive(const checkpoint *ck, int dev, llm_config *out) {
    const char *fam = dev ? "FLUX.2-dev (a Mistral Small 3.x language model)" : "FLUX.2-klein (a Qwen3 model)";
    llm_config probe = {.arch = dev ? LLM_MISTRAL : LLM_QWEN3};
    if (llm_config_resolve_prefix(&probe, ck)) {
        llm_config other = {.arch = dev ? LLM_QWEN3 : LLM_MISTRAL};
        if (!llm_config_resolve_prefix(&other, ck) && other.prefix[0])   /* the other family's own names */
            return tp_error("%s: its tensor names (prefix '%s') are a %s text encoder's, but %s is needed (is it %s? "
                            "then use %s)", ck->dir, other.prefix, dev ? "Qwen3" : "Mistral3", fam,
                            dev ? "klein's" : "FLUX.2-dev's", dev ? "--family klein or klein-base" : "--family dev");
        return tp_error_context("deriving the text encoder's config from %s for %s", ck->dir, fam);
    }
    const char *P = probe.prefix;
    const st_tensor_info *emb = find(ck, P, "embed_tokens.weight"), *q = find(ck, P, "layers.0.self_attn.q_proj.weight"),
                         *k = find(ck, P, "layers.0.self_attn.k_proj.weight"),
                         *g = find(ck, P, "layers.0.mlp.gate_proj.weight"),
                         *qn = find(ck, P, "layers.0.self_attn.q_norm.weight");
    const char *missing = !q ? "layers.0.self_attn.q_proj.weight" : !k ? "layers.0.self_attn.k_proj.weight"
                          : !g ? "layers.0.mlp.gate_proj.weight" : NULL;
    if (missing)
        return tp_error("%s: tensor %s%s is missing; without a config.json the text encoder's shape is derived from "
                        "its tensors, and this is not a complete %s text encoder", ck->dir, P, missing, fam);
    if (emb->ndim != 2 || q->ndim != 2 || k->ndim != 2 || g->ndim != 2 || (qn && qn->ndim != 1))
        return tp_error("%s: the text encoder's embedding and projections must be matrices", ck->dir);
    if (!dev && !qn)
        return tp_error("%s: no %slayers.0.self_attn.q_norm.weight: this is not a Qwen3 text encoder, which %s "
                        "needs (is it FLUX.2-dev's Mistral? then use --family dev)", ck->dir, P, fam);
    if (dev && qn)
        return tp_error("%s: the text encoder has q_norm tensors (a Qwen3 model), but %s needs a Mistral one (is it "
                        "klein's? then use --family klein or klein-base)", ck->dir, fam);
    int layers = 0;
    size_t np = strlen(P);
    for (int i = 0; i < ck->n; i++) {
        const char *n = ck->infos[i]->name;
        if (strncmp(n, P, np) || strncmp(n + np, "layers.", 7)) continue;
        long l = strtol(n + np + 7, NULL, 10);
        if (l >= 0 && l < (1 << 16) && l + 1 > layers) layers = (int)l + 1;
    }
    int64_t hidden = emb->shape[1], vocab = emb->shape[0], hd = dev ? 128 : qn->shape[0];
    if (q->shape[1] != hidden || k->shape[1] != hidden || g->shape[1] != hidden)
        return tp_error("%s: q_proj, k_proj and gate_proj take %lld, %lld, %lld inputs but the embedding is %lld wide: "
                        "not a %s text encoder", ck->dir, (long long)q->shape[1], (long long)k->shape[1],
                        (long long)g->shape[1], (long long)hidden, fam);
    if (hd <= 0 || q->shape[0] % hd || k->shape[0] % hd)
        return tp_error("%s: q_proj has %lld and k_proj %lld rows, not multiples of the head size %lld%s: the shapes "
                        "do not fit %s", ck->dir, (long long)q->shape[0], (long long)k->shape[0], (long long)hd,
                        dev ? " (Mistral Small 3.x)" : " (q_norm)", fam);
    json_t *j = json_pack("{s:s,s:I,s:i,s:I,s:I,s:I,s:I,s:I,s:f,s:f}", "model_type", dev ? "mistral" : "qwen3",
                          "hidden_size", (json_int_t)hidden, "num_hidden_layers", layers, "num_attention_heads",
                          (json_int_t)(q->shape[0] / hd), "num_key_value_heads", (json_int_t)(k->shape[0] / hd),
                          "head_dim", (json_int_t)hd, "intermediate_size", (json_int_t)g->shape[0], "vocab_size",
                          (json_int_t)vocab, "rms_norm_eps", dev ? 1e-5 : 1e-6, "rope_theta", dev ? 1e9 : 1e6);
    char *where = xasprintf("%s (config derived from the tensor shapes for %s)", ck->dir, fam);
    int rc = llm_config_parse(j, where, out);
    free(where);
    json_decref(j);
    if (!rc) memcpy(out->prefix, probe.prefix, sizeof out->prefix);
    return rc;
}
