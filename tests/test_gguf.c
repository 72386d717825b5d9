/* GGUF reader and ggml block types: every supported type against gguf-py's
 * reference dequantiser (tests/data/gguf, made by tests/tools/gguf_testdata.py),
 * the golden flux2-gguf files, column ranges at every block edge, typed
 * metadata, and hostile files built here byte by byte (gguf_hostile_*). */
#include "test.h"
#include "core/formats/gguf.h"
#include "core/formats/safetensors.h"
#include "kernels/err.h"
#include "kernels/tensor.h"
#include <jansson.h>
#include <nettle/sha2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TYPES_GGUF "tests/data/gguf/types.gguf"
#define TYPES_REF "tests/data/gguf/types_ref.safetensors"
#define TYPES_JSON "tests/data/gguf/types.json"
#define GOLDEN_JSON "tests/data/gguf/golden.json"

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

/* Every tensor of types.gguf equals gguf-py's dequantised values bit for
 * bit (gguf-py computes in f32 throughout), with the type and ne[] of
 * types.json and shape[] its reverse. */
TEST(gguf_types_exact) {
    gguf_file *g;
    st_file *ref;
    json_error_t je;
    json_t *js = json_load_file(TYPES_JSON, 0, &je);
    REQUIRE(js, "%s: %s", TYPES_JSON, je.text);
    REQUIRE(gguf_open(TYPES_GGUF, &g) == 0, "%s", tp_error_msg());
    REQUIRE(st_open(TYPES_REF, &ref) == 0, "%s", tp_error_msg());
    json_t *jt = json_object_get(js, "tensors");
    CHECK(g->n == (int)json_object_size(jt), "%d tensors, types.json lists %zu", g->n, json_object_size(jt));
    CHECK(g->version == 3 && g->alignment == 64 && g->data0 % 64 == 0, "version %u alignment %u data0 %llu",
          g->version, g->alignment, (unsigned long long)g->data0);
    const char *k;
    json_t *v;
    json_object_foreach(jt, k, v) {
        const gguf_tensor *t = gguf_find(g, k);
        REQUIRE(t, "tensor %s missing", k);
        CHECK(!strcmp(quant_type_name(t->type), json_string_value(json_object_get(v, "type"))), "%s: type %s", k,
              quant_type_name(t->type));
        json_t *ne = json_object_get(v, "ne");
        CHECK(t->ndim == (int)json_array_size(ne), "%s: ndim %d", k, t->ndim);
        for (int i = 0; i < t->ndim; i++) {
            CHECK(t->ne[i] == json_integer_value(json_array_get(ne, (size_t)i)), "%s: ne[%d] = %lld", k, i,
                  (long long)t->ne[i]);
            CHECK(t->shape[t->ndim - 1 - i] == t->ne[i], "%s: shape is not ne reversed", k);
        }
        CHECK(t->begin % 64 == 0 && t->end - t->begin == (uint64_t)t->rows * t->row_bytes, "%s: byte range", k);
        float *x, *r;
        const st_tensor_info *ri;
        REQUIRE(gguf_read_f32(g, k, &x, NULL) == 0, "%s", tp_error_msg());
        REQUIRE(st_read_f32(ref, k, &r, &ri) == 0, "%s", tp_error_msg());
        size_t n = (size_t)t->rows * (size_t)t->row_len;
        CHECK((size_t)st_numel(ri) == n, "%s: %zu values, reference %lld", k, n, (long long)st_numel(ri));
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++)
            if (memcmp(&x[i], &r[i], 4) && bad++ == 0) first = i;
        CHECK(bad == 0, "%s (%s): %zu of %zu values differ from gguf-py, first at %zu: %.9g vs %.9g", k,
              quant_type_name(t->type), bad, n, first, x[first], r[first]);
        dtype_t dt;
        if (quant_dtype(t->type, &dt) == 0)   /* plain types: the same bytes as a safetensors tensor of dt */
            CHECK(t->qt->block == 1 && (int)dtype_size(dt) == t->qt->bytes && !strcmp(dtype_name(dt), t->qt->name),
                  "%s: dtype %s", k, dtype_name(dt));
        else CHECK(t->qt->block > 1, "%s: a block type without a dtype", k);
        free(x), free(r);
    }
    /* every type tpgen claims to decode is in the file */
    int ids[] = {QUANT_F32, QUANT_F16, QUANT_BF16, QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1, QUANT_Q8_0,
                 QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_IQ4_NL, QUANT_IQ4_XS};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        int found = 0;
        for (int j = 0; j < g->n; j++) found |= g->tensors[j].type == ids[i];
        CHECK(found && quant_supported(ids[i]), "type %s not covered", quant_type_name(ids[i]));
    }
    st_close(ref);
    gguf_close(g);
    json_decref(js);
}

