/* Hostile GGUF files, built here byte by byte: each is refused by
 * gguf_open / gguf_open_mem with a message naming the file (and the tensor
 * or key where there is one), quickly and without large allocations (the
 * suite runs under ASan with its allocation limits in make asan). */
#include "test.h"
#include "core/formats/gguf.h"
#include "kernels/err.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *x, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}
static void u32(buf *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, 4);
}
static void u64(buf *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, 8);
}
static void str(buf *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void header(buf *b, uint32_t version, uint64_t nt, uint64_t nkv) {
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, nt);
    u64(b, nkv);
}
/* a tensor info: name, dims (fastest first), type, offset */
static void tinfo(buf *b, const char *name, int nd, const uint64_t *ne, uint32_t type, uint64_t off) {
    str(b, name);
    u32(b, (uint32_t)nd);
    for (int i = 0; i < nd; i++) u64(b, ne[i]);
    u32(b, type);
    u64(b, off);
}
static void pad_to(buf *b, size_t align, size_t extra) {
    static const uint8_t z[64];
    while (b->n % align) put(b, z, 1);
    while (extra) {
        size_t k = extra < sizeof z ? extra : sizeof z;
        put(b, z, k);
        extra -= k;
    }
}

/* A valid file: one key (general.architecture) and two tensors, "w" Q8_0
 * [64 x 2] (136 bytes) at 0 and "n" F32 [4] at 160. */
static void valid(buf *b) {
    header(b, 3, 2, 1);
    str(b, "general.architecture");
    u32(b, GGUF_STRING);
    str(b, "flux");
    tinfo(b, "w", 2, (const uint64_t[]){64, 2}, QUANT_Q8_0, 0);
    tinfo(b, "n", 1, (const uint64_t[]){4}, QUANT_F32, 160);
    pad_to(b, 32, 176);
}

/* refused, naming the file and each of the words */
static void refused(buf *b, const char *what, const char *w1, const char *w2) {
    gguf_file *g = NULL;
    clock_t t0 = clock();
    int rc = gguf_open_mem(b->p, b->n, "hostile.gguf", &g);
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(rc == -1 && g == NULL, "%s: accepted", what);
    const char *m = tp_error_msg();
    if (getenv("TPGEN_GGUF_SHOW")) fprintf(stderr, "%s: %s\n", what, m);   /* to read the messages */
    CHECK(strstr(m, "hostile.gguf") && (!w1 || strstr(m, w1)) && (!w2 || strstr(m, w2)), "%s: message '%s'", what, m);
    CHECK(s < 1.0, "%s: took %.2f s", what, s);
    if (rc == 0) gguf_close(g);
    free(b->p);
    *b = (buf){0};
}

TEST(gguf_hostile_valid_baseline) {
    buf b = {0};
    valid(&b);
    gguf_file *g;
    REQUIRE(gguf_open_mem(b.p, b.n, "ok.gguf", &g) == 0, "%s", tp_error_msg());
    CHECK(g->n == 2 && gguf_find(g, "w") && gguf_find(g, "n")->begin == g->data0 + 160, "baseline layout");
    gguf_close(g);
    /* every strict prefix is a truncated file, refused */
    for (size_t k = 0; k < b.n; k++) {
        int rc = gguf_open_mem(b.p, k, "cut.gguf", &g);
        CHECK(rc == -1 && strstr(tp_error_msg(), "cut.gguf"), "prefix of %zu bytes accepted", k);
        if (rc == 0) gguf_close(g);
    }
    /* and through the file path */
    char *p = xasprintf("%s/truncated.gguf", test_tmp_dir());
    FILE *f = fopen(p, "wb");
    fwrite(b.p, 1, b.n - 1, f);
    fclose(f);
    CHECK(gguf_open(p, &g) == -1 && strstr(tp_error_msg(), "truncated.gguf") && strstr(tp_error_msg(), "'n'"),
          "truncated file: %s", tp_error_msg());
    free(p);
    CHECK(gguf_open("/nonexistent/x.gguf", &g) == -1 && strstr(tp_error_msg(), "/nonexistent/x.gguf"), "missing file");
    free(b.p);
}

