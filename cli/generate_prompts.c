/* --prompts-file: one prompt per line, for batch jobs that render thousands
 * of prompts (see runspec.h). The file is text a user or a script wrote,
 * so every problem is reported with its line number: invalid UTF-8, a NUL
 * byte, a line over the length limit. A UTF-8 byte-order mark and CRLF line
 * ends (files from Windows editors) are accepted; blank lines are skipped. */
#include "runspec.h"
#include "kernels/err.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* the longest line accepted: a prompt is a few hundred tokens, so a longer
 * line is almost certainly a binary or a file without line breaks */
#define MAX_LINE_BYTES RUNSPEC_MAX_PROMPT_BYTES
#define MAX_FILE_BYTES ((size_t)1 << 30)

static int is_blank(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\f' && p[i] != '\v') return 0;
    return 1;
}

/* 1-based column of the first byte that is not valid UTF-8, 0 if none */
static size_t bad_utf8_column(const char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return i + 1;
        i += (size_t)k;
    }
    return 0;
}

int runspec_parse_prompt_lines(const char *text, size_t len, const char *name, char ***prompts, int *count) {
    *prompts = NULL;
    *count = 0;
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) text += 3, len -= 3;   /* byte-order mark */
    char **list = NULL;
    int n = 0, cap = 0;
    size_t line = 0;
    for (size_t pos = 0; pos < len;) {
        line++;
        const char *start = text + pos, *nl = memchr(start, '\n', len - pos);
        size_t n_bytes = nl ? (size_t)(nl - start) : len - pos;
        pos += n_bytes + (nl ? 1 : 0);
        if (n_bytes && start[n_bytes - 1] == '\r') n_bytes--;
        const char *nul = memchr(start, 0, n_bytes);
        size_t col = nul ? 0 : bad_utf8_column(start, n_bytes);
        int rc = 0;
        if (n_bytes > MAX_LINE_BYTES)
            rc = tp_error("%s:%zu: the line is %zu bytes long, more than the limit of %d (one prompt per line)", name,
                          line, n_bytes, MAX_LINE_BYTES);
        else if (nul)
            rc = tp_error("%s:%zu:%zu: a NUL byte; the prompts file must be UTF-8 text, one prompt per line", name, line,
                          (size_t)(nul - start) + 1);
        else if (col)
            rc = tp_error("%s:%zu:%zu: invalid UTF-8 (byte 0x%02x); save the file as UTF-8", name, line, col,
                          (unsigned char)start[col - 1]);
        if (rc) {
            for (int i = 0; i < n; i++) free(list[i]);
            free(list);
            return -1;
        }
        if (is_blank(start, n_bytes)) continue;
        if (n == cap) list = xrealloc(list, sizeof *list * (size_t)(cap = cap ? 2 * cap : 64));
        list[n] = xmalloc(n_bytes + 1);
        memcpy(list[n], start, n_bytes);
        list[n++][n_bytes] = 0;
    }
    if (!n) return tp_error("%s: the prompts file has no prompts (one per line; blank lines are skipped)", name);
    *prompts = list;
    *count = n;
    return 0;
}

/* the whole file: prompts files are small next to the models they drive.
 * The size is checked with fstat before anything is read. */
static int read_all(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return tp_error("--prompts-file %s: cannot open it: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size >= MAX_FILE_BYTES) {
        fclose(f);
        return tp_error("--prompts-file %s: %lld bytes, larger than the limit of 1 GB; split the batch", path,
                        (long long)sb.st_size);
    }
    size_t cap = 1 << 16, n = 0, k;
    char *buf = xmalloc(cap);
    while ((k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            if (cap >= MAX_FILE_BYTES) break;
            buf = xrealloc(buf, cap *= 2);
        }
    }
    int bad = ferror(f), big = n >= MAX_FILE_BYTES;
    fclose(f);
    if (bad || big) {
        free(buf);
        return bad ? tp_error("--prompts-file %s: read error", path)
                   : tp_error("--prompts-file %s: larger than 1 GB; split the batch", path);
    }
    *out = buf, *len = n;
    return 0;
}

int runspec_read_prompts_file(run_spec *s) {
    if (!s->prompts_file) return 0;
    if (s->n_prompts)
        return tp_error("give either --prompts-file (prompts_file:) or --prompt / prompts:, not both");
    char *buf = NULL;
    size_t len = 0;
    if (read_all(s->prompts_file, &buf, &len)) return -1;
    char **list = NULL;
    int n = 0;
    int rc = runspec_parse_prompt_lines(buf, len, s->prompts_file, &list, &n);
    free(buf);
    if (rc) return -1;
    s->prompts = list, s->n_prompts = n;
    return 0;
}
