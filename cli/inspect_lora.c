/* `tpgen inspect --lora FILE[:W]`: what an adapter does to this model
 * without reading a weight: its format, rank and scale, every module it
 * targets (the checkpoint tensor, rows and plan style) and the bytes each
 * rank of the requested tp reads from it (core/formats/lora.h). */
#include "commands.h"
#include "kernels/err.h"
#include "core/formats/lora.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "r 4", "8x8 (x) 16x16", "r 4 (x) r 4" or "full": a segment's rank or factors */
static void segment_factors(const lora_segment *g, char *out, size_t n) {
    if (g->kind == LORA_KIND_DIFF) { snprintf(out, n, "full"); return; }
    if (g->kind != LORA_KIND_LOKR) { snprintf(out, n, "r %lld", (long long)g->rank); return; }
    char f[2][24];
    for (int w = 0; w < 2; w++) {
        const st_tensor_info *full = g->x[w ? LK_W2 : LK_W1], *a = g->x[w ? LK_W2A : LK_W1A], *b = g->x[w ? LK_W2B : LK_W1B];
        if (full) snprintf(f[w], sizeof f[w], "%lldx%lld", (long long)full->shape[0], (long long)full->shape[1]);
        else snprintf(f[w], sizeof f[w], "%lldx%lld/r%lld", (long long)a->shape[0], (long long)b->shape[1],
                      (long long)a->shape[1]);
    }
    snprintf(out, n, "%s(x)%s", f[0], f[1]);
}

json_t *inspect_loras(const lora_spec *specs, int n, const checkpoint *c, const plan *p, int tp, int print,
                      int list_modules) {
    lora_set *ls = NULL;
    if (lora_set_open_inspect(specs, n, c, print, &ls)) return NULL;
    json_t *out = json_array();
    uint64_t *bytes = xcalloc((size_t)tp * LORA_MAX_ADAPTERS, sizeof *bytes);
    int rc = 0;
    for (int r = 0; r < tp && !rc; r++) rc = lora_estimate(ls, c, p, tp, r, bytes + (size_t)r * LORA_MAX_ADAPTERS);
    for (int a = 0; a < ls->n && !rc; a++) {
        const lora_adapter *ad = &ls->ad[a];
        json_t *targets = json_array(), *per = json_array();
        char scale[32];
        if (isnan(ad->scale)) snprintf(scale, sizeof scale, "per module");
        else snprintf(scale, sizeof scale, "%g", ad->scale);
        char kinds[64] = "";
        for (int k = LORA_KIND_LORA; k <= LORA_KIND_DIFF; k++)
            if (ad->kinds & (1u << k))
                snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s", *kinds ? "+" : "",
                         lora_kind_name((lora_kind)k));
        if (print)
            printf("\nLoRA %s: format %s, rank %lld, scale %s, weight %g, %d modules, dialect %s%s\n", ad->path,
                   lora_format_name(ad->fmt), (long long)ad->rank, scale, ad->weight, ad->n_modules, kinds,
                   ad->n_dora_dropped ? " (DoRA dora_scale keys dropped)" : "");
        json_t *unm = json_array();
        for (int k = 0; k < ad->n_unmatched; k++) json_array_append_new(unm, json_string(ad->unmatched[k]));
        if (print && ad->n_unmatched) {
            printf("  unmatched: %d module(s) match no weight of this transformer (a run refuses the adapter):",
                   ad->n_unmatched);
            for (int k = 0; k < ad->n_unmatched && k < 8; k++) printf(" %s", ad->unmatched[k]);
            printf("%s\n", ad->n_unmatched > 8 ? " ..." : "");
        }
        if (print && ad->n_ignored)
            printf("  ignored: %d bias patch key(s) (.diff_b; this transformer has no biases)\n", ad->n_ignored);
        if (print && list_modules)
            printf("  %-44s %-52s %-14s %-10s %-10s %-5s %-16s %s\n", "module", "tensor", "rows", "B rows from", "style",
                   "kind", "factors", "coef");
        for (int k = 0; k < ls->n_seg; k++) {
            const lora_segment *g = &ls->seg[k];
            if (g->adapter != a) continue;
            shard_info si;
            const char *style = plan_shard(p, st_plan_tensor(checkpoint_find(c, g->tensor, NULL)), tp, &si) ? "?"
                                                                                            : shard_style_name(si.style);
            char rows[48];
            snprintf(rows, sizeof rows, "[%lld, %lld)", (long long)g->row0, (long long)(g->row0 + g->nrows));
            char fac[64];
            segment_factors(g, fac, sizeof fac);
            if (print && list_modules)
                printf("  %-44s %-52s %-14s %-10lld %-10s %-5s %-16s %g\n", g->module, g->tensor, rows,
                       (long long)g->brow0, style, lora_kind_name(g->kind), fac, g->coef);
            json_array_append_new(targets, json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:f,s:s,s:s,s:s}", "module", g->module,
                                                     "tensor", g->tensor, "row0", (json_int_t)g->row0, "rows",
                                                     (json_int_t)g->nrows, "b_row0", (json_int_t)g->brow0, "rank",
                                                     (json_int_t)g->rank, "coef", g->coef, "style", style, "kind",
                                                     lora_kind_name(g->kind), "factors", fac));
        }
        if (print) printf("  %4s %15s\n", "rank", "bytes read");
        for (int r = 0; r < tp; r++) {
            uint64_t b = bytes[(size_t)r * LORA_MAX_ADAPTERS + a];
            if (print) printf("  %4d %15llu\n", r, (unsigned long long)b);
            json_array_append_new(per, json_integer((json_int_t)b));
        }
        json_array_append_new(out, json_pack("{s:s,s:s,s:I,s:o,s:f,s:i,s:i,s:I,s:o,s:o,s:s,s:i,s:o}", "file", ad->path,
                                             "format", lora_format_name(ad->fmt), "rank", (json_int_t)ad->rank, "scale",
                                             isnan(ad->scale) ? json_null() : json_real(ad->scale), "weight",
                                             ad->weight, "modules", ad->n_modules, "dora_keys_dropped",
                                             ad->n_dora_dropped, "alpha_bytes", (json_int_t)ad->bytes_alpha,
                                             "bytes_read_per_rank", per, "targets", targets, "dialect", kinds,
                                             "ignored_keys", ad->n_ignored, "unmatched", unm));
    }
    free(bytes);
    lora_set_free(ls);
    if (rc) return json_decref(out), NULL;
    return out;
}
