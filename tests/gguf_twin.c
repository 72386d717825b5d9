/* gguf_twin.h */
#include "gguf_twin.h"
#include "core/formats/gguf.h"
#include "core/formats/safetensors.h"
#include "kernels/err.h"
#include <stdlib.h>

int gguf_twin_write(const char *gguf_path, const char *st_path) {
    gguf_file *g;
    if (gguf_open(gguf_path, &g)) return -1;
    st_write_tensor *t = xcalloc((size_t)g->n + 1, sizeof *t);
    float **vals = xcalloc((size_t)g->n + 1, sizeof *vals);
    int rc = 0;
    for (int i = 0; i < g->n && !rc; i++) {
        const gguf_tensor *gt;
        if ((rc = gguf_read_f32(g, g->tensors[i].name, &vals[i], &gt))) break;
        t[i] = (st_write_tensor){.name = gt->name, .dtype = DT_F32, .ndim = gt->ndim, .data = vals[i]};
        for (int d = 0; d < gt->ndim; d++) t[i].shape[d] = gt->shape[d];
    }
    if (!rc) rc = st_write(st_path, t, g->n, NULL);
    for (int i = 0; i < g->n; i++) free(vals[i]);
    free(vals), free(t);
    gguf_close(g);
    return rc;
}
