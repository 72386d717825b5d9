/* `tpgen [generate]`: the product command. Every rank parses the same
 * flags and run spec and runs the same checks; ranks agree on every error
 * (dist_agree), so a bad input makes every rank exit non-zero with the
 * message printed once, before any weight is read. */
#include "commands.h"
#include "generate.h"
#include "core/dist/watchdog.h"
#include "kernels/err.h"
#include <stdio.h>
#include <string.h>

static int wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

static int setup(run_spec *s, gen_setup *g, dist *d, int argc, char **argv) {
    int rc = runspec_parse_args(s, argc, argv);
    if (!rc) rc = runspec_check(s);
    if (dist_agree(d->world, rc)) return -1;
    if (dist_agree(d->world, dist_set_mesh(d, s->tp, s->sp > 1 ? s->sp : 1, s->cfg_parallel ? 2 : 1))) return -1;
    watchdog_start(d->world_rank, d->dp_rank, d->dp_rank * d->grp, d->grp, s->watchdog);
    if (dist_agree(d->world, gen_setup_init(g, s, d))) return -1;
    return gen_skip_existing(g);
}

int cmd_generate(int argc, char **argv) {
    dist d;
    if (dist_init(&argc, &argv, &d)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    if (wants_help(argc, argv)) {   /* printed once, by rank 0 */
        if (d.world_rank == 0) runspec_print_help();
        dist_finalize(&d);
        return 0;
    }
    run_spec spec;
    runspec_init(&spec);
    gen_setup g;
    memset(&g, 0, sizeof g);
    gen_metrics m = {.t_start = gen_now()};
    int rc = setup(&spec, &g, &d, argc, argv);
    if (!rc) {
        rc = gen_run(&g, &m);
        if (!rc) rc = gen_report(&g, &m, rc);
    }
    if (rc) dist_report_error(d.world);
    watchdog_stop();
    gen_setup_free(&g);
    runspec_free(&spec);
    dist_finalize(&d);
    return rc ? 1 : 0;
}
