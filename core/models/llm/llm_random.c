/* Random LLM weights: a tiny Qwen3 checkpoint on disk (make-tiny's text
 * encoder) and in-memory shards for benchmarks. Initialisation: norm
 * weights 1 + 0.1 N(0,1), embeddings N(0,1), linears N(0,1)/sqrt(fan_in)
 * with o/down further / sqrt(layers), so the residual stream stays O(1). */
#include "llm_internal.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/formats/safetensors.h"
#include "kernels/ops.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint64_t s; } rng64;

static uint64_t rng_next(rng64 *r) {   /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_normal(rng64 *r) {    /* Box-Muller */
    double u1 = ((rng_next(r) >> 11) + 1.0) * 0x1.0p-53, u2 = (rng_next(r) >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

typedef enum { INIT_NORM, INIT_EMBED, INIT_LINEAR, INIT_LINEAR_OUT } init_kind;

static void fill_bf16(uint16_t *dst, size_t n, int64_t fan_in, init_kind k, int n_layers, rng64 *r) {
    float scale = k == INIT_EMBED || k == INIT_NORM ? 1.0f : 1.0f / sqrtf((float)fan_in);
    if (k == INIT_LINEAR_OUT) scale /= sqrtf((float)n_layers);
    for (size_t i = 0; i < n; i++) {
        float v = rng_normal(r);
        dst[i] = f32_to_bf16(k == INIT_NORM ? 1.0f + 0.1f * v : v * scale);
    }
}

/* The tensors of one layer: suffix, rows, cols, init. */
typedef struct { const char *what; int64_t rows, cols; init_kind init; } layer_tensor;

static int layer_tensors(const llm_config *c, layer_tensor *out) {
    int64_t H = c->hidden, D = c->head_dim, q = (int64_t)c->n_heads * D, kv = (int64_t)c->n_kv_heads * D;
    layer_tensor t[] = {
        {"input_layernorm", 1, H, INIT_NORM}, {"post_attention_layernorm", 1, H, INIT_NORM},
        {"self_attn.q_proj", q, H, INIT_LINEAR}, {"self_attn.k_proj", kv, H, INIT_LINEAR},
        {"self_attn.v_proj", kv, H, INIT_LINEAR}, {"self_attn.o_proj", H, q, INIT_LINEAR_OUT},
        {"mlp.gate_proj", c->ffn, H, INIT_LINEAR}, {"mlp.up_proj", c->ffn, H, INIT_LINEAR},
        {"mlp.down_proj", H, c->ffn, INIT_LINEAR_OUT},
        {"self_attn.q_norm", 1, D, INIT_NORM}, {"self_attn.k_norm", 1, D, INIT_NORM},
    };
    int n = c->qk_norm ? 11 : 9;
    memcpy(out, t, (size_t)n * sizeof *t);
    return n;
}

/* ---- a checkpoint on disk ---- */

static json_t *qwen3_config_json(const llm_config *c) {
    json_t *layer_types = json_array();
    for (int i = 0; i < c->n_layers; i++) json_array_append_new(layer_types, json_string("full_attention"));
    return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:f, s:{s:f, s:s}, s:b, s:b, "
                     "s:b, s:o, s:s, s:i, s:i}",
                     "architectures", "Qwen3ForCausalLM", "model_type", "qwen3", "vocab_size", c->vocab,
                     "hidden_size", c->hidden, "intermediate_size", c->ffn, "num_hidden_layers", c->n_layers,
                     "num_attention_heads", c->n_heads, "num_key_value_heads", c->n_kv_heads,
                     "head_dim", c->head_dim, "hidden_act", "silu", "rms_norm_eps", (double)c->eps,
                     "rope_theta", c->rope_theta, "rope_parameters", "rope_theta", c->rope_theta, "rope_type",
                     "default", "tie_word_embeddings", 1, "attention_bias", 0, "use_sliding_window", 0,
                     "layer_types", layer_types, "torch_dtype", "bfloat16", "bos_token_id", 151643,
                     "eos_token_id", 151645);
}

/* Mistral3 as FLUX.2-dev stores it: nested text_config, legacy names. */
static json_t *mistral_config_json(const llm_config *c) {
    return json_pack("{s:[s], s:s, s:{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:f, s:n, s:b}, "
                     "s:{s:s, s:i}, s:b}",
                     "architectures", "Mistral3ForConditionalGeneration", "model_type", "mistral3", "text_config",
                     "model_type", "mistral", "vocab_size", c->vocab, "hidden_size", c->hidden, "intermediate_size",
                     c->ffn, "num_hidden_layers", c->n_layers, "num_attention_heads", c->n_heads,
                     "num_key_value_heads", c->n_kv_heads, "head_dim", c->head_dim, "max_position_embeddings", 131072,
                     "hidden_act", "silu", "rms_norm_eps", (double)c->eps, "rope_theta", c->rope_theta,
                     "sliding_window", "tie_word_embeddings", 0, "vision_config", "model_type", "pixtral",
                     "hidden_size", 16, "tie_word_embeddings", 0);
}

/* Qwen3VLForConditionalGeneration as transformers 5 saves it: nested
 * text_config (qwen3_vl_text, M-RoPE sections for head_dim / 2), a small
 * vision_config (its one tensor in the file is never read). */
static json_t *qwen3vl_config_json(const llm_config *c) {
    int half = c->head_dim / 2, h = half * 5 / 16, w = h, t = half - h - w;   /* [24, 20, 20] for head_dim 128 */
    return json_pack("{s:[s], s:s, s:{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:{s:s, s:f, s:[i, i, i], "
                     "s:b}, s:b, s:b, s:i}, s:{s:s, s:i, s:i}, s:b, s:i, s:i, s:i, s:i}",
                     "architectures", "Qwen3VLForConditionalGeneration", "model_type", "qwen3_vl", "text_config",
                     "model_type", "qwen3_vl_text", "vocab_size", c->vocab, "hidden_size", c->hidden,
                     "intermediate_size", c->ffn, "num_hidden_layers", c->n_layers, "num_attention_heads", c->n_heads,
                     "num_key_value_heads", c->n_kv_heads, "head_dim", c->head_dim, "hidden_act", "silu",
                     "rms_norm_eps", (double)c->eps, "rope_parameters", "rope_type", "default", "rope_theta",
                     c->rope_theta, "mrope_section", t, h, w, "mrope_interleaved", 1, "tie_word_embeddings", 1,
                     "attention_bias", 0, "max_position_embeddings", 262144, "vision_config", "model_type",
                     "qwen3_vl_vision", "hidden_size", 16, "depth", 1, "tie_word_embeddings", 1, "image_token_id",
                     151655, "video_token_id", 151656, "vision_start_token_id", 151652, "vision_end_token_id", 151653);
}

/* The random checkpoint is streamed (st_write_stream), so that a full-size
 * encoder (Qwen3-4B: 8 GB) is never held in memory: each tensor's values
 * come from one generator in file order, chunk after chunk, which gives the
 * same bytes as filling whole tensors in that order. sparse: the matrices
 * are holes (zeros), the norm weights still get values. */
typedef struct { int64_t fan_in; init_kind init; } entry_init;
typedef struct { rng64 r; const entry_init *init; int n_layers, sparse; } fill_ctx;

static int fill_entry(void *vctx, int index, void *buf, size_t offset, size_t n) {
    fill_ctx *f = vctx;
    const entry_init *e = &f->init[index];
    if (!buf) return f->sparse && e->init != INIT_NORM;   /* 1: a hole */
    fill_bf16(buf, n / 2, e->fan_in, e->init, f->n_layers, &f->r);
    return 0;
}

static void entry(st_write_tensor *t, entry_init *in, char *name, int64_t rows, int64_t cols, int64_t fan_in,
                  init_kind k) {
    *t = rows == 1 ? (st_write_tensor){name, DT_BF16, 1, {cols}, NULL}
                   : (st_write_tensor){name, DT_BF16, 2, {rows, cols}, NULL};
    *in = (entry_init){fan_in, k};
}

int llm_write_random(const char *te_dir, const llm_config *c, unsigned seed, int sparse) {
    int mistral = c->arch == LLM_MISTRAL, vl = c->arch == LLM_QWEN3VL;
    const char *pre = mistral ? "language_model.model." : vl ? "model.language_model." : "model.";
    layer_tensor lt[11];
    int nl = layer_tensors(c, lt);
    /* Mistral also stores lm_head, the final norm and a vision tower the encoder never reads */
    int n = 1 + c->n_layers * nl + (mistral ? 3 : vl ? 2 : 0), k = 0;
    st_write_tensor *ts = xcalloc((size_t)n, sizeof *ts);
    entry_init *init = xcalloc((size_t)n, sizeof *init);
    entry(&ts[k], &init[k], xasprintf("%sembed_tokens.weight", pre), c->vocab, c->hidden, c->hidden, INIT_EMBED), k++;
    for (int i = 0; i < c->n_layers; i++)
        for (int j = 0; j < nl; j++, k++)
            entry(&ts[k], &init[k], xasprintf("%slayers.%d.%s.weight", pre, i, lt[j].what), lt[j].rows, lt[j].cols,
                  lt[j].cols, lt[j].init);
    if (mistral) {
        entry(&ts[k], &init[k], xasprintf("%snorm.weight", pre), 1, c->hidden, c->hidden, INIT_NORM), k++;
        entry(&ts[k], &init[k], xstrdup("language_model.lm_head.weight"), c->vocab, c->hidden, c->hidden, INIT_LINEAR),
            k++;
        entry(&ts[k], &init[k], xstrdup("vision_tower.ln_pre.weight"), 1, 16, 16, INIT_NORM), k++;
    }
    if (vl) {   /* Qwen3-VL: the final norm and a vision-tower tensor (tied lm_head: not stored) */
        entry(&ts[k], &init[k], xasprintf("%snorm.weight", pre), 1, c->hidden, c->hidden, INIT_NORM), k++;
        entry(&ts[k], &init[k], xstrdup("model.visual.blocks.0.norm1.weight"), 1, 16, 16, INIT_NORM), k++;
    }
    char *path = xasprintf("%s/model.safetensors", te_dir);
    static const char *meta[] = {"format", "pt", NULL};
    fill_ctx fc = {{seed * 0x2545f4914f6cdd1dull + 1}, init, c->n_layers, sparse};
    int rc = st_write_stream(path, ts, n, meta, fill_entry, &fc);
    free(path);
    if (!rc) {
        json_t *cfg = mistral ? mistral_config_json(c) : vl ? qwen3vl_config_json(c) : qwen3_config_json(c);
        char *cpath = xasprintf("%s/config.json", te_dir);
        if (!cfg || json_dump_file(cfg, cpath, JSON_INDENT(2))) rc = tp_error("could not write %s", cpath);
        free(cpath);
        json_decref(cfg);
    }
    for (int i = 0; i < n; i++) free((void *)ts[i].name);
    free(ts), free(init);
    return rc;
}

/* ---- in-memory shards (benchmarks) ---- */

static const tensor *random_tensor(llm *m, int64_t rows, int64_t cols, int64_t fan_in, init_kind k, dtype_t dt,
                                   rng64 *r, tensor **owned, int *n_owned) {
    tensor *t = tensor_new(m->be, dt, rows, cols);
    if (!t) return NULL;
    owned[(*n_owned)++] = t;
    size_t cnt = (size_t)rows * cols;
    uint16_t *h = xmalloc(cnt * 2);
    fill_bf16(h, cnt, fan_in, k, m->cfg.n_layers, r);
    float *f = xmalloc(cnt * sizeof *f);
    for (size_t i = 0; i < cnt; i++) f[i] = bf16_to_f32(h[i]);
    int rc = tensor_upload_f32(t, f);
    free(h), free(f);
    return rc ? NULL : t;
}

int llm_init_random(const llm_config *cfg, int n_run, backend *be, comm *c, dtype_t dt, unsigned seed, llm **out) {
    *out = NULL;
    llm *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg, m->be = be, m->comm = c;
    m->tp = c ? c->size : 1, m->rank = c ? c->rank : 0;
    m->dir = xstrdup("(random weights)");
    m->n_run = n_run < cfg->n_layers ? n_run : cfg->n_layers;
    if (llm_plan_build(cfg, m->tp, &m->plan)) return free(m->dir), free(m), -1;
    llm_shard_layout(cfg, m->tp, m->rank, &m->nq_local, &m->nkv_held, &m->kv_sharded, &m->ffn_local,
                     &m->vocab_sharded);
    m->owned = xcalloc((size_t)(2 + 11 * m->n_run), sizeof *m->owned);
    m->layers = xcalloc((size_t)(m->n_run > 0 ? m->n_run : 1), sizeof *m->layers);
    rng64 r = {seed + 12345u * (unsigned)m->rank};
    int64_t H = cfg->hidden, D = cfg->head_dim, qw = (int64_t)m->nq_local * D, kvw = (int64_t)m->nkv_held * D;
    int64_t F = m->ffn_local, V = m->vocab_sharded ? cfg->vocab / m->tp : cfg->vocab;
    int ok = (m->embed = random_tensor(m, V, H, H, INIT_EMBED, dt, &r, m->owned, &m->n_owned)) != NULL;
    for (int i = 0; ok && i < m->n_run; i++) {
        llm_layer *L = &m->layers[i];
#define RT(field, rows, cols, fan, kind) \
        ok = ok && (L->field = random_tensor(m, rows, cols, fan, kind, dt, &r, m->owned, &m->n_owned)) != NULL
        RT(in_norm, 1, H, H, INIT_NORM); RT(post_norm, 1, H, H, INIT_NORM);
        RT(q, qw, H, H, INIT_LINEAR); RT(k, kvw, H, H, INIT_LINEAR); RT(v, kvw, H, H, INIT_LINEAR);
        RT(o, H, qw, (int64_t)cfg->n_heads * D, INIT_LINEAR_OUT);
        RT(gate, F, H, H, INIT_LINEAR); RT(up, F, H, H, INIT_LINEAR); RT(down, H, F, cfg->ffn, INIT_LINEAR_OUT);
        if (cfg->qk_norm) { RT(q_norm, 1, D, D, INIT_NORM); RT(k_norm, 1, D, D, INIT_NORM); }
#undef RT
    }
    if (!ok) {
        llm_free(m);
        return tp_error_context("random text-encoder weights");
    }
    *out = m;
    return 0;
}