static void sha256_hex(const void *p, size_t n, char hex[65]) {
    struct sha256_ctx sc;
    uint8_t dg[32];
    sha256_init(&sc);
    sha256_update(&sc, n, p);
    sha256_digest(&sc, 32, dg);
    for (int b = 0; b < 32; b++) snprintf(hex + 2 * b, 3, "%02x", dg[b]);
}

/* All 65536 F16 and BF16 codes (subnormals, infinities, NaN payloads)
 * decode to gguf-py's f32 bits (sha256 in types.json), and to tpgen's
 * scalar converters'. */
TEST(gguf_f16_bf16_all_codes) {
    json_error_t je;
    json_t *js = json_load_file(TYPES_JSON, 0, &je), *sums = json_object_get(js, "all_codes_sha256");
    REQUIRE(sums, "%s: no all_codes_sha256", TYPES_JSON);
    uint8_t codes[65536 * 2];
    for (int i = 0; i < 65536; i++) codes[2 * i] = (uint8_t)i, codes[2 * i + 1] = (uint8_t)(i >> 8);
    float *y = malloc(65536 * sizeof(float));
    int types[2] = {QUANT_F16, QUANT_BF16};
    for (int k = 0; k < 2; k++) {
        quant_dequant_row(types[k], codes, y, 65536);
        char hex[65];
        sha256_hex(y, 65536 * 4, hex);
        const char *want = json_string_value(json_object_get(sums, quant_type_name(types[k])));
        CHECK(want && !strcmp(hex, want), "%s: all codes differ from gguf-py", quant_type_name(types[k]));
        int bad = 0;
        for (int i = 0; i < 65536; i++) {
            float r = types[k] == QUANT_F16 ? f16_to_f32((uint16_t)i) : bf16_to_f32((uint16_t)i);
            bad += memcmp(&r, &y[i], 4) != 0;
        }
        CHECK(bad == 0, "%s: %d codes differ from tensor.c's converter", quant_type_name(types[k]), bad);
    }
    free(y);
    json_decref(js);
}

