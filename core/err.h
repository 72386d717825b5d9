/* Error reporting: functions return 0 on success and -1 on failure after
 * recording a message with tp_error(). The message speaks to a person:
 * what was wrong, where, and what to do. */
#ifndef TPGEN_ERR_H
#define TPGEN_ERR_H
#include <stddef.h>

/* Record an error message (printf-style); always returns -1 so callers can
 * write `return tp_error("...")`. A later call replaces the message. */
int tp_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prefix the current message with context ("loading transformer: ..."). */
int tp_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *tp_error_msg(void);   /* "" when no error was recorded */
void tp_error_clear(void);

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
