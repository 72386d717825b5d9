/* GGUF transformers as checkpoints and their sharded, still quantised load
 * (core/formats/gguf_shard.c, weights.c): the entries against the file's
 * own tensor infos, each rank's bytes read against the covering-blocks
 * formula, and each rank's blocks decoded against the same columns of the
 * whole tensor (golden flux2-gguf files at tp 1 and 2: half-block shards;
 * a sparse klein-4B-shaped file at tp 8: 1.5 blocks). */
#include "test.h"
#include "gguf_twin.h"
#include "core/formats/checkpoint.h"
#include "core/formats/gguf.h"
#include "core/formats/weights.h"
#include "core/models/flux2/flux2.h"
#include "core/models/model_plan.h"
#include "kernels/cpu/cpu_rows.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *k_variants[] = {"Q8_0", "Q4_K", "mixed"};

static char *golden_transformer(const char *v) { return xasprintf("%s/flux2-gguf/%s/transformer", test_golden_dir(), v); }

/* Bytes rank `rank` must read for tensor ti: whole-row pieces their rows,
 * column pieces R x (ceil(c1/bs) - floor(c0/bs)) x block bytes per row;
 * plain dtypes width x height x element size (from the plan's pieces). */
static uint64_t formula_bytes(const st_tensor_info *ti, const shard_info *si, int tp, int rank) {
    shard_piece pc[PLAN_MAX_PIECES];
    int np = plan_shard_pieces(si, tp, rank, pc);
    uint64_t b = 0;
    for (int i = 0; i < np; i++) {
        if (ti->dtype != DT_GGML) { b += (uint64_t)(pc[i].width * pc[i].height) * dtype_size(ti->dtype); continue; }
        const quant_type *qt = quant_type_get(ti->qtype);
        int64_t cols = si->global_cols, bs = qt->block;
        if (pc[i].src_off % cols == 0 && pc[i].width % cols == 0) {
            b += (uint64_t)(pc[i].height * (pc[i].width / cols) * (cols / bs) * qt->bytes);
        } else {
            int64_t c0 = pc[i].src_off % cols, c1 = c0 + pc[i].width;
            b += (uint64_t)(pc[i].height * ((c1 + bs - 1) / bs - c0 / bs) * qt->bytes);
        }
    }
    return b;
}

static int open_plan(const char *dir, int tp, checkpoint **c, json_t **cfg, component_plan *cp) {
    if (checkpoint_open(dir, c)) return -1;
    *cfg = flux2_config_from_bfl(*c);
    if (!*cfg) return -1;
    return plan_for_component("transformer", *cfg, *c, tp, cp) < 0 ? -1 : 0;
}

/* The checkpoint lists every GGUF tensor as the file does: row-major shape,
 * plain dtypes for F32/F16/BF16, DT_GGML + the type id for blocks, the same
 * byte range; it is BFL and its derived config is the golden model's. */
