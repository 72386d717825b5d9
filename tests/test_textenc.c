/* The pipeline-level text encoder: klein-tiny end-to-end golden (ids and
 * prompt_embeds from diffusers' Flux2KleinPipeline), the tiny writer, and
 * bad model folders. */
#include "test.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/models/llm/textenc.h"
#include "core/models/llm/llm_internal.h"
#include "core/formats/safetensors.h"
#include "kernels/ops.h"
#include <jansson.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KLEIN_SEQ 32

static int read_case(st_file *f, int cs, int n, int32_t *ids, int32_t *mask, float **embeds, size_t want) {
    char name[64];
    int64_t *v;
    const st_tensor_info *info;
    snprintf(name, sizeof name, "case%d.input_ids", cs);
    if (st_read_i64(f, name, &v, &info) || st_numel(info) != n) return -1;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)v[i];
    free(v);
    snprintf(name, sizeof name, "case%d.attention_mask", cs);
    if (st_read_i64(f, name, &v, &info) || st_numel(info) != n) return -1;
    for (int i = 0; i < n; i++) mask[i] = (int32_t)v[i];
    free(v);
    snprintf(name, sizeof name, "case%d.prompt_embeds", cs);
    if (st_read_f32(f, name, embeds, &info)) return -1;
    return (size_t)st_numel(info) == want ? 0 : tp_error("%s: unexpected size", name);
}

/* Split the world into TP groups of size tp (tp must divide it). */
static comm *group_comm(int tp, backend *be, MPI_Comm *group) {
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_split(MPI_COMM_WORLD, r / tp, r, group);
    return comm_create_mpi(*group, be);
}

TEST_MPI(textenc_klein_tiny_golden) {
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    char *model = xasprintf("%s/klein-tiny/model", test_golden_dir());
    char *cpath = xasprintf("%s/klein-tiny/e2e.json", test_golden_dir());
    char *epath = xasprintf("%s/klein-tiny/e2e.safetensors", test_golden_dir());
    json_error_t je;
    json_t *meta = json_load_file(cpath, 0, &je);
    st_file *f = NULL;
    REQUIRE(meta && !st_open(epath, &f), "golden klein-tiny: %s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    for (int tp = 1; tp <= 2 && !test_failed(); tp++) {
        if (world % tp) continue;
        MPI_Comm group;
        comm *c = group_comm(tp, be, &group);
        textenc *t = NULL;
        int rc = textenc_load(model, be, c, DT_F32, &t, NULL);
        CHECK(!rc, "tp %d: %s", tp, tp_error_msg());
        CHECK(rc || (!strcmp(textenc_kind(t), "qwen3") && textenc_embed_dim(t) == 96), "kind/width");
        json_t *cases = json_object_get(meta, "cases");
        for (size_t cs = 0; !rc && cs < json_array_size(cases) && !test_failed(); cs++) {
            const char *prompt = json_string_value(json_object_get(json_array_get(cases, cs), "prompt"));
            int32_t gids[KLEIN_SEQ], gmask[KLEIN_SEQ], ids[KLEIN_SEQ], mask[KLEIN_SEQ];
            float *ref = NULL, *emb = malloc(KLEIN_SEQ * 96 * sizeof *emb);
            REQUIRE(prompt && !read_case(f, (int)cs, KLEIN_SEQ, gids, gmask, &ref, KLEIN_SEQ * 96), "case %zu", cs);
            /* from golden ids: the encoder alone */
            for (int i = 0; i < KLEIN_SEQ * 96; i++) emb[i] = NAN;
            CHECK(!textenc_encode_ids(t, gids, gmask, KLEIN_SEQ, emb), "%s", tp_error_msg());
            double e = rel_l2(emb, ref, KLEIN_SEQ * 96);
            CHECK(e < 1e-4, "tp %d case %zu prompt_embeds from golden ids: rel L2 %.3g", tp, cs, e);
            /* from the prompt text: tokenizer + chat template + padding + encoder */
            for (int i = 0; i < KLEIN_SEQ * 96; i++) emb[i] = NAN;
            if (textenc_encode(t, prompt, KLEIN_SEQ, emb, ids, mask)) {
                CHECK(0, "tp %d case %zu encode '%s': %s", tp, cs, prompt, tp_error_msg());
            } else {
                CHECK(!memcmp(ids, gids, sizeof ids), "tp %d case %zu: input_ids differ from diffusers", tp, cs);
                CHECK(!memcmp(mask, gmask, sizeof mask), "tp %d case %zu: attention_mask differs", tp, cs);
                e = rel_l2(emb, ref, KLEIN_SEQ * 96);
                CHECK(e < 1e-4, "tp %d case %zu prompt_embeds from the prompt: rel L2 %.3g", tp, cs, e);
            }
            free(ref), free(emb);
        }
        textenc_free(t);
        comm_destroy(c);
        MPI_Comm_free(&group);
    }
    backend_destroy(be);
    st_close(f);
    json_decref(meta);
    free(model), free(cpath), free(epath);
}

