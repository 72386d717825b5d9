#include "err.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The message body and, apart from it, the world rank it was agreed on
 * (-1: not agreed yet). Keeping the rank out of the body is what lets a
 * context added after an agreement go after the one "rank R: " prefix
 * instead of in front of it (which would make the next agreement add a
 * second prefix). */
static _Thread_local char g_msg[4096];
static _Thread_local char g_full[4096 + 32];
static _Thread_local int g_rank = -1;

int tp_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    g_rank = -1;
    return -1;
}

void tp_error_set_rank(int world_rank) { g_rank = world_rank; }
int tp_error_rank(void) { return g_rank; }
const char *tp_error_body(void) { return g_msg; }

int tp_error_context(const char *fmt, ...) {
    char prefix[1024], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    snprintf(g_msg, sizeof g_msg, "%.1000s: %.3000s", prefix, old);
    return -1;
}

const char *tp_error_msg(void) {
    if (g_rank < 0) return g_msg;
    snprintf(g_full, sizeof g_full, "rank %d: %s", g_rank, g_msg);
    return g_full;
}
void tp_error_clear(void) { g_msg[0] = 0; g_rank = -1; }

void tp_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tpgen: internal error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) tp_fatal("out of memory allocating %zu bytes", n);
    return p;
}
void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) tp_fatal("out of memory allocating %zu x %zu bytes", n, sz);
    return p;
}
void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) tp_fatal("out of memory reallocating %zu bytes", n);
    return q;
}
char *xstrdup(const char *s) { return strcpy(xmalloc(strlen(s) + 1), s); }
char *xasprintf(const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = xmalloc((size_t)n + 1);
    vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}
