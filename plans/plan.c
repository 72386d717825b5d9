/* The plan engine: glob matching, block resolution, divisibility checks
 * and the per-rank pieces (docs/spec/flux2-transformer.md §7, §8.2). Plans
 * themselves are data (plans/<model>_plan.c). */
#include "plan.h"
#include "kernels/err.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *shard_style_name(shard_style s) {
    switch (s) {
    case STYLE_REPLICATED: return "replicated";
    case STYLE_COLWISE: return "colwise";
    case STYLE_ROWWISE: return "rowwise";
    case STYLE_ROWWISE_SPLIT_INPUT: return "rowwise_split_input";
    case STYLE_PACKED_COLWISE: return "packed_colwise";
    case STYLE_PACKED_ROWWISE: return "packed_rowwise";
    }
    return "?";
}

static int splits_dim0(shard_style s) { return s == STYLE_COLWISE || s == STYLE_PACKED_COLWISE; }
static int is_packed(shard_style s) { return s == STYLE_PACKED_COLWISE || s == STYLE_PACKED_ROWWISE; }

void plan_add_symbol(plan *p, const char *name, int64_t value) {
    if (p->n_symbols >= PLAN_MAX_SYMBOLS) tp_fatal("plan %s: too many symbols", p->model);
    p->sym_names[p->n_symbols] = name;
    p->sym_values[p->n_symbols++] = value;
}

void plan_add_divisor(plan *p, const char *name, int64_t value) {
    if (p->n_divisors >= 4) tp_fatal("plan %s: too many divisors", p->model);
    p->div_names[p->n_divisors] = name;
    p->div_values[p->n_divisors++] = value;
}

int64_t plan_symbol(const plan *p, const char *name) {
    for (int i = 0; i < p->n_symbols; i++)
        if (!strcmp(p->sym_names[i], name)) return p->sym_values[i];
    return -1;
}

/* '*' stands for a block index: one or more digits. Anchored at both ends. */
static int glob_match(const char *glob, const char *name) {
    const char *star = strchr(glob, '*');
    if (!star) return !strcmp(glob, name);
    size_t pre = (size_t)(star - glob), suf = strlen(star + 1), n = strlen(name);
    if (n < pre + suf + 1 || strncmp(glob, name, pre) || strcmp(name + n - suf, star + 1)) return 0;
    for (size_t i = pre; i < n - suf; i++)
        if (!isdigit((unsigned char)name[i])) return 0;
    return 1;
}

static const plan_rule *find_rule(const plan *p, const char *name, int *index) {
    for (int i = 0; p && i < p->n_rules; i++)
        if (glob_match(p->rules[i].glob, name)) { *index = i; return &p->rules[i]; }
    *index = -1;
    return NULL;
}

/* Resolve "1,1" (proportions of the split dim) or "D,D,D,M,M" (plan
 * symbols: absolute sizes that must add up to the split dim). */
static int resolve_blocks(const plan *p, const plan_rule *r, const char *tname, int64_t len, shard_info *si) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", r->blocks ? r->blocks : "");
    int64_t v[8], sum = 0;
    int n = 0, n_sym = 0;
    for (char *save, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        if (n == 8) return tp_error("plan %s rule '%s': more than 8 blocks", p->model, r->glob);
        char *end;
        long long x = strtoll(tok, &end, 10);
        if (*end) {
            x = plan_symbol(p, tok);
            if (x < 0) return tp_error("plan %s rule '%s': block '%s' is neither a number nor a symbol of the plan",
                                       p->model, r->glob, tok);
            n_sym++;
        }
        if (x <= 0) return tp_error("plan %s rule '%s': block '%s' must be positive", p->model, r->glob, tok);
        v[n++] = x;
        sum += x;
    }
    if (n == 0) return tp_error("plan %s rule '%s': a packed style needs blocks", p->model, r->glob);
    if (n_sym && n_sym != n)
        return tp_error("plan %s rule '%s': blocks '%s' mix numbers and symbols", p->model, r->glob, r->blocks);
    if (n_sym && sum != len)
        return tp_error("tensor '%s': blocks %s add up to %lld but the split dimension is %lld (config.json does "
                        "not match the checkpoint)", tname, r->blocks, (long long)sum, (long long)len);
    if (!n_sym && len % sum)
        return tp_error("tensor '%s': split dimension %lld cannot be divided in the proportions %s", tname,
                        (long long)len, r->blocks);
    si->n_blocks = n;
    for (int i = 0; i < n; i++) si->blocks[i] = n_sym ? v[i] : v[i] * (len / sum);
    return 0;
}

static int check_divisible(const plan_rule *r, const char *tname, const shard_info *si, int tp) {
    for (int j = 0; j < si->n_blocks; j++) {
        if (si->blocks[j] % tp == 0) continue;
        if (!is_packed(r->style))
            return tp_error("tensor '%s' (%s): %s %lld is not divisible by tp %d; choose a tp that divides it", tname,
                            shard_style_name(r->style), splits_dim0(r->style) ? "out_features" : "in_features",
                            (long long)si->blocks[j], tp);
        return tp_error("tensor '%s' (%s, blocks %s): block %d of size %lld is not divisible by tp %d; every packed "
                        "block must split evenly", tname, shard_style_name(r->style), r->blocks, j,
                        (long long)si->blocks[j], tp);
    }
    return 0;
}

static void global_shape(const plan_tensor *t, shard_info *si) {
    si->global_rows = t->ndim >= 2 ? t->shape[0] : 1;
    si->global_cols = 1;
    for (int d = t->ndim >= 2 ? 1 : 0; d < t->ndim; d++) si->global_cols *= t->shape[d];
}

