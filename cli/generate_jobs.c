/* The jobs of a run (see runspec.h): every prompt x every seed, the output
 * path of each job from its pattern, the check that no two jobs write the
 * same file, and the data-parallel split of the jobs over TP groups. */
#include "runspec.h"
#include "kernels/err.h"
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_width(const char *v, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) return -1;
    *out = x;
    return 0;
}

int runspec_n_jobs(const run_spec *s) {
    int np = s->prompt_embeds ? 1 : s->n_prompts;
    int ns = s->n_seeds ? s->n_seeds : 1;
    return np * ns;
}

const char *runspec_job_prompt(const run_spec *s, int job) {
    if (s->prompt_embeds || !s->n_prompts) return NULL;
    int ns = s->n_seeds ? s->n_seeds : 1;
    return s->prompts[job / ns];
}

uint64_t runspec_job_seed(const run_spec *s, int job) {
    return s->n_seeds ? s->seeds[job % s->n_seeds] : 0;
}

/* ---- output patterns ---- */

static const char *k_placeholders[] = {"index", "seed", "prompt_index", "seed_index", "prompt"};

int runspec_pattern_varies(const char *p) {
    for (; *p; p++) {
        if (p[0] == '{' && p[1] == '{') { p++; continue; }
        if (*p == '{') return 1;
    }
    return 0;
}

static void slug(const char *prompt, char *out, size_t cap) {
    size_t n = 0;
    int dash = 0;
    for (const char *p = prompt ? prompt : "embeds"; *p && n + 1 < cap && n < 48; p++) {
        unsigned char ch = (unsigned char)*p;
        if (isalnum(ch)) {
            if (dash && n) out[n++] = '-';
            out[n++] = (char)tolower(ch);
            dash = 0;
        } else {
            dash = 1;
        }
    }
    out[n] = 0;
    if (!n) snprintf(out, cap, "prompt");
}

/* step < 0: no {step} placeholder (an output path) */
static char *expand(const run_spec *s, const char *pat, int job, int step) {
    size_t cap = strlen(pat) + 256, n = 0;
    char *out = xmalloc(cap);
    int ns = s->n_seeds ? s->n_seeds : 1;
    for (const char *p = pat; *p;) {
        if (n + 128 >= cap) out = xrealloc(out, cap *= 2);
        if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) { out[n++] = *p; p += 2; continue; }
        if (*p == '}') { free(out); tp_error("unmatched '}' in '%s' (write }} for a literal brace)", pat); return NULL; }
        if (*p != '{') { out[n++] = *p++; continue; }
        const char *end = strchr(p, '}');
        if (!end) { free(out); tp_error("unclosed '{' in '%s'", pat); return NULL; }
        char name[64] = "";
        size_t len = (size_t)(end - p - 1);
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, p + 1, len);
        name[len] = 0;
        int width = 0;
        char *colon = strchr(name, ':');
        if (colon) {
            *colon = 0;
            long long w;
            if (colon[1] != '0' || parse_width(colon + 1, &w) || w < 1 || w > 20) {
                free(out);
                tp_error("bad width in '{%s:%s}' of '%s' (write e.g. {index:04})", name, colon + 1, pat);
                return NULL;
            }
            width = (int)w;
        }
        unsigned long long v = 0;
        int known = 0;
        for (int i = 0; i < 5; i++) known |= !strcmp(name, k_placeholders[i]);
        if (step >= 0 && !strcmp(name, "step")) known = 1;
        if (!known) {
            free(out);
            tp_error("unknown placeholder '{%s}' in '%s' (known: {index} {seed} {prompt_index} {seed_index} {prompt}%s)",
                     name, pat, step >= 0 ? " {step}" : "");
            return NULL;
        }
        if (!strcmp(name, "prompt")) {
            if (width) { free(out); tp_error("{prompt} takes no width in '%s'", pat); return NULL; }
            char sl[64];
            slug(runspec_job_prompt(s, job), sl, sizeof sl);
            n += (size_t)snprintf(out + n, cap - n, "%s", sl);
        } else {
            if (!strcmp(name, "step")) v = (unsigned long long)step;
            else if (!strcmp(name, "index")) v = (unsigned long long)job;
            else if (!strcmp(name, "seed")) v = runspec_job_seed(s, job);
            else if (!strcmp(name, "prompt_index")) v = (unsigned long long)(job / ns);
            else v = (unsigned long long)(job % ns);
            n += (size_t)snprintf(out + n, cap - n, "%0*llu", width, v);
        }
        p = end + 1;
    }
    out[n] = 0;
    return out;
}

