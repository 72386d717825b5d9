/* AMX (Advanced Matrix Extensions) support shared by the CPU kernels that
 * use the tile registers (private to kernels/cpu): detection, the Linux
 * permission request, and the per-thread tile configuration. */
#ifndef TPGEN_CPU_AMX_H
#define TPGEN_CPU_AMX_H
#include <stdint.h>

/* 1 when this build has the AMX kernels, the CPU has AMX-TILE and AMX-BF16,
 * the OS saves the tile state, Linux granted this process the tile data
 * (arch_prctl ARCH_REQ_XCOMP_PERM) and TPGEN_NO_AMX is unset (or 0). The
 * result is computed once and cached; call it once before any parallel
 * region that uses tiles. It does not look at AVX512 (cpu_amx_enabled). */
int cpu_amx_available(void);
/* cpu_amx_available() and the bf16 hardware kernels allowed (AVX512-BF16
 * present, not forced off by cpu_kernel_route(CPU_ROUTE_PORTABLE) or
 * TPGEN_NO_AVX512=1): the AMX kernels pack
 * their operands with AVX-512, and the test/bench switch that selects the
 * portable routes turns AMX off too. */
int cpu_amx_enabled(void);

/* Every AMX kernel uses one configuration: palette 1, tiles 0-7 all 16 rows
 * of 64 bytes (a 16x16 fp32 C tile, a 16x32 bf16 A tile, or a 16 x 16-pair
 * B tile). Tile state is per thread: each thread that runs tile code calls
 * cpu_amx_tiles_begin() first and cpu_amx_tiles_end() when done (releasing
 * the state keeps context switches cheap). Only valid when
 * cpu_amx_available(). */
void cpu_amx_tiles_begin(void);
void cpu_amx_tiles_end(void);

/* 1 when cpu_amx_available() and the CPU has AMX-INT8 (TDPBSUD and friends).
 * The int8 kernels (cpu_gemm_qdot.c) use another configuration, loaded by
 * cpu_amx_tiles_begin_int8(kb) and released by cpu_amx_tiles_end(): tiles
 * 0-3 16 rows of 64 bytes (16 x 16 int32 C), tiles 4-5 16 rows of kb bytes
 * (A: kb signed bytes of 16 rows), tiles 6-7 kb/4 rows of 64 bytes (B: kb/4
 * lines of 16 columns x 4 bytes); kb is 16, 32 or 64. */
int cpu_amx_int8_available(void);
void cpu_amx_tiles_begin_int8(int kb);

/* The one micro-kernel: a 32x32 fp32 block C (2x2 tiles at c, rows ldc
 * floats apart) = [C +, load] sum over nk steps of A · B, where step ks
 * takes the 1 KB A tiles (16 rows of 32 bf16 k) of rows 0-15 at a0 + 512·ks
 * and of rows 16-31 at a1 + 512·ks, and the B tiles (16 rows of 16 (k, k+1)
 * pairs as 32-bit words, ldb words apart; columns 16-31 at +16 words) at
 * b + b_step·ks. On a thread holding the tile configuration. */
void cpu_amx_block(const uint16_t *a0, const uint16_t *a1, const uint32_t *b, int64_t b_step, int64_t ldb, int64_t nk,
                   float *c, int64_t ldc, int load);

#endif