TEST(gguf_checkpoint_entries) {
    json_error_t je;
    char *jp = xasprintf("%s/flux2-gguf/gguf.json", test_golden_dir());
    json_t *gj = json_load_file(jp, 0, &je);
    REQUIRE(gj, "%s: %s", jp, je.text);
    for (int v = 0; v < 3; v++) {
        char *dir = golden_transformer(k_variants[v]);
        char *file = xasprintf("%s/flux2-tiny-%s.gguf", dir, k_variants[v]);
        checkpoint *c;
        gguf_file *g;
        REQUIRE(checkpoint_open(dir, &c) == 0, "%s", tp_error_msg());
        REQUIRE(gguf_open(file, &g) == 0, "%s", tp_error_msg());
        CHECK(c->n == g->n && checkpoint_is_bfl(c), "%s: %d entries of %d, bfl %d", dir, c->n, g->n, checkpoint_is_bfl(c));
        json_t *types = json_object_get(json_object_get(json_object_get(gj, "variants"), k_variants[v]), "types");
        for (int i = 0; i < g->n; i++) {
            const gguf_tensor *t = &g->tensors[i];
            const st_tensor_info *e = checkpoint_find(c, t->name, NULL);
            REQUIRE(e, "%s: %s not listed", dir, t->name);
            int same = e->ndim == t->ndim && e->begin == t->begin && e->end == t->end;
            for (int d = 0; d < t->ndim; d++) same &= e->shape[d] == t->ne[t->ndim - 1 - d];
            const char *jt = json_string_value(json_object_get(types, t->name));
            const char *et = e->dtype == DT_GGML ? quant_type_name(e->qtype) : dtype_name(e->dtype);
            CHECK(same && jt && !strcmp(jt, et), "%s: %s is %s [%lld, ...], the file says %s", dir, t->name, et,
                  (long long)e->shape[0], jt ? jt : "?");
        }
        json_t *cfg = flux2_config_from_bfl(c), *want = json_object_get(gj, "config");
        REQUIRE(cfg, "%s", tp_error_msg());
        const char *keys[] = {"num_layers", "num_single_layers", "attention_head_dim", "num_attention_heads",
                              "joint_attention_dim", "in_channels"};
        for (int k = 0; k < 6; k++)
            CHECK(json_integer_value(json_object_get(cfg, keys[k])) == json_integer_value(json_object_get(want, keys[k])),
                  "%s: derived %s %lld, golden %lld", dir, keys[k], (long long)json_integer_value(json_object_get(cfg, keys[k])),
                  (long long)json_integer_value(json_object_get(want, keys[k])));
        json_decref(cfg);
        gguf_close(g);
        checkpoint_close(c);
        free(dir), free(file);
    }
    json_decref(gj);
    free(jp);
}

/* Compare rank `rank`'s loaded shard of every block tensor with the same
 * rows and columns decoded from the whole tensor, bit for bit. */
static void check_blocks(const char *file, const checkpoint *c, const plan *p, const weights *w, int tp, int rank) {
    gguf_file *g;
    REQUIRE(gguf_open(file, &g) == 0, "%s", tp_error_msg());
    for (int k = 0; k < c->n; k++) {
        const st_tensor_info *ti = c->infos[k];
        const tensor *t = weights_get(w, ti->name);
        if (ti->dtype != DT_GGML || !t) continue;
        CHECK(t->dtype == DT_GGML && t->qtype == ti->qtype, "%s: loaded as %s", ti->name, dtype_name(t->dtype));
        shard_info si;
        REQUIRE(plan_shard(p, st_plan_tensor(ti), tp, &si) == 0, "%s", tp_error_msg());
        shard_piece pc[PLAN_MAX_PIECES];
        int np = plan_shard_pieces(&si, tp, rank, pc);
        int64_t cols = si.global_cols, lcols = si.local_cols;
        const gguf_tensor *gt = gguf_find(g, ti->name);
        float *got = xmalloc((size_t)lcols * sizeof(float)), *want = xmalloc((size_t)cols * sizeof(float));
        int bad = 0;
        for (int i = 0; i < np && !bad; i++) {
            int whole = pc[i].width % cols == 0 && pc[i].src_off % cols == 0;
            int64_t runs = whole ? pc[i].width / cols : pc[i].height, c0 = whole ? 0 : pc[i].src_off % cols;
            int64_t n = whole ? cols : pc[i].width, lc0 = whole ? 0 : pc[i].dst_off % lcols;
            for (int64_t r = 0; r < runs && !bad; r++) {
                int64_t grow = pc[i].src_off / cols + (whole ? r : r * (pc[i].src_pitch / cols));
                int64_t lrow = pc[i].dst_off / lcols + r;
                REQUIRE(gguf_read_f32_block(g, gt, grow, grow + 1, c0, c0 + n, want, NULL) == 0, "%s", tp_error_msg());
                const float *v = row_f32_weight(t, lrow, lc0, n, got);
                bad = memcmp(v, want, (size_t)n * sizeof(float)) != 0;
                CHECK(!bad, "%s tp %d rank %d: local row %lld columns [%lld, +%lld) differ from file row %lld [%lld, ...)",
                      ti->name, tp, rank, (long long)lrow, (long long)lc0, (long long)n, (long long)grow, (long long)c0);
            }
        }
        free(got), free(want);
    }
    gguf_close(g);
}

