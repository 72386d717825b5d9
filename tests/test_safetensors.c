/* safetensors reader and writer: round trips, out-of-order data areas,
 * the golden shards, and one test per kind of corrupt file (bad_*). */
#include "test.h"
#include "kernels/err.h"
#include "core/formats/safetensors.h"
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Write a file by hand: 8-byte length, header text, then data bytes. */
static void write_raw(const char *path, uint64_t hlen_claimed, const char *header, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    uint8_t l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (uint8_t)(hlen_claimed >> (8 * i));
    fwrite(l8, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

static char *tmp_path(const char *name) { return xasprintf("%s/%s", test_tmp_dir(), name); }

static float frand(void) { return (float)rand() / RAND_MAX * 2.0f - 1.0f; }

TEST(st_roundtrip_dtypes) {
    enum { R = 7, C = 5 };
    float f32[R * C];
    uint16_t bf[R * C];
    int32_t i32[R * C];
    uint8_t u8[3];
    for (int i = 0; i < R * C; i++) {
        f32[i] = frand();
        bf[i] = f32_to_bf16(frand() * 100);
        i32[i] = rand() - RAND_MAX / 2;
    }
    u8[0] = 0, u8[1] = 200, u8[2] = 255;
    st_write_tensor t[] = {
        {"w.f32", DT_F32, 2, {R, C}, f32},
        {"a.bf16", DT_BF16, 3, {R, 1, C}, bf},
        {"ids", DT_I32, 1, {R * C}, i32},
        {"scalar_u8", DT_U8, 1, {3}, u8},
        {"empty", DT_F32, 2, {0, 4}, f32},
    };
    const char *meta[] = {"format", "pt", "note", "hello", NULL};
    char *path = tmp_path("rt.safetensors");
    REQUIRE(st_write(path, t, 5, meta) == 0, "st_write: %s", tp_error_msg());
    st_file *f;
    REQUIRE(st_open(path, &f) == 0, "st_open: %s", tp_error_msg());
    CHECK(f->n == 5, "n = %d", f->n);
    CHECK(f->data0 % 8 == 0, "data area not 8-aligned");
    CHECK(st_meta(f, "note") && !strcmp(st_meta(f, "note"), "hello"), "metadata lost");
    CHECK(st_find(f, "nope") == NULL, "found a missing tensor");
    const st_tensor_info *ti = st_find(f, "a.bf16");
    REQUIRE(ti && ti->dtype == DT_BF16 && ti->ndim == 3 && ti->shape[1] == 1 && ti->shape[2] == C, "a.bf16 header");
    float *x;
    REQUIRE(st_read_f32(f, "a.bf16", &x, NULL) == 0, "%s", tp_error_msg());
    for (int i = 0; i < R * C; i++) CHECK(x[i] == bf16_to_f32(bf[i]), "bf16 element %d", i);
    free(x);
    REQUIRE(st_read_f32(f, "w.f32", &x, NULL) == 0, "%s", tp_error_msg());
    CHECK(memcmp(x, f32, sizeof f32) == 0, "f32 data differs");
    free(x);
    int64_t *iv;
    REQUIRE(st_read_i64(f, "ids", &iv, NULL) == 0, "%s", tp_error_msg());
    for (int i = 0; i < R * C; i++) CHECK(iv[i] == i32[i], "i32 element %d", i);
    free(iv);
    REQUIRE(st_read_i64(f, "scalar_u8", &iv, NULL) == 0, "%s", tp_error_msg());
    CHECK(iv[0] == 0 && iv[1] == 200 && iv[2] == 255, "u8 values");
    free(iv);
    CHECK(st_read_f32(f, "ids", &x, NULL) == -1 && strstr(tp_error_msg(), "not a float"), "f32 read of ints accepted");
    CHECK(st_read_f32(f, "missing", &x, NULL) == -1 && strstr(tp_error_msg(), "missing"), "missing tensor read");
    st_close(f);
    free(path);
}

/* Tensors whose data lies in the reverse order of the header and with a
 * gap: the reader must use the offsets, never the order. */
TEST(st_out_of_order_offsets) {
    float data[6] = {1, 2, 3, 4, 5, 6};   /* a = data[4..5], b = data[0..2] */
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";
    char *path = tmp_path("order.safetensors");
    write_raw(path, strlen(h), h, data, sizeof data);
    st_file *f;
    REQUIRE(st_open(path, &f) == 0, "%s", tp_error_msg());
    float *a, *b;
    REQUIRE(st_read_f32(f, "a", &a, NULL) == 0 && st_read_f32(f, "b", &b, NULL) == 0, "%s", tp_error_msg());
    CHECK(a[0] == 5 && a[1] == 6, "a = %g %g", a[0], a[1]);
    CHECK(b[0] == 1 && b[1] == 2 && b[2] == 3, "b wrong");
    free(a), free(b);
    st_close(f);
    free(path);
}

/* The golden shards: every tensor the index assigns to a shard is in it,
 * BF16, and the shard has nothing else. */
TEST(st_golden_shards) {
    char *dir = xasprintf("%s/flux2-tiny-a/model/transformer", test_golden_dir());
    char *idx = xasprintf("%s/diffusion_pytorch_model.safetensors.index.json", dir);
    json_error_t e;
    json_t *j = json_load_file(idx, 0, &e);
    REQUIRE(j, "cannot read %s", idx);
    json_t *wm = json_object_get(j, "weight_map");
    const char *shards[2] = {"diffusion_pytorch_model-00001-of-00002.safetensors",
                             "diffusion_pytorch_model-00002-of-00002.safetensors"};
    int total = 0;
    for (int s = 0; s < 2; s++) {
        char *p = xasprintf("%s/%s", dir, shards[s]);
        st_file *f;
        if (st_open(p, &f)) { CHECK(0, "%s", tp_error_msg()); free(p); continue; }
        int expect = 0;
        const char *k;
        json_t *v;
        json_object_foreach(wm, k, v) {
            if (strcmp(json_string_value(v), shards[s])) continue;
            expect++;
            const st_tensor_info *t = st_find(f, k);
            CHECK(t && t->dtype == DT_BF16, "%s missing from %s or not BF16", k, shards[s]);
        }
        CHECK(f->n == expect, "%s holds %d tensors, index names %d", shards[s], f->n, expect);
        total += f->n;
        st_close(f);
        free(p);
    }
    CHECK(total == (int)json_object_size(wm), "total %d", total);
    json_decref(j);
    free(idx), free(dir);
}

TEST(st_write_sparse_hole) {
    st_write_tensor t[] = {{"big", DT_BF16, 2, {4096, 4096}, NULL}, {"small", DT_F32, 1, {2}, (float[]){7, 8}}};
    char *path = tmp_path("sparse.safetensors");
    REQUIRE(st_write(path, t, 2, NULL) == 0, "%s", tp_error_msg());
    st_file *f;
    REQUIRE(st_open(path, &f) == 0, "%s", tp_error_msg());
    CHECK(f->file_size == f->data0 + 4096ull * 4096 * 2 + 8, "file size %llu", (unsigned long long)f->file_size);
    float *x;
    REQUIRE(st_read_f32(f, "small", &x, NULL) == 0, "%s", tp_error_msg());
    CHECK(x[0] == 7 && x[1] == 8, "data after a hole");
    free(x);
    st_close(f);
    free(path);
}

/* ---- corrupt files: each must fail in st_open with a clear message ---- */

static void expect_open_fails(const char *path, const char *pattern) {
    st_file *f = NULL;
    tp_error_clear();
    int rc = st_open(path, &f);
    CHECK(rc == -1 && f == NULL, "st_open accepted %s", path);
    CHECK(strstr(tp_error_msg(), pattern) != NULL, "message '%s' lacks '%s'", tp_error_msg(), pattern);
    CHECK(strstr(tp_error_msg(), path) != NULL, "message '%s' does not name the file", tp_error_msg());
}

static const char *k_good = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}";

TEST(bad_st_truncated_file) {
    char *path = tmp_path("trunc.safetensors");
    write_raw(path, 0, "", NULL, 0);
    CHECK(truncate(path, 5) == 0, "truncate");
    expect_open_fails(path, "too short");
    /* a complete header whose data area was cut short */
    char data[12] = {0};
    write_raw(path, strlen(k_good), k_good, data, 12);
    CHECK(truncate(path, 8 + (off_t)strlen(k_good) + 6) == 0, "truncate");
    expect_open_fails(path, "outside the data area");
    free(path);
}

TEST(bad_st_header_beyond_file) {
    char *path = tmp_path("hlen.safetensors");
    write_raw(path, 1000000, k_good, "0123456789ab", 12);
    expect_open_fails(path, "header length 1000000 goes beyond");
    /* over the 256 MB cap: the cap is named, not the file size (issue 13) */
    write_raw(path, UINT64_MAX, k_good, "0123456789ab", 12);
    expect_open_fails(path, "header length 18446744073709551615 is more than the limit of 256 MB");
    free(path);
}

TEST(bad_st_malformed_json) {
    char *path = tmp_path("json.safetensors");
    const char *h = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]";
    write_raw(path, strlen(h), h, "0123456789ab", 12);
    expect_open_fails(path, "malformed JSON");
    const char *h2 = "[1,2,3]";
    write_raw(path, strlen(h2), h2, NULL, 0);
    expect_open_fails(path, "not an object");
    const char *h3 = "{\"w\":{\"dtype\":\"BF16\",\"shape\":\"2x3\",\"data_offsets\":[0,12]}}";
    write_raw(path, strlen(h3), h3, "0123456789ab", 12);
    expect_open_fails(path, "tensor 'w' needs");
    const char *h4 = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,-3],\"data_offsets\":[0,12]}}";
    write_raw(path, strlen(h4), h4, "0123456789ab", 12);
    expect_open_fails(path, "non-negative");
    free(path);
}

