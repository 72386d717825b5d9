/* Flag parsing shared by the subcommands with --key value / --key=value
 * arguments (commands.h). */
#include "commands.h"
#include "kernels/err.h"
#include <stdio.h>
#include <string.h>

int cli_flag(int argc, char **argv, int *i, const char *cmd, char key[64], const char **val) {
    const char *a = argv[*i], *eq = strchr(a, '=');
    size_t klen = eq ? (size_t)(eq - a) : strlen(a);
    snprintf(key, 64, "%.*s", (int)(klen < 63 ? klen : 63), a);
    if (eq) *val = eq + 1;
    else if (*i + 1 < argc) *val = argv[++*i];
    else return tp_error("%s: %s needs a value (see tpgen %s --help)", cmd, key, cmd);
    return 0;
}