/* Every rank of tp 1 and 2 (2 heads: tp 4 is refused by the plan; Q4_K
 * loaded through the mmap path, the others with pread) reads exactly the
 * formula's bytes, estimates them, holds them, and its blocks
 * decode to the file's values at its columns. */
TEST(gguf_load_golden_shards) {
    backend *be = backend_cpu_create(1);
    for (int v = 0; v < 3; v++)
        for (int tp = 1; tp <= 2; tp++)
            for (int rank = 0; rank < tp; rank++) {
                char *dir = golden_transformer(k_variants[v]);
                char *file = xasprintf("%s/flux2-tiny-%s.gguf", dir, k_variants[v]);
                checkpoint *c;
                json_t *cfg;
                component_plan cp;
                REQUIRE(open_plan(dir, tp, &c, &cfg, &cp) == 0, "%s", tp_error_msg());
                uint64_t want = 0, want_ggml = 0;
                for (int k = 0; k < c->n; k++) {
                    shard_info si;
                    REQUIRE(plan_shard(&cp.p, st_plan_tensor(c->infos[k]), tp, &si) == 0, "%s", tp_error_msg());
                    uint64_t b = formula_bytes(c->infos[k], &si, tp, rank);
                    want += b;
                    if (c->infos[k]->dtype == DT_GGML) want_ggml += b;
                }
                load_estimate est;
                REQUIRE(weights_estimate(c, &cp.p, tp, rank, &est) == 0, "%s", tp_error_msg());
                /* the Q4_K file through the mmap path, the others through pread */
                load_opts o = {.tp = tp, .rank = rank, .be = be, .dtype = DT_F32, .use_mmap = v == 1};
                weights *w;
                load_stats st;
                REQUIRE(weights_load(c, &cp.p, &o, &w, &st) == 0, "%s", tp_error_msg());
                CHECK(st.bytes_read == want && est.bytes_replicated + est.bytes_sharded == want,
                      "%s tp %d rank %d: read %llu, estimated %llu, formula %llu", k_variants[v], tp, rank,
                      (unsigned long long)st.bytes_read, (unsigned long long)(est.bytes_replicated + est.bytes_sharded),
                      (unsigned long long)want);
                uint64_t held = 0;
                for (int i = 0; i < weights_count(w); i++) {
                    const tensor *t = weights_get(w, weights_name(w, i));
                    if (t->dtype == DT_GGML) held += tensor_nbytes(t);
                }
                CHECK(held == want_ggml, "%s tp %d rank %d: block tensors hold %llu bytes, their covering blocks are %llu",
                      k_variants[v], tp, rank, (unsigned long long)held, (unsigned long long)want_ggml);
                check_blocks(file, c, &cp.p, w, tp, rank);
                weights_free(w);
                component_plan_free(&cp);
                json_decref(cfg);
                checkpoint_close(c);
                free(dir), free(file);
            }
    backend_destroy(be);
}

static int want_blocks(const char *name, void *ctx) { (void)ctx; return strstr(name, "blocks.") != NULL; }

/* A sparse klein-4B-shaped BFL file (D 3072 = 24 heads x 128, MLP 9216,
 * joint 7680): at tp 8 a row-parallel shard is 384 columns, 1.5 Q4_K
 * blocks, so each rank reads 2 blocks a row; every rank's estimate is the
 * formula, and ranks 0 and 1 load exactly it. */
