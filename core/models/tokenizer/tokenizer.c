/* Encoding (docs/spec/flux2-text-vae.md §5.1): added tokens first, then per segment NFC (if the file
 * asks for it), the pre-tokenizer regex, and byte-level BPE on each piece.
 * Loading lives in tokenizer_load.c (file and format) over tokenizer_hf.c /
 * tokenizer_tekken.c, the tables in tokenizer_vocab.c. */
#include "tokenizer_int.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct { int32_t *v; int n, cap; } id_list;

static void push_id(id_list *l, int32_t id) {
    if (l->n == l->cap) l->cap = l->cap ? l->cap * 2 : 64, l->v = xrealloc(l->v, (size_t)l->cap * sizeof *l->v);
    l->v[l->n++] = id;
}

/* A candidate merge of the adjacent symbols starting at byte offsets left and
 * right, valid while those symbols still hold lid and rid. */
typedef struct { int32_t rank, left, right, lid, rid, merged; } bpe_cand;

/* Scratch space for one encode call, grown as needed. Symbols are indexed by
 * the byte offset where they start; a merged-away symbol has len 0. */
typedef struct {
    int32_t *id, *len, *next, *prev;
    int cap;
    bpe_cand *heap;
    int heap_n, heap_cap;
} bpe_work;

static void work_reserve(bpe_work *w, int n) {
    if (n <= w->cap) return;
    w->cap = n * 2;
    w->id = xrealloc(w->id, (size_t)w->cap * sizeof *w->id);
    w->len = xrealloc(w->len, (size_t)w->cap * sizeof *w->len);
    w->next = xrealloc(w->next, (size_t)w->cap * sizeof *w->next);
    w->prev = xrealloc(w->prev, (size_t)w->cap * sizeof *w->prev);
    w->heap_cap = w->cap * 3; /* n-1 initial pairs + at most 2 per merge */
    w->heap = xrealloc(w->heap, (size_t)w->heap_cap * sizeof *w->heap);
}

static void work_free(bpe_work *w) {
    free(w->id), free(w->len), free(w->next), free(w->prev), free(w->heap);
}

static int cand_less(const bpe_cand *a, const bpe_cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left; /* ties: leftmost */
}

