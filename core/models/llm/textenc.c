/* The pipeline's text encoder: model folder -> tokenizer + sharded LLM ->
 * prompt_embeds (textenc.h). Which LLM and which hidden states come from
 * text_encoder/config.json or a llama.cpp GGUF's metadata (llm_gguf.c),
 * cross-checked with model_index.json. */
#include "textenc.h"
#include "llm_internal.h"
#include "core/formats/checkpoint.h"
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/models/tokenizer/tokenizer.h"
#include "prompt.h"
#include "textenc_qwen3vl.h"

struct textenc {
    llm_config cfg;
    llm *model;
    checkpoint *ck;
    comm *comm;
    int layers[QWEN3VL_N_STACK];   /* hidden-state indices stacked into prompt_embeds */
    int n_stack;                   /* 3 (FLUX.2) or 8 (FLUX.3) */
    tokenizer *tok;
};

static int agree(comm *c, int rc) { return c && c->size > 1 ? dist_agree(c->mpi, rc) : rc; }

/* model_index.json names the encoder class; it must agree with config.json. */
static int check_model_index(const model_dir *md, const llm_config *cfg) {
    const json_t *te = md->index ? json_object_get(md->index, "text_encoder") : NULL;
    const char *cls = json_is_array(te) ? json_string_value(json_array_get(te, 1)) : NULL;
    if (!cls) return 0;
    int is_vl = strstr(cls, "Qwen3VL") != NULL;
    int is_qwen = !is_vl && strstr(cls, "Qwen3") != NULL, is_mistral = strstr(cls, "Mistral") != NULL;
    if (!is_qwen && !is_mistral && !is_vl)
        return tp_error("%s/model_index.json: text encoder class %s is not supported (Qwen3ForCausalLM for "
                        "FLUX.2-klein, Mistral3ForConditionalGeneration for FLUX.2-dev, "
                        "Qwen3VLForConditionalGeneration for FLUX.3)", md->root, cls);
    if ((cfg->arch == LLM_QWEN3) != is_qwen || (cfg->arch == LLM_QWEN3VL) != is_vl)
        return tp_error("%s: model_index.json says the text encoder is %s but text_encoder/config.json is a %s "
                        "model", md->root, cls, llm_arch_name(cfg->arch));
    return 0;
}

/* FLUX.2-klein stacks Qwen3 hidden states 9, 18, 27; FLUX.2-dev Mistral's 10, 20, 30 (docs/spec/flux2-text-vae.md §1). */
/* FLUX.3 stacks Qwen3-VL's 4, 8, ..., 32 (textenc_qwen3vl.c). */
static int choose_layers(textenc *t, const model_dir *md, const char *dir) {
    static const int k_qwen3[3] = {9, 18, 27}, k_mistral[3] = {10, 20, 30};
    if (t->cfg.arch == LLM_QWEN3VL) {
        t->n_stack = QWEN3VL_N_STACK;
        memcpy(t->layers, qwen3vl_stack, sizeof qwen3vl_stack);
        if (!md) return tp_error("%s: a Qwen3-VL (FLUX.3) text encoder needs its pipeline folder (--model)", dir);
        return qwen3vl_check(md, t->cfg.hidden, t->cfg.n_layers);
    }
    t->n_stack = 3;
    memcpy(t->layers, t->cfg.arch == LLM_QWEN3 ? k_qwen3 : k_mistral, 3 * sizeof *t->layers);
    if (t->cfg.n_layers < t->layers[2])
        return tp_error("%s: the %s encoder has %d layers but FLUX.2 uses hidden state %d; this is "
                        "not a FLUX.2 text encoder", dir, llm_arch_name(t->cfg.arch), t->cfg.n_layers, t->layers[2]);
    return 0;
}

/* the .gguf file of a text-encoder folder (malloc'ed), NULL when it has none */
static char *gguf_in(const char *dir) {
    DIR *d = opendir(dir);
    char *found = NULL;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n > 5 && !strcmp(e->d_name + n - 5, ".gguf")) found = xasprintf("%s/%s", dir, e->d_name);
    }
    if (d) closedir(d);
    return found;
}

static int has_gguf(const char *dir) {
    char *p = gguf_in(dir);
    int found = p != NULL;
    free(p);
    return found;
}

/* config.json of a text-encoder folder, or the one beside a file (NULL when there is none) */
static char *config_path(const char *te) {
    if (path_is_dir(te)) return xasprintf("%s/config.json", te);
    const char *slash = strrchr(te, '/');
    return slash ? xasprintf("%.*s/config.json", (int)(slash - te), te) : xstrdup("config.json");
}

