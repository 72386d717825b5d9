/* A text encoder from one file without config.json (ComfyUI's
 * text_encoders/ files): the config derived from the shapes for the
 * family equals the golden klein-tiny config.json, the prefixed and bare
 * files give the pipeline folder's embeddings bit for bit, and a file that
 * does not fit the family is refused naming it. checkpoint_open on a file
 * path sees the folder's tensors. */
#include "test.h"
#include "core/formats/checkpoint.h"
#include "core/formats/safetensors.h"
#include "core/models/llm/llm_internal.h"
#include "core/models/llm/textenc.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static char *klein(const char *rel) { return xasprintf("%s/klein-tiny/model/%s", test_golden_dir(), rel); }

/* Copy the golden text encoder into one file with its "model." prefix replaced by `prefix`. */
static char *write_prefixed(const char *prefix, const char *name) {
    char *src = klein("text_encoder/model.safetensors"), *out = xasprintf("%s/%s", test_tmp_dir(), name);
    st_file *f = NULL;
    if (st_open(src, &f)) { free(src); free(out); return NULL; }
    st_write_tensor *t = xcalloc((size_t)f->n, sizeof *t);
    int rc = 0;
    for (int i = 0; i < f->n && !rc; i++) {
        const st_tensor_info *in = &f->tensors[i];
        const char *rest = strncmp(in->name, "model.", 6) ? in->name : in->name + 6;
        void *data = xmalloc((size_t)(in->end - in->begin));
        rc = st_read_raw(f, in, data);
        t[i] = (st_write_tensor){.name = xasprintf("%s%s", strncmp(in->name, "model.", 6) ? "" : prefix, rest),
                                 .dtype = in->dtype, .ndim = in->ndim, .data = data};
        memcpy(t[i].shape, in->shape, sizeof t[i].shape);
    }
    if (!rc) rc = st_write(out, t, f->n, NULL);
    for (int i = 0; i < f->n; i++) free((void *)t[i].name), free((void *)t[i].data);
    free(t);
    st_close(f);
    free(src);
    if (rc) { free(out); return NULL; }
    return out;
}

TEST(components_textenc_config_derived_from_shapes) {
    char *file = write_prefixed("text_encoder.model.", "te-prefixed.safetensors");
    REQUIRE(file, "writing the prefixed file: %s", tp_error_msg());
    checkpoint *ck = NULL;
    REQUIRE(checkpoint_open(file, &ck) == 0, "%s", tp_error_msg());
    llm_config got, want;
    char *cp = klein("text_encoder/config.json");
    json_t *j = json_load_file(cp, 0, NULL);
    REQUIRE(j && llm_config_parse(j, cp, &want) == 0, "golden config: %s", tp_error_msg());
    CHECK(textenc_config_derive(ck, 0, &got) == 0, "derive: %s", tp_error_msg());
    CHECK(got.arch == want.arch && got.hidden == want.hidden && got.n_layers == want.n_layers &&
          got.n_heads == want.n_heads && got.n_kv_heads == want.n_kv_heads && got.head_dim == want.head_dim &&
          got.ffn == want.ffn && got.vocab == want.vocab && got.eps == want.eps && got.rope_theta == want.rope_theta &&
          got.qk_norm == want.qk_norm && got.sliding_window == want.sliding_window,
          "derived H %d L %d heads %d/%d hd %d ffn %d vocab %d eps %g theta %g, config.json H %d L %d heads %d/%d hd %d "
          "ffn %d vocab %d eps %g theta %g", got.hidden, got.n_layers, got.n_heads, got.n_kv_heads, got.head_dim, got.ffn,
          got.vocab, got.eps, got.rope_theta, want.hidden, want.n_layers, want.n_heads, want.n_kv_heads, want.head_dim,
          want.ffn, want.vocab, want.eps, want.rope_theta);
    CHECK(!strcmp(got.prefix, "text_encoder.model."), "prefix '%s'", got.prefix);
    /* FLUX.2-dev needs Mistral: a Qwen3 file is refused, naming the file */
    CHECK(textenc_config_derive(ck, 1, &got) == -1 && strstr(tp_error_msg(), "te-prefixed.safetensors") &&
          strstr(tp_error_msg(), "q_norm"), "dev accepted a Qwen3 file: %s", tp_error_msg());
    /* the file alone: the folder's tensors, the file's own path as the checkpoint's name */
    checkpoint *dir = NULL;
    char *te_dir = klein("text_encoder");
    REQUIRE(checkpoint_open(te_dir, &dir) == 0, "%s", tp_error_msg());
    CHECK(ck->is_file && !dir->is_file && ck->n == dir->n && !strcmp(ck->dir, file), "file %d tensors, folder %d", ck->n, dir->n);
    checkpoint *bad = NULL;
    CHECK(checkpoint_open(cp, &bad) == -1 && strstr(tp_error_msg(), ".safetensors"), "config.json opened as a checkpoint");
    checkpoint_close(dir);
    checkpoint_close(ck);
    json_decref(j);
    free(te_dir), free(cp), free(file);
}

