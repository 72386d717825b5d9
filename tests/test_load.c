/* Sharded loading of the golden tiny FLUX.2 checkpoint (BF16, two shards,
 * tensors shuffled): every local tensor must equal the slice of the full
 * tensor that docs/spec/flux2-transformer.md §7.2 assigns to the rank. The
 * expected slices are cut here from whole tensors read with st_read_raw,
 * with the spec's row/column ranges written out independently of the
 * plan engine. */
#include "core/models/model_plan.h"
#include "test.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "core/formats/weights.h"
#include "kernels/ops.h"
#include <fcntl.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *tiny_dir(void) { return xasprintf("%s/flux2-tiny-a/model", test_golden_dir()); }

typedef struct tiny {
    model_dir *m;
    json_t *cfg;
    checkpoint *c;
    plan p;
    int64_t D, M;
} tiny;

static int tiny_open(tiny *t) {
    memset(t, 0, sizeof *t);
    char *dir = tiny_dir(), *tdir = xasprintf("%s/transformer", dir);
    int rc = model_dir_open(dir, &t->m);
    if (!rc) rc = (t->cfg = model_dir_config(t->m, "transformer")) ? 0 : -1;
    if (!rc) rc = plan_flux2(t->cfg, &t->p);
    if (!rc) rc = checkpoint_open(tdir, &t->c);
    if (!rc) {
        t->D = json_integer_value(json_object_get(t->cfg, "num_attention_heads")) *
               json_integer_value(json_object_get(t->cfg, "attention_head_dim"));
        t->M = 3 * t->D;   /* mlp_ratio 3.0 in this config */
    }
    free(dir), free(tdir);
    return rc;
}

static void tiny_close(tiny *t) {
    checkpoint_close(t->c);
    json_decref(t->cfg);
    model_dir_close(t->m);
}

static int ends(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* The spec's partition of a tensor: which dim is split (0 rows, 1 cols,
 * -1 replicated) and into which blocks. */
static int spec_partition(const tiny *t, const char *name, int64_t rows, int64_t cols, int64_t *blocks, int *nb) {
    static const char *col[] = {".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight",
                                ".attn.add_q_proj.weight", ".attn.add_k_proj.weight", ".attn.add_v_proj.weight"};
    static const char *row[] = {".attn.to_out.0.weight", ".attn.to_add_out.weight", ".ff.linear_out.weight",
                                ".ff_context.linear_out.weight"};
    int dbl = !strncmp(name, "transformer_blocks.", 19), sgl = !strncmp(name, "single_transformer_blocks.", 26);
    *nb = 1;
    for (int i = 0; dbl && i < 6; i++) if (ends(name, col[i])) { blocks[0] = rows; return 0; }
    for (int i = 0; dbl && i < 4; i++) if (ends(name, row[i])) { blocks[0] = cols; return 1; }
    if (dbl && (ends(name, ".ff.linear_in.weight") || ends(name, ".ff_context.linear_in.weight"))) {
        *nb = 2, blocks[0] = blocks[1] = rows / 2;
        return 0;
    }
    if (sgl && ends(name, ".attn.to_qkv_mlp_proj.weight")) {
        *nb = 5, blocks[0] = blocks[1] = blocks[2] = t->D, blocks[3] = blocks[4] = t->M;
        return 0;
    }
    if (sgl && ends(name, ".attn.to_out.weight")) {
        *nb = 2, blocks[0] = t->D, blocks[1] = t->M;
        return 1;
    }
    return -1;
}

/* Cut rank k's slice of the full [rows, cols] tensor (element size es). */
static char *spec_slice(const char *full, int64_t rows, int64_t cols, size_t es, int dim, const int64_t *b, int nb,
                        int tp, int k, size_t *nbytes) {
    char *out = xmalloc((size_t)(rows * cols) * es + 1), *o = out;
    if (dim < 0) {
        memcpy(out, full, (size_t)(rows * cols) * es);
        o += (size_t)(rows * cols) * es;
    } else if (dim == 0) {
        int64_t start = 0;
        for (int j = 0; j < nb; start += b[j++])
            for (int64_t r = start + k * b[j] / tp; r < start + (k + 1) * b[j] / tp; r++, o += (size_t)cols * es)
                memcpy(o, full + (size_t)(r * cols) * es, (size_t)cols * es);
    } else {
        for (int64_t r = 0; r < rows; r++) {
            int64_t start = 0;
            for (int j = 0; j < nb; start += b[j++])
                for (int64_t cc = start + k * b[j] / tp; cc < start + (k + 1) * b[j] / tp; cc++, o += es)
                    memcpy(o, full + (size_t)(r * cols + cc) * es, es);
        }
    }
    *nbytes = (size_t)(o - out);
    return out;
}