char *textenc_tokenizer_dir(const textenc_source *src) {
    static const char *k_files[] = {"tokenizer.json", "tekken.json", "tokenizer_config.json"};
    if (src->tokenizer) {
        if (!path_is_dir(src->tokenizer)) return tp_error("tokenizer folder %s does not exist", src->tokenizer), NULL;
        return xstrdup(src->tokenizer);
    }
    char *p = src->model_dir ? xasprintf("%s/tokenizer", src->model_dir) : NULL;
    if (p && path_is_dir(p)) return p;
    free(p);
    /* a text-encoder folder that holds its tokenizer files (tokenizer.json, tekken.json) */
    for (int i = 0; src->path && path_is_dir(src->path) && i < 3; i++) {
        char *f = xasprintf("%s/%s", src->path, k_files[i]);
        int ok = path_is_file(f);
        free(f);
        if (ok) return xstrdup(src->path);
    }
    /* (a .gguf text encoder's own tokenizer.ggml.* metadata is open_parts' fallback) */
    return tp_error("no tokenizer for the text encoder %s: pass --model PIPELINE (its tokenizer/ folder is used), "
                    "or give --text-encoder a folder that also holds the tokenizer files (tokenizer.json + "
                    "tokenizer_config.json, or tekken.json)", src->path ? src->path : "(none)"), NULL;
}

/* a llama.cpp GGUF text encoder: a .gguf file, or a folder holding one */
static int is_gguf(const char *te) {
    size_t n = strlen(te);
    return path_is_dir(te) ? has_gguf(te) : n > 5 && !strcmp(te + n - 5, ".gguf");
}

/* The encoder's configuration: the config.json of its folder (or beside
 * its file); a GGUF's metadata (a config.json next to it must agree:
 * llm_gguf_adopt); else derived from the shapes for the family
 * (textenc_config.c). */
static int open_parts(textenc *t, const textenc_source *src) {
    model_dir *md = NULL;
    int rc = 0;
    char *te = NULL;
    if (src->model_dir && (rc = model_dir_open(src->model_dir, &md))) return -1;
    if (src->path) te = xstrdup(src->path);
    else if (md && model_dir_has(md, "text_encoder")) te = model_dir_path(md, "text_encoder");
    else rc = tp_error("%s has no text_encoder/ folder: encoding a prompt needs the pipeline's text encoder "
                       "(or --text-encoder PATH, or precomputed --prompt-embeds)", src->model_dir ? src->model_dir : "(no --model)");
    const char *where = te ? te : "";
    char *cfg_path = te ? config_path(te) : NULL;
    int have_json = !rc && path_is_file(cfg_path), gguf = !rc && is_gguf(te);
    llm_config json_cfg;
    if (have_json) {   /* config.json first: a bad config is named before the weights */
        json_error_t je;
        json_t *cfg = json_load_file(cfg_path, 0, &je);
        rc = cfg ? llm_config_parse(cfg, cfg_path, &json_cfg) : tp_error("%s: not valid JSON (%s, line %d)", cfg_path, je.text, je.line);
        json_decref(cfg);
    } else if (!rc && !gguf && src->dev < 0) {
        rc = tp_error("%s has no config.json%s: say which family it belongs to (--family dev|klein|klein-base, "
                      "or --model with model_index.json), so its configuration can be derived from the shapes", te,
                      path_is_dir(te) ? "" : " beside it");
    }
    if (!rc) rc = checkpoint_open(te, &t->ck);
    if (!rc && llm_gguf_is(t->ck)) rc = llm_gguf_adopt(t->ck, have_json ? &json_cfg : NULL, &t->cfg);
    else if (!rc && have_json) t->cfg = json_cfg;
    else if (!rc) rc = textenc_config_derive(t->ck, src->dev, &t->cfg);
    if (!rc) rc = llm_config_resolve_prefix(&t->cfg, t->ck);
    if (!rc && md) rc = check_model_index(md, &t->cfg);
    if (!rc) rc = choose_layers(t, md, where);
    if (!rc) {
        /* a tokenizer folder when there is one; else a GGUF encoder's own tokenizer.ggml.* metadata */
        char *tok_dir = textenc_tokenizer_dir(src);
        if (tok_dir) {
            if (!(t->tok = tokenizer_load(tok_dir))) rc = -1;
        } else if (gguf) {
            char *g = path_is_dir(te) ? gguf_in(te) : xstrdup(te);
            tp_error_clear();
            if (!(t->tok = tokenizer_load_gguf(g))) rc = tp_error_context("no tokenizer/ folder, so the tokenizer comes from the GGUF's metadata");
            free(g);
        } else {
            rc = -1;
        }
        free(tok_dir);
    }
    free(cfg_path);
    free(te);
    if (md) model_dir_close(md);
    return rc;
}

int textenc_load(const char *dir, backend *be, comm *c, dtype_t precision, textenc **out,
                 load_stats *st) {
    textenc_source src = {.model_dir = dir, .dev = -1};
    return textenc_load_from(&src, be, c, precision, out, st);
}

