/* The decoder LLM against golden data computed by transformers (f32):
 * every stored hidden state and prompt_embeds of qwen3-tiny and
 * mistral-tiny, padded and unpadded, at every TP degree in {1, 2, 4} that
 * divides the world (tp 4 exercises the replicated-KV rule: 2 KV heads). */
#include "test.h"
#include "golden_case.h"
#include "core/formats/checkpoint.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/models/llm/llm.h"
#include "core/formats/safetensors.h"
#include "kernels/ops.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

typedef struct golden_model {
    const char *name;          /* folder under golden/ */
    const char *cases;         /* cases file */
    int n_cases, seq;
    int hs[8], n_hs;           /* stored hidden_states_K */
    int layers[3];             /* stacked into prompt_embeds */
} golden_model;

static const golden_model k_qwen3 = {"qwen3-tiny", "qwen3_cases.safetensors", 2, 16, {0, 1, 2, 3, 4}, 5, {1, 2, 3}};
static const golden_model k_mistral = {"mistral-tiny", "mistral_cases.safetensors", 2, 24, {0, 10, 20, 30, 31}, 5,
                                       {10, 20, 30}};

static int open_model(const golden_model *g, checkpoint **ck, llm_config *cfg) {
    char *dir = xasprintf("%s/%s/model/text_encoder", test_golden_dir(), g->name);
    char *cpath = xasprintf("%s/config.json", dir);
    json_error_t je;
    json_t *j = json_load_file(cpath, 0, &je);
    int rc = j ? llm_config_parse(j, cpath, cfg) : tp_error("cannot read %s", cpath);
    if (!rc) rc = checkpoint_open(dir, ck);
    if (!rc) rc = llm_config_resolve_prefix(cfg, *ck);
    json_decref(j);
    free(dir), free(cpath);
    return rc;
}

/* One case's inputs and a golden tensor of it. */
static float *golden_f32(st_file *f, int c, const char *what, size_t want) {
    char name[96];
    snprintf(name, sizeof name, "case%d.%s", c, what);
    float *v = NULL;
    const st_tensor_info *info = NULL;
    if (st_read_f32(f, name, &v, &info) || (size_t)st_numel(info) != want) {
        free(v);
        return NULL;
    }
    return v;
}

/* Pad rows under the production rule (SDPA: a fully masked query row gets
 * zero attention output), computed naively from the checkpoint in double:
 * such a row evolves as x += down(silu(gate(rms(x))) * up(rms(x))). */
static int naive_pad_rows(const checkpoint *ck, const llm_config *c, const float *emb_rows, int n_pad, int max_layer,
                          const int *want, int n_want, double *out /* [n_pad, n_want*H] */) {
    int H = c->hidden, F = c->ffn;
    double *x = calloc((size_t)H, sizeof *x), *xn = calloc((size_t)H, sizeof *xn), *a = calloc((size_t)F, sizeof *a);
    int rc = 0;
    for (int r = 0; r < n_pad && !rc; r++) {
        for (int d = 0; d < H; d++) x[d] = emb_rows[(size_t)r * H + d];
        for (int L = 0; L <= max_layer && !rc; L++) {
            for (int k = 0; k < n_want; k++)
                if (want[k] == L) memcpy(out + ((size_t)r * n_want + k) * H, x, (size_t)H * sizeof *x);
            if (L == max_layer) break;
            char name[160];
            float *w_post = NULL, *wg = NULL, *wu = NULL, *wd = NULL;
            const st_file *f;
            const st_tensor_info *info;
#define LOADW(var, what) \
            snprintf(name, sizeof name, "%slayers.%d.%s.weight", c->prefix, L, what); \
            info = checkpoint_find(ck, name, &f); \
            if (!info || st_read_f32(f, name, &var, NULL)) rc = -1;
            LOADW(w_post, "post_attention_layernorm") LOADW(wg, "mlp.gate_proj") LOADW(wu, "mlp.up_proj")
            LOADW(wd, "mlp.down_proj")
#undef LOADW
            if (!rc) {
                double ss = 0;
                for (int d = 0; d < H; d++) ss += x[d] * x[d];
                double inv = 1.0 / sqrt(ss / H + c->eps);
                for (int d = 0; d < H; d++) xn[d] = x[d] * inv * w_post[d];
                for (int j = 0; j < F; j++) {
                    double g = 0, u = 0;
                    for (int d = 0; d < H; d++) g += wg[(size_t)j * H + d] * xn[d], u += wu[(size_t)j * H + d] * xn[d];
                    a[j] = g / (1 + exp(-g)) * u;
                }
                for (int d = 0; d < H; d++) {
                    double s = 0;
                    for (int j = 0; j < F; j++) s += wd[(size_t)d * F + j] * a[j];
                    x[d] += s;
                }
            }
            free(w_post), free(wg), free(wu), free(wd);
        }
    }
    free(x), free(xn), free(a);
    return rc;
}

