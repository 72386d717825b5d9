/* The plan engine: globs, block resolution, divisibility errors, the
 * byte ranges of docs/spec/flux2-transformer.md §8.3, and per-rank bytes of the
 * real FLUX.2 shapes (sparse checkpoints) against docs/spec/flux2-transformer.md §2.3 / §7.4. */
#include "core/models/model_plan.h"
#include "test.h"
#include "kernels/err.h"
#include "core/formats/weights.h"
#include "core/models/llm/textenc.h"
#include "kernels/ops.h"
#include <stdlib.h>
#include <string.h>

int flux2_make_checkpoint(const char *dir, const char *shape, int sparse, int shards, unsigned seed); /* bench_load.c */

static st_tensor_info info2(const char *name, int64_t r, int64_t c) {
    return (st_tensor_info){.name = (char *)name, .dtype = DT_BF16, .ndim = 2, .shape = {r, c}, .end = (uint64_t)(2 * r * c)};
}

/* A checkpoint made of header entries only (plan_validate reads no data). */
static checkpoint mem_ckpt(st_tensor_info *t, const st_tensor_info **ptrs, int n) {
    for (int i = 0; i < n; i++) ptrs[i] = &t[i];
    return (checkpoint){.dir = "memory", .n = n, .infos = ptrs};
}

static const plan_rule k_test_rules[] = {
    {"blocks.*.w", STYLE_COLWISE, NULL, NULL},
    {"blocks.*.*", STYLE_ROWWISE, NULL, NULL},     /* never valid: two stars (only used by bad_plan_two_stars) */
};

TEST(plan_glob_star_is_block_index) {
    plan p = {.model = "test", .rules = k_test_rules, .n_rules = 1};
    const char *yes[] = {"blocks.0.w", "blocks.12.w"}, *no[] = {"blocks..w", "blocks.x.w", "xblocks.1.w", "blocks.1.w.b",
                                                                "blocks.1.2.w", "blocks.1.wx"};
    for (int i = 0; i < 2; i++) {
        st_tensor_info t = info2(yes[i], 8, 4);
        shard_info si;
        CHECK(plan_shard(&p, st_plan_tensor(&t), 2, &si) == 0 && si.style == STYLE_COLWISE && si.rule == 0, "%s not matched", yes[i]);
    }
    for (int i = 0; i < 6; i++) {
        st_tensor_info t = info2(no[i], 8, 4);
        shard_info si;
        CHECK(plan_shard(&p, st_plan_tensor(&t), 2, &si) == 0 && si.style == STYLE_REPLICATED && si.rule == -1, "%s matched", no[i]);
    }
}