int textenc_load_from(const textenc_source *src, backend *be, comm *c, dtype_t precision, textenc **out,
                      load_stats *st) {
    *out = NULL;
    textenc *t = xcalloc(1, sizeof *t);
    t->comm = c;
    int rc = agree(c, open_parts(t, src));
    if (!rc) rc = llm_load(t->ck, &t->cfg, t->layers[t->n_stack - 1], be, c, precision, &t->model, st);  /* collective */
    if (rc) {
        tp_error_context("text encoder");
        textenc_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

int textenc_encode_ids(textenc *t, const int32_t *ids, const int32_t *mask, int n, float *embeds) {
    int32_t *pos = NULL;
    if (t->cfg.arch == LLM_QWEN3VL && n > 0) {   /* FLUX.3 passes position 1 for its pad rows */
        pos = xmalloc((size_t)n * sizeof *pos);
        qwen3vl_positions(mask, n, pos);
    }
    int rc = llm_forward_pos(t->model, ids, mask, pos, n, t->layers, t->n_stack, embeds);
    free(pos);
    if (rc) return rc;
    /* non-finite embeddings would give NaN latents and a black image */
    int64_t E = (int64_t)textenc_embed_dim(t), bad = first_nonfinite_f32(embeds, (size_t)n * (size_t)E);
    if (bad >= 0)
        rc = tp_error("text encoder: the prompt embeddings are not finite (%s at token %lld, feature %lld); a "
                      "text-encoder weight holds NaN/Inf: find it with 'tpgen inspect --model DIR --component "
                      "text_encoder --scan-weights'", embeds[bad] != embeds[bad] ? "NaN" : "Inf",
                      (long long)(bad / E), (long long)(bad % E));
    return agree(t->comm, rc);
}

static int check_vocab(const textenc *t) {
    if (tokenizer_vocab_size(t->tok) > t->cfg.vocab)
        return tp_error("%s has %d tokens but the text encoder's vocabulary has %d: tokenizer and text encoder "
                        "do not belong together", tokenizer_source(t->tok), tokenizer_vocab_size(t->tok), t->cfg.vocab);
    return 0;
}

static int tokenize(textenc *t, const char *prompt, int max_len, int32_t *ids, int32_t *mask) {
    if (check_vocab(t)) return -1;
    /* the template follows the encoder: klein's chat template for Qwen3, the dev layout for Mistral,
     * Qwen3-VL-Instruct's for FLUX.3 */
    if (t->cfg.arch == LLM_QWEN3VL) return qwen3vl_tokenize(t->tok, prompt, max_len, ids, mask, NULL);
    prompt_format f = t->cfg.arch == LLM_QWEN3 ? PROMPT_KLEIN : PROMPT_DEV;
    return prompt_encode_ids(t->tok, f, prompt, max_len, ids, mask, NULL);
}

int textenc_max_len(const textenc *t) {
    return t->cfg.arch == LLM_QWEN3VL ? QWEN3VL_MAX_LEN : TEXTENC_DEFAULT_MAX_LEN;
}

int textenc_pad_multiple(const textenc *t) { return t->cfg.arch == LLM_QWEN3VL ? QWEN3VL_PAD_MULTIPLE : 0; }

int textenc_window(textenc *t, const char *prompt, int max_len, int *L) {
    if (max_len <= 0) max_len = textenc_max_len(t);
    int rc = 0, n = max_len;
    if (t->cfg.arch == LLM_QWEN3VL) {
        rc = check_vocab(t);
        if (!rc) rc = qwen3vl_real_length(t->tok, prompt ? prompt : "", max_len, &n);
        if (!rc) n = qwen3vl_window(n, max_len);
    }
    rc = agree(t->comm, rc);
    *L = rc ? 0 : n;
    return rc;
}

int textenc_encode(textenc *t, const char *prompt, int max_len, float *embeds, int32_t *ids, int32_t *mask) {
    if (max_len <= 0 && t->cfg.arch == LLM_QWEN3VL)   /* the caller sized embeds: it must know L */
        return agree(t->comm, tp_error("text encoder: FLUX.3's window depends on the prompt: pass the L that "
                                       "textenc_window gives (max_len %d)", max_len));
    if (max_len <= 0) max_len = TEXTENC_DEFAULT_MAX_LEN;
    int32_t *my_ids = ids ? ids : xmalloc((size_t)max_len * sizeof *my_ids);
    int32_t *my_mask = mask ? mask : xmalloc((size_t)max_len * sizeof *my_mask);
    int rc = agree(t->comm, tokenize(t, prompt ? prompt : "", max_len, my_ids, my_mask));
    if (!rc) rc = textenc_encode_ids(t, my_ids, my_mask, max_len, embeds);
    if (!ids) free(my_ids);
    if (!mask) free(my_mask);
    return rc;
}

int textenc_hidden(const textenc *t) { return t->cfg.hidden; }
int textenc_embed_dim(const textenc *t) { return t->n_stack * t->cfg.hidden; }
const char *textenc_kind(const textenc *t) { return llm_arch_name(t->cfg.arch); }
uint64_t textenc_bytes(const textenc *t) { return t->model ? llm_bytes(t->model) : 0; }

void textenc_free(textenc *t) {
    if (!t) return;
    llm_free(t->model);
    if (t->ck) checkpoint_close(t->ck);
    if (t->tok) tokenizer_free(t->tok);
    free(t);
}