/* Expected bytes this rank reads, from the file's tensor list and the
 * documented split rules (independent of the plan code). */
static uint64_t expected_bytes(const checkpoint *ck, const llm_config *c, int n_run, int with_norm, int tp) {
    static const char *split[] = {"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    uint64_t total = 0;
    size_t np = strlen(c->prefix);
    for (int i = 0; i < ck->n; i++) {
        const st_tensor_info *t = ck->infos[i];
        if (strncmp(t->name, c->prefix, np)) continue;   /* vision tower, lm_head */
        const char *rest = t->name + np;
        uint64_t b = t->end - t->begin;
        if (!strcmp(rest, "embed_tokens.weight")) total += c->vocab % tp ? b : b / tp;
        else if (!strcmp(rest, "norm.weight")) total += with_norm ? b : 0;
        else if (!strncmp(rest, "layers.", 7) && atoi(rest + 7) < n_run) {
            int sharded = 0;
            for (int k = 0; k < 5; k++) sharded |= strstr(rest, split[k]) != NULL;
            if ((strstr(rest, "k_proj") || strstr(rest, "v_proj")) && c->n_kv_heads % tp == 0) sharded = 1;
            total += sharded ? b / tp : b;
        }
    }
    return total;
}

/* f32: 1e-4 against the golden (spec); bf16 weights and bf16 GEMM inputs: the spec's ~3e-2 */
static void check_model(const golden_model *g, dtype_t dt, double tol) {
    int world_rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    checkpoint *ck = NULL;
    llm_config cfg;
    REQUIRE(!open_model(g, &ck, &cfg), "%s", tp_error_msg());
    char *cpath = xasprintf("%s/%s/%s", test_golden_dir(), g->name, g->cases);
    st_file *cf = NULL;
    REQUIRE(!st_open(cpath, &cf), "%s", tp_error_msg());
    free(cpath);
    backend *be = backend_cpu_create(1);
    int n = g->seq, H = cfg.hidden, top = g->hs[g->n_hs - 1];
    float *out = malloc((size_t)n * g->n_hs * H * sizeof *out), *emb = malloc((size_t)n * 3 * H * sizeof *emb);
    int32_t ids[64], mask[64];
    for (int tp = 1; tp <= 4 && !test_failed(); tp *= 2) {
        if (world % tp) continue;
        MPI_Comm group;
        MPI_Comm_split(MPI_COMM_WORLD, world_rank / tp, world_rank, &group);
        comm *c = comm_create_mpi(group, be);
        llm *m = NULL;
        load_stats st = {0};
        int rc = llm_load(ck, &cfg, top, be, c, dt, &m, &st);
        CHECK(!rc, "tp %d: %s", tp, tp_error_msg());
        if (!rc) {
            uint64_t want = expected_bytes(ck, &cfg, cfg.n_layers, top == cfg.n_layers, tp);
            CHECK(st.bytes_read == want, "tp %d rank %d read %llu bytes, expected its share %llu", tp, c->rank,
                  (unsigned long long)st.bytes_read, (unsigned long long)want);
        }
        for (int cs = 0; !rc && cs < g->n_cases && !test_failed(); cs++) {
            REQUIRE(!golden_case_ids(cf, cs, n, ids, mask), "case %d ids: %s", cs, tp_error_msg());
            for (size_t i = 0; i < (size_t)n * g->n_hs * H; i++) out[i] = NAN;   /* poison */
            rc = llm_forward(m, ids, mask, n, g->hs, g->n_hs, out);
            CHECK(!rc, "forward: %s", tp_error_msg());
            for (int k = 0; !rc && k < g->n_hs; k++) {
                char what[48];
                snprintf(what, sizeof what, "hidden_states_%d", g->hs[k]);
                float *ref = golden_f32(cf, cs, what, (size_t)n * H);
                REQUIRE(ref, "golden %s missing", what);
                double e = golden_block_rel(out, g->n_hs, k, ref, n, H, mask);   /* real rows */
                CHECK(e < tol, "tp %d %s case %d %s (real rows): rel L2 %.3g", tp, dtype_name(dt), cs, what, e);
                if (cfg.arch == LLM_QWEN3) {   /* right padding: pad rows are real computation too */
                    double ea = golden_block_rel(out, g->n_hs, k, ref, n, H, NULL);
                    CHECK(ea < tol, "tp %d %s case %d %s (all rows): rel L2 %.3g", tp, dtype_name(dt), cs, what, ea);
                }
                free(ref);
            }
            rc = rc ? rc : llm_forward(m, ids, mask, n, g->layers, 3, emb);
            float *pe = golden_f32(cf, cs, "prompt_embeds", (size_t)n * 3 * H);
            REQUIRE(pe, "golden prompt_embeds missing");
            int *rows = malloc((size_t)n * sizeof *rows);
            for (int t = 0; t < n; t++) rows[t] = cfg.arch == LLM_QWEN3 || mask[t];
            /* prompt_embeds [n, 3H] compared as one block of width 3H */
            double e = golden_block_rel(emb, 1, 0, pe, n, 3 * H, rows);
            CHECK(!rc && e < tol, "tp %d %s case %d prompt_embeds: rel L2 %.3g", tp, dtype_name(dt), cs, e);
            free(rows), free(pe);
            if (cfg.arch == LLM_MISTRAL && !rc) {
                /* Left-pad rows: golden is eager attention (uniform over all keys); production
                 * (SDPA) gives zero attention output. Check them against that rule instead. */
                int n_pad = 0;
                while (n_pad < n && !mask[n_pad]) n_pad++;
                if (n_pad > 0) {
                    float *e0 = golden_f32(cf, cs, "hidden_states_0", (size_t)n * H);
                    double *ref = malloc((size_t)n_pad * 3 * H * sizeof *ref);
                    REQUIRE(e0 && !naive_pad_rows(ck, &cfg, e0, n_pad, g->layers[2], g->layers, 3, ref),
                            "naive pad rows: %s", tp_error_msg());
                    double num = 0, den = 0;
                    for (size_t i = 0; i < (size_t)n_pad * 3 * H; i++)
                        num += (emb[i] - ref[i]) * (emb[i] - ref[i]), den += ref[i] * ref[i];
                    double pe_err = num != num ? INFINITY : sqrt(num / den);
                    CHECK(pe_err < (dt == DT_F32 ? 1e-5 : tol), "tp %d %s case %d: left-pad rows vs the zero-attention rule: "
                          "rel L2 %.3g", tp, dtype_name(dt), cs, pe_err);
                    free(e0), free(ref);
                }
            }
        }
        llm_free(m);
        comm_destroy(c);
        MPI_Comm_free(&group);
    }
    free(out), free(emb);
    backend_destroy(be);
    st_close(cf);
    checkpoint_close(ck);
}

TEST_MPI(llm_qwen3_tiny_golden) { check_model(&k_qwen3, DT_F32, 1e-4); }
TEST_MPI(llm_mistral_tiny_golden) { check_model(&k_mistral, DT_F32, 1e-4); }
TEST_MPI(llm_qwen3_tiny_golden_bf16) { check_model(&k_qwen3, DT_BF16, 3e-2); }
TEST_MPI(llm_mistral_tiny_golden_bf16) { check_model(&k_mistral, DT_BF16, 3e-2); }

/* ---- configuration and plan rules (single process) ---- */

TEST(llm_config_mistral_nested) {
    char *p = xasprintf("%s/mistral-tiny/model/text_encoder/config.json", test_golden_dir());
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    REQUIRE(j, "cannot read %s", p);
    llm_config c;
    REQUIRE(!llm_config_parse(j, p, &c), "%s", tp_error_msg());
    /* expected values read independently from text_config */
    json_t *tc = json_object_get(j, "text_config");
    CHECK(c.arch == LLM_MISTRAL && !c.qk_norm, "arch");
    CHECK(c.hidden == json_integer_value(json_object_get(tc, "hidden_size")), "hidden %d", c.hidden);
    CHECK(c.head_dim == json_integer_value(json_object_get(tc, "head_dim")), "explicit head_dim %d", c.head_dim);
    CHECK(c.n_layers == json_integer_value(json_object_get(tc, "num_hidden_layers")), "layers");
    CHECK(c.rope_theta == json_number_value(json_object_get(tc, "rope_theta")), "theta %g", c.rope_theta);
    CHECK(fabsf(c.eps - (float)json_number_value(json_object_get(tc, "rms_norm_eps"))) < 1e-12f, "eps");
    json_decref(j);
    free(p);
}

TEST(llm_config_unknown_type) {
    json_t *j = json_pack("{s:s, s:i}", "model_type", "bert", "hidden_size", 64);
    llm_config c;
    CHECK(llm_config_parse(j, "x/config.json", &c) == -1, "bert accepted");
    CHECK(strstr(tp_error_msg(), "bert") && strstr(tp_error_msg(), "not supported"), "message: %s", tp_error_msg());
    json_decref(j);
    j = json_pack("{s:s}", "model_type", "mistral3");
    CHECK(llm_config_parse(j, "x/config.json", &c) == -1 && strstr(tp_error_msg(), "text_config"),
          "mistral3 without text_config: %s", tp_error_msg());
    json_decref(j);
}

TEST(llm_plan_rules) {
    llm_config c = {.arch = LLM_QWEN3, .hidden = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                    .ffn = 128, .vocab = 300, .eps = 1e-6f, .rope_theta = 1e6, .qk_norm = 1};
    strcpy(c.prefix, "model.");
    llm_plan p;
    CHECK(plan_qwen3(&c, 3, &p) == -1 && strstr(tp_error_msg(), "num_attention_heads"), "tp 3: %s", tp_error_msg());
    REQUIRE(!plan_qwen3(&c, 2, &p), "%s", tp_error_msg());
    int kv = 0, emb = 0;
    for (int i = 0; i < p.p.n_rules; i++) {
        kv += strstr(p.p.rules[i].glob, "k_proj") != NULL;
        emb += strstr(p.p.rules[i].glob, "embed_tokens") != NULL;
        CHECK(!strncmp(p.p.rules[i].glob, "model.layers.", 13) || !strcmp(p.p.rules[i].glob, "model.embed_tokens.weight"),
              "glob %s", p.p.rules[i].glob);
    }
    CHECK(kv == 1 && emb == 1, "tp 2 shards k_proj and the vocabulary");
    REQUIRE(!plan_qwen3(&c, 4, &p), "%s", tp_error_msg());   /* 2 KV heads, tp 4: replicated */
    for (int i = 0; i < p.p.n_rules; i++) CHECK(!strstr(p.p.rules[i].glob, "k_proj"), "k_proj sharded at tp 4");
    c.vocab = 301;
    REQUIRE(!plan_qwen3(&c, 2, &p), "%s", tp_error_msg());
    for (int i = 0; i < p.p.n_rules; i++) CHECK(!strstr(p.p.rules[i].glob, "embed"), "odd vocab sharded");
}

TEST(llm_rope_tables_reference) {
    /* independent: double-precision angles; the fp32 reference path differs by rounding only */
    int n = 40, D = 16;
    float *c = malloc((size_t)n * D * sizeof *c), *s = malloc((size_t)n * D * sizeof *s);
    for (int i = 0; i < n * D; i++) c[i] = s[i] = NAN;
    llm_rope_tables(n, D, 1e6, c, s);
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < D; j++) {
            double ang = t * pow(1e6, -(double)(2 * (j % (D / 2))) / D);
            worst = fmax(worst, fabs(c[t * D + j] - cos(ang)) + fabs(s[t * D + j] - sin(ang)));
        }
    CHECK(worst < 1e-4, "rope tables differ by %.3g", worst);
    free(c), free(s);
}

