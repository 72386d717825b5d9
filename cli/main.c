/* tpgen entry point: picks the subcommand (generate is the default). */
#include "commands.h"
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    const char *help;
} k_commands[] = {
    {"generate", "render images from prompts (default)"},
    {"serve", "serve the model over HTTP (OpenAI images API), weights resident"},
    {"check", "compare the TP transformer with a reference (golden cases or unsharded)"},
    {"inspect", "show the TP plan, shapes and per-rank bytes of a model"},
    {"decode", "decode saved latents to a PNG with the VAE"},
    {"tokenize", "print the token ids of a prompt"},
    {"encode", "run the text encoder and save prompt_embeds"},
    {"encode-image", "preprocess and VAE-encode a reference image, save pixels and latents"},
    {"bench", "benchmarks (transformer forward, GEMM, load, VAE, encoder)"},
    {"make-tiny", "write a tiny random pipeline folder (for the demo and tests)"},
    {"affinity", "show each rank's CPU binding and thread count"},
    {"quantize", "write a transformer checkpoint as a GGUF (ComfyUI-GGUF layout, Q8_0/Q4_0/...)"},
};

static command_fn lookup(const char *name) {
    if (!strcmp(name, "generate")) return cmd_generate;
    if (!strcmp(name, "serve")) return cmd_serve;
    if (!strcmp(name, "check")) return cmd_check;
    if (!strcmp(name, "inspect")) return cmd_inspect;
    if (!strcmp(name, "decode")) return cmd_decode;
    if (!strcmp(name, "tokenize")) return cmd_tokenize;
    if (!strcmp(name, "encode")) return cmd_encode;
    if (!strcmp(name, "encode-image")) return cmd_encode_image;
    if (!strcmp(name, "bench")) return cmd_bench;
    if (!strcmp(name, "make-tiny")) return cmd_make_tiny;
    if (!strcmp(name, "affinity")) return cmd_affinity;
    if (!strcmp(name, "quantize")) return cmd_quantize;
    return NULL;
}

static void usage(FILE *f) {
    fprintf(f, "tpgen %s: tensor-parallel FLUX.2 image generation\n\n"
               "usage: mpirun -np N tpgen [COMMAND] [OPTIONS]\n\ncommands:\n", TPGEN_VERSION);
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-12s %s\n", k_commands[i].name, k_commands[i].help);
    fprintf(f, "\n'tpgen COMMAND --help' describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("tpgen %s\n", TPGEN_VERSION);
        return 0;
    }
    if (argc >= 2 && argv[1][0] != '-') {
        command_fn fn = lookup(argv[1]);
        if (!fn) {
            fprintf(stderr, "tpgen: error: unknown command '%s'\n\n", argv[1]);
            usage(stderr);
            return 2;
        }
        return fn(argc - 1, argv + 1);
    }
    return cmd_generate(argc, argv);
}