/* Load rank k of tp onto backend be and compare every tensor bit for bit
 * (BF16) or with the exact upcast (F32). Also checks the byte accounting. */
static void check_rank_be(tiny *t, backend *be, int tp, int k, dtype_t dt, int use_mmap, size_t cap, int threads) {
    load_opts o = {.tp = tp, .rank = k, .be = be, .dtype = dt, .use_mmap = use_mmap, .staging_cap = cap,
                   .io_threads = threads};
    weights *w;
    load_stats st;
    REQUIRE(weights_load(t->c, &t->p, &o, &w, &st) == 0, "weights_load tp %d rank %d: %s", tp, k, tp_error_msg());
    uint64_t rep = 0, shard = 0;
    CHECK(weights_count(w) == t->c->n, "loaded %d of %d tensors", weights_count(w), t->c->n);
    for (int i = 0; i < t->c->n && !test_failed(); i++) {
        const st_file *f;
        const st_tensor_info *ti = t->c->infos[i];
        checkpoint_find(t->c, ti->name, &f);
        int64_t rows = ti->ndim == 2 ? ti->shape[0] : 1, cols = ti->ndim == 2 ? ti->shape[1] : ti->shape[0];
        char *full = xmalloc((size_t)(ti->end - ti->begin));
        REQUIRE(st_read_raw(f, ti, full) == 0, "%s", tp_error_msg());
        int64_t b[8];
        int nb, dim = spec_partition(t, ti->name, rows, cols, b, &nb);
        size_t n;
        char *want = spec_slice(full, rows, cols, 2, dim, b, nb, tp, k, &n);
        *(dim < 0 ? &rep : &shard) += (uint64_t)(ti->end - ti->begin);
        const tensor *x = weights_get(w, ti->name);
        REQUIRE(x, "%s not loaded", ti->name);
        int64_t lr = dim == 0 ? rows / tp : rows, lc = dim == 1 ? cols / tp : cols;
        CHECK(x->rows == lr && x->cols == lc && x->dtype == dt, "%s: local [%lld, %lld] %s, want [%lld, %lld]",
              ti->name, (long long)x->rows, (long long)x->cols, dtype_name(x->dtype), (long long)lr, (long long)lc);
        if (dt == DT_BF16) {
            CHECK(tensor_nbytes(x) == n && !memcmp(x->data, want, n), "%s: tp %d rank %d slice differs", ti->name, tp, k);
        } else {
            const uint16_t *h = (const uint16_t *)want;
            const float *y = x->data;
            for (size_t e = 0; e < n / 2; e++)
                if (y[e] != bf16_to_f32(h[e])) { CHECK(0, "%s: element %zu %g != %g", ti->name, e, y[e], bf16_to_f32(h[e])); break; }
        }
        free(full), free(want);
    }
    CHECK(shard % (uint64_t)tp == 0, "sharded bytes %llu not divisible", (unsigned long long)shard);
    CHECK(st.bytes_read == rep + shard / (uint64_t)tp, "rank %d read %llu bytes, expected %llu + %llu/%d", k,
          (unsigned long long)st.bytes_read, (unsigned long long)rep, (unsigned long long)shard, tp);
    CHECK(st.bytes_replicated == rep && st.bytes_sharded == shard / (uint64_t)tp, "byte split wrong");
    CHECK(cap == 0 || st.max_staging <= 3 * cap, "staging %llu above cap %zu", (unsigned long long)st.max_staging, cap);
    weights_free(w);
}

static void check_rank_t(tiny *t, int tp, int k, dtype_t dt, int use_mmap, size_t cap, int threads) {
    backend *be = backend_cpu_create(1);
    check_rank_be(t, be, tp, k, dt, use_mmap, cap, threads);
    backend_destroy(be);
}