/* The same embeddings from the pipeline folder, a "text_encoder.model." file and a bare file (no prefix). */
TEST(components_textenc_prefixed_file_same_embeddings) {
    const char *prefixes[2] = {"text_encoder.model.", ""}, *names[2] = {"te-p.safetensors", "te-bare.safetensors"};
    char *model = klein(""), *tok = klein("tokenizer");
    backend *be = backend_cpu_create(1);
    const int L = 24;
    textenc *ref = NULL;
    REQUIRE(textenc_load(model, be, NULL, DT_F32, &ref, NULL) == 0, "%s", tp_error_msg());
    int E = textenc_embed_dim(ref);
    float *a = xmalloc(sizeof(float) * (size_t)L * E), *b = xmalloc(sizeof(float) * (size_t)L * E);
    CHECK(textenc_encode(ref, "a red fox in the snow", L, a, NULL, NULL) == 0, "%s", tp_error_msg());
    for (int k = 0; k < 2; k++) {
        char *file = write_prefixed(prefixes[k], names[k]);
        REQUIRE(file, "%s", tp_error_msg());
        textenc_source src = {.path = file, .tokenizer = tok, .dev = 0};
        textenc *t = NULL;
        if (textenc_load_from(&src, be, NULL, DT_F32, &t, NULL)) {
            test_fail(__FILE__, __LINE__, "%s: %s", names[k], tp_error_msg());
        } else {
            memset(b, 0xff, sizeof(float) * (size_t)L * E);
            CHECK(textenc_encode(t, "a red fox in the snow", L, b, NULL, NULL) == 0, "%s", tp_error_msg());
            CHECK(!memcmp(a, b, sizeof(float) * (size_t)L * E), "%s: embeddings differ from the pipeline folder's (%g)",
                  names[k], max_abs_diff(b, a, (size_t)L * E));
        }
        textenc_free(t);
        /* no tokenizer anywhere: the error says what to pass */
        textenc_source none = {.path = file, .dev = 0};
        t = NULL;
        CHECK(textenc_load_from(&none, be, NULL, DT_F32, &t, NULL) == -1 && !t && strstr(tp_error_msg(), "--model"),
              "no tokenizer: %s", tp_error_msg());
        /* unknown family and no config.json */
        textenc_source nofam = {.path = file, .tokenizer = tok, .dev = -1};
        CHECK(textenc_load_from(&nofam, be, NULL, DT_F32, &t, NULL) == -1 && strstr(tp_error_msg(), "--family"),
              "no family: %s", tp_error_msg());
        free(file);
    }
    textenc_free(ref);
    backend_destroy(be);
    free(a), free(b), free(model), free(tok);
}

/* FLUX.2-dev's Mistral without config.json: head_dim 128 (Mistral Small 3.x), heads from the projections, the
 * family's rope_theta/eps; Mistral3's language_model.model. prefix; a q_proj of the wrong width refused. */
static char *write_mistral(const char *name, int64_t q_rows, int n_layers) {
    const int64_t H = 32, V = 64, F = 48;
    struct { const char *n; int64_t r, c; } spec[] = {
        {"language_model.model.embed_tokens.weight", V, H},
        {"language_model.model.layers.0.self_attn.q_proj.weight", q_rows, H},
        {"language_model.model.layers.0.self_attn.k_proj.weight", 128, H},
        {"language_model.model.layers.0.mlp.gate_proj.weight", F, H},
        {"language_model.model.layers.%d.input_layernorm.weight", H, 1},
        {"vision_tower.patch_conv.weight", 4, 4},
    };
    st_write_tensor t[6];
    char last[96];
    for (int i = 0; i < 6; i++) {
        const char *n = spec[i].n;
        if (strchr(n, '%')) snprintf(last, sizeof last, n, n_layers - 1), n = last;
        t[i] = (st_write_tensor){.name = n, .dtype = DT_BF16, .ndim = spec[i].c > 1 ? 2 : 1,
                                 .data = xcalloc((size_t)(spec[i].r * spec[i].c), 2)};
        t[i].shape[0] = spec[i].r;
        t[i].shape[1] = spec[i].c;
    }
    char *out = xasprintf("%s/%s", test_tmp_dir(), name);
    int rc = st_write(out, t, 6, NULL);
    for (int i = 0; i < 6; i++) free((void *)t[i].data);
    if (rc) { free(out); return NULL; }
    return out;
}

TEST(components_mistral_config_derived_for_dev) {
    char *file = write_mistral("mistral.safetensors", 256, 31);
    REQUIRE(file, "%s", tp_error_msg());
    checkpoint *ck = NULL;
    REQUIRE(checkpoint_open(file, &ck) == 0, "%s", tp_error_msg());
    llm_config c;
    REQUIRE(textenc_config_derive(ck, 1, &c) == 0, "%s", tp_error_msg());
    CHECK(c.arch == LLM_MISTRAL && c.hidden == 32 && c.vocab == 64 && c.n_layers == 31 && c.head_dim == 128 &&
          c.n_heads == 2 && c.n_kv_heads == 1 && c.ffn == 48 && c.rope_theta == 1e9 && c.eps == 1e-5f &&
          !c.qk_norm && !c.sliding_window && !strcmp(c.prefix, "language_model.model."),
          "H %d V %d L %d hd %d heads %d/%d ffn %d theta %g eps %g prefix %s", c.hidden, c.vocab, c.n_layers,
          c.head_dim, c.n_heads, c.n_kv_heads, c.ffn, c.rope_theta, c.eps, c.prefix);
    /* klein needs Qwen3: a Mistral file (no q_norm) is refused, naming it */
    CHECK(textenc_config_derive(ck, 0, &c) == -1 && strstr(tp_error_msg(), "mistral.safetensors") &&
          strstr(tp_error_msg(), "--family dev"), "klein accepted a Mistral file: %s", tp_error_msg());
    checkpoint_close(ck);
    free(file);
    /* q_proj rows that are no multiple of 128 do not fit Mistral Small's heads */
    file = write_mistral("mistral-bad.safetensors", 96, 31);
    REQUIRE(file && checkpoint_open(file, &ck) == 0, "%s", tp_error_msg());
    CHECK(textenc_config_derive(ck, 1, &c) == -1 && strstr(tp_error_msg(), "mistral-bad.safetensors") &&
          strstr(tp_error_msg(), "head size 128"), "bad widths: %s", tp_error_msg());
    checkpoint_close(ck);
    free(file);
}
