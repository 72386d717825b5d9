/* Decoder LLM: configuration, weight selection and loading (the forward
 * pass is in llm_forward.c). */
#include "llm_internal.h"
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *llm_arch_name(llm_arch a) { return a == LLM_QWEN3 ? "qwen3" : a == LLM_QWEN3VL ? "qwen3vl" : "mistral"; }

static int get_int(const json_t *o, const char *key, int def, const char *where, int *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return tp_error("%s: required field \"%s\" is missing", where, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 30))
        return tp_error("%s: \"%s\" must be a positive integer", where, key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_num(const json_t *o, const char *key, double def, double *out) {
    const json_t *v = json_object_get(o, key);
    *out = v && json_is_number(v) ? json_number_value(v) : def;
    return 0;
}

/* Qwen3-VL's M-RoPE sections (rope_parameters or, before transformers 5,
 * rope_scaling): three positive counts summing to head_dim / 2. For
 * text-only input they do not change the angles (llm.h), but a config
 * whose sections do not fit its heads is not a Qwen3-VL we understand. */
static int parse_mrope(const json_t *rp, const char *where, llm_config *c) {
    const json_t *sec = json_object_get(rp, "mrope_section");
    if (!sec) return 0;
    if (c->arch != LLM_QWEN3VL) return tp_error("%s: mrope_section is only supported for qwen3_vl", where);
    int sum = 0;
    if (!json_is_array(sec) || json_array_size(sec) != 3)
        return tp_error("%s: mrope_section must be a list of 3 integers (t, h, w)", where);
    for (int i = 0; i < 3; i++) {
        const json_t *v = json_array_get(sec, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 20)
            return tp_error("%s: mrope_section[%d] must be a non-negative integer", where, i);
        c->mrope_section[i] = (int)json_integer_value(v);
        sum += c->mrope_section[i];
    }
    if (sum != c->head_dim / 2)
        return tp_error("%s: mrope_section [%d, %d, %d] sums to %d but head_dim %d has %d rotary frequencies", where,
                        c->mrope_section[0], c->mrope_section[1], c->mrope_section[2], sum, c->head_dim,
                        c->head_dim / 2);
    return 0;
}

/* rope_theta sits at the top level (older transformers) or in
 * rope_parameters (transformers 5); rope scaling is not supported. */
static int parse_rope(const json_t *tc, const char *where, llm_config *c, double def_theta) {
    const json_t *rp = json_object_get(tc, "rope_parameters");
    double theta = 0;
    if (rp && json_is_object(rp)) {
        get_num(rp, "rope_theta", 0, &theta);
        const char *type = json_string_value(json_object_get(rp, "rope_type"));
        if (type && strcmp(type, "default"))
            return tp_error("%s: rope_type \"%s\" is not supported (only \"default\")", where, type);
        if (parse_mrope(rp, where, c)) return -1;
    }
    if (theta <= 0) get_num(tc, "rope_theta", def_theta, &theta);
    const json_t *rs = json_object_get(tc, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        const char *type = json_string_value(json_object_get(rs, "rope_type"));
        if (!type) type = json_string_value(json_object_get(rs, "type"));
        if (!type || strcmp(type, "default"))
            return tp_error("%s: rope_scaling \"%s\" is not supported", where, type ? type : "?");
        if (parse_mrope(rs, where, c)) return -1;
    }
    if (!(theta > 0)) return tp_error("%s: rope_theta must be positive", where);
    c->rope_theta = theta;
    return 0;
}

int llm_config_parse(const json_t *config, const char *where, llm_config *out) {
    memset(out, 0, sizeof *out);
    if (!json_is_object(config)) return tp_error("%s: not a JSON object", where);
    const char *mt = json_string_value(json_object_get(config, "model_type"));
    const json_t *tc = config;
    double def_theta;
    if (mt && !strcmp(mt, "qwen3")) {
        out->arch = LLM_QWEN3;
        out->qk_norm = 1;
        def_theta = 1e6;
    } else if (mt && (!strcmp(mt, "mistral3") || !strcmp(mt, "mistral"))) {
        out->arch = LLM_MISTRAL;
        def_theta = 1e9;
        if (!strcmp(mt, "mistral3")) {
            tc = json_object_get(config, "text_config");
            if (!json_is_object(tc))
                return tp_error("%s: model_type mistral3 needs a \"text_config\" object", where);
        }
    } else if (mt && !strcmp(mt, "qwen3_vl")) {
        out->arch = LLM_QWEN3VL;
        out->qk_norm = 1;
        def_theta = 5e6;
        tc = json_object_get(config, "text_config");
        if (!json_is_object(tc))
            return tp_error("%s: model_type qwen3_vl needs a \"text_config\" object (the language model's "
                            "configuration); is this a complete Qwen3VLForConditionalGeneration config.json?", where);
        const char *tmt = json_string_value(json_object_get(tc, "model_type"));
        if (tmt && strcmp(tmt, "qwen3_vl_text"))
            return tp_error("%s: text_config.model_type \"%s\" is not supported (expected \"qwen3_vl_text\")",
                            where, tmt);
    } else {
        return tp_error("%s: text encoder model_type \"%s\" is not supported (expected \"qwen3\" for "
                        "FLUX.2-klein, \"mistral3\"/\"mistral\" for FLUX.2-dev or \"qwen3_vl\" for FLUX.3)", where,
                        mt ? mt : "(missing)");
    }
    if (get_int(tc, "hidden_size", -1, where, &out->hidden) ||
        get_int(tc, "num_hidden_layers", -1, where, &out->n_layers) ||
        get_int(tc, "num_attention_heads", -1, where, &out->n_heads) ||
        get_int(tc, "num_key_value_heads", out->n_heads, where, &out->n_kv_heads) ||
        get_int(tc, "intermediate_size", -1, where, &out->ffn) ||
        get_int(tc, "vocab_size", -1, where, &out->vocab))
        return -1;
    if (get_int(tc, "head_dim", out->hidden / out->n_heads, where, &out->head_dim)) return -1;
    double eps;
    get_num(tc, "rms_norm_eps", 1e-6, &eps);
    out->eps = (float)eps;
    if (parse_rope(tc, where, out, def_theta)) return -1;
    if (out->n_heads % out->n_kv_heads)
        return tp_error("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", where,
                        out->n_heads, out->n_kv_heads);
    if (out->head_dim % 2) return tp_error("%s: head_dim %d must be even for RoPE", where, out->head_dim);
    const char *act = json_string_value(json_object_get(tc, "hidden_act"));
    if (act && strcmp(act, "silu"))
        return tp_error("%s: hidden_act \"%s\" is not supported (only silu)", where, act);
    /* a sliding window only matters beyond its length; the forward refuses longer sequences */
    const json_t *sw = json_object_get(tc, "sliding_window");
    const json_t *use_sw = json_object_get(tc, "use_sliding_window");
    if (json_is_integer(sw) && json_integer_value(sw) > (1 << 30))
        return tp_error("%s: sliding_window %lld is out of range (at most 2^30)", where, (long long)json_integer_value(sw));
    if (json_is_integer(sw) && json_integer_value(sw) > 0 && (out->arch == LLM_MISTRAL || json_is_true(use_sw)))
        out->sliding_window = (int)json_integer_value(sw);
    const json_t *bias = json_object_get(tc, "attention_bias");
    if (bias && json_is_true(bias)) return tp_error("%s: attention_bias true is not supported", where);
    return 0;
}

int llm_config_resolve_prefix(llm_config *cfg, const checkpoint *ck) {
    /* HF names, saved from the causal LM ("model."), from the bare model (""), or from a pipeline state dict
     * ("text_encoder." in front) */
    static const char *k_qwen3[] = {"model.", "text_encoder.model.", "", NULL};
    static const char *k_mistral[] = {"model.language_model.", "language_model.model.", "model.",
                                      "text_encoder.model.language_model.", "text_encoder.language_model.model.",
                                      "text_encoder.model.", "", NULL};
    static const char *k_qwen3vl[] = {"model.language_model.", "language_model.model.", NULL};
    const char **cands = cfg->arch == LLM_QWEN3 ? k_qwen3 : cfg->arch == LLM_QWEN3VL ? k_qwen3vl : k_mistral;
    for (int i = 0; cands[i]; i++) {
        char name[128];
        snprintf(name, sizeof name, "%sembed_tokens.weight", cands[i]);
        if (checkpoint_find(ck, name, NULL)) {
            snprintf(cfg->prefix, sizeof cfg->prefix, "%s", cands[i]);
            return 0;
        }
    }
    return tp_error("%s: no %s embedding table found (looked for %sembed_tokens.weight%s, with or without a "
                    "text_encoder. prefix, and embed_tokens.weight); is this a %s text encoder checkpoint?", ck->dir,
                    llm_arch_name(cfg->arch), cands[0],
                    cfg->arch == LLM_MISTRAL   ? ", language_model.model.embed_tokens.weight, model.embed_tokens.weight"
                    : cfg->arch == LLM_QWEN3VL ? ", language_model.model.embed_tokens.weight"
                                               : "",
                    llm_arch_name(cfg->arch));
}

int llm_want_tensor(const char *name, void *ctx) {
    const llm_want *w = ctx;
    size_t np = strlen(w->cfg->prefix);
    if (strncmp(name, w->cfg->prefix, np)) return 0;   /* vision tower, projector, lm_head */
    const char *rest = name + np;
    if (!strcmp(rest, "embed_tokens.weight")) return 1;
    if (!strcmp(rest, "norm.weight")) return w->with_norm;
    if (strncmp(rest, "layers.", 7)) return 0;
    char *end;
    long layer = strtol(rest + 7, &end, 10);
    return end != rest + 7 && *end == '.' && layer >= 0 && layer < w->n_run;
}

void llm_rope_tables(int n, int head_dim, double theta, float *cos_out, float *sin_out) {
    llm_rope_tables_pos(n, NULL, head_dim, theta, cos_out, sin_out);
}

void llm_rope_tables_pos(int n, const int32_t *pos, int head_dim, double theta, float *cos_out, float *sin_out) {
    int half = head_dim / 2;
    float *inv = xmalloc((size_t)half * sizeof *inv);
    /* HF: inv_freq = 1 / theta ** (arange(0, D, 2).float() / D), all fp32 */
    for (int j = 0; j < half; j++) {
        float e = (float)(2 * j) / (float)head_dim;
        float p = (float)pow(theta, (double)e);
        inv[j] = 1.0f / p;
    }
    for (int t = 0; t < n; t++)
        for (int j = 0; j < half; j++) {
            float ang = (float)(pos ? pos[t] : t) * inv[j];   /* fp32 product, as the reference's matmul */
            float c = (float)cos((double)ang), s = (float)sin((double)ang);
            cos_out[(size_t)t * head_dim + j] = cos_out[(size_t)t * head_dim + j + half] = c;
            sin_out[(size_t)t * head_dim + j] = sin_out[(size_t)t * head_dim + j + half] = s;
        }
    free(inv);
}

/* ---- loading ---- */

static const tensor *req_shape(llm *m, int64_t rows, int64_t cols, const char *name) {
    const tensor *t = weights_req(m->w, "%s", name);
    if (!t) return NULL;
    if (t->rows != rows || t->cols != cols) {
        tp_error("%s: tensor %s has local shape [%lld, %lld] on rank %d, expected [%lld, %lld] from "
                 "the configuration (config.json or the GGUF metadata); configuration and checkpoint disagree", m->dir, name, (long long)t->rows,
                 (long long)t->cols, m->rank, (long long)rows, (long long)cols);
        return NULL;
    }
    return t;
}

static const tensor *req_layer(llm *m, int64_t rows, int64_t cols, int layer, const char *what) {
    char name[192];
    snprintf(name, sizeof name, "%slayers.%d.%s.weight", m->cfg.prefix, layer, what);
    return req_shape(m, rows, cols, name);
}

static int bind_layer(llm *m, int i) {
    const llm_config *c = &m->cfg;
    llm_layer *L = &m->layers[i];
    int64_t H = c->hidden, D = c->head_dim, kv_rows = (int64_t)m->nkv_held * D, qw = (int64_t)m->nq_local * D;
    if (!(L->in_norm = req_layer(m, 1, H, i, "input_layernorm")) ||
        !(L->post_norm = req_layer(m, 1, H, i, "post_attention_layernorm")) ||
        !(L->q = req_layer(m, qw, H, i, "self_attn.q_proj")) ||
        !(L->k = req_layer(m, kv_rows, H, i, "self_attn.k_proj")) ||
        !(L->v = req_layer(m, kv_rows, H, i, "self_attn.v_proj")) ||
        !(L->o = req_layer(m, H, qw, i, "self_attn.o_proj")) ||
        !(L->gate = req_layer(m, m->ffn_local, H, i, "mlp.gate_proj")) ||
        !(L->up = req_layer(m, m->ffn_local, H, i, "mlp.up_proj")) ||
        !(L->down = req_layer(m, H, m->ffn_local, i, "mlp.down_proj")))
        return -1;
    if (c->qk_norm && (!(L->q_norm = req_layer(m, 1, D, i, "self_attn.q_norm")) ||
                       !(L->k_norm = req_layer(m, 1, D, i, "self_attn.k_norm"))))
        return -1;
    return 0;
}

static int bind_all(llm *m) {
    const llm_config *c = &m->cfg;
    char name[192];
    snprintf(name, sizeof name, "%sembed_tokens.weight", c->prefix);
    if (!(m->embed = req_shape(m, m->vocab_sharded ? c->vocab / m->tp : c->vocab, c->hidden, name))) return -1;
    snprintf(name, sizeof name, "%snorm.weight", c->prefix);
    if (m->with_norm && !(m->norm = req_shape(m, 1, c->hidden, name))) return -1;
    for (int i = 0; i < m->n_run; i++)
        if (bind_layer(m, i)) return -1;
    return 0;
}

int llm_load(const checkpoint *ck, const llm_config *cfg, int max_index, backend *be, comm *c,
             dtype_t precision, llm **out, load_stats *st) {
    *out = NULL;
    if (max_index < 0 || max_index > cfg->n_layers)
        return tp_error("%s: hidden state %d requested but the model has %d layers (indices 0..%d)", ck->dir,
                        max_index, cfg->n_layers, cfg->n_layers);
    if (precision != DT_F32 && precision != DT_BF16)
        return tp_error("text encoder precision must be f32 or bf16, not %s", dtype_name(precision));
    llm *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->be = be;
    m->comm = c;
    m->tp = c ? c->size : 1;
    m->rank = c ? c->rank : 0;
    m->dir = xstrdup(ck->dir);
    m->n_run = max_index < cfg->n_layers ? max_index : cfg->n_layers;
    m->with_norm = max_index == cfg->n_layers;
    int rc = llm_plan_build(cfg, m->tp, &m->plan);
    if (!rc) {
        llm_shard_layout(cfg, m->tp, m->rank, &m->nq_local, &m->nkv_held, &m->kv_sharded, &m->ffn_local,
                         &m->vocab_sharded);
        llm_want want = {&m->cfg, m->n_run, m->with_norm};
        load_opts o = {.tp = m->tp, .rank = m->rank, .be = be, .dtype = precision,
                       .want = llm_want_tensor, .want_ctx = &want};
        rc = weights_load(ck, &m->plan.p, &o, &m->w, st);
    }
    if (!rc) {
        m->layers = xcalloc((size_t)(m->n_run > 0 ? m->n_run : 1), sizeof *m->layers);
        rc = bind_all(m);
    }
    if (c && m->tp > 1) rc = dist_agree(c->mpi, rc);
    if (rc) {
        llm_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void llm_free(llm *m) {
    if (!m) return;
    if (m->w) weights_free(m->w);
    for (int i = 0; i < m->n_owned; i++) tensor_free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->dir);
    free(m);
}

const llm_config *llm_cfg(const llm *m) { return &m->cfg; }

uint64_t llm_bytes(const llm *m) {
    uint64_t n = 0;
    const tensor *ts[2] = {m->embed, m->norm};
    for (int i = 0; i < 2; i++) if (ts[i]) n += tensor_nbytes(ts[i]);
    for (int i = 0; i < m->n_run; i++) {
        const llm_layer *L = &m->layers[i];
        const tensor *lt[] = {L->in_norm, L->post_norm, L->q, L->k, L->v, L->o, L->q_norm, L->k_norm,
                              L->gate, L->up, L->down};
        for (size_t k = 0; k < sizeof lt / sizeof lt[0]; k++) if (lt[k]) n += tensor_nbytes(lt[k]);
    }
    return n;
}
