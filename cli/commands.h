/* Subcommands. Each lives in its own cli/cmd_*.c and returns the process
 * exit status (0 success). They are declared weak so that the binary links
 * while a subcommand is still being built; main() reports a missing one. */
#ifndef TPGEN_COMMANDS_H
#define TPGEN_COMMANDS_H

#define TPGEN_VERSION "0.1.0"

typedef int (*command_fn)(int argc, char **argv);

int cmd_generate(int argc, char **argv) __attribute__((weak));
int cmd_check(int argc, char **argv) __attribute__((weak));
int cmd_inspect(int argc, char **argv) __attribute__((weak));
int cmd_decode(int argc, char **argv) __attribute__((weak));
int cmd_tokenize(int argc, char **argv) __attribute__((weak));
int cmd_encode(int argc, char **argv) __attribute__((weak));
int cmd_bench(int argc, char **argv) __attribute__((weak));
int cmd_make_tiny(int argc, char **argv) __attribute__((weak));

#endif
