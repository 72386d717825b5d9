/* Text encoders stored as llama.cpp GGUF files (llm.h, docs/gguf.md "Text
 * encoders"): the configuration from the `<arch>.*` metadata keys, the
 * tensor names mapped to the HF names the loader binds, and the Q/K row
 * order of the llama architecture.
 *
 * Names (gguf-py's TensorNameMap, as llama.cpp's convert_hf_to_gguf.py
 * writes them) -> HF:
 *   token_embd.weight       model.embed_tokens.weight
 *   output_norm.weight      model.norm.weight
 *   output.weight           lm_head.weight (never loaded)
 *   blk.N.attn_norm         model.layers.N.input_layernorm
 *   blk.N.ffn_norm          model.layers.N.post_attention_layernorm
 *   blk.N.attn_q/k/v        model.layers.N.self_attn.q_proj/k_proj/v_proj
 *   blk.N.attn_output       model.layers.N.self_attn.o_proj
 *   blk.N.attn_q/k_norm     model.layers.N.self_attn.q_norm/k_norm (Qwen3)
 *   blk.N.ffn_gate/up/down  model.layers.N.mlp.gate_proj/up_proj/down_proj
 * Other names are kept (they match no plan rule and are never loaded);
 * attention biases and MoE experts are refused. */
#include "llm_internal.h"
#include "core/formats/gguf.h"
#include "kernels/err.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct { const char *gguf, *hf; } k_layer_names[] = {
    {"attn_norm", "input_layernorm"},     {"ffn_norm", "post_attention_layernorm"},
    {"attn_q", "self_attn.q_proj"},       {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},       {"attn_output", "self_attn.o_proj"},
    {"attn_q_norm", "self_attn.q_norm"},  {"attn_k_norm", "self_attn.k_norm"},
    {"ffn_gate", "mlp.gate_proj"},        {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},
};

typedef struct rename_ctx {
    const char *path;
} rename_ctx;

static int gguf_to_hf(const char *name, char *out, size_t cap, void *ctx) {
    const rename_ctx *rc = ctx;
    if (!strcmp(name, "token_embd.weight")) return snprintf(out, cap, "model.embed_tokens.weight"), 1;
    if (!strcmp(name, "output_norm.weight")) return snprintf(out, cap, "model.norm.weight"), 1;
    if (!strcmp(name, "output.weight")) return snprintf(out, cap, "lm_head.weight"), 1;
    if (strncmp(name, "blk.", 4)) return 0;
    char *end;
    long layer = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || layer < 0) return 0;
    const char *rest = end + 1;
    if (strstr(rest, "_exps") || strstr(rest, "ffn_gate_inp"))
        return tp_error("%s: tensor '%s' is a mixture-of-experts weight; MoE text encoders are not supported (FLUX.2 "
                        "uses dense Qwen3 / Mistral Small)", rc->path, name);
    size_t n = strlen(rest);
    if (n > 5 && !strcmp(rest + n - 5, ".bias"))
        return tp_error("%s: tensor '%s': attention/MLP biases are not supported (Qwen3 and Mistral have none)",
                        rc->path, name);
    for (size_t i = 0; i < sizeof k_layer_names / sizeof k_layer_names[0]; i++) {
        size_t g = strlen(k_layer_names[i].gguf);
        if (!strncmp(rest, k_layer_names[i].gguf, g) && !strcmp(rest + g, ".weight"))
            return snprintf(out, cap, "model.layers.%ld.%s.weight", layer, k_layer_names[i].hf), 1;
    }
    return 0;
}

/* a required positive integer <arch>.<key> */
static int req_int(const gguf_file *g, const char *where, const char *arch, const char *key, int *out) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    uint32_t v;
    int r = gguf_get_u32(g, k, &v);
    if (r < 0) return tp_error_context("%s: metadata key %s", where, k);
    if (r > 0)
        return tp_error("%s: metadata key %s is missing; it is needed for the text encoder's configuration (is this "
                        "a complete llama.cpp GGUF?)", where, k);
    if (v == 0 || v > (1u << 30)) return tp_error("%s: metadata key %s = %u is out of range (1 .. 2^30)", where, k, v);
    *out = (int)v;
    return 0;
}

