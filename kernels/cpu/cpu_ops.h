/* CPU implementations of the op interface (kernels/ops.h). */
#ifndef TPGEN_CPU_OPS_H
#define TPGEN_CPU_OPS_H
#include "../ops.h"

/* Set the OpenMP / OpenBLAS thread count for this process (<= 0: leave). */
void cpu_set_threads(int threads);

#endif