static void check_rank(tiny *t, int tp, int k, dtype_t dt, int use_mmap, size_t cap) {
    check_rank_t(t, tp, k, dt, use_mmap, cap, 1);
}

/* Each MPI rank loads its own shard at tp = world size. */
TEST_MPI(load_tiny_golden_tp_world) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    tiny t;
    REQUIRE(tiny_open(&t) == 0, "%s", tp_error_msg());
    check_rank(&t, size, rank, DT_BF16, 0, 0);
    check_rank(&t, size, rank, DT_F32, 0, 0);
    tiny_close(&t);
}

/* Every rank of tp 1, 2, 4 in one process, through each read path:
 * direct pread, mmap, and the staged path with a tiny staging bound
 * (forces chunked runs and row batches). */
TEST(load_tiny_golden_all_paths) {
    tiny t;
    REQUIRE(tiny_open(&t) == 0, "%s", tp_error_msg());
    for (int tp = 1; tp <= 4; tp *= 2)
        for (int k = 0; k < tp; k++) {
            check_rank(&t, tp, k, DT_BF16, 1, 0);
            check_rank(&t, tp, k, DT_F32, k & 1, 100);
            check_rank(&t, tp, k, DT_F32, 0, 4096);
            check_rank_t(&t, tp, k, DT_BF16, k & 1, 0, 3);   /* parallel in-place reads */
        }
    tiny_close(&t);
}

static int only_single(const char *name, void *ctx) { return !strncmp(name, "single_transformer_blocks.", 26); }

TEST(load_filter_and_req) {
    tiny t;
    REQUIRE(tiny_open(&t) == 0, "%s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    load_opts o = {.tp = 2, .rank = 1, .be = be, .dtype = DT_F32};
    weights *w;
    REQUIRE(weights_load(t.c, &t.p, &o, &w, NULL) == 0, "%s", tp_error_msg());
    CHECK(weights_req(w, "single_transformer_blocks.%d.attn.to_out.weight", 2) != NULL, "req failed");
    CHECK(weights_req(w, "single_transformer_blocks.%d.attn.to_out.weight", 9) == NULL &&
              strstr(tp_error_msg(), "single_transformer_blocks.9.attn.to_out.weight"), "missing tensor: %s",
          tp_error_msg());
    const st_tensor_info *gi = weights_info(w, "single_transformer_blocks.0.attn.to_out.weight");
    CHECK(gi && gi->shape[0] == t.D && gi->shape[1] == t.D + t.M, "global info");
    weights_free(w);
    /* the filter: only the single-stream blocks */
    o.want = only_single;
    load_stats st;
    REQUIRE(weights_load(t.c, &t.p, &o, &w, &st) == 0, "%s", tp_error_msg());
    int expect = 0;
    for (int i = 0; i < t.c->n; i++) expect += only_single(t.c->infos[i]->name, NULL);
    CHECK(expect == 12 && weights_count(w) == expect && st.n_tensors == expect, "filter kept %d of %d", weights_count(w), expect);
    CHECK(weights_get(w, "proj_out.weight") == NULL, "filtered tensor loaded");
    weights_free(w);
    backend_destroy(be);
    tiny_close(&t);
}

/* A failure on one rank (here the last one opens a truncated copy of a
 * shard) makes every rank fail, with the message naming that rank. */
TEST_MPI(load_error_agreement) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char *dir = tiny_dir(), *good = xasprintf("%s/transformer", dir), *bad = xasprintf("%s/bad-tr", test_tmp_dir());
    char *cmd = xasprintf("rm -rf %s && cp -r %s %s && chmod -R u+w %s && truncate -s 100000 "
                          "%s/diffusion_pytorch_model-00002-of-00002.safetensors", bad, good, bad, bad, bad);
    int failing = size - 1, rc = 0;
    if (rank == failing) rc = system(cmd) == 0 ? 0 : tp_error("could not prepare %s", bad);
    checkpoint *c = NULL;
    if (!rc) rc = checkpoint_open(rank == failing ? bad : good, &c);
    int agreed = dist_agree(MPI_COMM_WORLD, rc);
    CHECK(agreed == -1, "rank %d: dist_agree returned %d", rank, agreed);
    char want[32];
    snprintf(want, sizeof want, "rank %d: ", failing);
    if (size > 1) CHECK(strstr(tp_error_msg(), want) == tp_error_msg(), "message '%s' lacks '%s'", tp_error_msg(), want);
    CHECK(strstr(tp_error_msg(), "00002-of-00002") != NULL, "message '%s' does not name the file", tp_error_msg());
    checkpoint_close(c);
    free(dir), free(good), free(bad), free(cmd);
}

