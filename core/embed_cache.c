/* Prompt-embedding LRU cache (embed_cache.h): a doubly linked list in use
 * order and a linear key lookup. A server holds tens of entries (FLUX.2-dev:
 * 31 MB per 512-token prompt in f32), so a hash table would buy nothing. */
#include "embed_cache.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    char *key;
    float *x;
    size_t n;
    struct entry *prev, *next;   /* prev: more recently used */
} entry;

struct embed_cache {
    size_t cap, bytes, entries;
    entry *mru, *lru;
    uint64_t hits, misses, evictions;
};

char *embed_cache_key(const char *encoder, int max_len, int pad_multiple, const char *precision, const char *prompt) {
    const char *e = encoder ? encoder : "", *p = precision ? precision : "", *t = prompt ? prompt : "";
    /* the prompt comes last: the fields before it hold no '|' of their own */
    int n = snprintf(NULL, 0, "%s|%d|%d|%s|%s", e, max_len, pad_multiple, p, t);
    char *k = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (k) snprintf(k, (size_t)n + 1, "%s|%d|%d|%s|%s", e, max_len, pad_multiple, p, t);
    return k;
}

embed_cache *embed_cache_create(size_t cap_bytes) {
    embed_cache *c = calloc(1, sizeof *c);
    if (c) c->cap = cap_bytes;
    return c;
}

static void unlink_entry(embed_cache *c, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else c->mru = e->next;
    if (e->next) e->next->prev = e->prev;
    else c->lru = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(embed_cache *c, entry *e) {
    e->prev = NULL;
    e->next = c->mru;
    if (c->mru) c->mru->prev = e;
    c->mru = e;
    if (!c->lru) c->lru = e;
}

static void drop(embed_cache *c, entry *e) {
    unlink_entry(c, e);
    c->bytes -= e->n * sizeof(float);
    c->entries--;
    free(e->key);
    free(e->x);
    free(e);
}

void embed_cache_free(embed_cache *c) {
    if (!c) return;
    while (c->mru) drop(c, c->mru);
    free(c);
}

static entry *find(embed_cache *c, const char *key) {
    for (entry *e = c->mru; e; e = e->next)
        if (!strcmp(e->key, key)) return e;
    return NULL;
}

const float *embed_cache_get(embed_cache *c, const char *key, size_t *n) {
    entry *e = find(c, key);
    if (!e) {
        c->misses++;
        return NULL;
    }
    c->hits++;
    unlink_entry(c, e);
    push_front(c, e);
    if (n) *n = e->n;
    return e->x;
}

int embed_cache_put(embed_cache *c, const char *key, const float *x, size_t n) {
    size_t need = n * sizeof(float);
    entry *old = find(c, key);
    if (old) drop(c, old);
    if (need > c->cap) return 0;
    while (c->bytes + need > c->cap && c->lru) {
        drop(c, c->lru);
        c->evictions++;
    }
    entry *e = calloc(1, sizeof *e);
    if (!e) return -1;
    e->key = strdup(key);
    e->x = malloc(need ? need : 1);
    if (!e->key || !e->x) {
        free(e->key);
        free(e->x);
        free(e);
        return -1;
    }
    memcpy(e->x, x, need);
    e->n = n;
    push_front(c, e);
    c->bytes += need;
    c->entries++;
    return 1;
}

void embed_cache_get_stats(const embed_cache *c, embed_cache_stats *s) {
    s->hits = c->hits;
    s->misses = c->misses;
    s->evictions = c->evictions;
    s->bytes = c->bytes;
    s->entries = c->entries;
}