/* The five examples of docs/spec/flux2-transformer.md §8.3 (dev, tp 4), byte for byte. */
TEST(plan_pieces_spec_examples_dev_tp4) {
    json_t *cfg = json_pack("{s:i,s:i,s:f}", "num_attention_heads", 48, "attention_head_dim", 128, "mlp_ratio", 3.0);
    plan p;
    REQUIRE(plan_flux2(cfg, &p) == 0, "%s", tp_error_msg());
    st_tensor_info q = info2("transformer_blocks.3.attn.to_q.weight", 6144, 6144),
                   li = info2("transformer_blocks.0.ff.linear_in.weight", 36864, 6144),
                   lo = info2("transformer_blocks.7.ff.linear_out.weight", 6144, 18432),
                   qkv = info2("single_transformer_blocks.40.attn.to_qkv_mlp_proj.weight", 55296, 6144),
                   out = info2("single_transformer_blocks.5.attn.to_out.weight", 6144, 24576);
    for (int k = 0; k < 4; k++) {
        shard_info si;
        shard_piece pc[PLAN_MAX_PIECES];
        REQUIRE(plan_shard(&p, st_plan_tensor(&q), 4, &si) == 0, "%s", tp_error_msg());
        CHECK(plan_shard_pieces(&si, 4, k, pc) == 1 && pc[0].height == 1 && pc[0].width * 2 == 18874368 &&
                  pc[0].src_off * 2 == k * 18874368ll, "to_q rank %d", k);
        REQUIRE(plan_shard(&p, st_plan_tensor(&li), 4, &si) == 0, "%s", tp_error_msg());
        CHECK(plan_shard_pieces(&si, 4, k, pc) == 2 && pc[0].width * 2 == 56623104 && pc[1].width * 2 == 56623104 &&
                  pc[0].src_off == 4608ll * k * 6144 && pc[1].src_off == (18432 + 4608ll * k) * 6144 &&
                  pc[1].dst_off == 4608ll * 6144, "linear_in rank %d", k);
        REQUIRE(plan_shard(&p, st_plan_tensor(&lo), 4, &si) == 0, "%s", tp_error_msg());
        CHECK(plan_shard_pieces(&si, 4, k, pc) == 1 && pc[0].height == 6144 && pc[0].width * 2 == 9216 &&
                  pc[0].src_pitch * 2 == 36864 && pc[0].src_off * 2 == 9216ll * k && pc[0].dst_pitch == 4608,
              "linear_out rank %d", k);
        REQUIRE(plan_shard(&p, st_plan_tensor(&qkv), 4, &si) == 0, "%s", tp_error_msg());
        int64_t starts[5] = {1536ll * k, 6144 + 1536ll * k, 12288 + 1536ll * k, 18432 + 4608ll * k, 36864 + 4608ll * k},
                lens[5] = {1536, 1536, 1536, 4608, 4608}, dst = 0;
        CHECK(plan_shard_pieces(&si, 4, k, pc) == 5 && si.local_rows == 13824 && si.local_cols == 6144, "qkv local");
        for (int j = 0; j < 5; dst += lens[j] * 6144, j++)
            CHECK(pc[j].src_off == starts[j] * 6144 && pc[j].width == lens[j] * 6144 && pc[j].dst_off == dst,
                  "qkv rank %d block %d", k, j);
        REQUIRE(plan_shard(&p, st_plan_tensor(&out), 4, &si) == 0, "%s", tp_error_msg());
        CHECK(plan_shard_pieces(&si, 4, k, pc) == 2 && si.local_rows == 6144 && si.local_cols == 6144 &&
                  pc[0].src_off == 1536ll * k && pc[0].width == 1536 && pc[1].src_off == 6144 + 4608ll * k &&
                  pc[1].width == 4608 && pc[1].dst_off == 1536 && pc[1].dst_pitch == 6144 && pc[1].height == 6144,
              "to_out rank %d", k);
    }
    json_decref(cfg);
}

/* Per-rank bytes from the config formulas (docs/spec/flux2-transformer.md §1.2, §2, §7.2). */
typedef struct shape_case {
    const char *shape;
    int H, L, S, Jt, guidance, n_tensors;
    uint64_t total;                 /* docs/spec/flux2-transformer.md §2.3 */
    double gb[4];                   /* docs/spec/flux2-transformer.md §7.4 at tp 1, 2, 4, 8 (0: not valid) */
} shape_case;

static void formula_bytes(const shape_case *s, uint64_t *rep, uint64_t *sh) {
    uint64_t D = 128ull * (uint64_t)s->H, M = 3 * D, hd = 128, C = 128, Ct = 256;
    *rep = 2 * (D * C + D * (uint64_t)s->Jt + D * Ct + D * D + (s->guidance ? D * Ct + D * D : 0) + 12 * D * D + 3 * D * D +
                2 * D * D + C * D + (uint64_t)s->L * 4 * hd + (uint64_t)s->S * 2 * hd);
    *sh = 2 * ((uint64_t)s->L * (8 * D * D + 4 * M * D + 2 * D * M) + (uint64_t)s->S * ((3 * D + 2 * M) * D + D * (D + M)));
}

