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

json_t *inspect_loras(const lora_spec *specs, int n, const checkpoint *c, const plan *p, int tp, int print,
                      int list_modules) {
    lora_set *ls = NULL;
    if (lora_set_open(specs, n, c, print, &ls)) return NULL;
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
        if (print)
            printf("\nLoRA %s: format %s, rank %lld, scale %s, weight %g, %d modules%s\n", ad->path,
                   lora_format_name(ad->fmt), (long long)ad->rank, scale, ad->weight, ad->n_modules,
                   ad->n_dora_dropped ? " (DoRA dora_scale keys dropped)" : "");
        if (print && list_modules)
            printf("  %-44s %-52s %-14s %-10s %s\n", "module", "tensor", "rows", "B rows from", "style");
        for (int k = 0; k < ls->n_seg; k++) {
            const lora_segment *g = &ls->seg[k];
            if (g->adapter != a) continue;
            shard_info si;
            const char *style = plan_shard(p, st_plan_tensor(checkpoint_find(c, g->tensor, NULL)), tp, &si) ? "?"
                                                                                            : shard_style_name(si.style);
            char rows[48];
            snprintf(rows, sizeof rows, "[%lld, %lld)", (long long)g->row0, (long long)(g->row0 + g->nrows));
            if (print && list_modules)
                printf("  %-44s %-52s %-14s %-10lld %s\n", g->module, g->tensor, rows, (long long)g->brow0, style);
            json_array_append_new(targets, json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:f,s:s}", "module", g->module, "tensor",
                                                     g->tensor, "row0", (json_int_t)g->row0, "rows",
                                                     (json_int_t)g->nrows, "b_row0", (json_int_t)g->brow0, "rank",
                                                     (json_int_t)g->rank, "coef", g->coef, "style", style));
        }
        if (print) printf("  %4s %15s\n", "rank", "bytes read");
        for (int r = 0; r < tp; r++) {
            uint64_t b = bytes[(size_t)r * LORA_MAX_ADAPTERS + a];
            if (print) printf("  %4d %15llu\n", r, (unsigned long long)b);
            json_array_append_new(per, json_integer((json_int_t)b));
        }
        json_array_append_new(out, json_pack("{s:s,s:s,s:I,s:o,s:f,s:i,s:i,s:I,s:o,s:o}", "file", ad->path, "format",
                                             lora_format_name(ad->fmt), "rank", (json_int_t)ad->rank, "scale",
                                             isnan(ad->scale) ? json_null() : json_real(ad->scale), "weight",
                                             ad->weight, "modules", ad->n_modules, "dora_keys_dropped",
                                             ad->n_dora_dropped, "alpha_bytes", (json_int_t)ad->bytes_alpha,
                                             "bytes_read_per_rank", per, "targets", targets));
    }
    free(bytes);
    lora_set_free(ls);
    if (rc) return json_decref(out), NULL;
    return out;
}