/* make-tiny's encoder: loads, encodes, and TP over the whole world agrees
 * with a single-rank run of the same folder. */
TEST_MPI(textenc_tiny_tp_matches_tp1) {
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    char dir[512] = {0};
    int rc = 0;
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/tiny", test_tmp_dir());
        rc = textenc_write_tiny(dir, 7);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    REQUIRE(!rc, "textenc_write_tiny: %s", rank == 0 ? tp_error_msg() : "(rank 0)");
    backend *be = backend_cpu_create(1);
    int n = 24;
    int32_t ids[24], mask[24];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919 + 13) % 151643), mask[i] = i < 17;
    float *out[2] = {0};
    int tps[2] = {1, world};
    for (int k = 0; k < 2; k++) {
        MPI_Comm group;
        comm *c = group_comm(tps[k], be, &group);
        textenc *t = NULL;
        int lrc = textenc_load(dir, be, c, DT_F32, &t, NULL);
        CHECK(!lrc, "tp %d load: %s", tps[k], tp_error_msg());
        if (!lrc) {
            CHECK(textenc_embed_dim(t) == 3 * TEXTENC_TINY_HIDDEN, "embed dim %d", textenc_embed_dim(t));
            out[k] = malloc((size_t)n * textenc_embed_dim(t) * sizeof(float));
            CHECK(!textenc_encode_ids(t, ids, mask, n, out[k]), "tp %d encode: %s", tps[k], tp_error_msg());
        }
        textenc_free(t);
        comm_destroy(c);
        MPI_Comm_free(&group);
    }
    if (out[0] && out[1]) {
        double e = rel_l2(out[1], out[0], (size_t)n * 3 * TEXTENC_TINY_HIDDEN);
        CHECK(e < 1e-5, "tp %d vs tp 1: rel L2 %.3g", world, e);
    }
    free(out[0]), free(out[1]);
    backend_destroy(be);
}

/* ---- bad model folders ---- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

TEST(textenc_bad_missing_text_encoder) {
    char *dir = xasprintf("%s/no_te", test_tmp_dir());
    mkdir(dir, 0755);
    backend *be = backend_cpu_create(1);
    textenc *t = NULL;
    CHECK(textenc_load(dir, be, NULL, DT_F32, &t, NULL) == -1 && !t, "loaded a folder without text_encoder/");
    CHECK(strstr(tp_error_msg(), "text_encoder"), "message: %s", tp_error_msg());
    char *missing = xasprintf("%s/does-not-exist", test_tmp_dir());
    CHECK(textenc_load(missing, be, NULL, DT_F32, &t, NULL) == -1, "loaded a missing folder");
    backend_destroy(be);
    free(dir), free(missing);
}

TEST(textenc_bad_unknown_model_type) {
    char *dir = xasprintf("%s/bert", test_tmp_dir()), *te = xasprintf("%s/text_encoder", dir);
    char *cfg = xasprintf("%s/config.json", te);
    mkdir(dir, 0755), mkdir(te, 0755);
    write_text(cfg, "{\"model_type\": \"t5\", \"d_model\": 4096, \"num_layers\": 24}");
    backend *be = backend_cpu_create(1);
    textenc *t = NULL;
    CHECK(textenc_load(dir, be, NULL, DT_F32, &t, NULL) == -1 && !t, "loaded a t5 config");
    CHECK(strstr(tp_error_msg(), "t5") && strstr(tp_error_msg(), "config.json"), "message: %s", tp_error_msg());
    write_text(cfg, "{\"model_type\": \"qwen3\", \"hidden_size\": ");
    CHECK(textenc_load(dir, be, NULL, DT_F32, &t, NULL) == -1, "loaded malformed JSON");
    backend_destroy(be);
    free(dir), free(te), free(cfg);
}

TEST(textenc_bad_too_few_layers) {
    /* qwen3-tiny has 4 layers: FLUX.2 needs hidden state 27 */
    char *dir = xasprintf("%s/qwen3-tiny/model", test_golden_dir());
    backend *be = backend_cpu_create(1);
    textenc *t = NULL;
    CHECK(textenc_load(dir, be, NULL, DT_F32, &t, NULL) == -1, "loaded a 4-layer encoder");
    CHECK(strstr(tp_error_msg(), "27"), "message: %s", tp_error_msg());
    backend_destroy(be);
    free(dir);
}