TEST(llm_sliding_window_refused) {
    json_t *j = json_pack("{s:s, s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i}}", "model_type", "mistral3", "text_config",
                          "hidden_size", 32, "num_hidden_layers", 2, "num_attention_heads", 4, "num_key_value_heads",
                          2, "intermediate_size", 64, "vocab_size", 100, "sliding_window", 16);
    llm_config c;
    REQUIRE(!llm_config_parse(j, "x/config.json", &c), "%s", tp_error_msg());
    CHECK(c.sliding_window == 16 && c.head_dim == 8, "window %d head_dim %d", c.sliding_window, c.head_dim);
    json_decref(j);
    /* the real tiny model with a window shorter than the sequence: a clear error, no wrong numbers */
    checkpoint *ck = NULL;
    REQUIRE(!open_model(&k_mistral, &ck, &c), "%s", tp_error_msg());
    c.sliding_window = 8;
    backend *be = backend_cpu_create(1);
    llm *m = NULL;
    REQUIRE(!llm_load(ck, &c, 10, be, NULL, DT_F32, &m, NULL), "%s", tp_error_msg());
    int32_t ids[24] = {0};
    int idx[1] = {10};
    float *out = malloc(24 * 32 * sizeof *out);
    CHECK(llm_forward(m, ids, NULL, 24, idx, 1, out) == -1 && strstr(tp_error_msg(), "sliding_window"),
          "message: %s", tp_error_msg());
    free(out);
    llm_free(m);
    backend_destroy(be);
    checkpoint_close(ck);
}