static void heap_push(bpe_work *w, bpe_cand c) {
    int i = w->heap_n++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_less(&c, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static bpe_cand heap_pop(bpe_work *w) {
    bpe_cand top = w->heap[0], last = w->heap[--w->heap_n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= w->heap_n) break;
        if (c + 1 < w->heap_n && cand_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!cand_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->heap_n) w->heap[i] = last;
    return top;
}

static void try_pair(const tokenizer *t, bpe_work *w, int left, int right) {
    uint64_t key = (uint64_t)(uint32_t)w->id[left] << 32 | (uint32_t)w->id[right];
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & t->pair_mask;
    for (;; h = (h + 1) & t->pair_mask) {
        if (t->pair_keys[h] == UINT64_MAX) return;
        if (t->pair_keys[h] == key) break;
    }
    heap_push(w, (bpe_cand){t->pair_rank[h], left, right, w->id[left], w->id[right], t->pair_merged[h]});
}

/* BPE on one piece of raw bytes: repeatedly merge the adjacent pair with the
 * lowest merge rank (leftmost on ties) until no adjacent pair is a merge. */
static void bpe_piece(const tokenizer *t, const uint8_t *p, int n, bpe_work *w, id_list *out) {
    if (n == 1) { push_id(out, t->byte_id[p[0]]); return; }
    if (t->ignore_merges) {
        int id = tok_vocab_find(t, (const char *)p, n);
        if (id >= 0) { push_id(out, id); return; }
    }
    work_reserve(w, n);
    for (int i = 0; i < n; i++)
        w->id[i] = t->byte_id[p[i]], w->len[i] = 1, w->next[i] = i + 1, w->prev[i] = i - 1;
    w->heap_n = 0;
    for (int i = 0; i + 1 < n; i++) try_pair(t, w, i, i + 1);
    while (w->heap_n) {
        bpe_cand c = heap_pop(w);
        if (!w->len[c.left] || !w->len[c.right] || w->next[c.left] != c.right || w->id[c.left] != c.lid ||
            w->id[c.right] != c.rid)
            continue; /* stale: one side has merged since */
        int l = c.left, r = c.right;
        w->id[l] = c.merged;
        w->len[l] += w->len[r];
        w->len[r] = 0;
        w->next[l] = w->next[r];
        if (w->next[l] < n) w->prev[w->next[l]] = l;
        if (w->prev[l] >= 0) try_pair(t, w, w->prev[l], l);
        if (w->next[l] < n) try_pair(t, w, l, w->next[l]);
    }
    for (int i = 0; i < n; i = w->next[i]) push_id(out, w->id[i]);
}

static int utf8_len_at(const uint8_t *s) {
    return s[0] < 0x80 ? 1 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : 4;
}

/* Split a segment with the pre-tokenizer regex (behaviour "Isolated": each
 * match is a piece, and so is any text between matches) and BPE each piece. */
static int split_and_bpe(const tokenizer *t, const char *s, size_t n, pcre2_match_data *md, bpe_work *w, id_list *out) {
    if (!t->split_re) {
        bpe_piece(t, (const uint8_t *)s, (int)n, w, out);
        return 0;
    }
    size_t gap = 0, search = 0;
    while (search < n) {
        int rc = pcre2_match(t->split_re, (PCRE2_SPTR)s, n, search, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tp_error("%s: the pre-tokenizer regex failed: %s", t->source, msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) { /* an empty match yields no piece */
            if (ov[0] >= n) break;   /* at the end (e.g. '$'): s[n] is past the text */
            search = ov[0] + (size_t)utf8_len_at((const uint8_t *)s + ov[0]);
            continue;
        }
        if (ov[0] > gap) bpe_piece(t, (const uint8_t *)s + gap, (int)(ov[0] - gap), w, out);
        bpe_piece(t, (const uint8_t *)s + ov[0], (int)(ov[1] - ov[0]), w, out);
        gap = search = ov[1];
    }
    if (gap < n) bpe_piece(t, (const uint8_t *)s + gap, (int)(n - gap), w, out);
    return 0;
}

static int is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0x80) return 0;
    return 1;
}

/* Normalise and pre-tokenise the text between two added tokens. */
static int encode_segment(const tokenizer *t, const char *s, size_t n, pcre2_match_data *md, bpe_work *w, id_list *out) {
    if (n == 0) return 0;
    utf8proc_uint8_t *norm = NULL;
    char *prefixed = NULL;
    if (t->nfc && !is_ascii(s, n)) { /* ASCII is already NFC */
        utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &norm,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (m < 0) return tp_error("NFC normalisation failed: %s", utf8proc_errmsg(m));
        s = (const char *)norm, n = (size_t)m;
    }
    if (t->add_prefix_space && s[0] != ' ') {
        prefixed = xmalloc(n + 1);
        prefixed[0] = ' ';
        memcpy(prefixed + 1, s, n);
        s = prefixed, n++;
    }
    int rc = split_and_bpe(t, s, n, md, w, out);
    free(norm);
    free(prefixed);
    return rc;
}

/* Longest added token starting at s (bucketed by first byte, longest first). */
static int added_at(const tokenizer *t, const char *s, size_t left, int *len) {
    uint8_t b = (uint8_t)s[0];
    for (int k = t->added_start[b]; k < t->added_start[b + 1]; k++) {
        int id = t->added_ids[k], n = t->tok_len[id];
        if ((size_t)n <= left && !memcmp(s, t->arena + t->tok_off[id], (size_t)n)) {
            *len = n;
            return id;
        }
    }
    return -1;
}

static int check_utf8(const char *text, size_t len) {
    size_t i = 0;
    while (i < len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k < 0)
            return tp_error("the prompt is not valid UTF-8: bad byte 0x%02x at byte offset %zu; "
                            "pass the text in UTF-8", (uint8_t)text[i], i);
        i += (size_t)k;
    }
    return 0;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    if (check_utf8(text, len)) return -1;
    id_list out = {0};
    bpe_work w = {0};
    pcre2_match_data *md = t->split_re ? pcre2_match_data_create_from_pattern(t->split_re, NULL) : NULL;
    size_t seg = 0, i = 0;
    int rc = 0;
    while (i < len && rc == 0) {
        int alen, id = added_at(t, text + i, len - i, &alen);
        if (id < 0) { i++; continue; }
        rc = encode_segment(t, text + seg, i - seg, md, &w, &out);
        push_id(&out, id);
        i += (size_t)alen;
        seg = i;
    }
    if (rc == 0) rc = encode_segment(t, text + seg, len - seg, md, &w, &out);
    if (md) pcre2_match_data_free(md);
    work_free(&w);
    if (rc) { free(out.v); return -1; }
    *ids = out.v;
    *n = out.n;
    return 0;
}