static int req_float(const gguf_file *g, const char *where, const char *arch, const char *key, double hi,
                     float *out) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int r = gguf_get_f32(g, k, out);
    if (r < 0) return tp_error_context("%s: metadata key %s", where, k);
    if (r > 0) return tp_error("%s: metadata key %s is missing; it is needed for the text encoder's configuration", where, k);
    if (!(*out > 0) || !(*out < hi)) return tp_error("%s: metadata key %s = %g is out of range (0 .. %g)", where, k, *out, hi);
    return 0;
}

int llm_gguf_config(const gguf_file *g, const char *where, llm_config *out) {
    memset(out, 0, sizeof *out);
    const char *arch = NULL;
    int r = gguf_get_str(g, "general.architecture", &arch);
    if (r < 0) return tp_error_context("%s: metadata key general.architecture", where);
    if (r > 0) return tp_error("%s: metadata key general.architecture is missing (not a llama.cpp model file?)", where);
    if (!strcmp(arch, "qwen3")) {
        out->arch = LLM_QWEN3;
        out->qk_norm = 1;
    } else if (!strcmp(arch, "llama")) {
        out->arch = LLM_MISTRAL;
        out->rope_interleaved = 1;   /* LlamaModel.undo_permute: Q/K rows permuted by the converter */
    } else {
        return tp_error("%s: metadata key general.architecture = \"%s\" is not a supported text encoder (\"qwen3\" for "
                        "FLUX.2-klein, \"llama\" for FLUX.2-dev's Mistral Small)", where, arch);
    }
    int ctx_len;
    float eps, theta;
    if (req_int(g, where, arch, "block_count", &out->n_layers) ||
        req_int(g, where, arch, "embedding_length", &out->hidden) ||
        req_int(g, where, arch, "feed_forward_length", &out->ffn) ||
        req_int(g, where, arch, "attention.head_count", &out->n_heads) ||
        req_int(g, where, arch, "attention.head_count_kv", &out->n_kv_heads) ||
        req_int(g, where, arch, "context_length", &ctx_len) ||
        req_float(g, where, arch, "attention.layer_norm_rms_epsilon", 1.0, &eps) ||
        req_float(g, where, arch, "rope.freq_base", 1e30, &theta))
        return -1;
    out->eps = eps;
    out->rope_theta = theta;
    char k[128];
    /* head_dim: key_length, or llama.cpp's default embedding_length / head_count when absent */
    snprintf(k, sizeof k, "%s.attention.key_length", arch);
    if (gguf_find_kv(g, k)) {
        if (req_int(g, where, arch, "attention.key_length", &out->head_dim)) return -1;
    } else {
        out->head_dim = out->hidden / out->n_heads;
    }
    static const char *const same_as_head_dim[] = {"attention.value_length", "rope.dimension_count"};
    for (int i = 0; i < 2; i++) {
        snprintf(k, sizeof k, "%s.%s", arch, same_as_head_dim[i]);
        int v;
        if (!gguf_find_kv(g, k)) continue;
        if (req_int(g, where, arch, same_as_head_dim[i], &v)) return -1;
        if (v != out->head_dim)
            return tp_error("%s: metadata key %s = %d differs from the head size %d (%s.attention.key_length); "
                            "%s is not supported", where, k, v, out->head_dim, arch,
                            i ? "RoPE on part of a head" : "a value size other than the key size");
    }
    if (out->head_dim % 2) return tp_error("%s: the head size %d (%s.attention.key_length) is odd", where, out->head_dim, arch);
    if (out->n_heads % out->n_kv_heads)
        return tp_error("%s: metadata key %s.attention.head_count = %d is not a multiple of %s.attention.head_count_kv "
                        "= %d", where, arch, out->n_heads, arch, out->n_kv_heads);
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    const char *scaling = NULL;
    if (gguf_get_str(g, k, &scaling) < 0) return tp_error_context("%s: metadata key %s", where, k);
    if (scaling && strcmp(scaling, "none"))
        return tp_error("%s: metadata key %s = \"%s\": RoPE scaling is not supported", where, k, scaling);
    snprintf(k, sizeof k, "%s.expert_count", arch);
    uint32_t experts = 0;
    if (gguf_get_u32(g, k, &experts) < 0) return tp_error_context("%s: metadata key %s", where, k);
    if (experts > 0) return tp_error("%s: metadata key %s = %u: MoE text encoders are not supported", where, k, experts);
    snprintf(k, sizeof k, "%s.attention.sliding_window", arch);
    uint32_t sw = 0;
    if (gguf_get_u32(g, k, &sw) < 0) return tp_error_context("%s: metadata key %s", where, k);
    if (out->arch == LLM_MISTRAL && sw > 0) out->sliding_window = sw > (1u << 30) ? (1 << 30) : (int)sw;
    const gguf_tensor *emb = gguf_find(g, "token_embd.weight");
    if (!emb || emb->ndim != 2)
        return tp_error("%s: no 2-D token_embd.weight tensor: the vocabulary size is taken from it", where);
    if (emb->shape[1] != out->hidden)
        return tp_error("%s: token_embd.weight has rows of %lld values but metadata key %s.embedding_length = %d",
                        where, (long long)emb->shape[1], arch, out->hidden);
    if (emb->shape[0] <= 0 || emb->shape[0] > (1 << 30))
        return tp_error("%s: token_embd.weight has %lld rows (vocabulary out of range)", where, (long long)emb->shape[0]);
    out->vocab = (int)emb->shape[0];
    snprintf(out->prefix, sizeof out->prefix, "model.");
    return 0;
}

