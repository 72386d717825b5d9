/* The CPU check at start-up (cpu_check.c): a CPU without the instruction
 * set extensions the build uses gets a clear error naming them and how to
 * rebuild, instead of SIGILL. */
#ifndef TPGEN_CPU_CHECK_H
#define TPGEN_CPU_CHECK_H
#include <stddef.h>

/* The features the build needs that has(flag) denies ("avx2", "fma", ...),
 * as "AVX2, FMA" in buf; returns how many. */
int cpu_check_missing(int (*has)(const char *flag), char *buf, size_t len);
const char *cpu_check_build_opt(void);   /* the OPT the build was compiled with */

#endif
