/* A text encoder from one file without config.json (ComfyUI's
 * text_encoders/ files): the config derived from the shapes for the
 * family equals the golden klein-tiny config.json, the prefixed and bare
 * files give the pipeline folder's embeddings bit for bit, and a file that
 * does not fit the family is refused naming it. checkpoint_open on a file
 * path sees the folder's tensors. */
#include "test.h"
#include "core/formats/checkpoint.h"
#include "core/formats/safetensors.h"
#include "core/models/llm_internal.h"
#include "core/models/textenc.h"
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