int llm_gguf_is(const checkpoint *ck) {
    if (!ck || ck->n_files != 1) return 0;
    const char *p = ck->files[0]->path;
    size_t n = strlen(p);
    return n > 5 && !strcmp(p + n - 5, ".gguf");
}

static int close_enough(double a, double b) { return fabs(a - b) <= 1e-6 * fabs(b); }

/* config.json next to the GGUF must describe the same model */
static int agree_json(const llm_config *g, const llm_config *j, const char *path, const char *dir) {
    const char *field = NULL;
    double a = 0, b = 0;
#define CMP(f, name) else if (g->f != j->f) field = name, a = g->f, b = j->f
    if (0) {}
    CMP(arch, "the architecture (0 qwen3, 1 mistral)");
    CMP(hidden, "hidden_size");
    CMP(n_layers, "num_hidden_layers");
    CMP(n_heads, "num_attention_heads");
    CMP(n_kv_heads, "num_key_value_heads");
    CMP(head_dim, "head_dim");
    CMP(ffn, "intermediate_size");
    CMP(vocab, "vocab_size");
#undef CMP
    else if (!close_enough(g->eps, j->eps)) field = "rms_norm_eps", a = g->eps, b = j->eps;
    else if (!close_enough(g->rope_theta, j->rope_theta)) field = "rope_theta", a = g->rope_theta, b = j->rope_theta;
    if (!field) return 0;
    return tp_error("%s and %s/config.json disagree on %s (%g in the GGUF, %g in config.json); the GGUF's tensors are "
                    "what would be loaded: remove the config.json or put the matching one there", path, dir, field, a, b);
}

int llm_gguf_adopt(checkpoint *ck, const llm_config *json, llm_config *out) {
    if (!llm_gguf_is(ck)) return tp_error("%s: not a single GGUF file", ck->dir);
    const char *path = ck->files[0]->path;
    gguf_file *g;
    if (gguf_open(path, &g)) return -1;
    int rc = llm_gguf_config(g, path, out);
    gguf_close(g);
    if (!rc && json) rc = agree_json(out, json, path, ck->dir);
    rename_ctx rctx = {path};
    if (!rc) rc = checkpoint_rename(ck, gguf_to_hf, &rctx);
    return rc;
}