TEST(bad_st_offsets_out_of_range) {
    char *path = tmp_path("offs.safetensors");
    const char *h = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]}}";
    write_raw(path, strlen(h), h, "0123456789ab", 12);
    expect_open_fails(path, "outside the data area");
    const char *h2 = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[12,0]}}";
    write_raw(path, strlen(h2), h2, "0123456789ab", 12);
    expect_open_fails(path, "outside the data area");
    free(path);
}

TEST(bad_st_shape_offset_mismatch) {
    char *path = tmp_path("shape.safetensors");
    const char *h = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,4],\"data_offsets\":[0,12]}}";
    write_raw(path, strlen(h), h, "0123456789ab", 12);
    expect_open_fails(path, "shape needs 16 bytes");
    /* overflowing element count must not wrap around to a matching span */
    const char *h2 = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}";
    write_raw(path, strlen(h2), h2, NULL, 0);
    expect_open_fails(path, "impossibly large");
    free(path);
}

TEST(bad_st_overlapping_tensors) {
    char *path = tmp_path("overlap.safetensors");
    const char *h = "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[6,10]}}";
    write_raw(path, strlen(h), h, "0123456789ab", 12);
    expect_open_fails(path, "tensors 'a' and 'b' overlap");
    free(path);
}

TEST(bad_st_unknown_dtype) {
    char *path = tmp_path("dtype.safetensors");
    const char *h = "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[12],\"data_offsets\":[0,12]}}";
    write_raw(path, strlen(h), h, "0123456789ab", 12);
    expect_open_fails(path, "unknown dtype 'Q4_K'");
    /* F8_E4M3/F8_E5M2 are storage dtypes now (core/formats/fp8.h); other low-precision ones are named as such */
    const char *h8 = "{\"w\":{\"dtype\":\"F8_E8M0\",\"shape\":[12],\"data_offsets\":[0,12]}}";
    write_raw(path, strlen(h8), h8, "0123456789ab", 12);
    expect_open_fails(path, "low-precision dtype 'F8_E8M0'");
    free(path);
}

TEST(bad_st_missing_file) {
    st_file *f;
    CHECK(st_open("/nonexistent/x.safetensors", &f) == -1 && strstr(tp_error_msg(), "cannot open"), "%s",
          tp_error_msg());
}