/* ---- the FLUX.2-dev path end to end on a tiny random Mistral ---- */

/* A FLUX.2-dev-style folder: make-tiny's Mistral3 text encoder (legacy
 * names, nested text_config, lm_head and a vision tensor) with the Tekken
 * mini tokenizer of tests/data (left padding, <pad> = 11). */
static int write_dev_tiny(const char *dir) {
    int rc = textenc_write_tiny_mistral(dir, 11);
    char *mi = xasprintf("%s/model_index.json", dir);
    write_text(mi, "{\"_class_name\": \"Flux2Pipeline\", \"text_encoder\": [\"transformers\", "
                   "\"Mistral3ForConditionalGeneration\"], \"tokenizer\": [\"transformers\", \"PixtralProcessor\"]}");
    free(mi);
    return rc;
}

TEST_MPI(textenc_dev_tiny_end_to_end) {
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    char dir[512] = {0};
    int rc = 0;
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/dev", test_tmp_dir());
        rc = write_dev_tiny(dir);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    REQUIRE(!rc, "writing the dev folder: %s", rank == 0 ? tp_error_msg() : "(rank 0)");
    backend *be = backend_cpu_create(1);
    enum { L = 224 };   /* the dev layout is 193 tokens with this mini vocabulary */
    int32_t ids[2][L], mask[2][L];
    float *out[2] = {0};
    int tps[2] = {1, world};
    for (int k = 0; k < 2 && !test_failed(); k++) {
        MPI_Comm group;
        comm *c = group_comm(tps[k], be, &group);
        textenc *t = NULL;
        int lrc = textenc_load(dir, be, c, DT_F32, &t, NULL);
        CHECK(!lrc, "tp %d load: %s", tps[k], tp_error_msg());
        if (!lrc) {
            CHECK(!strcmp(textenc_kind(t), "mistral") && textenc_embed_dim(t) == 96, "kind %s", textenc_kind(t));
            out[k] = malloc((size_t)L * 96 * sizeof(float));
            for (int i = 0; i < L * 96; i++) out[k][i] = NAN;
            CHECK(!textenc_encode(t, "a red fox [IMG]in the snow", L, out[k], ids[k], mask[k]), "tp %d encode: %s",
                  tps[k], tp_error_msg());
        }
        textenc_free(t);
        comm_destroy(c);
        MPI_Comm_free(&group);
    }
    if (out[0] && out[1] && !test_failed()) {
        /* the dev layout (docs/spec/flux2-text-vae.md §2.1): left pads of 11, then BOS 1, [SYSTEM_PROMPT] 17 ... 18, [INST] 3 ... [/INST] 4 */
        int p = 0, has_img = 0, n18 = 0;
        while (p < L && ids[0][p] == 11 && mask[0][p] == 0) p++;
        for (int i = p; i < L; i++) {
            has_img |= ids[0][i] == 10, n18 += ids[0][i] == 18;
            CHECK(mask[0][i] == 1, "mask 0 at real position %d", i);
        }
        CHECK(p > 0 && p < L - 4, "expected left padding, got %d pads", p);
        CHECK(ids[0][p] == 1 && ids[0][p + 1] == 17 && ids[0][L - 1] == 4 && n18 == 1 && !has_img,
              "layout: %d %d ... %d (pads %d, [IMG] %d)", ids[0][p], ids[0][p + 1], ids[0][L - 1], p, has_img);
        CHECK(!memcmp(ids[0], ids[1], sizeof ids[0]), "tp %d tokenised differently", world);
        double e = rel_l2(out[1], out[0], (size_t)L * 96);
        CHECK(e < 1e-5, "tp %d vs tp 1: rel L2 %.3g", world, e);
    }
    free(out[0]), free(out[1]);
    backend_destroy(be);
}
