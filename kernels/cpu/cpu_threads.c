#include "cpu_ops.h"
#include "kernels/err.h"
#include <omp.h>
#include <pthread.h>
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

/* Every scratch block in use, by the threads' own cpu_scratch: OpenMP's
 * worker threads keep theirs in thread-local storage for the life of the
 * process, and this list is what still holds a block once the pool's
 * threads are gone at exit (so that it is not a leak). */
static pthread_mutex_t g_scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static void **g_scratch;
static size_t g_n_scratch, g_cap_scratch;

static void scratch_track(void *old, void *now) {
    pthread_mutex_lock(&g_scratch_lock);
    size_t i = 0;
    while (i < g_n_scratch && (!old || g_scratch[i] != old)) i++;
    if (i == g_n_scratch) {
        if (g_n_scratch == g_cap_scratch) {
            g_cap_scratch = g_cap_scratch ? 2 * g_cap_scratch : 64;
            g_scratch = xrealloc(g_scratch, g_cap_scratch * sizeof *g_scratch);
        }
        g_n_scratch++;
    }
    g_scratch[i] = now;
    pthread_mutex_unlock(&g_scratch_lock);
}

void *cpu_scratch_get(cpu_scratch *s, size_t bytes) {
    if (s->bytes < bytes) {
        size_t n = (bytes + 63) / 64 * 64;
        void *p = aligned_alloc(64, n);
        if (!p) tp_fatal("CPU backend: out of memory for %zu bytes of scratch", n);
        scratch_track(s->p, p);
        free(s->p);
        s->p = p;
        s->bytes = n;
    }
    return s->p;
}