TEST(gguf_hostile_header) {
    buf b = {0};
    valid(&b);
    b.p[3] = 'X';
    refused(&b, "bad magic", "not a GGUF file", NULL);
    valid(&b);
    b.p[4] = 1;
    refused(&b, "version 1", "version 1", NULL);
    valid(&b);
    b.p[4] = 4;
    refused(&b, "version 4", "version 4", NULL);
    valid(&b);
    b.p[4] = 0, b.p[7] = 3;
    refused(&b, "big-endian", "big-endian", NULL);
    header(&b, 3, 1ull << 40, 0);
    pad_to(&b, 1, 64);
    refused(&b, "huge tensor count", "tensors", NULL);
    header(&b, 3, 0, 1ull << 40);
    pad_to(&b, 1, 64);
    refused(&b, "huge key count", "metadata keys", NULL);
    header(&b, 3, 1000, 0);   /* below the limit, beyond what 64 bytes can hold */
    pad_to(&b, 1, 64);
    refused(&b, "tensor count past the file", "tensors", NULL);
}

TEST(gguf_hostile_metadata) {
    buf b = {0};
    header(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, GGUF_STRING);
    u64(&b, 1ull << 60);
    put(&b, "abc", 3);
    refused(&b, "string length past the end", "past the end", "'k'");
    header(&b, 3, 0, 1);
    u64(&b, 1ull << 62);   /* the key's own length */
    pad_to(&b, 1, 64);
    refused(&b, "key length past the end", "past the end", NULL);
    header(&b, 3, 0, 1);   /* arrays nested 100 deep */
    str(&b, "bomb");
    u32(&b, GGUF_ARRAY);
    for (int i = 0; i < 100; i++) u32(&b, GGUF_ARRAY), u64(&b, 1);
    u32(&b, GGUF_U8), u64(&b, 0);
    refused(&b, "nesting depth bomb", "nested", "'bomb'");
    header(&b, 3, 0, 1);   /* a numeric array longer than the file */
    str(&b, "arr");
    u32(&b, GGUF_ARRAY);
    u32(&b, GGUF_U32), u64(&b, 1ull << 61);
    refused(&b, "array length past the end", "past the end", NULL);
    header(&b, 3, 0, 1);   /* a string array of 2^40 strings */
    str(&b, "toks");
    u32(&b, GGUF_ARRAY);
    u32(&b, GGUF_STRING), u64(&b, 1ull << 40);
    str(&b, "a");
    refused(&b, "string array count past the end", "past the end", NULL);
    header(&b, 3, 0, 1);
    str(&b, "t");
    u32(&b, 13);
    u32(&b, 0);
    refused(&b, "unknown value type", "value type 13", "'t'");
    header(&b, 3, 0, 1);
    str(&b, "b");
    u32(&b, GGUF_BOOL);
    put(&b, "\x07", 1);
    refused(&b, "bool 7", "bool", "'b'");
    header(&b, 3, 0, 2);
    for (int i = 0; i < 2; i++) str(&b, "dup"), u32(&b, GGUF_U8), put(&b, "\x01", 1);
    refused(&b, "duplicate key", "twice", "dup");
    header(&b, 3, 0, 1);
    str(&b, "general.alignment");
    u32(&b, GGUF_U32);
    u32(&b, 48);
    refused(&b, "alignment 48", "power of two", "general.alignment");
    header(&b, 3, 0, 1);
    str(&b, "general.alignment");
    u32(&b, GGUF_STRING);
    str(&b, "32");
    refused(&b, "string alignment", "power of two", NULL);
}

