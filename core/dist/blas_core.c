/* OpenBLAS's kernel choice, fixed at start-up where it fell back to its
 * slowest one.
 *
 * Debian's OpenBLAS (a DYNAMIC_ARCH build) picks its kernels by CPU model
 * when the library loads, before main. A model newer than the library (for
 * 0.3.21: Emerald Rapids, family 6 model 207, among others) gets its
 * fallback, the SSE3 "Prescott" kernels: cblas_sgemm then runs at about a
 * sixth of the speed its AVX-512 kernels reach on the same core (22 vs 116-150
 * GFLOP/s per thread measured on a 2-vCPU Emerald Rapids VM: docs/cpu-backend.md),
 * and every f32 GEMM of tpgen with it. The choice can only be made again by
 * a new process image, so when the library reports "Prescott" on a CPU with
 * AVX2 and FMA (a real Prescott cannot run this build at all), this
 * constructor sets OPENBLAS_CORETYPE (OpenBLAS's documented override) to the
 * kernels the CPU's features allow (SkylakeX with AVX-512 F/CD/BW/DQ/VL, else
 * Haswell) and re-executes the program with the same arguments. It runs
 * before main, so before MPI_Init (the process keeps its pid, environment
 * and open descriptors). A user's own OPENBLAS_CORETYPE is never touched,
 * and TPGEN_BLAS_CORE=keep disables this. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
static const char *blas_core_for_cpu(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    return "Haswell";
}

/* glibc passes main's argc, argv and envp to the executable's constructors */
__attribute__((constructor(102))) static void blas_core_at_start(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc < 1 || !argv || !argv[0] || getenv("OPENBLAS_CORETYPE")) return;
    const char *keep = getenv("TPGEN_BLAS_CORE");
    if (keep && !strcmp(keep, "keep")) return;
    const char *name = openblas_get_corename();
    if (!name || strcmp(name, "Prescott") != 0) return;
    const char *core = blas_core_for_cpu();
    if (!core) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("TPGEN_BLAS_CORE", "set", 1); /* says so to `tpgen bench gemm`; never loops: OPENBLAS_CORETYPE is set now */
    execv("/proc/self/exe", argv);
    /* no exec (no /proc): run on the fallback kernels */
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("TPGEN_BLAS_CORE");
    fprintf(stderr, "tpgen: warning: OpenBLAS fell back to its Prescott kernels on this CPU and tpgen could not "
                    "restart itself with OPENBLAS_CORETYPE=%s; set it yourself for faster f32 GEMMs\n", core);
}
#endif
