/* AMX detection, permission and tile configuration (see cpu_amx.h).
 *
 * Three things must hold before a tile instruction may run:
 *  1. cpuid.(7,0):EDX reports AMX-TILE (bit 24) and AMX-BF16 (bit 22);
 *  2. the OS has enabled the XTILECFG and XTILEDATA state components in
 *     XCR0 (bits 17 and 18, read with xgetbv), i.e. it saves them on a
 *     context switch;
 *  3. on Linux (5.16+) the 8 KB tile data state is handed out per process
 *     only on request: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
 *     Without it the first tile instruction kills the process (SIGILL).
 * Then each thread loads a tile configuration (ldtilecfg) before using the
 * tiles. Compiled with a target attribute only around the tile
 * instructions, so the rest of tpgen keeps its baseline ISA. */
#include "cpu_amx.h"
#include "cpu_ops.h"
#include "kernels/err.h"
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__)) && defined(__linux__)
#define HAVE_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#ifdef HAVE_AMX

enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

static int detect(void) {
    /* TPGEN_NO_AMX=1: as on a CPU without AMX (the AVX512-BF16 or portable routes) */
    const char *off = getenv("TPGEN_NO_AMX");
    if (off && *off && strcmp(off, "0")) return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0; /* XTILECFG + XTILEDATA enabled by the OS */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    return 1;
}

/* found once (pthread_once): every thread sees the same, whole answer */
static int g_amx, g_amx_int8;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT, g_int8_once = PTHREAD_ONCE_INIT;
static void set_amx(void) { g_amx = detect(); }

int cpu_amx_available(void) {
    pthread_once(&g_amx_once, set_amx);
    return g_amx;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* A static object, not a local: GCC 12 may drop stores into a local
 * struct as dead, not seeing that ldtilecfg reads it. */
static const tile_config g_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* the int8 kernels' configurations (cpu_amx.h), for kb = 16, 32 and 64 */
#define INT8_CONFIG(kb)                                                                                        \
    {.palette = 1, .colsb = {64, 64, 64, 64, kb, kb, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, kb / 4, kb / 4}}
static const tile_config g_int8_config[3] = {INT8_CONFIG(16), INT8_CONFIG(32), INT8_CONFIG(64)};

static void set_amx_int8(void) {
    unsigned a, b, c, d;
    g_amx_int8 = cpu_amx_available() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 25));
}
int cpu_amx_int8_available(void) {
    pthread_once(&g_int8_once, set_amx_int8);
    return g_amx_int8;
}

__attribute__((target("amx-tile"))) void cpu_amx_tiles_begin(void) { _tile_loadconfig(&g_config); }
__attribute__((target("amx-tile"))) void cpu_amx_tiles_begin_int8(int kb) {
    if (kb != 16 && kb != 32 && kb != 64) tp_fatal("cpu_amx_tiles_begin_int8: k bytes %d not 16, 32 or 64", kb);
    _tile_loadconfig(&g_int8_config[kb == 16 ? 0 : kb == 32 ? 1 : 2]);
}
__attribute__((target("amx-tile"))) void cpu_amx_tiles_end(void) { _tile_release(); }

__attribute__((target("amx-tile,amx-bf16"))) void cpu_amx_block(const uint16_t *a0, const uint16_t *a1,
                                                                const uint32_t *b, int64_t b_step, int64_t ldb,
                                                                int64_t nk, float *c, int64_t ldc, int load) {
    size_t bs = (size_t)ldb * 4, cs = (size_t)ldc * 4;
    if (load) {
        _tile_loadd(0, c, cs);
        _tile_loadd(1, c + 16, cs);
        _tile_loadd(2, c + 16 * ldc, cs);
        _tile_loadd(3, c + 16 * ldc + 16, cs);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t ks = 0; ks < nk; ks++) {
        _tile_loadd(4, a0 + ks * 512, 64);
        _tile_loadd(5, a1 + ks * 512, 64);
        const uint32_t *bk = b + ks * b_step;
        _tile_loadd(6, bk, bs);
        _tile_loadd(7, bk + 16, bs);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, cs);
    _tile_stored(1, c + 16, cs);
    _tile_stored(2, c + 16 * ldc, cs);
    _tile_stored(3, c + 16 * ldc + 16, cs);
}

#else /* no AMX in this build */

int cpu_amx_available(void) { return 0; }
int cpu_amx_int8_available(void) { return 0; }
void cpu_amx_tiles_begin(void) { tp_fatal("cpu_amx_tiles_begin: this build has no AMX support"); }
void cpu_amx_tiles_begin_int8(int kb) { tp_fatal("cpu_amx_tiles_begin_int8: this build has no AMX support"); }
void cpu_amx_tiles_end(void) {}
void cpu_amx_block(const uint16_t *a0, const uint16_t *a1, const uint32_t *b, int64_t b_step, int64_t ldb, int64_t nk,
                   float *c, int64_t ldc, int load) {
    tp_fatal("cpu_amx_block: this build has no AMX support");
}

#endif

int cpu_amx_enabled(void) { return cpu_bf16_hw_allowed() && cpu_amx_available(); }