TEST(gguf_load_klein_tp8_sparse) {
    enum { D = 3072, M = 9216, J = 7680, T = 256, C = 128 };
    gguf_write_tensor t[] = {
        {"img_in.weight", QUANT_F16, 2, {C, D, 1, 1}, NULL},
        {"txt_in.weight", QUANT_Q8_0, 2, {J, D, 1, 1}, NULL},
        {"time_in.in_layer.weight", QUANT_Q8_0, 2, {T, D, 1, 1}, NULL},
        {"time_in.out_layer.weight", QUANT_Q8_0, 2, {D, D, 1, 1}, NULL},
        {"double_stream_modulation_img.lin.weight", QUANT_Q8_0, 2, {D, 6 * D, 1, 1}, NULL},
        {"double_stream_modulation_txt.lin.weight", QUANT_Q8_0, 2, {D, 6 * D, 1, 1}, NULL},
        {"single_stream_modulation.lin.weight", QUANT_Q8_0, 2, {D, 3 * D, 1, 1}, NULL},
        {"final_layer.adaLN_modulation.1.weight", QUANT_Q8_0, 2, {D, 2 * D, 1, 1}, NULL},
        {"final_layer.linear.weight", QUANT_Q8_0, 2, {D, C, 1, 1}, NULL},
        {"double_blocks.0.img_attn.qkv.weight", QUANT_Q4_K, 2, {D, 3 * D, 1, 1}, NULL},
        {"double_blocks.0.img_attn.proj.weight", QUANT_Q4_K, 2, {D, D, 1, 1}, NULL},
        {"double_blocks.0.img_attn.norm.query_norm.scale", QUANT_F32, 1, {128, 1, 1, 1}, NULL},
        {"double_blocks.0.img_attn.norm.key_norm.scale", QUANT_F32, 1, {128, 1, 1, 1}, NULL},
        {"double_blocks.0.img_mlp.0.weight", QUANT_Q4_K, 2, {D, 2 * M, 1, 1}, NULL},
        {"double_blocks.0.img_mlp.2.weight", QUANT_Q6_K, 2, {M, D, 1, 1}, NULL},
        {"double_blocks.0.txt_attn.qkv.weight", QUANT_Q4_K, 2, {D, 3 * D, 1, 1}, NULL},
        {"double_blocks.0.txt_attn.proj.weight", QUANT_Q4_K, 2, {D, D, 1, 1}, NULL},
        {"double_blocks.0.txt_attn.norm.query_norm.scale", QUANT_F32, 1, {128, 1, 1, 1}, NULL},
        {"double_blocks.0.txt_attn.norm.key_norm.scale", QUANT_F32, 1, {128, 1, 1, 1}, NULL},
        {"double_blocks.0.txt_mlp.0.weight", QUANT_Q4_K, 2, {D, 2 * M, 1, 1}, NULL},
        {"double_blocks.0.txt_mlp.2.weight", QUANT_Q6_K, 2, {M, D, 1, 1}, NULL},
        {"single_blocks.0.linear1.weight", QUANT_Q4_K, 2, {D, 3 * D + 2 * M, 1, 1}, NULL},
        {"single_blocks.0.linear2.weight", QUANT_Q4_K, 2, {D + M, D, 1, 1}, NULL},
        {"single_blocks.0.norm.query_norm.scale", QUANT_F32, 1, {128, 1, 1, 1}, NULL},
        {"single_blocks.0.norm.key_norm.scale", QUANT_F32, 1, {128, 1, 1, 1}, NULL},
    };
    int n = (int)(sizeof t / sizeof t[0]), tp = 8;
    char *dir = xasprintf("%s/klein-gguf", test_tmp_dir());
    mkdir(dir, 0755);
    char *p = xasprintf("%s/flux2-klein-4b-Q4_K.gguf", dir);
    gguf_kv kv = {"general.architecture", {.type = GGUF_STRING, .str = {4, "flux"}}};
    REQUIRE(gguf_write(p, &kv, 1, t, n, NULL, NULL) == 0, "%s", tp_error_msg());
    checkpoint *c;
    json_t *cfg;
    component_plan cp;
    REQUIRE(open_plan(dir, tp, &c, &cfg, &cp) == 0, "%s", tp_error_msg());
    CHECK(json_integer_value(json_object_get(cfg, "num_attention_heads")) == 24, "derived heads");
    backend *be = backend_cpu_create(1);
    for (int rank = 0; rank < tp; rank++) {
        uint64_t want = 0, want_blk = 0;
        for (int k = 0; k < c->n; k++) {
            shard_info si;
            REQUIRE(plan_shard(&cp.p, st_plan_tensor(c->infos[k]), tp, &si) == 0, "%s", tp_error_msg());
            uint64_t b = formula_bytes(c->infos[k], &si, tp, rank);
            want += b;
            if (want_blocks(c->infos[k]->name, NULL)) want_blk += b;
            if (!strcmp(c->infos[k]->name, "double_blocks.0.img_attn.proj.weight"))   /* 384 columns: 2 blocks a row */
                CHECK(b == (uint64_t)D * 2 * 144, "proj rank %d: %llu bytes", rank, (unsigned long long)b);
        }
        load_estimate est;
        REQUIRE(weights_estimate(c, &cp.p, tp, rank, &est) == 0, "%s", tp_error_msg());
        CHECK(est.bytes_replicated + est.bytes_sharded == want, "tp 8 rank %d: estimate %llu, formula %llu", rank,
              (unsigned long long)(est.bytes_replicated + est.bytes_sharded), (unsigned long long)want);
        if (rank > 1) continue;
        load_opts o = {.tp = tp, .rank = rank, .be = be, .dtype = DT_BF16, .want = want_blocks};
        weights *w;
        load_stats st;
        REQUIRE(weights_load(c, &cp.p, &o, &w, &st) == 0, "%s", tp_error_msg());
        CHECK(st.bytes_read == want_blk, "tp 8 rank %d: read %llu, formula %llu", rank, (unsigned long long)st.bytes_read,
              (unsigned long long)want_blk);
        check_blocks(p, c, &cp.p, w, tp, rank);
        weights_free(w);
    }
    backend_destroy(be);
    component_plan_free(&cp);
    json_decref(cfg);
    checkpoint_close(c);
    unlink(p);
    rmdir(dir);
    free(p), free(dir);
}