/* Every value type of the metadata, read back through the typed getters. */
TEST(gguf_metadata) {
    gguf_file *g;
    REQUIRE(gguf_open(TYPES_GGUF, &g) == 0, "%s", tp_error_msg());
    json_error_t je;
    json_t *js = json_load_file(TYPES_JSON, 0, &je), *m = json_object_get(js, "metadata");
    REQUIRE(m, "%s", TYPES_JSON);
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f;
    int b;
    const char *s;
    CHECK(gguf_get_u32(g, "test.u8", &u32) == 0 && u32 == json_integer_value(json_object_get(m, "test.u8")), "u8");
    CHECK(gguf_get_i32(g, "test.i8", &i32) == 0 && i32 == json_integer_value(json_object_get(m, "test.i8")), "i8");
    CHECK(gguf_get_u32(g, "test.u16", &u32) == 0 && u32 == json_integer_value(json_object_get(m, "test.u16")), "u16");
    CHECK(gguf_get_i32(g, "test.i16", &i32) == 0 && i32 == json_integer_value(json_object_get(m, "test.i16")), "i16");
    CHECK(gguf_get_u32(g, "test.u32", &u32) == 0 && u32 == (uint32_t)json_integer_value(json_object_get(m, "test.u32")),
          "u32");
    CHECK(gguf_get_i32(g, "test.i32", &i32) == 0 && i32 == json_integer_value(json_object_get(m, "test.i32")), "i32");
    CHECK(gguf_get_f32(g, "test.f32", &f) == 0 && f == (float)json_real_value(json_object_get(m, "test.f32")), "f32");
    CHECK(gguf_get_bool(g, "test.bool", &b) == 0 && b == 1, "bool");
    CHECK(gguf_get_str(g, "test.string", &s) == 0 && !strcmp(s, json_string_value(json_object_get(m, "test.string"))),
          "string");
    /* beyond int64 (jansson's integers): types.json holds it as a string */
    CHECK(gguf_get_u64(g, "test.u64", &u64) == 0 &&
          u64 == strtoull(json_string_value(json_object_get(m, "test.u64")), NULL, 10), "u64 %llu",
          (unsigned long long)u64);
    const gguf_kv *kv = gguf_find_kv(g, "test.i64");
    CHECK(kv && kv->v.type == GGUF_I64 && kv->v.num.i == json_integer_value(json_object_get(m, "test.i64")), "i64");
    kv = gguf_find_kv(g, "test.f64");
    CHECK(kv && kv->v.type == GGUF_F64 && kv->v.num.f == json_real_value(json_object_get(m, "test.f64")), "f64");
    /* range and type errors name the file and the key; absent keys are 1 */
    CHECK(gguf_get_i32(g, "test.u32", &i32) == -1 && strstr(tp_error_msg(), "test.u32") &&
          strstr(tp_error_msg(), "types.gguf"), "u32 4e9 as i32: %s", tp_error_msg());
    CHECK(gguf_get_u32(g, "test.i8", &u32) == -1 && strstr(tp_error_msg(), "out of range"), "negative as u32");
    CHECK(gguf_get_str(g, "test.u8", &s) == -1 && strstr(tp_error_msg(), "expected a string"), "u8 as string");
    CHECK(gguf_get_u32(g, "no.such.key", &u32) == 1, "absent key");
    CHECK(gguf_get_str(g, "general.architecture", &s) == 0 && !strcmp(s, "tpgen-test"), "architecture");
    /* arrays */
    int64_t *iv;
    uint64_t n;
    json_t *ja = json_object_get(m, "test.arr_i32");
    REQUIRE(gguf_get_arr_i64(g, "test.arr_i32", &iv, &n) == 0 && n == json_array_size(ja), "arr_i32: %s",
            tp_error_msg());
    for (uint64_t i = 0; i < n; i++) CHECK(iv[i] == json_integer_value(json_array_get(ja, i)), "arr_i32[%llu]",
                                           (unsigned long long)i);
    free(iv);
    const gguf_str *ss;
    ja = json_object_get(m, "test.arr_str");
    REQUIRE(gguf_get_arr_str(g, "test.arr_str", &ss, &n) == 0 && n == json_array_size(ja), "arr_str");
    for (uint64_t i = 0; i < n; i++)
        CHECK(ss[i].len == strlen(ss[i].s) && !strcmp(ss[i].s, json_string_value(json_array_get(ja, i))),
              "arr_str[%llu] = '%s'", (unsigned long long)i, ss[i].s);
    float *fv;
    ja = json_object_get(m, "test.arr_f32");
    REQUIRE(gguf_get_arr_f32(g, "test.arr_f32", &fv, &n) == 0 && n == json_array_size(ja), "arr_f32");
    for (uint64_t i = 0; i < n; i++) CHECK(fv[i] == (float)json_real_value(json_array_get(ja, i)), "arr_f32[%llu]",
                                           (unsigned long long)i);
    free(fv);
    CHECK(gguf_get_arr_str(g, "test.arr_i32", &ss, &n) == -1 && strstr(tp_error_msg(), "array of i32"),
          "ints as strings: %s", tp_error_msg());
    kv = gguf_find_kv(g, "test.arr_nested");
    ja = json_object_get(m, "test.arr_nested");
    REQUIRE(kv && kv->v.type == GGUF_ARRAY && kv->v.elem == GGUF_ARRAY && kv->v.n == json_array_size(ja), "nested");
    for (uint64_t i = 0; i < kv->v.n; i++) {
        const gguf_value *in = &((const gguf_value *)kv->v.data)[i];
        json_t *ji = json_array_get(ja, i);
        REQUIRE(in->n == json_array_size(ji) && in->elem == GGUF_I32, "nested[%llu]", (unsigned long long)i);
        for (uint64_t j = 0; j < in->n; j++) {
            int32_t x;
            memcpy(&x, (const uint8_t *)in->data + 4 * j, 4);
            CHECK(x == json_integer_value(json_array_get(ji, j)), "nested[%llu][%llu]", (unsigned long long)i,
                  (unsigned long long)j);
        }
    }
    json_decref(js);
    gguf_close(g);
}

/* Columns [c0, c1) of a row at every block edge (inside a block at either
 * end, one element, whole row) equal that slice of the whole row; the bytes
 * read are the covering blocks: (ceil(c1 / bs) - floor(c0 / bs)) blocks a row. */