/* A tp that does not divide the heads fails on every rank before any
 * byte is read. */
TEST(bad_load_tp_not_dividing_heads) {
    tiny t;
    REQUIRE(tiny_open(&t) == 0, "%s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    load_opts o = {.tp = 3, .rank = 0, .be = be, .dtype = DT_BF16};
    weights *w = NULL;
    load_stats st;
    CHECK(weights_load(t.c, &t.p, &o, &w, &st) == -1 && w == NULL, "tp 3 accepted");
    CHECK(strstr(tp_error_msg(), "tp 3 does not divide num_attention_heads (4)") &&
              strstr(tp_error_msg(), "valid tp values: 1, 2, 4"), "message: %s", tp_error_msg());
    CHECK(st.bytes_read == 0, "read %llu bytes before failing", (unsigned long long)st.bytes_read);
    backend_destroy(be);
    tiny_close(&t);
}

/* ---- checkpoint folders ---- */

/* A writable copy of the golden transformer folder with its index edited:
 * weight_map[name] = file (file NULL: leave it). */
static char *edited_copy(const char *tag, const char *name, const char *file) {
    char *dir = tiny_dir(), *dst = xasprintf("%s/%s", test_tmp_dir(), tag);
    char *cmd = xasprintf("rm -rf %s && cp -r %s/transformer %s && chmod -R u+w %s", dst, dir, dst, dst);
    if (system(cmd)) tp_fatal("cannot copy the golden folder");
    char *idx = xasprintf("%s/diffusion_pytorch_model.safetensors.index.json", dst);
    json_t *j = json_load_file(idx, 0, NULL);
    if (name) json_object_set_new(json_object_get(j, "weight_map"), name, json_string(file));
    json_dump_file(j, idx, 0);
    json_decref(j);
    free(dir), free(cmd), free(idx);
    return dst;
}

TEST(load_checkpoint_index_vs_single) {
    char *dst = edited_copy("ckpt-ok", NULL, NULL);
    checkpoint *c;
    REQUIRE(checkpoint_open(dst, &c) == 0, "%s", tp_error_msg());
    CHECK(c->n_files == 2, "files %d", c->n_files);
    const st_file *f;
    const st_tensor_info *t = checkpoint_find(c, "proj_out.weight", &f);
    CHECK(t && strstr(f->path, "00001-of-00002"), "proj_out.weight should be in shard 1 (as the index says)");
    checkpoint_close(c);
    /* a single file, written by st_write, found without an index */
    char *one = xasprintf("%s/single", test_tmp_dir()), *p = xasprintf("%s/model.safetensors", one);
    char *cmd = xasprintf("mkdir -p %s", one);
    CHECK(system(cmd) == 0, "mkdir");
    float v[2] = {1, 2};
    st_write_tensor w = {"x", DT_F32, 1, {2}, v};
    REQUIRE(st_write(p, &w, 1, NULL) == 0, "%s", tp_error_msg());
    REQUIRE(checkpoint_open(one, &c) == 0, "%s", tp_error_msg());
    CHECK(c->n == 1 && checkpoint_find(c, "x", NULL), "single file");
    checkpoint_close(c);
    free(dst), free(one), free(p), free(cmd);
}

TEST(bad_ckpt_index_names_missing_tensor) {
    char *dst = edited_copy("ckpt-tensor", "transformer_blocks.0.attn.to_q.weight",
                            "diffusion_pytorch_model-00002-of-00002.safetensors");
    checkpoint *c = NULL;
    CHECK(checkpoint_open(dst, &c) == -1 && c == NULL, "accepted");
    CHECK(strstr(tp_error_msg(), "tensor 'transformer_blocks.0.attn.to_q.weight' is listed in") &&
              strstr(tp_error_msg(), "missing from") && strstr(tp_error_msg(), "00002-of-00002"), "%s", tp_error_msg());
    free(dst);
}

TEST(bad_ckpt_index_names_missing_file) {
    char *dst = edited_copy("ckpt-file", "proj_out.weight", "diffusion_pytorch_model-00003-of-00003.safetensors");
    checkpoint *c = NULL;
    CHECK(checkpoint_open(dst, &c) == -1 && c == NULL, "accepted");
    CHECK(strstr(tp_error_msg(), "00003-of-00003.safetensors") && strstr(tp_error_msg(), "proj_out.weight") &&
              strstr(tp_error_msg(), "No such file"), "%s", tp_error_msg());
    free(dst);
}

TEST(bad_ckpt_folder_problems) {
    checkpoint *c = NULL;
    CHECK(checkpoint_open("/nonexistent/transformer", &c) == -1 && strstr(tp_error_msg(), "does not exist"), "%s",
          tp_error_msg());
    char *empty = xasprintf("%s/empty", test_tmp_dir()), *cmd = xasprintf("mkdir -p %s", empty);
    CHECK(system(cmd) == 0, "mkdir");
    CHECK(checkpoint_open(empty, &c) == -1 && strstr(tp_error_msg(), "has no *.safetensors"), "%s", tp_error_msg());
    model_dir *m = NULL;
    CHECK(model_dir_open("/nonexistent", &m) == -1 && strstr(tp_error_msg(), "--model"), "%s", tp_error_msg());
    REQUIRE(model_dir_open(empty, &m) == 0, "%s", tp_error_msg());
    CHECK(model_dir_config(m, "transformer") == NULL && strstr(tp_error_msg(), "config.json"), "%s", tp_error_msg());
    model_dir_close(m);
    free(empty), free(cmd);
}

/* GPU (run by `tpgen_tests --gpu` on a CUDA build): both load paths into
 * device memory give the same bytes as the CPU backend, for every rank of
 * tp 1, 2 and 4: BF16 goes through the backend's upload_file (pread into
 * the pinned ring + cudaMemcpy2DAsync; no loader staging at all), F32
 * (conversion) and BF16 with use_mmap through the staged upload/upload2d
 * path, with a small staging cap so long runs are chunked. */
TEST_GPU(gpu_load_tiny_golden_matches_cpu) {
    tiny t;
    REQUIRE(tiny_open(&t) == 0, "%s", tp_error_msg());
    backend *gpu = backend_cuda_create(0), *cpu = backend_cpu_create(1);
    REQUIRE(gpu, "no CUDA backend: %s", tp_error_msg());
    REQUIRE(gpu->vt->upload_file, "the CUDA backend has no upload_file");
    for (int tp = 1; tp <= 4; tp *= 2)
        for (int k = 0; k < tp; k++)
            for (int d = 0; d < 3; d++) {
                dtype_t dt = d == 1 ? DT_F32 : DT_BF16;
                load_opts oc = {.tp = tp, .rank = k, .be = cpu, .dtype = dt};
                load_opts og = {.tp = tp, .rank = k, .be = gpu, .dtype = dt, .staging_cap = 3000, .use_mmap = d == 2};
                weights *wc, *wg;
                load_stats sg;
                REQUIRE(weights_load(t.c, &t.p, &oc, &wc, NULL) == 0, "%s", tp_error_msg());
                REQUIRE(weights_load(t.c, &t.p, &og, &wg, &sg) == 0, "%s", tp_error_msg());
                CHECK((sg.max_staging == 0) == (d == 0), "tp %d rank %d path %d: loader staging %llu", tp, k, d,
                      (unsigned long long)sg.max_staging);
                for (int i = 0; i < weights_count(wc); i++) {
                    const tensor *a = weights_get(wc, weights_name(wc, i)), *b = weights_get(wg, weights_name(wc, i));
                    REQUIRE(b && b->rows == a->rows && b->cols == a->cols, "%s shape", weights_name(wc, i));
                    char *h = xmalloc(tensor_nbytes(b));
                    memset(h, 0xff, tensor_nbytes(b));
                    CHECK(tensor_download_raw(b, h) == 0 && !memcmp(h, a->data, tensor_nbytes(a)),
                          "%s tp %d rank %d path %d: GPU copy differs", weights_name(wc, i), tp, k, d);
                    free(h);
                }
                weights_free(wc);
                weights_free(wg);
            }
    backend_destroy(gpu);
    backend_destroy(cpu);
    tiny_close(&t);
}

/* Stored dtypes other than BF16: F32/F16/F64 tensors loaded as F32 (exact
 * for F32/F16; F64 rounded to f32) and as BF16 (rounded to nearest even
 * from the f32 value), integer tensors kept as they are; sharded through
 * the staged path with a default and a tiny staging cap. */
TEST(load_converts_dtypes) {
    enum { R = 8, C = 6 };
    float cw[R * C];
    uint16_t rw[4 * 8];
    double pw[8 * 4];
    int64_t ids[3] = {-5, 7, 1LL << 40};
    for (int i = 0; i < R * C; i++) cw[i] = (float)rand() / RAND_MAX * 3 - 1.5f;
    for (int i = 0; i < 32; i++) rw[i] = f32_to_f16((float)rand() / RAND_MAX - 0.5f), pw[i] = (double)rand() / RAND_MAX - 0.3;
    st_write_tensor wt[] = {{"c.w", DT_F32, 2, {R, C}, cw}, {"r.w", DT_F16, 2, {4, 8}, rw},
                            {"p.w", DT_F64, 2, {8, 4}, pw}, {"ids", DT_I64, 1, {3}, ids}};
    char *dir = xasprintf("%s/dtypes", test_tmp_dir()), *cmd = xasprintf("mkdir -p %s", dir);
    char *path = xasprintf("%s/model.safetensors", dir);
    REQUIRE(system(cmd) == 0 && st_write(path, wt, 4, NULL) == 0, "%s", tp_error_msg());
    static const plan_rule rules[] = {{"c.w", STYLE_COLWISE, NULL, NULL}, {"r.w", STYLE_ROWWISE, NULL, NULL},
                                      {"p.w", STYLE_PACKED_COLWISE, "1,3", NULL}};
    plan p = {.model = "test", .rules = rules, .n_rules = 3};
    checkpoint *c;
    REQUIRE(checkpoint_open(dir, &c) == 0, "%s", tp_error_msg());
    /* rank 1 of tp 2, by hand: c rows 4..7; r cols 4..7 of each row; p rows 1 and 2+3..5 */
    float want_c[24], want_r[16], want_p[16];
    for (int i = 0; i < 24; i++) want_c[i] = cw[4 * C + i];
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 4; j++) want_r[r * 4 + j] = f16_to_f32(rw[r * 8 + 4 + j]);
    int prow[4] = {1, 5, 6, 7};
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 4; j++) want_p[r * 4 + j] = (float)pw[prow[r] * 4 + j];
    backend *be = backend_cpu_create(1);
    for (int d = 0; d < 2; d++)
        for (size_t cap = 0; cap <= 16; cap += 16) {
            dtype_t dt = d ? DT_BF16 : DT_F32;
            load_opts o = {.tp = 2, .rank = 1, .be = be, .dtype = dt, .staging_cap = cap};
            weights *w;
            REQUIRE(weights_load(c, &p, &o, &w, NULL) == 0, "%s", tp_error_msg());
            const char *names[3] = {"c.w", "r.w", "p.w"};
            const float *want[3] = {want_c, want_r, want_p};
            size_t n[3] = {24, 16, 16};
            for (int k = 0; k < 3; k++) {
                const tensor *x = weights_get(w, names[k]);
                REQUIRE(x && x->dtype == dt && tensor_numel(x) == n[k], "%s", names[k]);
                for (size_t e = 0; e < n[k]; e++) {
                    float got = dt == DT_F32 ? ((const float *)x->data)[e] : bf16_to_f32(((const uint16_t *)x->data)[e]);
                    float exp = dt == DT_F32 ? want[k][e] : bf16r(want[k][e]);
                    if (got != exp) { CHECK(0, "%s %s cap %zu element %zu: %g != %g", names[k], dtype_name(dt), cap, e, got, exp); break; }
                }
            }
            const tensor *iv = weights_get(w, "ids");
            CHECK(iv && iv->dtype == DT_I64 && !memcmp(iv->data, ids, sizeof ids), "integer tensor changed");
            weights_free(w);
        }
    backend_destroy(be);
    checkpoint_close(c);
    free(dir), free(cmd), free(path);
}