/* A block type tpgen cannot decode is refused when the folder opens,
 * naming the tensor and the type. */
TEST(gguf_checkpoint_refuses_type) {
    char *dir = xasprintf("%s/q81", test_tmp_dir());
    mkdir(dir, 0755);
    char *p = xasprintf("%s/model.gguf", dir);
    gguf_write_tensor t[] = {{"img_in.weight", QUANT_F32, 2, {64, 256, 1, 1}, NULL},
                             {"txt_in.weight", QUANT_Q8_1, 2, {256, 256, 1, 1}, NULL}};
    REQUIRE(gguf_write(p, NULL, 0, t, 2, NULL, NULL) == 0, "%s", tp_error_msg());
    checkpoint *c = NULL;
    int rc = checkpoint_open(dir, &c);
    CHECK(rc != 0 && strstr(tp_error_msg(), "txt_in.weight") && strstr(tp_error_msg(), "Q8_1"),
          "rc %d: %s", rc, tp_error_msg());
    checkpoint_close(c);
    unlink(p);
    rmdir(dir);
    free(p), free(dir);
}

/* The dequantised twin of a golden GGUF file: every tensor as F32 with the
 * values gguf_read_f32 gives (bit-identical to gguf-py's dequantiser), same
 * names, one safetensors file. With TPGEN_GGUF_TWIN_OUT=DIR (and
 * TPGEN_GGUF_TWIN_VARIANT) it writes DIR/flux2-tiny-twin.safetensors for
 * tests/sh/gguf_check.sh, whose generate runs compare the two folders. */
