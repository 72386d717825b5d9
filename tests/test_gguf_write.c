/* GGUF writer: files read and written back are byte-identical to what
 * gguf-py's GGUFWriter wrote (types.gguf and the golden flux2-gguf files),
 * and sparse files of real FLUX.2 shapes whose shards read exactly the
 * bytes of their covering blocks. */
#include "test.h"
#include "core/formats/gguf.h"
#include "kernels/err.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int same_bytes(const char *a, const char *b, long *where) {
    FILE *x = fopen(a, "rb"), *y = fopen(b, "rb");
    int same = x && y;
    long pos = 0;
    while (same) {
        int c = fgetc(x), d = fgetc(y);
        if (c != d) same = 0;
        else if (c == EOF) break;
        else pos++;
    }
    *where = pos;
    if (x) fclose(x);
    if (y) fclose(y);
    return same;
}

/* read every tensor's bytes and write the file back */
static void roundtrip(const char *src) {
    gguf_file *g;
    REQUIRE(gguf_open(src, &g) == 0, "%s", tp_error_msg());
    gguf_write_tensor *wt = xcalloc((size_t)g->n, sizeof *wt);
    for (int i = 0; i < g->n; i++) {
        const gguf_tensor *t = &g->tensors[i];
        void *d = xmalloc(t->end - t->begin);
        REQUIRE(gguf_read_raw(g, t, d) == 0, "%s", tp_error_msg());
        wt[i] = (gguf_write_tensor){t->name, t->type, t->ndim, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, d};
    }
    char *out = xasprintf("%s/roundtrip.gguf", test_tmp_dir());
    REQUIRE(gguf_write(out, g->kv, g->n_kv, wt, g->n, NULL, NULL) == 0, "%s", tp_error_msg());
    long at;
    CHECK(same_bytes(src, out, &at), "%s written back differs from the original from byte %ld", src, at);
    for (int i = 0; i < g->n; i++) free((void *)wt[i].data);
    free(wt), free(out);
    gguf_close(g);
}

TEST(gguf_write_roundtrip_bytes) {
    roundtrip("tests/data/gguf/types.gguf");
    const char *v[] = {"Q8_0", "Q4_K", "mixed"};
    for (int i = 0; i < 3; i++) {
        char *p = xasprintf("%s/flux2-gguf/%s/transformer/flux2-tiny-%s.gguf", test_golden_dir(), v[i], v[i]);
        roundtrip(p);
        free(p);
    }
}

/* The bytes a rank reads for columns [c0, c1) of every row: the covering
 * blocks, computed here from the block size alone. */
static uint64_t cover_bytes(int64_t rows, int64_t c0, int64_t c1, int bs, int bytes) {
    return (uint64_t)rows * (uint64_t)((c1 + bs - 1) / bs - c0 / bs) * (uint64_t)bytes;
}

/* Real shapes as holes: FLUX.2-dev (D 6144, MLP 18432, joint 15360) and
 * klein-4B (D 3072, MLP 9216), Q4_K with F32 norms. Column-parallel shards
 * are contiguous row ranges; row-parallel shards read their covering
 * blocks: klein-4B's attention output at tp 8 is 384 columns, 1.5 blocks. */