/* A shard that shrinks after its header was read (a download being
 * replaced, a full disk): the read fails cleanly, also when the failing
 * read runs on a reader thread, and no tensor is handed out. */
TEST(bad_load_file_shrinks_during_load) {
    char *dir = tiny_dir(), *dst = xasprintf("%s/shrink", test_tmp_dir());
    char *cmd = xasprintf("rm -rf %s && cp -r %s/transformer %s && chmod -R u+w %s", dst, dir, dst, dst);
    REQUIRE(system(cmd) == 0, "copy");
    tiny t;
    REQUIRE(tiny_open(&t) == 0, "%s", tp_error_msg());
    checkpoint *c;
    REQUIRE(checkpoint_open(dst, &c) == 0, "%s", tp_error_msg());
    char *shard = xasprintf("%s/diffusion_pytorch_model-00001-of-00002.safetensors", dst);
    REQUIRE(truncate(shard, 200000) == 0, "truncate");
    backend *be = backend_cpu_create(1);
    for (int threads = 1; threads <= 4; threads += 3)
        for (int d = 0; d < 2; d++) {
            load_opts o = {.tp = 2, .rank = 1, .be = be, .dtype = d ? DT_F32 : DT_BF16, .io_threads = threads};
            weights *w = (weights *)1;
            tp_error_clear();
            CHECK(weights_load(c, &t.p, &o, &w, NULL) == -1 && w == NULL, "load of a shrunk file succeeded");
            CHECK(strstr(tp_error_msg(), "unexpected end of file") && strstr(tp_error_msg(), "00001-of-00002") &&
                      strstr(tp_error_msg(), "rank 1 of tp 2"), "threads %d: %s", threads, tp_error_msg());
            CHECK(be->bytes_in_use == 0, "%zu backend bytes leaked", be->bytes_in_use);
        }
    backend_destroy(be);
    checkpoint_close(c);
    tiny_close(&t);
    free(dir), free(dst), free(cmd), free(shard);
}