char *runspec_output_path(const run_spec *s, const char *pat, int job) { return expand(s, pat, job, -1); }
char *runspec_preview_path(const run_spec *s, const char *pat, int job, int step) { return expand(s, pat, job, step); }

int runspec_group_jobs(int n_jobs, int groups, int group, int *jobs) {
    int n = 0;
    for (int j = group; j < n_jobs; j += groups) jobs[n++] = j;
    return n;
}

typedef struct job_path { char *path; int job; } job_path;

static int cmp_job_path(const void *a, const void *b) {
    return strcmp(((const job_path *)a)->path, ((const job_path *)b)->path);
}

/* One element of a (valid) pattern at *p: a literal character (returned,
 * *ph set to 0) or a placeholder (*ph set to 1, its name in name). */
static int pattern_next(const char **p, int *ph, char *name, size_t cap) {
    const char *q = *p;
    *ph = 0;
    if ((q[0] == '{' && q[1] == '{') || (q[0] == '}' && q[1] == '}')) return *p = q + 2, q[0];
    if (q[0] != '{') return *p = q + 1, q[0];
    const char *end = strchr(q, '}');
    size_t len = (size_t)(end - q - 1);
    const char *colon = memchr(q + 1, ':', len);
    if (colon) len = (size_t)(colon - q - 1);
    snprintf(name, cap, "%.*s", (int)len, q + 1);
    *ph = 1;
    *p = end + 1;
    return 0;
}

/* Whether every job's path is distinct by construction, so that no path
 * needs to be built: {index} is the first placeholder (or the last), and the
 * next literal character after it (before it) is not a digit, or the
 * pattern ends (starts) there. Then the index is read back from the path as
 * the run of digits after the fixed prefix (before the fixed suffix), so
 * different jobs cannot share a path. */
static int pattern_unique(const char *pat) {
    char name[64];
    int ph, n_ph = 0, idx_at = -1, first = -1, last = -1;
    int before = -1, after = -1;   /* the literal characters around {index}; -1: none (pattern edge) */
    int prev = -1, prev_ph = 0, want_after = 0;
    for (const char *p = pat; *p;) {
        int c = pattern_next(&p, &ph, name, sizeof name);
        if (want_after) after = ph ? 'P' : c, want_after = 0;
        if (ph) {
            if (!strcmp(name, "index") && idx_at < 0) {
                idx_at = n_ph;
                before = prev_ph ? 'P' : prev;
                want_after = 1;
            }
            if (first < 0) first = n_ph;
            last = n_ph++;
        }
        prev = c, prev_ph = ph;
    }
    if (idx_at < 0) return 0;
    if (idx_at == first && (after < 0 || (after != 'P' && !(after >= '0' && after <= '9')))) return 1;
    if (idx_at == last && (before < 0 || (before != 'P' && !(before >= '0' && before <= '9')))) return 1;
    return 0;
}

/* two jobs must never write the same file (e.g. {prompt} alone with several seeds) */
int runspec_check_unique_paths(const run_spec *s, const char *pat, const char *name, int n) {
    if (pattern_unique(pat)) return 0;
    /* otherwise every path is built and sorted: bound what that costs */
    char *p0 = runspec_output_path(s, pat, 0);
    if (!p0) return -1;
    uint64_t need = (uint64_t)n * (strlen(p0) + 24 + 1 + sizeof(job_path));
    free(p0);
    if (need > RUNSPEC_MAX_CHECK_BYTES)
        return tp_error("%s: checking that the %d jobs write distinct files would build about %llu MB of paths, "
                        "more than the limit of %u MB; start or end the pattern's placeholders with {index} set apart "
                        "by a non-digit (e.g. out/{index:06}-{seed}.png), or split the batch", name, n,
                        (unsigned long long)(need >> 20), RUNSPEC_MAX_CHECK_BYTES >> 20);
    job_path *p = xmalloc(sizeof *p * (size_t)n);
    int rc = 0, k = 0;
    for (; k < n; k++)
        if (!(p[k].path = runspec_output_path(s, pat, k))) { rc = -1; break; } else p[k].job = k;
    if (!rc) {
        qsort(p, (size_t)n, sizeof *p, cmp_job_path);
        for (int i = 1; i < n && !rc; i++)
            if (!strcmp(p[i].path, p[i - 1].path))
                rc = tp_error("%s: jobs %d and %d would both write '%s'; add {index} or {seed} to the pattern", name,
                              p[i - 1].job < p[i].job ? p[i - 1].job : p[i].job,
                              p[i - 1].job < p[i].job ? p[i].job : p[i - 1].job, p[i].path);
    }
    for (int i = 0; i < k; i++) free(p[i].path);
    free(p);
    return rc;
}

