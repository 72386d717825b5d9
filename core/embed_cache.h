/* A cache of prompt embeddings, bounded in bytes, least recently used out
 * first: a resident server skips the text encoder for a prompt it has seen
 * (regression scripts and services repeat prompts with new seeds). The key
 * is the prompt text together with everything else the embedding depends
 * on (the sequence length, the precision), as one string the caller builds.
 * Not thread-safe: the render loop owns it. */
#ifndef TPGEN_EMBED_CACHE_H
#define TPGEN_EMBED_CACHE_H
#include <stddef.h>
#include <stdint.h>

typedef struct embed_cache embed_cache;

/* The key of one prompt's embedding (malloc'ed; NULL when out of memory):
 * everything the embedding depends on besides the model folder the cache
 * belongs to. encoder: the text encoder's kind (textenc_kind: "qwen3",
 * "mistral", "qwen3vl"); max_len: the max_sequence_length (FLUX.2's fixed
 * window, FLUX.3's cap); pad_multiple: FLUX.3's window multiple (0: fixed
 * window); precision: "bf16" / "f32". The entry's size tells the window
 * (FLUX.3: n / joint_attention_dim rows). */
char *embed_cache_key(const char *encoder, int max_len, int pad_multiple, const char *precision, const char *prompt);

/* cap_bytes: the most embedding bytes held (0: caching off). */
embed_cache *embed_cache_create(size_t cap_bytes);
void embed_cache_free(embed_cache *c);

/* The cached embedding of key (n floats), or NULL; a hit makes it the most
 * recently used. Counts a hit or a miss. */
const float *embed_cache_get(embed_cache *c, const char *key, size_t *n);
/* Store a copy of x (n floats) under key, evicting the least recently used
 * entries until it fits; an entry larger than the whole cache is not kept.
 * Returns 1 when stored, 0 when not, -1 when out of memory. */
int embed_cache_put(embed_cache *c, const char *key, const float *x, size_t n);

typedef struct embed_cache_stats {
    uint64_t hits, misses, evictions;
    size_t bytes, entries;
} embed_cache_stats;
void embed_cache_get_stats(const embed_cache *c, embed_cache_stats *s);

#endif
