/* `tpgen bench WHAT [OPTIONS]`: benchmarks, never tests. Each benchmark
 * lives beside the code it measures. */
#include "cli/commands.h"
#include <stdio.h>
#include <string.h>

int bench_load(int argc, char **argv);
int bench_gemm(int argc, char **argv);
int bench_forward(int argc, char **argv);
int bench_forward3(int argc, char **argv);
int bench_allreduce(int argc, char **argv);
int bench_vae(int argc, char **argv);
int bench_encoder(int argc, char **argv);
int bench_tokenizer(int argc, char **argv);

static const struct { const char *name; command_fn fn; const char *help; } k_bench[] = {
    {"load", bench_load, "sharded vs naive checkpoint loading: time, bytes read, peak RSS per rank"},
    {"gemm", bench_gemm, "GEMM throughput of the backend against plain BLAS on model shapes"},
    {"forward", bench_forward, "one transformer forward: time, GFLOP/s, all-reduce and attention share"},
    {"forward3", bench_forward3, "one FLUX.3 transformer forward at the default widths: time, GFLOP/s, all-reduce share"},
    {"allreduce", bench_allreduce, "all-reduce bandwidth of the communicator"},
    {"vae", bench_vae, "VAE decoder time and peak memory"},
    {"encoder", bench_encoder, "text-encoder time for a 512-token prompt"},
    {"tokenizer", bench_tokenizer, "tokenizer load time and tokens/s"},
};

int cmd_bench(int argc, char **argv) {
    size_t n = sizeof k_bench / sizeof k_bench[0];
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: tpgen bench WHAT [OPTIONS]   ('tpgen bench WHAT --help' for its options)\n\n");
        for (size_t i = 0; i < n; i++)
            printf("  %-10s %s\n", k_bench[i].name, k_bench[i].help);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < n; i++)
        if (!strcmp(argv[1], k_bench[i].name)) {
            return k_bench[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "tpgen: error: unknown benchmark '%s' (see 'tpgen bench --help')\n", argv[1]);
    return 2;
}
