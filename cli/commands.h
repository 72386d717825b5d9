/* Subcommands. Each lives in its own cli/cmd_*.c and returns the process
 * exit status (0 success). */
#ifndef TPGEN_COMMANDS_H
#define TPGEN_COMMANDS_H

#define TPGEN_VERSION "0.1.0"

typedef int (*command_fn)(int argc, char **argv);

/* One "--key value" or "--key=value" argument at argv[*i] (cli/flags.c):
 * the key (at most 63 bytes) into key and its value into *val, advancing
 * *i past a separate value; -1 + tp_error naming cmd when there is none. */
int cli_flag(int argc, char **argv, int *i, const char *cmd, char key[64], const char **val);

int cmd_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
/* inspect --lora (cli/inspect_lora.c): the adapters' targets and the bytes
 * each rank reads; NULL + tp_error when an adapter does not fit the model */
struct lora_spec;
struct checkpoint;
struct plan;
struct json_t *inspect_loras(const struct lora_spec *specs, int n, const struct checkpoint *c, const struct plan *p,
                             int tp, int print, int list_modules);
/* inspect of a .gguf file (cli/inspect_gguf.c): metadata and tensors; the exit status */
int inspect_gguf(const char *path, int summary);
int cmd_decode(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_encode(int argc, char **argv);
int cmd_encode_image(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_affinity(int argc, char **argv);
int cmd_make_tiny(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
/* A FLUX.2-shaped transformer checkpoint of real widths in DIR (shape dev,
 * klein-4b, klein-9b or small), random data or holes (sparse): written by
 * `bench load --make` and `make-tiny --widths *-full` (cli/bench/bench_load.c). */
int flux2_make_checkpoint(const char *dir, const char *shape, int sparse, int shards, unsigned seed);

#endif
