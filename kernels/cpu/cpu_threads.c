#include "cpu_ops.h"
#include "kernels/err.h"
#include <omp.h>
#include <cblas.h>
#include <stdlib.h>

void cpu_set_threads(int threads) {
    if (threads <= 0) return;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}

static size_t g_tile_budget;
void cpu_set_tile_budget(size_t bytes) { g_tile_budget = bytes; }
size_t cpu_tile_budget(size_t default_bytes) { return g_tile_budget ? g_tile_budget : default_bytes; }

void *cpu_scratch_get(cpu_scratch *s, size_t bytes) {
    if (s->bytes < bytes) {
        free(s->p);
        size_t n = (bytes + 63) / 64 * 64;
        s->p = aligned_alloc(64, n);
        if (!s->p) tp_fatal("CPU backend: out of memory for %zu bytes of scratch", n);
        s->bytes = n;
    }
    return s->p;
}