TEST(gguf_hostile_tensors) {
    buf b = {0};
#define ONE_TENSOR(name, nd, ne, type, off, data)                                                                     \
    do {                                                                                                               \
        header(&b, 3, 1, 0);                                                                                           \
        tinfo(&b, name, nd, (const uint64_t[])ne, type, off);                                                          \
        pad_to(&b, 32, data);                                                                                          \
    } while (0)
#define A(...) {__VA_ARGS__}
    ONE_TENSOR("big", 4, A(1u << 20, 1u << 20, 1u << 20, 1u << 20), QUANT_F32, 0, 64);
    refused(&b, "dims product overflow", "2^58", "'big'");
    ONE_TENSOR("five", 5, A(1, 1, 1, 1, 1), QUANT_F32, 0, 64);
    refused(&b, "ndim 5", "5 dimensions", "'five'");
    ONE_TENSOR("zero", 2, A(4, 0), QUANT_F32, 0, 64);
    refused(&b, "zero dimension", "zero", "'zero'");
    ONE_TENSOR("mis", 1, A(4), QUANT_F32, 16, 64);
    refused(&b, "misaligned offset", "alignment", "'mis'");
    ONE_TENSOR("far", 1, A(4), QUANT_F32, 1 << 20, 64);
    refused(&b, "offset past the end", "outside", "'far'");
    ONE_TENSOR("long", 1, A(32), QUANT_F32, 0, 64);   /* 128 bytes in a 64-byte data section */
    refused(&b, "data past the end", "outside", "'long'");
    ONE_TENSOR("odd", 2, A(33, 2), QUANT_Q8_0, 0, 256);
    refused(&b, "row not whole blocks", "whole Q8_0 blocks", "'odd'");
    ONE_TENSOR("alien", 1, A(4), 77, 0, 64);
    refused(&b, "unknown type", "type id 77", "'alien'");
    header(&b, 3, 2, 0);
    tinfo(&b, "a", 1, (const uint64_t[]){16}, QUANT_F32, 0);
    tinfo(&b, "b", 1, (const uint64_t[]){16}, QUANT_F32, 32);   /* a is 64 bytes: [0, 64) */
    pad_to(&b, 32, 128);
    refused(&b, "overlap", "overlap", "'b'");
    header(&b, 3, 2, 0);
    tinfo(&b, "same", 1, (const uint64_t[]){8}, QUANT_F32, 0);
    tinfo(&b, "same", 1, (const uint64_t[]){8}, QUANT_F32, 32);
    pad_to(&b, 32, 64);
    refused(&b, "duplicate tensor", "twice", "'same'");
    header(&b, 3, 1, 0);
    u64(&b, 0);
    pad_to(&b, 1, 64);
    refused(&b, "empty name", "empty", NULL);
#undef ONE_TENSOR
#undef A
}

/* A type ggml defines but tpgen does not decode opens (inspect lists it);
 * using the tensor is refused with its name and the type's. */
TEST(gguf_hostile_unsupported_type) {
    buf b = {0};
    header(&b, 3, 1, 0);
    tinfo(&b, "iq2", 2, (const uint64_t[]){256, 2}, 16 /* IQ2_XXS, 66 bytes a block */, 0);
    pad_to(&b, 32, 132);
    gguf_file *g;
    REQUIRE(gguf_open_mem(b.p, b.n, "iq.gguf", &g) == 0, "%s", tp_error_msg());
    const gguf_tensor *t = gguf_find(g, "iq2");
    float *x;
    CHECK(gguf_check_type(g, t) == -1 && strstr(tp_error_msg(), "'iq2'") && strstr(tp_error_msg(), "IQ2_XXS") &&
          strstr(tp_error_msg(), "iq.gguf"), "check_type: %s", tp_error_msg());
    CHECK(gguf_read_f32(g, "iq2", &x, NULL) == -1 && strstr(tp_error_msg(), "IQ2_XXS"), "read accepted");
    CHECK(!strcmp(quant_type_name(16), "IQ2_XXS") && !strcmp(quant_type_name(77), "unknown"), "type names");
    gguf_close(g);
    free(b.p);
}