TEST(gguf_col_ranges) {
    gguf_file *g;
    REQUIRE(gguf_open(TYPES_GGUF, &g) == 0, "%s", tp_error_msg());
    for (int ti = 0; ti < g->n; ti++) {
        const gguf_tensor *t = &g->tensors[ti];
        float *whole;
        REQUIRE(gguf_read_f32(g, t->name, &whole, NULL) == 0, "%s", tp_error_msg());
        int64_t bs = t->qt->block, L = t->row_len, edges[64];
        int ne = 0;
        for (int64_t b = 0; b * bs <= L && ne < 56; b++)
            for (int d = -1; d <= 1; d++) {
                int64_t e = b * bs + d;
                if (e >= 0 && e <= L && (ne == 0 || edges[ne - 1] < e)) edges[ne++] = e;
            }
        if (bs > 16 && ne < 60) edges[ne++] = bs / 2 + 3;   /* mid-block */
        float *out = malloc((size_t)L * (size_t)t->rows * sizeof(float));
        for (int i = 0; i < ne; i++)
            for (int j = 0; j < ne; j++) {
                int64_t c0 = edges[i], c1 = edges[j];
                if (c0 >= c1) continue;
                int64_t r0 = t->rows > 1 ? 1 : 0, r1 = t->rows;
                uint64_t nb;
                REQUIRE(gguf_read_f32_block(g, t, r0, r1, c0, c1, out, &nb) == 0, "%s", tp_error_msg());
                int64_t w = c1 - c0, blocks = (c1 + bs - 1) / bs - c0 / bs;
                CHECK(nb == (uint64_t)((r1 - r0) * blocks * t->qt->bytes), "%s [%lld, %lld): %llu bytes read", t->name,
                      (long long)c0, (long long)c1, (unsigned long long)nb);
                for (int64_t r = r0; r < r1; r++)
                    CHECK(!memcmp(out + (r - r0) * w, whole + r * L + c0, (size_t)w * 4), "%s row %lld [%lld, %lld)",
                          t->name, (long long)r, (long long)c0, (long long)c1);
                /* the raw covering blocks: pitch, skip and bytes as the formula says */
                int64_t pitch, skip;
                uint8_t *raw = malloc((size_t)((r1 - r0) * blocks * t->qt->bytes));
                REQUIRE(gguf_read_blocks(g, t, r0, r1, c0, c1, raw, &pitch, &skip, &nb) == 0, "%s", tp_error_msg());
                CHECK(pitch == blocks * t->qt->bytes && skip == c0 % bs && nb == (uint64_t)((r1 - r0) * pitch),
                      "%s [%lld, %lld): pitch %lld skip %lld", t->name, (long long)c0, (long long)c1, (long long)pitch,
                      (long long)skip);
                for (int64_t r = r0; r < r1; r++) {
                    quant_dequant_span(t->type, raw + (r - r0) * pitch, skip, w, out);
                    CHECK(!memcmp(out, whole + r * L + c0, (size_t)w * 4), "%s read_blocks row %lld", t->name,
                          (long long)r);
                }
                free(raw);
                /* the in-memory path on the row's bytes */
                uint8_t *row = malloc(t->row_bytes);
                REQUIRE(gguf_read_range(g, t->begin, row, t->row_bytes) == 0, "%s", tp_error_msg());
                quant_dequant_cols(t->type, row, c0, w, out);
                CHECK(!memcmp(out, whole + c0, (size_t)w * 4), "%s quant_dequant_cols [%lld, %lld)", t->name,
                      (long long)c0, (long long)c1);
                free(row);
            }
        if (t->rows > 1) {   /* rows [1, rows) are one contiguous byte range */
            uint64_t b0, b1;
            gguf_rows_range(t, 1, t->rows, &b0, &b1);
            CHECK(b0 == t->begin + t->row_bytes && b1 == t->end, "%s: rows range", t->name);
        }
        free(out), free(whole);
    }
    const gguf_tensor *t = gguf_find(g, "w.Q4_K");
    float x;
    CHECK(t && gguf_read_f32_block(g, t, 0, 1, 700, 769, &x, NULL) == -1 && strstr(tp_error_msg(), "w.Q4_K"),
          "columns past the row accepted");
    gguf_close(g);
}

/* The golden flux2-gguf files: types as gguf.json lists them, ne[] and
 * offsets as gguf-py's GGUFReader reads them, and the sha256 of every
 * tensor's dequantised f32 bytes equal to that of gguf-py's dequantiser. */
