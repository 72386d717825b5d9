/* Error reporting: functions return 0 on success and -1 on failure after
 * recording a message with tp_error(). The message speaks to a person:
 * what was wrong, where, and what to do. */
#ifndef TPGEN_ERR_H
#define TPGEN_ERR_H
#include <stddef.h>

/* Record an error message (printf-style); always returns -1 so callers can
 * write `return tp_error("...")`. A later call replaces the message. */
int tp_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prefix the current message with context ("loading transformer: ..."); an
 * agreed message keeps its single "rank R: " in front of every context. */
int tp_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The message as printed: "rank R: body" once agreed (dist_agree), else the
 * body; "" when no error was recorded. */
const char *tp_error_msg(void);
void tp_error_clear(void);
/* The rank prefix, set by dist_agree (the lowest failing world rank); a new
 * tp_error() clears it. tp_error_body() is the message without it. */
void tp_error_set_rank(int world_rank);
int tp_error_rank(void);          /* -1 when the message was not agreed yet */
const char *tp_error_body(void);

/* Unrecoverable programming error (bad op arguments): print and abort. */
void tp_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* malloc/calloc/realloc that call tp_fatal on exhaustion; for small
 * bookkeeping only. Large buffers (weights, activations) go through the
 * backend allocator and report out-of-memory as a normal error. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t sz);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
