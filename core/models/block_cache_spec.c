/* --cache SPEC: parsing, presets, the checks against a model, and the
 * canonical text (block_cache.h; docs/cache.md). */
#include "block_cache.h"
#include "kernels/err.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Presets (docs/cache.md has their measured effect):
 *  balanced: cache-dit's DBCache defaults (threshold 0.08, the 1.80x /
 *            ImageReward 1.037-vs-1.041 row of its FLUX.1 benchmark) on
 *            F1B0 with an 8-step warmup, the single group at 3x (cache-dit's
 *            FLUX.2 example), at most 2 cached steps in a row;
 *  fast:     cache-dit's own FLUX.2 example (F1B0, warmup 8, 0.12 / 0.36,
 *            at most 3 in a row) plus TaylorSeer order 1. */
static const struct { const char *name; bc_spec s; } presets[] = {
    {"balanced", {.on = 1, .fn = 1, .bn = 0, .warmup = 8, .threshold = 0.08, .threshold_single = 0.24,
                  .max_cached = -1, .max_continuous = 2, .taylorseer = 0}},
    {"fast", {.on = 1, .fn = 1, .bn = 0, .warmup = 8, .threshold = 0.12, .threshold_single = 0.36,
              .max_cached = -1, .max_continuous = 3, .taylorseer = 1}},
};

static const char *keys = "fn, bn, warmup, threshold, threshold_single, max_cached, max_continuous, taylorseer";

static int parse_int(const char *key, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi)
        return tp_error("--cache: %s=%s: expected an integer from %ld to %ld", key, v, lo, hi);
    *out = (int)x;
    return 0;
}

static int parse_num(const char *key, const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(x) || x < 0)
        return tp_error("--cache: %s=%s: expected a number >= 0 (a threshold is compared with the relative change of "
                        "the first blocks' residual, e.g. 0.08)", key, v);
    *out = x;
    return 0;
}

static int set_key(bc_spec *s, const char *k, const char *v) {
    if (!strcmp(k, "fn")) return parse_int(k, v, 1, 1000, &s->fn);
    if (!strcmp(k, "bn")) return parse_int(k, v, 0, 1000, &s->bn);
    if (!strcmp(k, "warmup")) return parse_int(k, v, 0, 100000, &s->warmup);
    if (!strcmp(k, "threshold")) return parse_num(k, v, &s->threshold);
    if (!strcmp(k, "threshold_single")) return parse_num(k, v, &s->threshold_single);
    if (!strcmp(k, "max_cached")) return parse_int(k, v, -1, 100000, &s->max_cached);
    if (!strcmp(k, "max_continuous")) return parse_int(k, v, -1, 100000, &s->max_continuous);
    if (!strcmp(k, "taylorseer")) return parse_int(k, v, 0, 2, &s->taylorseer);
    return tp_error("--cache: unknown key '%s' (keys: %s; or a preset: fast, balanced; or off)", k, keys);
}

static int preset(const char *name, bc_spec *s) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(name, presets[i].name)) {
            *s = presets[i].s;
            snprintf(s->preset, sizeof s->preset, "%s", name);
            return 1;
        }
    return 0;
}

int bc_spec_parse(const char *text, bc_spec *out) {
    /* defaults without a preset: F1B0, warmup 8, cache-dit's threshold 0.08 */
    bc_spec s = {.on = 1, .fn = 1, .bn = 0, .warmup = 8, .threshold = 0.08, .threshold_single = -1,
                 .max_cached = -1, .max_continuous = -1, .taylorseer = 0};
    if (!text || !*text || !strcmp(text, "off")) {
        memset(out, 0, sizeof *out);
        return 0;
    }
    char *buf = xstrdup(text), *save = NULL;
    int rc = 0, first = 1;
    for (char *tok = strtok_r(buf, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save), first = 0) {
        char *eq = strchr(tok, '=');
        if (!eq && first && preset(tok, &s)) continue;
        if (!eq) {
            rc = tp_error("--cache %s: '%s' is not key=value (keys: %s; presets: fast, balanced; or off)", text, tok,
                          keys);
            break;
        }
        *eq = 0;
        rc = set_key(&s, tok, eq + 1);
    }
    free(buf);
    if (rc) return -1;
    *out = s;
    return 0;
}

int bc_spec_check_model(const bc_spec *s, int n_double, int n_single, const char *names[2]) {
    if (!s->on) return 0;
    int n[2] = {n_double, n_single};
    for (int g = 0; g < BC_GROUPS; g++)
        if (s->fn + s->bn > n[g])
            return tp_error("--cache: fn=%d + bn=%d is more than the %d %s of this model: each group needs fn + bn "
                            "<= its block count; lower fn or bn", s->fn, s->bn, n[g], names[g]);
    return 0;
}

char *bc_spec_format(const bc_spec *s) {
    if (!s || !s->on) return xstrdup("off");
    char ts[48] = "";
    if (s->threshold_single >= 0) snprintf(ts, sizeof ts, ",threshold_single=%g", s->threshold_single);
    return xasprintf("%s%sfn=%d,bn=%d,warmup=%d,threshold=%g%s,max_cached=%d,max_continuous=%d,taylorseer=%d",
                     s->preset, *s->preset ? "," : "", s->fn, s->bn, s->warmup, s->threshold, ts, s->max_cached,
                     s->max_continuous, s->taylorseer);
}
