/* Fast path for the two big members of a tokenizer.json: model.vocab
 * (150k "key": id pairs) and model.merges (150k entries). A general JSON
 * parser builds a tree of 300k nodes only for us to walk and free it; this
 * scanner reads them straight into flat arrays (raw bytes, the byte-level
 * mapping already undone) and then cuts them out of the text, so jansson
 * parses only the small rest. Anything unexpected makes the scan give up and
 * the caller falls back to jansson for the whole file, which also produces
 * the error message with line and column. */
#include "tokenizer_scan.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p, *end;
    const int16_t *cp_to_byte;
} scanner;

static void ws(scanner *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static int expect(scanner *s, char c) {
    ws(s);
    if (s->p >= s->end || *s->p != c) return -1;
    s->p++;
    return 0;
}

static int hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int c = (uint8_t)p[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/* One code point of a JSON string body (escape or raw UTF-8); -1 at the
 * closing quote or on malformed input (*bad set). */
static int64_t string_cp(scanner *s, int *bad) {
    if (s->p >= s->end) return *bad = 1, -1;
    uint8_t c = (uint8_t)*s->p;
    if (c == '"') return s->p++, -1;
    if (c == '\\') {
        if (s->end - s->p < 2) return *bad = 1, -1;
        char e = s->p[1];
        s->p += 2;
        switch (e) {
        case '"': return '"';
        case '\\': return '\\';
        case '/': return '/';
        case 'b': return 8;
        case 'f': return 12;
        case 'n': return 10;
        case 'r': return 13;
        case 't': return 9;
        case 'u': {
            uint32_t v, lo;
            if (s->end - s->p < 4 || hex4(s->p, &v)) return *bad = 1, -1;
            s->p += 4;
            if (v >= 0xDC00 && v <= 0xDFFF) return *bad = 1, -1;   /* a lone low surrogate: jansson refuses it */
            if (v == 0) return *bad = 1, -1;                         /* NUL: leave it to jansson */
            if (v >= 0xD800 && v < 0xDC00) { /* surrogate pair */
                if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u' || hex4(s->p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return *bad = 1, -1;
                s->p += 6;
                v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            }
            return v;
        }
        default: return *bad = 1, -1;
        }
    }
    /* strict UTF-8, as jansson checks it: continuation bytes 10xxxxxx, no
     * overlong forms, no surrogates, nothing above U+10FFFF */
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || s->end - s->p < n || c < 0x20) return *bad = 1, -1;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if (((uint8_t)s->p[i] & 0xC0) != 0x80) return *bad = 1, -1;
        cp = cp << 6 | ((uint8_t)s->p[i] & 0x3F);
    }
    static const uint32_t k_min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < k_min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return *bad = 1, -1;
    s->p += n;
    return cp;
}

static void put_byte(hf_fast *f, char b) {
    if (f->nbytes == f->cap_bytes) f->cap_bytes = f->cap_bytes ? f->cap_bytes * 2 : 1 << 20, f->bytes = xrealloc(f->bytes, f->cap_bytes);
    f->bytes[f->nbytes++] = b;
}

/* A byte-level string: the bytes its code points stand for. A code point
 * outside the alphabet makes *unmapped 1 (the bytes are then meaningless);
 * split_at_space records where an unescaped-or-escaped U+0020 separates the
 * two halves of a merge "A B" (space itself is never in the alphabet). */
static int scan_mapped(scanner *s, hf_fast *f, int *unmapped, int64_t *space_at) {
    if (expect(s, '"')) return -1;
    int bad = 0;
    for (;;) {
        int64_t cp = string_cp(s, &bad);
        if (cp < 0) return bad ? -1 : 0;
        if (cp == ' ' && space_at && *space_at < 0) *space_at = (int64_t)f->nbytes;
        else if (cp < 0x144 && s->cp_to_byte[cp] >= 0) put_byte(f, (char)s->cp_to_byte[cp]);
        else *unmapped = 1;
    }
}