TEST(plan_real_shapes_per_rank_bytes) {
    static const shape_case cases[] = {
        {"dev", 48, 8, 48, 15360, 1, 331, 64446562304ull, {64.45, 33.04, 17.34, 9.48}},
        {"klein-4b", 24, 5, 20, 7680, 0, 169, 7751089152ull, {7.75, 4.07, 2.23, 1.31}},
        {"klein-9b", 32, 8, 24, 12288, 0, 233, 18157162496ull, {18.16, 9.43, 5.07, 2.89}},
    };
    for (int i = 0; i < 3; i++) {
        const shape_case *s = &cases[i];
        char *dir = xasprintf("%s/real-%s", test_tmp_dir(), s->shape), *tdir = xasprintf("%s/transformer", dir);
        REQUIRE(flux2_make_checkpoint(dir, s->shape, 1, i == 0 ? 7 : 1, 3) == 0, "%s", tp_error_msg());
        model_dir *m;
        checkpoint *c;
        json_t *cfg = NULL;
        plan p;
        REQUIRE(model_dir_open(dir, &m) == 0 && (cfg = model_dir_config(m, "transformer")) && plan_flux2(cfg, &p) == 0 &&
                    checkpoint_open(tdir, &c) == 0, "%s", tp_error_msg());
        uint64_t total = 0, rep, sh;
        for (int k = 0; k < c->n; k++) total += c->infos[k]->end - c->infos[k]->begin;
        CHECK(c->n == s->n_tensors, "%s: %d tensors, spec says %d", s->shape, c->n, s->n_tensors);
        CHECK(total == s->total, "%s: %llu bytes, spec says %llu", s->shape, (unsigned long long)total,
              (unsigned long long)s->total);
        formula_bytes(s, &rep, &sh);
        CHECK(rep + sh == s->total, "%s: formula total %llu", s->shape, (unsigned long long)(rep + sh));
        for (int j = 0; j < 4; j++) {
            int tp = 1 << j;
            for (int r = 0; r < tp; r += tp - 1 > 0 ? tp - 1 : 1) {   /* first and last rank */
                load_estimate e;
                REQUIRE(weights_estimate(c, &p, tp, r, &e) == 0, "%s tp %d: %s", s->shape, tp, tp_error_msg());
                CHECK(e.bytes_replicated == rep && e.bytes_sharded == sh / (uint64_t)tp, "%s tp %d rank %d: %llu + %llu",
                      s->shape, tp, r, (unsigned long long)e.bytes_replicated, (unsigned long long)e.bytes_sharded);
                double gb = (double)(e.bytes_replicated + e.bytes_sharded) / 1e9;
                CHECK(gb > s->gb[j] - 0.0051 && gb < s->gb[j] + 0.0051, "%s tp %d: %.3f GB, docs/spec/flux2-transformer.md §7.4 says %.2f",
                      s->shape, tp, gb, s->gb[j]);
            }
        }
        load_estimate e;
        CHECK(weights_estimate(c, &p, 5, 0, &e) == -1 && strstr(tp_error_msg(), "tp 5 does not divide"), "%s tp 5: %s",
              s->shape, tp_error_msg());
        checkpoint_close(c);
        json_decref(cfg);
        model_dir_close(m);
        char *rm = xasprintf("rm -rf %s", dir);
        CHECK(system(rm) == 0, "rm");
        free(rm), free(dir), free(tdir);
    }
}

TEST(plan_proportional_and_symbolic_blocks) {
    static const plan_rule rules[] = {{"a", STYLE_PACKED_COLWISE, "1,3", NULL}, {"b", STYLE_PACKED_ROWWISE, "X,Y", NULL}};
    plan p = {.model = "test", .rules = rules, .n_rules = 2};
    plan_add_symbol(&p, "X", 4);
    plan_add_symbol(&p, "Y", 8);
    st_tensor_info a = info2("a", 16, 3), b = info2("b", 3, 12);
    shard_info si;
    shard_piece pc[PLAN_MAX_PIECES];
    REQUIRE(plan_shard(&p, st_plan_tensor(&a), 2, &si) == 0, "%s", tp_error_msg());
    CHECK(si.n_blocks == 2 && si.blocks[0] == 4 && si.blocks[1] == 12 && si.local_rows == 8, "a blocks");
    CHECK(plan_shard_pieces(&si, 2, 1, pc) == 2 && pc[0].src_off == 2 * 3 && pc[1].src_off == (4 + 6) * 3, "a pieces");
    REQUIRE(plan_shard(&p, st_plan_tensor(&b), 4, &si) == 0, "%s", tp_error_msg());
    CHECK(si.local_cols == 3 && plan_shard_pieces(&si, 4, 3, pc) == 2 && pc[0].src_off == 3 && pc[0].width == 1 &&
              pc[1].src_off == 4 + 6 && pc[1].width == 2 && pc[1].dst_off == 1, "b pieces");
}

