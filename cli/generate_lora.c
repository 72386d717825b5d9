/* `tpgen generate`, LoRA adapters (core/formats/lora.h): checked against the
 * transformer checkpoint at setup (before the text encoder or any weight is
 * loaded), hashed by the ranks that write PNGs, and reported in the PNG
 * parameters and --json-metrics with the bytes each rank read from them. */
#include "generate.h"
#include "kernels/err.h"
#include "core/image/sha256.h"
#include "core/formats/lora.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gen_lora {
    int n;
    char sha[LORA_MAX_ADAPTERS][65];
    const char *format[LORA_MAX_ADAPTERS];
    int64_t rank[LORA_MAX_ADAPTERS];
    int modules[LORA_MAX_ADAPTERS];
    uint64_t bytes[LORA_MAX_ADAPTERS];   /* this rank's reads during the load */
};

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

int gen_lora_setup(gen_setup *g) {
    const run_spec *s = g->spec;
    if (!s->n_loras) return 0;
    gen_lora *L = g->lora = xcalloc(1, sizeof *L);
    L->n = s->n_loras;
    checkpoint *ck = NULL;
    lora_set *ls = NULL;
    int rc = checkpoint_open(g->info.transformer_dir, &ck);
    if (!rc) rc = lora_set_open(s->loras, s->n_loras, ck, 0, &ls);   /* the load warns (DoRA) */
    for (int i = 0; !rc && i < L->n; i++) {
        L->format[i] = lora_format_name(ls->ad[i].fmt);
        L->rank[i] = ls->ad[i].rank;
        L->modules[i] = ls->ad[i].n_modules;
        /* the ranks that write PNGs hash the files (the others never read them whole) */
        if (g->d->grp_rank == 0) rc = file_sha256(s->loras[i].path, L->sha[i]);
    }
    lora_set_free(ls);
    checkpoint_close(ck);
    return rc;
}

void gen_lora_loaded(gen_setup *g, const uint64_t *bytes) {
    for (int i = 0; g->lora && i < g->lora->n; i++) g->lora->bytes[i] = bytes[i];
}

void gen_lora_free(gen_setup *g) {
    free(g->lora);
    g->lora = NULL;
}

char *gen_lora_parameters(const gen_setup *g) {
    const run_spec *s = g->spec;
    if (!g->lora) return xstrdup("loras: none\n");
    size_t cap = 64 + (size_t)s->n_loras * 4200, k = 0;
    char *t = xmalloc(cap);
    k += (size_t)snprintf(t + k, cap - k, "loras:");
    for (int i = 0; i < s->n_loras; i++)
        k += (size_t)snprintf(t + k, cap - k, "%s %.4000s (sha256 %s, weight %g)", i ? ";" : "",
                              base_name(s->loras[i].path), g->lora->sha[i], s->loras[i].weight);
    snprintf(t + k, cap - k, "\n");
    return t;
}

json_t *gen_lora_gather(const gen_setup *g) {
    const dist *d = g->d;
    if (!g->lora) return d->world_rank == 0 ? json_array() : NULL;
    int n = g->lora->n;
    double mine[LORA_MAX_ADAPTERS], *all = d->world_rank == 0 ? xmalloc(sizeof(double) * (size_t)(n * d->world_size)) : NULL;
    for (int i = 0; i < n; i++) mine[i] = (double)g->lora->bytes[i];
    MPI_Gather(mine, n, MPI_DOUBLE, all, n, MPI_DOUBLE, 0, d->world);
    if (d->world_rank != 0) return NULL;
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        json_t *per = json_array();
        for (int r = 0; r < d->world_size; r++) json_array_append_new(per, json_integer((json_int_t)all[r * n + i]));
        json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:f, s:s, s:I, s:i, s:o}", "file",
                                             base_name(g->spec->loras[i].path), "path", g->spec->loras[i].path,
                                             "sha256", g->lora->sha[i], "weight", g->spec->loras[i].weight, "format",
                                             g->lora->format[i], "rank", (json_int_t)g->lora->rank[i], "modules",
                                             g->lora->modules[i], "bytes_read_per_rank", per));
    }
    free(all);
    return arr;
}