static int scan_uint(scanner *s, int32_t *v) {
    ws(s);
    int64_t x = 0;
    const char *start = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9' && x <= 0x7fffffff) x = x * 10 + (*s->p++ - '0');
    if (s->p - start > 1 && *start == '0') return -1;   /* "01" is not JSON; jansson reports it */
    if (s->p == start || x > 0x7fffffff || (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E'))) return -1;
    *v = (int32_t)x;
    return 0;
}

static int scan_vocab(scanner *s, hf_fast *f) {
    if (expect(s, '{')) return -1;
    ws(s);
    if (s->p < s->end && *s->p == '}') return s->p++, 0;
    for (;;) {
        if (f->n_vocab == f->cap_vocab) {
            f->cap_vocab = f->cap_vocab ? f->cap_vocab * 2 : 1 << 16;
            f->vocab = xrealloc(f->vocab, (size_t)f->cap_vocab * sizeof *f->vocab);
        }
        hf_fast_entry *e = &f->vocab[f->n_vocab];
        int unmapped = 0;
        e->off = (uint32_t)f->nbytes;
        if (scan_mapped(s, f, &unmapped, NULL) || expect(s, ':') || scan_uint(s, &e->id)) return -1;
        e->len = unmapped ? -1 : (int32_t)(f->nbytes - e->off);
        f->n_vocab++;
        ws(s);
        if (s->p < s->end && *s->p == '}') return s->p++, 0;
        if (expect(s, ',')) return -1;
    }
}

/* merges: ["A B", ...] or [["A", "B"], ...]; each stored as the bytes of A
 * then B, with the length of A. */
static int scan_merges(scanner *s, hf_fast *f) {
    if (expect(s, '[')) return -1;
    ws(s);
    if (s->p < s->end && *s->p == ']') return s->p++, 0;
    for (;;) {
        if (f->n_merges == f->cap_merges) {
            f->cap_merges = f->cap_merges ? f->cap_merges * 2 : 1 << 16;
            f->merges = xrealloc(f->merges, (size_t)f->cap_merges * sizeof *f->merges);
        }
        hf_fast_merge *m = &f->merges[f->n_merges];
        int unmapped = 0;
        m->off = (uint32_t)f->nbytes;
        ws(s);
        if (s->p < s->end && *s->p == '[') {
            s->p++;
            if (scan_mapped(s, f, &unmapped, NULL)) return -1;
            m->len_a = (int32_t)(f->nbytes - m->off);
            if (expect(s, ',') || scan_mapped(s, f, &unmapped, NULL) || expect(s, ']')) return -1;
        } else {
            int64_t sp = -1;
            if (scan_mapped(s, f, &unmapped, &sp) || sp < 0) return -1;
            m->len_a = (int32_t)(sp - m->off);
        }
        if (unmapped) return -1; /* let the general path name the entry */
        m->len = (int32_t)(f->nbytes - m->off);
        f->n_merges++;
        ws(s);
        if (s->p < s->end && *s->p == ']') return s->p++, 0;
        if (expect(s, ',')) return -1;
    }
}

/* Skip any JSON value (strings with escapes, nesting by depth). */
static int skip_value(scanner *s) {
    ws(s);
    int depth = 0;
    while (s->p < s->end) {
        char c = *s->p;
        if (c == '"') {
            for (s->p++; s->p < s->end && *s->p != '"'; s->p++)
                if (*s->p == '\\') s->p++;
            if (s->p >= s->end) return -1;
            s->p++;
        } else if (c == '{' || c == '[') {
            depth++, s->p++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) return 0; /* end of the enclosing container */
            depth--, s->p++;
        } else if (c == ',' && depth == 0) {
            return 0;
        } else {
            s->p++;
        }
        if (depth == 0 && (c == '"' || c == '}' || c == ']')) return 0;
    }
    return depth ? -1 : 0;
}

/* The raw text of an object key (no escapes expected in the keys we look for). */
static int scan_key(scanner *s, const char **k, size_t *n) {
    if (expect(s, '"')) return -1;
    *k = s->p;
    while (s->p < s->end && *s->p != '"')
        s->p += *s->p == '\\' ? 2 : 1;
    if (s->p >= s->end) return -1;
    *n = (size_t)(s->p++ - *k);
    return expect(s, ':');
}

/* Remember a value to cut out of the text later (its brackets stay). */
static void mark_span(hf_fast *f, char *from, char *to) {
    f->span_from[f->n_spans] = from;
    f->span_to[f->n_spans++] = to;
}

/* Cut the marked values, keeping their brackets and the newlines inside
 * them so that jansson's line numbers stay right. Returns the new length. */
static size_t cut_spans(char *text, size_t len, hf_fast *f) {
    char *w = text, *r = text, *end = text + len;
    for (int i = 0; i <= f->n_spans; i++) {
        char *stop = i < f->n_spans ? f->span_from[i] + 1 : end;
        size_t n = (size_t)(stop - r);
        memmove(w, r, n);
        w += n;
        if (i == f->n_spans) break;
        for (r = stop; r < f->span_to[i] - 1; r++)
            if (*r == '\n') *w++ = '\n';
    }
    return (size_t)(w - text);
}

static int key_is(const char *k, size_t n, const char *want) { return n == strlen(want) && !memcmp(k, want, n); }

static int scan_model(scanner *s, hf_fast *f) {
    if (expect(s, '{')) return -1;
    for (;;) {
        ws(s);
        if (s->p < s->end && *s->p == '}') return s->p++, 0;
        const char *k;
        size_t n;
        if (scan_key(s, &k, &n)) return -1;
        ws(s);
        char *start = s->p;
        /* a member given twice: give up, so that jansson reports the duplicate */
        if ((key_is(k, n, "vocab") && f->have_vocab) || (key_is(k, n, "merges") && f->have_merges)) return -1;
        if (key_is(k, n, "vocab")) {
            if (scan_vocab(s, f)) return -1;
            mark_span(f, start, s->p);
            f->have_vocab = 1;
        } else if (key_is(k, n, "merges")) {
            if (scan_merges(s, f)) return -1;
            mark_span(f, start, s->p);
            f->have_merges = 1;
        } else if (skip_value(s)) {
            return -1;
        }
        ws(s);
        if (s->p < s->end && *s->p == ',') s->p++;
    }
}

int hf_fast_scan(char *text, size_t *len_io, const int16_t *cp_to_byte, hf_fast *f) {
    memset(f, 0, sizeof *f);
    scanner s = {text, text + *len_io, cp_to_byte};
    int seen_model = 0;
    if (expect(&s, '{')) return -1;
    for (;;) {
        ws(&s);
        if (s.p >= s.end) return -1;
        if (*s.p == '}') break;
        const char *k;
        size_t n;
        if (scan_key(&s, &k, &n)) return -1;
        if (key_is(k, n, "model")) {
            if (seen_model++) return -1;   /* twice: jansson reports it */
            char *save = s.p;
            if (scan_model(&s, f)) {
                s.p = save; /* not the shape we read fast: leave it to jansson */
                return -1;
            }
        } else if (skip_value(&s)) {
            return -1;
        }
        ws(&s);
        if (s.p < s.end && *s.p == ',') s.p++;
    }
    if (!f->have_vocab || !f->have_merges) return -1;
    if (f->n_spans == 2 && f->span_from[1] < f->span_from[0]) { /* merges came first */
        char *a = f->span_from[0], *b = f->span_to[0];
        f->span_from[0] = f->span_from[1], f->span_to[0] = f->span_to[1];
        f->span_from[1] = a, f->span_to[1] = b;
    }
    *len_io = cut_spans(text, *len_io, f);
    return 0;
}

void hf_fast_free(hf_fast *f) {
    free(f->bytes);
    free(f->vocab);
    free(f->merges);
    memset(f, 0, sizeof *f);
}
