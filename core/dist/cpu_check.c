/* Start-up check of the CPU against the instruction set tpgen was built
 * for (OPT in the Makefile, -march=x86-64-v3 by default: AVX2, FMA, F16C,
 * BMI2). Without it the first vector instruction would kill the program
 * with SIGILL and no message. This file is compiled for the baseline
 * x86-64 ISA (see the Makefile) and runs as an early constructor, before
 * main and before any other code of tpgen. */
#include "cpu_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TPGEN_BUILD_OPT
#define TPGEN_BUILD_OPT "?"
#endif

/* the features this build's compiler flags let it use (-DNEED_X from the Makefile) */
static const struct { const char *name, *flag; int needed; } k_features[] = {
    {"AVX", "avx", 0
#ifdef NEED_AVX
     + 1
#endif
    },
    {"AVX2", "avx2", 0
#ifdef NEED_AVX2
     + 1
#endif
    },
    {"FMA", "fma", 0
#ifdef NEED_FMA
     + 1
#endif
    },
    {"BMI2", "bmi2", 0
#ifdef NEED_BMI2
     + 1
#endif
    },
    {"AVX512F", "avx512f", 0
#ifdef NEED_AVX512F
     + 1
#endif
    },
};

int cpu_check_missing(int (*has)(const char *flag), char *buf, size_t len) {
    int n = 0;
    size_t pos = 0;
    if (len) buf[0] = 0;
    for (size_t i = 0; i < sizeof k_features / sizeof *k_features; i++) {
        if (!k_features[i].needed || has(k_features[i].flag)) continue;
        if (len > pos) pos += (size_t)snprintf(buf + pos, len - pos, "%s%s", n ? ", " : "", k_features[i].name);
        n++;
    }
    return n;
}

const char *cpu_check_build_opt(void) { return TPGEN_BUILD_OPT; }

#if defined(__x86_64__) || defined(__i386__)
static int cpu_has(const char *f) {
    __builtin_cpu_init();
    if (!strcmp(f, "avx")) return __builtin_cpu_supports("avx");
    if (!strcmp(f, "avx2")) return __builtin_cpu_supports("avx2");
    if (!strcmp(f, "fma")) return __builtin_cpu_supports("fma");
    if (!strcmp(f, "bmi2")) return __builtin_cpu_supports("bmi2");
    if (!strcmp(f, "avx512f")) return __builtin_cpu_supports("avx512f");
    return 1;
}

__attribute__((constructor(101))) static void cpu_check_at_start(void) {
    char missing[128];
    if (!cpu_check_missing(cpu_has, missing, sizeof missing)) return;
    fprintf(stderr,
            "tpgen: error: this CPU lacks %s, which this tpgen build uses (it was compiled with '%s'). "
            "Rebuild it for this CPU: make clean && make OPT=\"-O2 -march=native\" (or OPT=\"-O2 -march=x86-64-v2\" "
            "for a binary that runs on any x86-64-v2 CPU)\n",
            missing, TPGEN_BUILD_OPT);
    exit(1);
}
#endif
