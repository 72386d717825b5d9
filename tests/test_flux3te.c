/* FLUX.3's text encoder (Qwen3-VL's language model) against the golden of
 * tests/data/flux3-te (tests/tools/flux3_te_golden.py: a tiny random
 * Qwen3VLForConditionalGeneration run through diffusers' own
 * Flux3TextEncoderStep._get_qwen3_vl_prompt_embeds with the real Qwen3
 * tokenizer): exact tokens and windows, prompt_embeds and hidden states at
 * tp 1/2/4, bf16, position controls, bad configs, the embedding cache key. */
#include "test.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/embed_cache.h"
#include "core/models/llm/textenc.h"
#include "core/models/llm/llm.h"
#include "core/formats/safetensors.h"
#include "kernels/ops.h"
#include <jansson.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TE_H 16
#define TE_E (8 * TE_H)
#define TE_LAYERS 34

/* The golden, unpacked once per process into its temporary folder (each
 * rank its own copy: no race), with the Qwen3 tokenizer files put back. */
static const char *golden(void) {
    static char dir[512];
    if (dir[0]) return dir;
    snprintf(dir, sizeof dir, "%s/flux3-te", test_tmp_dir());
    char *cmd = xasprintf("mkdir -p '%s' && xz -dc tests/data/flux3-te/flux3-te.tar.xz | tar -xf - -C '%s' && "
                          "cp tests/data/qwen3-tokenizer/tokenizer.json tests/data/qwen3-tokenizer/tokenizer_config.json "
                          "'%s/model/tokenizer/'", dir, dir, dir);
    int rc = system(cmd);
    free(cmd);
    if (rc) {
        dir[0] = 0;
        return NULL;
    }
    return dir;
}

typedef struct gcase {
    const char *prompt;
    int max_len, L, n_real;
    int32_t *ids, *mask, *pos;
    float *embeds, *hs0, *hs_last;
} gcase;

static int read_i32(st_file *f, const char *name, int n, int32_t **out) {
    int64_t *v;
    const st_tensor_info *info;
    if (st_read_i64(f, name, &v, &info)) return -1;
    if (st_numel(info) != n) return tp_error("%s: %lld values, expected %d", name, (long long)st_numel(info), n);
    *out = malloc((size_t)n * sizeof **out);
    for (int i = 0; i < n; i++) (*out)[i] = (int32_t)v[i];
    free(v);
    return 0;
}

static int read_f32(st_file *f, const char *name, size_t n, float **out) {
    const st_tensor_info *info;
    if (st_read_f32(f, name, out, &info)) return -1;
    return (size_t)st_numel(info) == n ? 0 : tp_error("%s: unexpected size", name);
}

/* All cases of cases.json / cases.safetensors; returns the count (0 on error). */
static int load_cases(gcase **out) {
    const char *g = golden();
    if (!g) return 0;
    char *jp = xasprintf("%s/cases.json", g), *sp = xasprintf("%s/cases.safetensors", g);
    json_error_t je;
    json_t *meta = json_load_file(jp, 0, &je);
    st_file *f = NULL;
    int n = 0, ok = meta && !st_open(sp, &f);
    const json_t *cs = ok ? json_object_get(meta, "cases") : NULL;
    gcase *c = calloc(json_array_size(cs) + 1, sizeof *c);
    for (size_t k = 0; ok && k < json_array_size(cs); k++) {
        const json_t *o = json_array_get(cs, k);
        gcase *x = &c[k];
        x->prompt = xstrdup(json_string_value(json_object_get(o, "prompt")));
        x->max_len = (int)json_integer_value(json_object_get(o, "max_sequence_length"));
        x->L = (int)json_integer_value(json_object_get(o, "window"));
        x->n_real = (int)json_integer_value(json_object_get(o, "real_tokens"));
        char name[64];
#define NM(s) (snprintf(name, sizeof name, "case%zu." s, k), name)
        ok = !read_i32(f, NM("input_ids"), x->L, &x->ids) && !read_i32(f, NM("attention_mask"), x->L, &x->mask) &&
             !read_i32(f, NM("position_ids"), x->L, &x->pos) &&
             !read_f32(f, NM("prompt_embeds"), (size_t)x->L * TE_E, &x->embeds) &&
             !read_f32(f, NM("hidden_states_0"), (size_t)x->L * TE_H, &x->hs0) &&
             !read_f32(f, NM("hidden_states_34"), (size_t)x->L * TE_H, &x->hs_last);
#undef NM
        if (ok) n++;
    }
    if (f) st_close(f);
    json_decref(meta);
    free(jp), free(sp);
    *out = c;
    return ok ? n : 0;
}

