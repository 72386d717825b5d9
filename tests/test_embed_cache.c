/* The prompt-embedding LRU cache against a reference model written here
 * (an array with last-use times, evicting the oldest): a random sequence of
 * lookups and stores must give the same hits, misses, evictions and
 * contents. */
#include "test.h"
#include "core/embed_cache.h"
#include <stdlib.h>
#include <string.h>

#define NKEYS 12

typedef struct { int present; size_t n; long used; } ref_entry;

static size_t ref_bytes(const ref_entry *r) {
    size_t b = 0;
    for (int k = 0; k < NKEYS; k++) if (r[k].present) b += r[k].n * sizeof(float);
    return b;
}

static void fill(float *x, size_t n, int key) { for (size_t i = 0; i < n; i++) x[i] = (float)(key * 1000 + (int)i); }

TEST(embed_cache_matches_reference_lru) {
    const size_t cap = 40 * sizeof(float);
    embed_cache *c = embed_cache_create(cap);
    ref_entry ref[NKEYS] = {{0}};
    uint64_t hits = 0, misses = 0, evictions = 0;
    unsigned s = test_seed();
    float buf[64];
    for (long t = 1; t <= 4000; t++) {
        s = s * 1103515245u + 12345u;
        int key = (int)((s >> 8) % NKEYS);
        char name[32];
        snprintf(name, sizeof name, "prompt-%d|512|bf16", key);
        size_t n = 0;
        const float *x = embed_cache_get(c, name, &n);
        if (ref[key].present) {
            hits++;
            ref[key].used = t;
            CHECK(x && n == ref[key].n, "t=%ld key %d: expected a hit of %zu floats", t, key, ref[key].n);
            if (x) {
                fill(buf, n, key);
                CHECK(!memcmp(x, buf, n * sizeof(float)), "t=%ld key %d: wrong contents", t, key);
            }
        } else {
            misses++;
            CHECK(!x, "t=%ld key %d: unexpected hit", t, key);
            size_t len = 4 + (size_t)((s >> 20) % 20);   /* 4..23 floats */
            if (key == 0) len = 50;                        /* never fits: not stored */
            fill(buf, len, key);
            int stored = embed_cache_put(c, name, buf, len);
            if (len * sizeof(float) <= cap) {
                while (ref_bytes(ref) + len * sizeof(float) > cap) {
                    int old = -1;
                    for (int k = 0; k < NKEYS; k++)
                        if (ref[k].present && (old < 0 || ref[k].used < ref[old].used)) old = k;
                    ref[old].present = 0;
                    evictions++;
                }
                ref[key] = (ref_entry){1, len, t};
                CHECK(stored == 1, "t=%ld: not stored", t);
            } else {
                CHECK(stored == 0, "t=%ld: an entry larger than the cache was stored", t);
            }
        }
        if (test_failed()) break;
    }
    embed_cache_stats st;
    embed_cache_get_stats(c, &st);
    CHECK(st.hits == hits && st.misses == misses && st.evictions == evictions,
          "stats %llu/%llu/%llu, reference %llu/%llu/%llu", (unsigned long long)st.hits, (unsigned long long)st.misses,
          (unsigned long long)st.evictions, (unsigned long long)hits, (unsigned long long)misses,
          (unsigned long long)evictions);
    CHECK(st.bytes == ref_bytes(ref) && st.bytes <= cap, "bytes %zu, reference %zu", st.bytes, ref_bytes(ref));
    CHECK(hits > 100 && evictions > 100, "the sequence exercised hits (%llu) and evictions (%llu)",
          (unsigned long long)hits, (unsigned long long)evictions);
    embed_cache_free(c);
}

TEST(embed_cache_off_when_capacity_zero) {
    embed_cache *c = embed_cache_create(0);
    float x[4] = {1, 2, 3, 4};
    CHECK(embed_cache_put(c, "a", x, 4) == 0, "stored with capacity 0");
    CHECK(!embed_cache_get(c, "a", NULL), "hit with capacity 0");
    embed_cache_free(c);
}