/* ---- upload_file on the CPU backend ---- */

enum { UF_FILE_BYTES = 100003 };

typedef struct uf_case {
    uint64_t off;
    size_t spitch, width, height, dpitch;
} uf_case;

/* One call against the plain (fread) copy: rows land at their pitch, the
 * bytes between and after them keep their poison. */
static void uf_check(backend *be, int fd, const unsigned char *plain, uf_case c) {
    size_t n = c.height ? (c.height - 1) * c.dpitch + c.width + 64 : 64;
    unsigned char *got = be_alloc(be, n), *want = xmalloc(n);
    memset(got, 0xa5, n), memset(want, 0xa5, n);
    for (size_t r = 0; r < c.height; r++) memcpy(want + r * c.dpitch, plain + c.off + r * c.spitch, c.width);
    CHECK(be_upload_file(be, got, c.dpitch, fd, c.off, c.spitch, c.width, c.height) == 0, "off %llu: %s",
          (unsigned long long)c.off, tp_error_msg());
    CHECK(!memcmp(got, want, n), "off %llu spitch %zu width %zu height %zu dpitch %zu: bytes differ",
          (unsigned long long)c.off, c.spitch, c.width, c.height, c.dpitch);
    be_free(be, got);
    free(want);
}

TEST(upload_file_cpu_matches_plain_read) {
    char *path = xasprintf("%s/upload_file.bin", test_tmp_dir());
    unsigned char *file = xmalloc(UF_FILE_BYTES), *plain = xmalloc(UF_FILE_BYTES);
    for (int i = 0; i < UF_FILE_BYTES; i++) file[i] = (unsigned char)(rand() >> 7);
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(file, 1, UF_FILE_BYTES, f) == UF_FILE_BYTES && fclose(f) == 0, "writing %s", path);
    f = fopen(path, "rb");
    REQUIRE(f && fread(plain, 1, UF_FILE_BYTES, f) == UF_FILE_BYTES, "reading %s", path);
    fclose(f);
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0, "open %s", path);
    backend *be = backend_cpu_create(1);
    const uf_case cases[] = {
        {0, 4096, 4096, 16, 4096},          /* contiguous on both sides: one read */
        {7, 1001, 1001, 3, 1001},           /* contiguous at an odd offset */
        {13, 997, 333, 77, 335},            /* rowwise: odd pitches, gaps on both sides */
        {1, 12345, 5, 8, 7},                /* tiny runs far apart */
        {3, 999, 999, 4, 1000},             /* whole source rows, padded destination rows */
        {UF_FILE_BYTES - 1003, 1, 1003, 1, 1003},   /* one run up to the last byte */
        {5, 50, 50, 0, 50},                 /* nothing to copy */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) uf_check(be, fd, plain, cases[i]);
    /* the same through the reader threads at once (pread is thread-safe) */
