/* `tpgen inspect --model FILE.gguf`: what a GGUF file holds, from its
 * header alone: version, alignment, every metadata key with its type and
 * value (arrays by element type and length), and every tensor with its ggml
 * type, row-major shape, ne[] and bytes. No TP plan yet (docs/gguf.md). */
#include "commands.h"
#include "core/formats/gguf.h"
#include "kernels/err.h"
#include <stdio.h>

static void print_value(const gguf_value *v) {
    switch (v->type) {
    case GGUF_STRING:
        if (v->str.len > 60) printf("\"%.60s...\" (%llu bytes)", v->str.s, (unsigned long long)v->str.len);
        else printf("\"%s\"", v->str.s);
        break;
    case GGUF_ARRAY: printf("[%llu x %s]", (unsigned long long)v->n, gguf_vtype_name(v->elem)); break;
    case GGUF_F32: case GGUF_F64: printf("%.9g", v->num.f); break;
    case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64: printf("%lld", (long long)v->num.i); break;
    case GGUF_BOOL: printf("%s", v->num.u ? "true" : "false"); break;
    default: printf("%llu", (unsigned long long)v->num.u);
    }
}

int inspect_gguf(const char *path, int summary) {
    gguf_file *g;
    if (gguf_open(path, &g)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    uint64_t bytes = 0;
    int unsupported = 0;
    for (int i = 0; i < g->n; i++) {
        bytes += g->tensors[i].end - g->tensors[i].begin;
        unsupported += !quant_supported(g->tensors[i].type);
    }
    printf("gguf %s: version %u, alignment %u, %d metadata keys, %d tensors (%llu bytes from byte %llu)%s\n", path,
           g->version, g->alignment, g->n_kv, g->n, (unsigned long long)bytes, (unsigned long long)g->data0,
           unsupported ? ", some of types tpgen cannot decode" : "");
    for (int i = 0; i < g->n_kv; i++) {
        printf("  %-40s %-7s ", g->kv[i].key, gguf_vtype_name(g->kv[i].v.type));
        print_value(&g->kv[i].v);
        printf("\n");
    }
    for (int i = 0; i < g->n && !summary; i++) {
        const gguf_tensor *t = &g->tensors[i];
        char shape[96];
        int k = snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < t->ndim; d++) k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        snprintf(shape + k, sizeof shape - (size_t)k, "]");
        printf("  %-50s %-7s %-20s %12llu bytes%s\n", t->name, quant_type_name(t->type), shape,
               (unsigned long long)(t->end - t->begin), quant_supported(t->type) ? "" : "  (cannot decode)");
    }
    gguf_close(g);
    return 0;
}