TEST(gguf_write_sparse_real_shapes) {
    enum { D = 6144, M = 18432, J = 15360, K = 3072, KM = 9216 };
    gguf_write_tensor t[] = {
        {"double_blocks.0.img_attn.qkv.weight", QUANT_Q4_K, 2, {D, 3 * D, 1, 1}, NULL},
        {"double_blocks.0.img_attn.proj.weight", QUANT_Q4_K, 2, {D, D, 1, 1}, NULL},
        {"double_blocks.0.img_attn.norm.query_norm.scale", QUANT_F32, 1, {128, 1, 1, 1}, NULL},
        {"double_blocks.0.img_mlp.0.weight", QUANT_Q4_K, 2, {D, 2 * M, 1, 1}, NULL},
        {"double_blocks.0.img_mlp.2.weight", QUANT_Q6_K, 2, {M, D, 1, 1}, NULL},
        {"single_blocks.0.linear2.weight", QUANT_Q4_K, 2, {D + M, D, 1, 1}, NULL},
        {"txt_in.weight", QUANT_Q8_0, 2, {J, D, 1, 1}, NULL},
        {"klein.attn.proj.weight", QUANT_Q4_K, 2, {K, K, 1, 1}, NULL},
        {"klein.mlp.2.weight", QUANT_Q4_K, 2, {KM, K, 1, 1}, NULL},
    };
    int n = (int)(sizeof t / sizeof t[0]);
    gguf_kv kv = {"general.architecture", {.type = GGUF_STRING, .str = {4, "flux"}}};
    char *p = xasprintf("%s/dev-shapes.gguf", test_tmp_dir());
    REQUIRE(gguf_write(p, &kv, 1, t, n, NULL, NULL) == 0, "%s", tp_error_msg());
    gguf_file *g;
    REQUIRE(gguf_open(p, &g) == 0, "%s", tp_error_msg());
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const gguf_tensor *gt = gguf_find(g, t[i].name);
        REQUIRE(gt, "%s", t[i].name);
        const quant_type *qt = quant_type_get(t[i].type);
        uint64_t rows = (uint64_t)t[i].ne[1], want = rows * (uint64_t)(t[i].ne[0] / qt->block) * (uint64_t)qt->bytes;
        CHECK(gt->end - gt->begin == want && gt->rows == (int64_t)rows && gt->shape[0] == t[i].ne[t[i].ndim - 1], "%s: %llu bytes",
              t[i].name, (unsigned long long)(gt->end - gt->begin));
        total += (want + 31) / 32 * 32;
    }
    CHECK(g->file_size == g->data0 + total, "file size %llu", (unsigned long long)g->file_size);
    struct stat sb;
    if (stat(p, &sb) == 0) printf("# dev-shapes.gguf: %llu bytes, %llu on disk\n", (unsigned long long)sb.st_size,
                                  (unsigned long long)sb.st_blocks * 512);
    /* column-parallel: qkv rows split in tp at tp 4; each shard one range */
    const gguf_tensor *qkv = gguf_find(g, "double_blocks.0.img_attn.qkv.weight");
    for (int r = 0; r < 4; r++) {
        uint64_t b0, b1;
        gguf_rows_range(qkv, r * 3 * D / 4, (r + 1) * 3 * D / 4, &b0, &b1);
        CHECK(b1 - b0 == (uint64_t)(3 * D / 4) * (D / 256) * 144 && b0 == qkv->begin + (b1 - b0) * (uint64_t)r,
              "qkv rank %d range", r);
    }
    /* row-parallel: every rank's columns of every row, read and decoded */
    struct { const char *name; int tp; } rp[] = {{"klein.attn.proj.weight", 8}, {"klein.mlp.2.weight", 8},
                                                 {"single_blocks.0.linear2.weight", 4}, {"double_blocks.0.img_mlp.2.weight", 3}};
    for (size_t k = 0; k < sizeof rp / sizeof rp[0]; k++) {
        const gguf_tensor *w = gguf_find(g, rp[k].name);
        int64_t cols = w->row_len / rp[k].tp, rows = 16;   /* 16 rows are enough: every row has the same span */
        float *out = xmalloc((size_t)(rows * cols) * sizeof(float));
        uint64_t sum = 0;
        for (int r = 0; r < rp[k].tp; r++) {
            uint64_t got;
            int64_t c0 = r * cols, c1 = c0 + cols;
            REQUIRE(gguf_read_f32_block(g, w, w->rows - rows, w->rows, c0, c1, out, &got) == 0, "%s", tp_error_msg());
            uint64_t want = cover_bytes(rows, c0, c1, w->qt->block, w->qt->bytes);
            CHECK(got == want, "%s tp %d rank %d: %llu bytes read, covering blocks are %llu", rp[k].name, rp[k].tp, r,
                  (unsigned long long)got, (unsigned long long)want);
            sum += got;
            int nz = 0;
            for (int64_t i = 0; i < rows * cols; i++) nz += out[i] != 0;
            CHECK(nz == 0, "%s: a hole decoded to %d non-zero values", rp[k].name, nz);
        }
        /* half-block edges read each straddled block twice */
        uint64_t whole = (uint64_t)rows * w->row_bytes;
        CHECK(sum >= whole, "%s: the shards read less than the rows", rp[k].name);
        if (!strcmp(rp[k].name, "klein.attn.proj.weight"))
            CHECK(sum * 3 == whole * 4, "klein proj at tp 8: 2 blocks a rank for 1.5 of data (read %llu of %llu)",
                  (unsigned long long)sum, (unsigned long long)whole);
        free(out);
    }
    gguf_close(g);
    unlink(p);
    free(p);
}

/* writer input is checked like reader input */
TEST(gguf_write_refuses) {
    char *p = xasprintf("%s/bad.gguf", test_tmp_dir());
    gguf_write_tensor t = {"w", QUANT_Q4_K, 2, {100, 2, 1, 1}, NULL};
    CHECK(gguf_write(p, NULL, 0, &t, 1, NULL, NULL) == -1 && strstr(tp_error_msg(), "'w'"), "100 columns of Q4_K");
    t = (gguf_write_tensor){"x", 99, 1, {4, 1, 1, 1}, NULL};
    CHECK(gguf_write(p, NULL, 0, &t, 1, NULL, NULL) == -1 && strstr(tp_error_msg(), "type 99"), "type 99");
    gguf_kv kv = {"general.alignment", {.type = GGUF_U32, .num.u = 24}};
    t = (gguf_write_tensor){"y", QUANT_F32, 1, {4, 1, 1, 1}, NULL};
    CHECK(gguf_write(p, &kv, 1, &t, 1, NULL, NULL) == -1 && strstr(tp_error_msg(), "power of two"), "alignment 24");
    struct stat sb;
    CHECK(stat(p, &sb) != 0, "a refused write left a file");
    free(p);
}
