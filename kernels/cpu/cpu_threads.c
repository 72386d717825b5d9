#include "cpu_ops.h"
#include <omp.h>
#include <cblas.h>

void cpu_set_threads(int threads) {
    if (threads <= 0) return;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}