/* ---- bad plans and shapes ---- */

TEST(bad_plan_packed_block_not_divisible) {
    /* mlp_ratio gives M = int(128 * 3.0078125) = 385: heads (4) allow tp 2 but the gate/up blocks do not */
    json_t *cfg = json_pack("{s:i,s:i,s:f}", "num_attention_heads", 4, "attention_head_dim", 32, "mlp_ratio", 3.0078125);
    plan p;
    REQUIRE(plan_flux2(cfg, &p) == 0, "%s", tp_error_msg());
    st_tensor_info t[] = {info2("single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight", 3 * 128 + 2 * 385, 128),
                          info2("single_transformer_blocks.0.attn.to_out.weight", 128, 128 + 385)};
    const st_tensor_info *ptr[2];
    static const plan_rule one[] = {{"single_transformer_blocks.*.attn.to_qkv_mlp_proj.weight", STYLE_PACKED_COLWISE,
                                     "D,D,D,M,M", NULL}};
    plan q = p;
    q.rules = one, q.n_rules = 1;
    checkpoint c = mem_ckpt(t, ptr, 1);
    CHECK(checkpoint_validate_plan(&c, &q, 2) == -1, "accepted");
    CHECK(strstr(tp_error_msg(), "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight") &&
              strstr(tp_error_msg(), "block 3 of size 385 is not divisible by tp 2"), "message: %s", tp_error_msg());
    CHECK(checkpoint_validate_plan(&c, &q, 1) == 0, "tp 1 rejected: %s", tp_error_msg());
    json_decref(cfg);
}

TEST(bad_plan_colwise_rowwise_not_divisible) {
    static const plan_rule rules[] = {{"c", STYLE_COLWISE, NULL, NULL}, {"r", STYLE_ROWWISE, NULL, NULL}};
    plan p = {.model = "test", .rules = rules, .n_rules = 2};
    st_tensor_info t[] = {info2("c", 6, 8), info2("r", 8, 6)};
    const st_tensor_info *ptr[2];
    checkpoint c = mem_ckpt(t, ptr, 2);
    CHECK(checkpoint_validate_plan(&c, &p, 4) == -1 && strstr(tp_error_msg(), "tensor 'c' (colwise): out_features 6 is not divisible by tp 4"),
          "%s", tp_error_msg());
    t[0] = info2("c", 8, 6);
    CHECK(checkpoint_validate_plan(&c, &p, 4) == -1 && strstr(tp_error_msg(), "tensor 'r' (rowwise): in_features 6 is not divisible by tp 4"),
          "%s", tp_error_msg());
    CHECK(checkpoint_validate_plan(&c, &p, 2) == 0, "tp 2: %s", tp_error_msg());
}

TEST(bad_plan_glob_matches_nothing) {
    plan p = {.model = "test", .rules = k_test_rules, .n_rules = 1};
    st_tensor_info t[] = {info2("other.w", 8, 8)};
    const st_tensor_info *ptr[1];
    checkpoint c = mem_ckpt(t, ptr, 1);
    CHECK(checkpoint_validate_plan(&c, &p, 2) == -1 && strstr(tp_error_msg(), "rule 'blocks.*.w' (colwise) matches no tensor"),
          "%s", tp_error_msg());
}

TEST(bad_plan_two_stars) {
    plan p = {.model = "test", .rules = k_test_rules + 1, .n_rules = 1};
    st_tensor_info t[] = {info2("blocks.1.2", 8, 8)};
    const st_tensor_info *ptr[1];
    checkpoint c = mem_ckpt(t, ptr, 1);
    CHECK(checkpoint_validate_plan(&c, &p, 2) == -1 && strstr(tp_error_msg(), "at most one '*'"), "%s", tp_error_msg());
}

