#include "cpu_ops.h"
#include <omp.h>
#include <cblas.h>

void cpu_set_threads(int threads) {
    if (threads <= 0) return;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}

static size_t g_tile_budget;
void cpu_set_tile_budget(size_t bytes) { g_tile_budget = bytes; }
size_t cpu_tile_budget(size_t default_bytes) { return g_tile_budget ? g_tile_budget : default_bytes; }