int plan_shard(const plan *p, plan_tensor tensor, int tp, shard_info *out) {
    const plan_tensor *t = &tensor;
    memset(out, 0, sizeof *out);
    global_shape(t, out);
    out->local_rows = out->global_rows, out->local_cols = out->global_cols;
    const plan_rule *r = find_rule(p, t->name, &out->rule);
    out->style = r ? r->style : STYLE_REPLICATED;
    if (!r) return 0;
    int dim = splits_dim0(r->style) ? 0 : 1;
    if (t->ndim < dim + 1)
        return tp_error("tensor '%s' has %d dimension(s); style %s needs at least %d", t->name, t->ndim,
                        shard_style_name(r->style), dim + 1);
    out->split_len = t->shape[dim];
    out->unit = 1;
    for (int d = dim + 1; d < t->ndim; d++) out->unit *= t->shape[d];
    if (is_packed(r->style)) {
        if (resolve_blocks(p, r, t->name, out->split_len, out)) return -1;
    } else {
        out->n_blocks = 1;
        out->blocks[0] = out->split_len;
    }
    if (check_divisible(r, t->name, out, tp)) return -1;
    if (dim == 0 && t->ndim == 1) out->local_cols = out->global_cols / tp;
    else if (dim == 0) out->local_rows = out->global_rows / tp;
    else out->local_cols = out->global_cols / tp;
    return 0;
}

int plan_shard_pieces(const shard_info *si, int tp, int rank, shard_piece pc[PLAN_MAX_PIECES]) {
    if (si->style == STYLE_REPLICATED) {
        pc[0] = (shard_piece){0, 0, si->global_rows * si->global_cols, 1, 0, 0};
        return 1;
    }
    int64_t start = 0, dst = 0;   /* index along the split dim; local element / column */
    for (int j = 0; j < si->n_blocks; j++) {
        int64_t n = si->blocks[j] / tp, src = (start + rank * n) * si->unit;
        if (splits_dim0(si->style)) {
            pc[j] = (shard_piece){src, 0, n * si->unit, 1, dst, 0};
        } else {
            pc[j] = (shard_piece){src, si->global_cols, n * si->unit, si->global_rows, dst, si->local_cols};
        }
        dst += n * si->unit;
        start += si->blocks[j];
    }
    return si->n_blocks;
}

/* The divisors of div up to PLAN_MAX_TP: the loop is bounded by the largest
 * tp that makes sense, not by div (a corrupt config may say 2^61 - 1). */
static int tp_hint(const plan *p, int64_t div, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int64_t d = 1; d <= div && d <= PLAN_MAX_TP && k + 24 < n; d++)
        if (div % d == 0) k += (size_t)snprintf(buf + k, n - k, "%s%lld", k ? ", " : "", (long long)d);
    return 0;
}

int plan_validate(const plan *p, const plan_tensor *ts, int n, const char *where, int tp) {
    if (tp < 1 || tp > PLAN_MAX_TP) return tp_error("tp must be from 1 to %d (got %d)", PLAN_MAX_TP, tp);
    if (!p) return 0;
    for (int i = 0; i < p->n_divisors; i++) {
        if (p->div_values[i] > 0 && p->div_values[i] % tp == 0) continue;
        char hint[256];
        tp_hint(p, p->div_values[i], hint, sizeof hint);
        return tp_error("tp %d does not divide %s (%lld) of the %s model; valid tp values: %s", tp, p->div_names[i],
                        (long long)p->div_values[i], p->model, hint);
    }
    for (int i = 0; i < p->n_rules; i++) {
        const char *g = p->rules[i].glob, *s = strchr(g, '*');
        if (s && strchr(s + 1, '*'))
            return tp_error("plan %s rule '%s': at most one '*' (a block index) per glob", p->model, g);
        int hits = 0;
        for (int k = 0; k < n && !hits; k++) hits = glob_match(g, ts[k].name);
        if (!hits)
            return tp_error("plan %s rule '%s' (%s) matches no tensor in %s: the checkpoint is not a %s model or "
                            "its tensor names differ", p->model, g, shard_style_name(p->rules[i].style), where,
                            p->model);
    }
    for (int k = 0; k < n; k++) {
        shard_info si;
        if (plan_shard(p, ts[k], tp, &si)) return tp_error_context("%s at tp %d", where, tp);
    }
    return 0;
}

int plan_use_table(plan_built *b, const plan_table *t, const char *prefix, int tp) {
    if (tp < 1 || tp > PLAN_MAX_TP) return tp_error("tp must be from 1 to %d (got %d)", PLAN_MAX_TP, tp);
    if (t->n_rules > PLAN_MAX_RULES)
        return tp_error("plan %s: %d rules, at most %d", t->model, t->n_rules, PLAN_MAX_RULES);
    int k = 0;
    for (int i = 0; i < t->n_rules; i++) {
        const plan_rule *r = &t->rules[i];
        if (r->if_divides) {
            int64_t v = plan_symbol(&b->p, r->if_divides);
            if (v < 0) tp_fatal("plan %s rule '%s': symbol %s is not set", t->model, r->glob, r->if_divides);
            if (v % tp) continue;
        }
        int len = snprintf(b->globs[k], sizeof b->globs[k], "%s%s", prefix ? prefix : "", r->glob);
        if (len < 0 || (size_t)len >= sizeof b->globs[k])
            return tp_error("plan %s: glob '%s%s' is too long", t->model, prefix ? prefix : "", r->glob);
        b->rules[k] = (plan_rule){b->globs[k], r->style, r->blocks, NULL};
        k++;
    }
    if (!b->p.model) b->p.model = t->model;
    b->p.rules = b->rules;
    b->p.n_rules = k;
    return 0;
}