TEST(bad_plan_blocks_do_not_add_up) {
    static const plan_rule rules[] = {{"a", STYLE_PACKED_COLWISE, "X,X", NULL}};
    plan p = {.model = "test", .rules = rules, .n_rules = 1};
    plan_add_symbol(&p, "X", 4);
    st_tensor_info t[] = {info2("a", 10, 2)};
    const st_tensor_info *ptr[1];
    checkpoint c = mem_ckpt(t, ptr, 1);
    CHECK(checkpoint_validate_plan(&c, &p, 2) == -1 && strstr(tp_error_msg(), "tensor 'a': blocks X,X add up to 8"), "%s",
          tp_error_msg());
}

TEST(bad_plan_flux2_config) {
    plan p;
    json_t *cfg = json_pack("{s:i}", "attention_head_dim", 128);
    CHECK(plan_flux2(cfg, &p) == -1 && strstr(tp_error_msg(), "num_attention_heads"), "%s", tp_error_msg());
    json_decref(cfg);
}

/* The per-component plan table: inspect's estimate for klein-tiny's
 * transformer and Qwen3 text encoder equals what weights_load then holds
 * with the same plan and filter, at tp 1 and 2; at tp 1 the text
 * encoder's estimate also equals what textenc_load (the real consumer)
 * holds. */
TEST(plan_component_table_matches_loads) {
    char *root = xasprintf("%s/klein-tiny/model", test_golden_dir());
    const char *comps[2] = {"transformer", "text_encoder"};
    model_dir *m;
    REQUIRE(model_dir_open(root, &m) == 0, "%s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    uint64_t te_tp1 = 0;
    for (int i = 0; i < 2; i++) {
        char *dir = model_dir_path(m, comps[i]);
        json_t *cfg = model_dir_config(m, comps[i]);
        checkpoint *c;
        REQUIRE(cfg && checkpoint_open(dir, &c) == 0, "%s", tp_error_msg());
        for (int tp = 1; tp <= 2; tp++) {
            component_plan cp;
            REQUIRE(plan_for_component(comps[i], cfg, c, tp, &cp) == 0, "%s tp %d: %s", comps[i], tp, tp_error_msg());
            CHECK(!strcmp(cp.p.model, i ? "qwen3" : "flux2"), "plan %s", cp.p.model);
            CHECK((cp.want != NULL) == (i == 1), "want filter");
            load_estimate e;
            REQUIRE(weights_estimate_want(c, &cp.p, tp, tp - 1, cp.want, cp.want_ctx, &e) == 0, "%s", tp_error_msg());
            load_opts o = {.tp = tp, .rank = tp - 1, .be = be, .dtype = DT_BF16, .want = cp.want, .want_ctx = cp.want_ctx};
            weights *w;
            load_stats st;
            REQUIRE(weights_load(c, &cp.p, &o, &w, &st) == 0, "%s", tp_error_msg());
            CHECK(st.bytes_held == e.bytes_replicated + e.bytes_sharded && st.bytes_read == st.bytes_held &&
                      st.n_tensors == e.n_tensors, "%s tp %d: estimate %llu, loaded %llu", comps[i], tp,
                  (unsigned long long)(e.bytes_replicated + e.bytes_sharded), (unsigned long long)st.bytes_held);
            CHECK(i == 0 || st.n_tensors < c->n, "the text encoder filter skipped nothing");
            if (i == 1 && tp == 1) te_tp1 = e.bytes_replicated + e.bytes_sharded;
            weights_free(w);
            component_plan_free(&cp);
        }
        checkpoint_close(c);
        json_decref(cfg);
        free(dir);
    }
    textenc *te;
    REQUIRE(textenc_load(root, be, NULL, DT_BF16, &te, NULL) == 0, "%s", tp_error_msg());
    CHECK(textenc_bytes(te) == te_tp1, "textenc holds %llu bytes, inspect says %llu",
          (unsigned long long)textenc_bytes(te), (unsigned long long)te_tp1);
    textenc_free(te);
    backend_destroy(be);
    model_dir_close(m);
    free(root);
}
