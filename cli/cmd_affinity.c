/* `tpgen affinity`: each rank's CPUs and thread count, as tpgen's start-up
 * binding logic left them (core/dist/affinity.h), printed by world rank 0 in rank
 * order, one line per rank:
 *   rank=0 local=0/2 host=node1 source=ompi-default before=0 cpus=0-7 ncpus=8 threads=8
 * For checking a launcher's binding before a long run. */
#include "commands.h"
#include "core/dist/affinity.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE 512

int cmd_affinity(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: mpirun -np N tpgen affinity\n\n"
               "Print each rank's CPU binding and thread count (key=value, one line per rank):\n"
               "source is how the binding was made (no-launcher, slurm, ompi-explicit, ompi-default,\n"
               "ompi-unbound, unknown-launcher), before the mask at start-up, cpus the mask tpgen runs on,\n"
               "threads the CPU backend's threads (OMP_NUM_THREADS wins).\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "tpgen: error: affinity takes no arguments ('%s'); see 'tpgen affinity --help'\n", argv[1]);
        return 2;
    }
    dist d;
    if (dist_init(&argc, &argv, &d)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    const affinity_info *a = affinity_current();
    char host[64] = "?", before[128], after[128], line[LINE];
    gethostname(host, sizeof host - 1);
    affinity_format(&a->before, before, sizeof before);
    affinity_format(&a->after, after, sizeof after);
    snprintf(line, sizeof line, "rank=%d local=%d/%d host=%s source=%s before=%s cpus=%s ncpus=%d threads=%d%s%s",
             d.world_rank, d.local_rank, d.local_size, host, affinity_source_name(a->src), before, after,
             CPU_COUNT(&a->after), a->threads, a->from_env ? " (OMP_NUM_THREADS)" : "", a->warned ? " warned" : "");
    char *all = d.world_rank == 0 ? malloc((size_t)d.world_size * LINE) : NULL;
    MPI_Gather(line, LINE, MPI_CHAR, all, LINE, MPI_CHAR, 0, d.world);
    if (all)
        for (int r = 0; r < d.world_size; r++) printf("%s\n", all + (size_t)r * LINE);
    free(all);
    dist_finalize(&d);
    return 0;
}