#pragma omp parallel for num_threads(4)
    for (int i = 0; i < 16; i++) uf_check(be, fd, plain, (uf_case){(uint64_t)i * 101, 2000 + i, 777 + i, 40, 800 + i});
    /* a run past the end of the file, a strided one too, a bad descriptor */
    char *buf = xmalloc(256);
    tp_error_clear();
    CHECK(be_upload_file(be, buf, 20, fd, UF_FILE_BYTES - 10, 20, 20, 1) == -1 &&
              strstr(tp_error_msg(), "unexpected end of file"), "short read: %s", tp_error_msg());
    tp_error_clear();
    CHECK(be_upload_file(be, buf, 50, fd, UF_FILE_BYTES - 100, 60, 50, 2) == -1 &&
              strstr(tp_error_msg(), "unexpected end of file"), "short strided read: %s", tp_error_msg());
    tp_error_clear();
    CHECK(be_upload_file(be, buf, 20, -1, 0, 20, 20, 1) == -1 && strstr(tp_error_msg(), "read failed"), "bad fd: %s",
          tp_error_msg());
    /* a backend without the entry says so instead of crashing */
    static backend_vtable bare;
    bare = *be->vt;
    bare.upload_file = NULL;
    const backend_vtable *cpu_vt = be->vt;
    be->vt = &bare;
    tp_error_clear();
    CHECK(be_upload_file(be, buf, 20, fd, 0, 20, 20, 1) == -1 && strstr(tp_error_msg(), "upload_file"), "%s",
          tp_error_msg());
    be->vt = cpu_vt;
    tp_error_clear();
    CHECK(be->bytes_in_use == 0, "%zu bytes leaked", be->bytes_in_use);
    backend_destroy(be);
    close(fd);
    unlink(path);
    free(buf), free(file), free(plain), free(path);
}