static void free_cases(gcase *c, int n) {
    for (int k = 0; k < n; k++) {
        free((char *)c[k].prompt);
        free(c[k].ids), free(c[k].mask), free(c[k].pos), free(c[k].embeds), free(c[k].hs0), free(c[k].hs_last);
    }
    free(c);
}

static comm *group_comm(int tp, backend *be, MPI_Comm *group) {
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_split(MPI_COMM_WORLD, r / tp, r, group);
    return comm_create_mpi(*group, be);
}

/* rel L2 over the rows whose mask equals `which` (pad rows: 0, real: 1) */
static double rel_rows(const float *a, const float *b, const int32_t *mask, int L, int w, int which) {
    double num = 0, den = 0;
    for (int t = 0; t < L; t++) {
        if ((mask[t] != 0) != which) continue;
        for (int d = 0; d < w; d++) {
            double e = (double)a[(size_t)t * w + d] - b[(size_t)t * w + d];
            num += e * e;
            den += (double)b[(size_t)t * w + d] * b[(size_t)t * w + d];
        }
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

/* The pipeline path: window, exact tokens and prompt_embeds from the prompt text. */
static uint64_t g_bytes_tp1;   /* bytes rank 0 read at tp 1 (check_textenc's first call) */

static void check_textenc(int tp, dtype_t prec, double tol, gcase *cs, int nc) {
    backend *be = backend_cpu_create(1);
    MPI_Comm group;
    comm *c = group_comm(tp, be, &group);
    char *model = xasprintf("%s/model", golden());
    textenc *t = NULL;
    load_stats st = {0};
    double worst = 0;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    uint64_t base = be->bytes_in_use;
    int rc = textenc_load(model, be, c, prec, &t, &st);
    CHECK(rc || be->bytes_in_use > base, "tp %d: the loaded encoder holds no backend bytes", tp);
    if (!rc && tp == 1 && prec == DT_F32) g_bytes_tp1 = st.bytes_read;
    /* sharded: a rank reads about 1/tp of the tp-1 bytes (+ the replicated norms, and K/V at tp 4: 2 KV heads) */
    if (!rc && tp > 1 && g_bytes_tp1)
        CHECK(st.bytes_read < g_bytes_tp1 / tp + 40000, "tp %d: rank read %llu bytes, tp 1 %llu", tp,
              (unsigned long long)st.bytes_read, (unsigned long long)g_bytes_tp1);
    if (!rc && rank == 0)
        printf("# flux3te tp %d %s: rank 0 read %llu bytes\n", tp, prec == DT_F32 ? "f32" : "bf16",
               (unsigned long long)st.bytes_read);
    CHECK(!rc, "tp %d: %s", tp, tp_error_msg());
    if (!rc) {
        CHECK(!strcmp(textenc_kind(t), "qwen3vl") && textenc_embed_dim(t) == TE_E && textenc_hidden(t) == TE_H &&
                  textenc_max_len(t) == 8192 && textenc_pad_multiple(t) == 80,
              "kind %s, width %d, cap %d, multiple %d", textenc_kind(t), textenc_embed_dim(t), textenc_max_len(t),
              textenc_pad_multiple(t));
        for (int k = 0; k < nc && !test_failed(); k++) {
            gcase *x = &cs[k];
            int L = 0;
            CHECK(!textenc_window(t, x->prompt, x->max_len, &L) && L == x->L,
                  "tp %d case %d: window %d, diffusers %d (%d real tokens)", tp, k, L, x->L, x->n_real);
            if (L != x->L) continue;
            float *emb = malloc((size_t)L * TE_E * sizeof *emb);
            int32_t *ids = malloc((size_t)L * sizeof *ids), *mask = malloc((size_t)L * sizeof *mask);
            for (size_t i = 0; i < (size_t)L * TE_E; i++) emb[i] = NAN;
            if (textenc_encode(t, x->prompt, L, emb, ids, mask)) {
                CHECK(0, "tp %d case %d: %s", tp, k, tp_error_msg());
            } else {
                CHECK(!memcmp(ids, x->ids, (size_t)L * sizeof *ids), "tp %d case %d: input_ids differ from diffusers",
                      tp, k);
                CHECK(!memcmp(mask, x->mask, (size_t)L * sizeof *mask), "tp %d case %d: attention_mask differs", tp, k);
                double e = rel_l2(emb, x->embeds, (size_t)L * TE_E);
                if (e > worst) worst = e;
                CHECK(e < tol, "tp %d case %d (%s): prompt_embeds [%d, %d] rel L2 %.3g (limit %.0e)", tp, k,
                      prec == DT_F32 ? "f32" : "bf16", L, TE_E, e, tol);
                if (x->n_real < L) {
                    double ep = rel_rows(emb, x->embeds, x->mask, L, TE_E, 0);
                    CHECK(ep < tol, "tp %d case %d: pad rows rel L2 %.3g", tp, k, ep);
                }
            }
            free(emb), free(ids), free(mask);
        }
        if (rank == 0 && !test_failed())
            printf("# flux3te tp %d %s: worst prompt_embeds rel L2 over %d cases %.3g\n", tp,
                   prec == DT_F32 ? "f32" : "bf16", nc, worst);
    }
    textenc_free(t);
    CHECK(be->bytes_in_use == base, "tp %d: %llu backend bytes still held after textenc_free", tp,
          (unsigned long long)(be->bytes_in_use - base));
    comm_destroy(c);
    MPI_Comm_free(&group);
    backend_destroy(be);
    free(model);
}

TEST_MPI(flux3te_golden) {
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    gcase *cs = NULL;
    int nc = load_cases(&cs);
    REQUIRE(nc == 5, "flux3-te golden: %d cases (%s)", nc, tp_error_msg());
    /* the cases cover the window rules: padded, exact multiple, two multiples, the cap, the empty prompt */
    CHECK(cs[0].L == 80 && cs[0].n_real < 80 && cs[1].L == 80 && cs[1].n_real == 80 && cs[2].L == 160 &&
              cs[2].n_real > 80 && cs[3].L == 90 && cs[3].n_real == 90 && cs[4].L == 80,
          "golden windows");
    for (int tp = 1; tp <= 4 && !test_failed(); tp *= 2)
        if (world % tp == 0) check_textenc(tp, DT_F32, 1e-4, cs, nc);
    free_cases(cs, nc);
}

TEST_MPI(flux3te_golden_bf16) {
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    gcase *cs = NULL;
    int nc = load_cases(&cs);
    REQUIRE(nc == 5, "flux3-te golden: %s", tp_error_msg());
    check_textenc(world <= 4 ? world : 1, DT_BF16, 3e-2, cs, nc);
    free_cases(cs, nc);
}

/* The LLM variant directly: hidden states 0, 4..32 and 34 (after the final
 * norm) with the pipeline's position ids, and two controls showing the test
 * sees positions: every position shifted by one, and the pad rows at
 * arange positions (transformers' default) instead of the pipeline's 1. */
TEST_MPI(flux3te_hidden_states_positions) {
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    gcase *cs = NULL;
    int nc = load_cases(&cs);
    REQUIRE(nc == 5, "flux3-te golden: %s", tp_error_msg());
    char *te = xasprintf("%s/model/text_encoder", golden()), *cp = xasprintf("%s/config.json", te);
    json_error_t je;
    json_t *cj = json_load_file(cp, 0, &je);
    llm_config cfg;
    checkpoint *ck = NULL;
    REQUIRE(cj && !llm_config_parse(cj, cp, &cfg) && !checkpoint_open(te, &ck) && !llm_config_resolve_prefix(&cfg, ck),
            "%s", tp_error_msg());
    CHECK(cfg.arch == LLM_QWEN3VL && cfg.n_layers == TE_LAYERS && cfg.hidden == TE_H && cfg.head_dim == 8 &&
              cfg.n_heads == 4 && cfg.n_kv_heads == 2 && cfg.rope_theta == 5e6 && cfg.qk_norm &&
              cfg.mrope_section[0] == 2 && cfg.mrope_section[1] == 1 && cfg.mrope_section[2] == 1 &&
              !strcmp(cfg.prefix, "model.language_model."),
          "parsed config: arch %d layers %d theta %g prefix %s", cfg.arch, cfg.n_layers, cfg.rope_theta, cfg.prefix);
    backend *be = backend_cpu_create(1);
    int tp = world <= 4 ? world : 1;   /* np 1, 2, 4: tp 1, 2, 4 (4 replicates the 2 KV heads) */
    MPI_Comm group;
    comm *c = group_comm(tp, be, &group);
    llm *m = NULL;
    REQUIRE(!llm_load(ck, &cfg, TE_LAYERS, be, c, DT_F32, &m, NULL), "%s", tp_error_msg());
    static const int idx[10] = {0, 4, 8, 12, 16, 20, 24, 28, 32, TE_LAYERS};
    for (int k = 0; k < nc && !test_failed(); k++) {
        gcase *x = &cs[k];
        int L = x->L;
        float *out = malloc((size_t)L * 10 * TE_H * sizeof *out), *got = malloc((size_t)L * TE_E * sizeof *got);
        float *h0 = malloc((size_t)L * TE_H * sizeof *h0), *hl = malloc((size_t)L * TE_H * sizeof *hl);
        int32_t *pos = malloc((size_t)L * sizeof *pos);
        REQUIRE(!llm_forward_pos(m, x->ids, x->mask, x->pos, L, idx, 10, out), "%s", tp_error_msg());
        for (int t = 0; t < L; t++) {
            memcpy(h0 + (size_t)t * TE_H, out + (size_t)t * 10 * TE_H, TE_H * sizeof *out);
            memcpy(got + (size_t)t * TE_E, out + (size_t)t * 10 * TE_H + TE_H, TE_E * sizeof *out);
            memcpy(hl + (size_t)t * TE_H, out + (size_t)t * 10 * TE_H + 9 * TE_H, TE_H * sizeof *out);
        }
        double e0 = rel_l2(h0, x->hs0, (size_t)L * TE_H), es = rel_l2(got, x->embeds, (size_t)L * TE_E),
               el = rel_l2(hl, x->hs_last, (size_t)L * TE_H);
        CHECK(e0 < 1e-6 && es < 1e-4 && el < 1e-4, "tp %d case %d: hidden state 0 %.3g, 4..32 %.3g, 34 %.3g", tp, k,
              e0, es, el);
        /* control 1: positions off by one from the middle of the prompt on (pos[t] = t + 1 for t >= n/2),
         * what an off-by-one in the position ids gives: the real rows must be far off */
        int half = x->n_real / 2;
        for (int t = 0; t < L; t++) pos[t] = x->pos[t] + (t >= half && x->mask[t]);
        REQUIRE(!llm_forward_pos(m, x->ids, x->mask, pos, L, idx + 1, 8, got), "%s", tp_error_msg());
        double skip = rel_rows(got, x->embeds, x->mask, L, TE_E, 1);
        CHECK(skip > 1e-2, "case %d: positions off by one from row %d still match (%.3g): the test does not see "
              "positions", k, half, skip);
        /* every position one later: RoPE is relative, so this changes only rounding */
        for (int t = 0; t < L; t++) pos[t] = x->pos[t] + 1;
        REQUIRE(!llm_forward_pos(m, x->ids, x->mask, pos, L, idx + 1, 8, got), "%s", tp_error_msg());
        double uniform = rel_l2(got, x->embeds, (size_t)L * TE_E);
        CHECK(uniform < 1e-3, "case %d: a uniform shift by one changed the output by %.3g", k, uniform);
        int wr;
        MPI_Comm_rank(MPI_COMM_WORLD, &wr);
        if (k == 2 && wr == 0 && !test_failed())
            printf("# flux3te case 2 (94 real of 160): rel L2 of the real rows with positions off by one from row "
                   "%d: %.3g; all positions shifted by one: %.3g\n", half, skip, uniform);
        /* control 2: pad rows at arange positions (not the pipeline's 1): pad rows off, real rows unchanged */
        if (x->n_real < L) {
            REQUIRE(!llm_forward_pos(m, x->ids, x->mask, NULL, L, idx + 1, 8, got), "%s", tp_error_msg());
            double real = rel_rows(got, x->embeds, x->mask, L, TE_E, 1), pad = rel_rows(got, x->embeds, x->mask, L, TE_E, 0);
            CHECK(real < 1e-4 && pad > 1e-2, "case %d: arange pad positions: real rows %.3g (want < 1e-4), pad rows "
                  "%.3g (want > 1e-2)", k, real, pad);
        }
        free(out), free(got), free(h0), free(hl), free(pos);
    }
    llm_free(m);
    comm_destroy(c);
    MPI_Comm_free(&group);
    backend_destroy(be);
    checkpoint_close(ck);
    json_decref(cj);
    free(te), free(cp);
    free_cases(cs, nc);
}

/* ---- bad configs ---- */

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

/* A copy of the golden folder whose text_encoder/config.json is `cfg_text`
 * (NULL: unchanged) and, when joint > 0, a transformer/config.json with
 * that joint_attention_dim. Returns the folder (malloc'ed). */
static char *variant(const char *name, const char *cfg_text, int joint) {
    char *dir = xasprintf("%s/%s", test_tmp_dir(), name);
    char *cmd = xasprintf("rm -rf '%s' && cp -r '%s/model' '%s' && mkdir -p '%s/transformer'", dir, golden(), dir, dir);
    if (system(cmd)) tp_error("cannot copy the golden folder");
    free(cmd);
    if (cfg_text) {
        char *p = xasprintf("%s/text_encoder/config.json", dir);
        write_file(p, cfg_text);
        free(p);
    }
    if (joint > 0) {
        char *p = xasprintf("%s/transformer/config.json", dir), *j = xasprintf("{\"joint_attention_dim\": %d}", joint);
        write_file(p, j);
        free(p), free(j);
    }
    return dir;
}

/* The golden config with one text_config field replaced (or the object removed). */
static char *config_with(const char *key, json_t *value) {
    char *p = xasprintf("%s/model/text_encoder/config.json", golden());
    json_error_t je;
    json_t *c = json_load_file(p, 0, &je);
    free(p);
    if (!c) return NULL;
    if (!key) json_object_del(c, "text_config");
    else json_object_set_new(json_object_get(c, "text_config"), key, value);
    char *s = json_dumps(c, 0);
    json_decref(c);
    return s;
}

static void expect_refused(const char *dir, const char *what, const char *needle) {
    backend *be = backend_cpu_create(1);
    textenc *t = NULL;
    int rc = textenc_load(dir, be, NULL, DT_F32, &t, NULL);
    CHECK(rc && !t, "%s: accepted", what);
    CHECK(!rc || strstr(tp_error_msg(), needle), "%s: error does not name %s: %s", what, needle, tp_error_msg());
    textenc_free(t);
    backend_destroy(be);
}

TEST(flux3te_bad_configs) {
    REQUIRE(golden(), "cannot unpack tests/data/flux3-te");
    char *s = config_with(NULL, NULL), *d = variant("no-text-config", s, 0);
    expect_refused(d, "no text_config", "text_encoder/config.json");
    CHECK(strstr(tp_error_msg(), "text_config"), "no text_config: %s", tp_error_msg());
    free(s), free(d);
    s = config_with("num_hidden_layers", json_integer(31)), d = variant("31-layers", s, 0);
    expect_refused(d, "31 layers", "text_encoder/config.json");
    CHECK(strstr(tp_error_msg(), "hidden state 32"), "31 layers: %s", tp_error_msg());
    free(s), free(d);
    json_t *rp = json_pack("{s:s, s:f, s:[i,i,i]}", "rope_type", "default", "rope_theta", 5e6, "mrope_section", 2, 2, 1);
    s = config_with("rope_parameters", rp), d = variant("bad-mrope", s, 0);
    expect_refused(d, "mrope_section not summing to head_dim/2", "mrope_section");
    free(s), free(d);
    d = variant("bad-joint", NULL, 100);
    expect_refused(d, "joint_attention_dim 100 for 8 x 16", "transformer/config.json");
    CHECK(strstr(tp_error_msg(), "joint_attention_dim 100"), "joint: %s", tp_error_msg());
    free(d);
    /* the same folder with the matching width loads */
    d = variant("good-joint", NULL, TE_E);
    backend *be = backend_cpu_create(1);
    textenc *t = NULL;
    CHECK(!textenc_load(d, be, NULL, DT_F32, &t, NULL), "joint %d refused: %s", TE_E, tp_error_msg());
    textenc_free(t);
    backend_destroy(be);
    free(d);
    /* model_index says Qwen3 (klein) for a qwen3_vl config */
    d = variant("bad-index", NULL, 0);
    char *p = xasprintf("%s/model_index.json", d);
    write_file(p, "{\"_class_name\": \"Flux3ModularPipeline\", \"text_encoder\": [\"transformers\", \"Qwen3ForCausalLM\"]}");
    expect_refused(d, "model_index Qwen3ForCausalLM", "model_index.json");
    free(p), free(d);
}

/* FLUX.3 pads on the right whatever tokenizer_config.json says (the pipeline
 * passes padding_side="right"). */
TEST(flux3te_right_padding_forced) {
    gcase *cs = NULL;
    int nc = load_cases(&cs);
    REQUIRE(nc == 5, "flux3-te golden: %s", tp_error_msg());
    char *d = variant("left-pad", NULL, 0), *p = xasprintf("%s/tokenizer/tokenizer_config.json", d);
    json_error_t je;
    json_t *tc = json_load_file(p, 0, &je);
    REQUIRE(tc, "%s", p);
    json_object_set_new(tc, "padding_side", json_string("left"));
    json_dump_file(tc, p, 0);
    json_decref(tc);
    backend *be = backend_cpu_create(1);
    textenc *t = NULL;
    REQUIRE(!textenc_load(d, be, NULL, DT_F32, &t, NULL), "%s", tp_error_msg());
    int L = cs[0].L;
    int32_t *ids = malloc((size_t)L * sizeof *ids), *mask = malloc((size_t)L * sizeof *mask);
    float *emb = malloc((size_t)L * TE_E * sizeof *emb);
    CHECK(!textenc_encode(t, cs[0].prompt, L, emb, ids, mask), "%s", tp_error_msg());
    CHECK(!memcmp(ids, cs[0].ids, (size_t)L * sizeof *ids) && mask[0] == 1 && mask[L - 1] == 0,
          "padding_side left in tokenizer_config.json changed FLUX.3's ids");
    /* without a window the call is refused (the caller could not have sized the output) */
    CHECK(textenc_encode(t, cs[0].prompt, 0, emb, NULL, NULL) && strstr(tp_error_msg(), "textenc_window"),
          "max_len 0 accepted: %s", tp_error_msg());
    free(ids), free(mask), free(emb), free(p), free(d);
    textenc_free(t);
    backend_destroy(be);
    free_cases(cs, nc);
}

/* The cache key separates what changes FLUX.3 embeddings, and a cached
 * entry gives back the window with the embedding. */
TEST(flux3te_embed_cache) {
    gcase *cs = NULL;
    int nc = load_cases(&cs);
    REQUIRE(nc == 5, "flux3-te golden: %s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    char *model = xasprintf("%s/model", golden());
    textenc *t = NULL;
    REQUIRE(!textenc_load(model, be, NULL, DT_F32, &t, NULL), "%s", tp_error_msg());
    embed_cache *c = embed_cache_create(1 << 20);
    const char *kind = textenc_kind(t);
    char *k2 = embed_cache_key(kind, 8192, 80, "f32", cs[2].prompt), *k3 = embed_cache_key(kind, 90, 80, "f32", cs[3].prompt);
    char *kb = embed_cache_key(kind, 8192, 80, "bf16", cs[2].prompt), *km = embed_cache_key(kind, 8192, 64, "f32", cs[2].prompt);
    char *kq = embed_cache_key("qwen3", 8192, 0, "f32", cs[2].prompt);
    CHECK(strcmp(k2, k3) && strcmp(k2, kb) && strcmp(k2, km) && strcmp(k2, kq), "keys collide");
    size_t n = 0;
    CHECK(!embed_cache_get(c, k2, &n), "empty cache hit");
    int L = 0;
    REQUIRE(!textenc_window(t, cs[2].prompt, 8192, &L) && L == 160, "window %d", L);
    float *emb = malloc((size_t)L * TE_E * sizeof *emb);
    REQUIRE(!textenc_encode(t, cs[2].prompt, L, emb, NULL, NULL), "%s", tp_error_msg());
    CHECK(embed_cache_put(c, k2, emb, (size_t)L * TE_E) == 1, "put");
    const float *hit = embed_cache_get(c, k2, &n);
    CHECK(hit && n == (size_t)L * TE_E && n / TE_E == 160 && rel_l2(hit, cs[2].embeds, n) < 1e-4,
          "hit: %zu floats", n);
    /* the same prompt under the cap of case 3 (90 tokens) is another entry */
    CHECK(!embed_cache_get(c, k3, &n) && !embed_cache_get(c, kb, &n) && !embed_cache_get(c, km, &n), "false hit");
    embed_cache_stats st;
    embed_cache_get_stats(c, &st);
    CHECK(st.hits == 1 && st.misses == 4 && st.entries == 1, "stats %llu hits %llu misses",
          (unsigned long long)st.hits, (unsigned long long)st.misses);
    free(emb), free(k2), free(k3), free(kb), free(km), free(kq), free(model);
    embed_cache_free(c);
    textenc_free(t);
    backend_destroy(be);
    free_cases(cs, nc);
}

/* make-tiny's FLUX.3 encoder (textenc_write_tiny_qwen3vl): the width follows
 * the transformer's joint_attention_dim, it loads as qwen3vl, and tp = world
 * gives tp 1's embeddings over the prompt's window. */
TEST_MPI(flux3te_tiny_writer_tp) {
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    char dir[512] = {0};
    int rc = 0;
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/tiny3", test_tmp_dir());
        char *tr = xasprintf("%s/transformer", dir), *cfg = xasprintf("%s/config.json", tr);
        mkdir(dir, 0755), mkdir(tr, 0755);
        write_file(cfg, "{\"joint_attention_dim\": 256}");
        rc = textenc_write_tiny_qwen3vl(dir, 11);
        free(tr), free(cfg);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    REQUIRE(!rc, "textenc_write_tiny_qwen3vl: %s", rank == 0 ? tp_error_msg() : "(rank 0)");
    backend *be = backend_cpu_create(1);
    const char *prompt = "a lighthouse on a cliff at dusk, waves below";
    float *out[2] = {0};
    int Ls[2] = {0}, tps[2] = {1, world};
    for (int k = 0; k < 2; k++) {
        MPI_Comm group;
        comm *c = group_comm(tps[k], be, &group);
        textenc *t = NULL;
        rc = textenc_load(dir, be, c, DT_F32, &t, NULL);
        CHECK(!rc, "tp %d: %s", tps[k], tp_error_msg());
        if (!rc) {
            CHECK(!strcmp(textenc_kind(t), "qwen3vl") && textenc_embed_dim(t) == 256, "kind %s width %d",
                  textenc_kind(t), textenc_embed_dim(t));
            CHECK(!textenc_window(t, prompt, 0, &Ls[k]) && Ls[k] == 80, "window %d", Ls[k]);
            out[k] = malloc((size_t)Ls[k] * 256 * sizeof *out[k]);
            CHECK(!textenc_encode(t, prompt, Ls[k], out[k], NULL, NULL), "%s", tp_error_msg());
        }
        textenc_free(t);
        comm_destroy(c);
        MPI_Comm_free(&group);
    }
    if (out[0] && out[1]) {
        double e = rel_l2(out[1], out[0], (size_t)Ls[0] * 256);
        CHECK(e < 1e-5, "tp %d vs tp 1: rel L2 %.3g", world, e);
    }
    free(out[0]), free(out[1]);
    backend_destroy(be);
}

/* For tests/sh/flux3_e2e.sh: TPGEN_FLUX3_TE_OUT=DIR (a FLUX.3 folder with
 * transformer/config.json) gets make-tiny's encoder, as wide as the
 * transformer's joint_attention_dim / 8; without it, a folder of joint 80
 * (the golden flux3-tiny's: hidden 10, two heads of 8) must load as
 * qwen3vl with that width. */
TEST(flux3te_tiny_writer_files) {
    const char *env = getenv("TPGEN_FLUX3_TE_OUT");
    char *dir = env ? xstrdup(env) : xasprintf("%s/tiny3-80", test_tmp_dir());
    if (!env) {
        char *tr = xasprintf("%s/transformer", dir), *cfg = xasprintf("%s/config.json", tr);
        mkdir(dir, 0755), mkdir(tr, 0755);
        write_file(cfg, "{\"joint_attention_dim\": 80}");
        free(tr), free(cfg);
    }
    REQUIRE(textenc_write_tiny_qwen3vl(dir, 3) == 0, "%s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    textenc *t = NULL;
    CHECK(textenc_load(dir, be, NULL, DT_F32, &t, NULL) == 0 && !strcmp(textenc_kind(t), "qwen3vl"), "%s",
          tp_error_msg());
    if (t && !env) CHECK(textenc_embed_dim(t) == 80, "width %d", textenc_embed_dim(t));
    textenc_free(t);
    backend_destroy(be);
    free(dir);
}