TEST(gguf_golden) {
    json_error_t je;
    char *gj = xasprintf("%s/flux2-gguf/gguf.json", test_golden_dir());
    json_t *meta = json_load_file(gj, 0, &je), *ref = json_load_file(GOLDEN_JSON, 0, &je);
    REQUIRE(meta && ref, "cannot read %s or %s (run tests/unpack-golden.sh)", gj, GOLDEN_JSON);
    const char *var;
    json_t *rv;
    int files = 0;
    json_object_foreach(ref, var, rv) {
        char *p = xasprintf("%s/flux2-gguf/%s", test_golden_dir(), json_string_value(json_object_get(rv, "file")));
        gguf_file *g;
        REQUIRE(gguf_open(p, &g) == 0, "%s", tp_error_msg());
        files++;
        json_t *mv = json_object_get(json_object_get(meta, "variants"), var), *types = json_object_get(mv, "types");
        json_t *rts = json_object_get(rv, "tensors");
        CHECK(g->file_size == (uint64_t)json_integer_value(json_object_get(mv, "bytes")), "%s: size", p);
        CHECK(g->n == (int)json_object_size(types) && g->n == (int)json_object_size(rts), "%s: %d tensors", p, g->n);
        const char *arch;
        CHECK(gguf_get_str(g, "general.architecture", &arch) == 0 && !strcmp(arch, "flux"), "%s: architecture", p);
        for (int i = 0; i < g->n; i++) {
            const gguf_tensor *t = &g->tensors[i];
            json_t *rt = json_object_get(rts, t->name), *ne = json_object_get(rt, "ne");
            REQUIRE(rt, "%s: tensor %s not in golden.json", p, t->name);
            CHECK(!strcmp(quant_type_name(t->type), json_string_value(json_object_get(types, t->name))),
                  "%s: %s is %s", var, t->name, quant_type_name(t->type));
            CHECK(t->ndim == (int)json_array_size(ne), "%s: %s ndim", var, t->name);
            for (int d = 0; d < t->ndim; d++)
                CHECK(t->ne[d] == json_integer_value(json_array_get(ne, (size_t)d)), "%s: %s ne[%d]", var, t->name, d);
            CHECK(t->begin == (uint64_t)json_integer_value(json_object_get(rt, "offset")), "%s: %s offset", var, t->name);
            float *x;
            REQUIRE(gguf_read_f32(g, t->name, &x, NULL) == 0, "%s", tp_error_msg());
            char hex[65];
            sha256_hex(x, (size_t)t->rows * (size_t)t->row_len * 4, hex);
            CHECK(!strcmp(hex, json_string_value(json_object_get(rt, "sha256"))),
                  "%s: %s (%s) dequantises differently from gguf-py", var, t->name, quant_type_name(t->type));
            free(x);
        }
        gguf_close(g);
        free(p);
    }
    CHECK(files == 3, "%d golden files", files);
    json_decref(meta), json_decref(ref);
    free(gj);
}

/* The same file as version 2 (identical layout) and opened from memory. */
TEST(gguf_v2_and_memory) {
    size_t n;
    uint8_t *p = slurp(TYPES_GGUF, &n);
    REQUIRE(p, "cannot read %s", TYPES_GGUF);
    p[4] = 2;
    gguf_file *g, *h;
    REQUIRE(gguf_open_mem(p, n, "v2.gguf", &g) == 0, "%s", tp_error_msg());
    REQUIRE(gguf_open(TYPES_GGUF, &h) == 0, "%s", tp_error_msg());
    CHECK(g->version == 2 && g->n == h->n && g->n_kv == h->n_kv && g->data0 == h->data0, "v2 differs");
    for (int i = 0; i < g->n && i < h->n; i++) {
        float *a, *b;
        REQUIRE(gguf_read_f32(g, h->tensors[i].name, &a, NULL) == 0 && gguf_read_f32(h, h->tensors[i].name, &b, NULL) == 0,
                "%s", tp_error_msg());
        CHECK(!memcmp(a, b, (size_t)h->tensors[i].rows * (size_t)h->tensors[i].row_len * 4), "%s", h->tensors[i].name);
        free(a), free(b);
    }
    CHECK(gguf_is_gguf(TYPES_GGUF) && !gguf_is_gguf(TYPES_REF), "gguf_is_gguf");
    gguf_close(g), gguf_close(h);
    free(p);
}