/* Which path the loader takes: on the CPU backend a tensor in its stored
 * dtype is read in place by upload_file (no staging at all); a backend
 * without upload_file stages the same bytes through upload/upload2d
 * (bounded by the cap) and must give bit-identical shards for every rank. */
TEST(load_paths_file_and_staged_agree) {
    tiny t;
    REQUIRE(tiny_open(&t) == 0, "%s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    load_opts o = {.tp = 2, .rank = 1, .be = be, .dtype = DT_BF16};
    weights *w;
    load_stats st;
    REQUIRE(weights_load(t.c, &t.p, &o, &w, &st) == 0, "%s", tp_error_msg());
    CHECK(st.max_staging == 0, "the file path used %llu bytes of staging", (unsigned long long)st.max_staging);
    weights_free(w);
    static backend_vtable staged;
    staged = *be->vt;
    staged.upload_file = NULL;
    be->vt = &staged;
    o.staging_cap = 1000;
    REQUIRE(weights_load(t.c, &t.p, &o, &w, &st) == 0, "%s", tp_error_msg());
    CHECK(st.max_staging > 0 && st.max_staging <= 1000, "staged path: staging %llu", (unsigned long long)st.max_staging);
    weights_free(w);
    for (int tp = 1; tp <= 4; tp *= 2)
        for (int k = 0; k < tp; k++) check_rank_be(&t, be, tp, k, DT_BF16, 0, k & 1 ? 1000 : 0, 1);
    CHECK(be->bytes_in_use == 0, "%zu backend bytes leaked", be->bytes_in_use);
    backend_destroy(be);
    tiny_close(&t);
}