TEST(gguf_write_dequantised_twin) {
    const char *env = getenv("TPGEN_GGUF_TWIN_OUT"), *var = getenv("TPGEN_GGUF_TWIN_VARIANT");
    if (!var || !*var) var = "mixed";
    char *dir = env ? xstrdup(env) : xasprintf("%s/twin", test_tmp_dir());
    mkdir(dir, 0755);
    char *src = xasprintf("%s/flux2-gguf/%s/transformer/flux2-tiny-%s.gguf", test_golden_dir(), var, var);
    gguf_file *g;
    REQUIRE(gguf_open(src, &g) == 0, "%s", tp_error_msg());
    float **vals = xcalloc((size_t)g->n, sizeof *vals);
    char *out = xasprintf("%s/flux2-tiny-twin.safetensors", dir);
    int rc = gguf_twin_write(src, out);
    CHECK(rc == 0, "%s", tp_error_msg());
    for (int i = 0; i < g->n && !rc; i++) {
        const gguf_tensor *gt;
        rc = gguf_read_f32(g, g->tensors[i].name, &vals[i], &gt);
    }
    /* the twin reads back as the same values */
    st_file *f = NULL;
    for (int i = 0; !rc && i < g->n && st_open(out, &f) == 0; i++) {
        float *back;
        const st_tensor_info *info;
        REQUIRE(st_read_f32(f, g->tensors[i].name, &back, &info) == 0, "%s", tp_error_msg());
        CHECK(!memcmp(back, vals[i], (size_t)st_numel(info) * sizeof(float)), "%s differs", g->tensors[i].name);
        free(back);
        st_close(f), f = NULL;
    }
    for (int i = 0; i < g->n; i++) free(vals[i]);
    free(vals), free(out), free(src), free(dir);
    gguf_close(g);
}

/* The weight scan (inspect --scan-weights, check) decodes GGUF blocks: an
 * Inf f16 scale in block 3 of a Q8_0 row is found at element 96 and named;
 * the same file with finite scales is clean. */
TEST(gguf_scan_finite_blocks) {
    enum { COLS = 256, ROWS = 4 };
    static uint8_t q8[ROWS * COLS / 32 * 34];
    for (size_t b = 0; b < sizeof q8 / 34; b++) {
        uint16_t d = f32_to_f16(0.01f);
        memcpy(q8 + b * 34, &d, 2);
        for (int i = 0; i < 32; i++) q8[b * 34 + 2 + i] = (uint8_t)(i * 7);
    }
    for (int bad = 0; bad < 2; bad++) {
        if (bad) { uint16_t inf = 0x7c00; memcpy(q8 + 3 * 34, &inf, 2); }
        char *dir = xasprintf("%s/scan%d", test_tmp_dir(), bad);
        mkdir(dir, 0755);
        char *p = xasprintf("%s/model.gguf", dir);
        gguf_write_tensor t[] = {{"w.weight", QUANT_Q8_0, 2, {COLS, ROWS, 1, 1}, q8}};
        REQUIRE(gguf_write(p, NULL, 0, t, 1, NULL, NULL) == 0, "%s", tp_error_msg());
        checkpoint *c;
        REQUIRE(checkpoint_open(dir, &c) == 0, "%s", tp_error_msg());
        int n = checkpoint_scan_finite(c, 0);
        if (bad) CHECK(n == 1 && strstr(tp_error_msg(), "w.weight") && strstr(tp_error_msg(), "element 96"), "scan %d: %s", n, tp_error_msg());
        else CHECK(n == 0, "clean file: scan %d", n);
        checkpoint_close(c);
        unlink(p), rmdir(dir);
        free(p), free(dir);
    }
}
