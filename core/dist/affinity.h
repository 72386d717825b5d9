/* CPU binding: which cores each rank runs on, and how many threads.
 *
 * Launchers bind ranks by default in ways that waste cores: Open MPI 4
 * binds each rank to one core when np <= 2 (to a socket or NUMA node
 * above), so `mpirun -np 1 tpgen` on a 16-core node would run 1 thread.
 * tpgen therefore tells a default binding from one the user asked for:
 *
 *   Open MPI (ORTE: OMPI_MCA_orte_launch in the environment). mpirun puts
 *     its binding options in the ranks' environment: --bind-to X sets
 *     OMPI_MCA_hwloc_base_binding_policy, --map-by ...:PE=K sets
 *     OMPI_MCA_rmaps_base_mapping_policy with "pe=", --cpu-list/--cpu-set
 *     OMPI_MCA_hwloc_base_cpu_list, --cpus-per-proc
 *     OMPI_MCA_rmaps_base_cpus_per_rank. Any of these (also when set as an
 *     OMPI_MCA_ environment variable) is an explicit binding and is kept.
 *     Without them, a rank that was bound at launch
 *     (OMPI_MCA_orte_bound_at_launch) has the default binding: it takes
 *     its share of the CPUs its launcher (mpirun or orted, found among its
 *     parent processes) may use: local rank i of n gets the i-th of n
 *     contiguous slices, and is re-bound to it.
 *   Slurm (srun: SLURM_STEP_ID): the mask Slurm gave (--cpu-bind,
 *     --cpus-per-task) is kept.
 *   No launcher (a single process): the mask is kept (taskset, numactl).
 *   Another launcher (PMIX_RANK, PMI_RANK, ... without the above, e.g.
 *     MPICH's hydra or Open MPI 5's prterun): tpgen cannot tell. The mask
 *     is kept, and when it holds fewer CPUs than the rank's share of the
 *     node, the node's first rank prints one warning with the fix.
 *
 * Threads: OMP_NUM_THREADS when set, else the CPUs of the rank's final
 * mask divided by the number of the node's ranks that have the same mask
 * (with --bind-to none every rank sees the whole node, so they split it).
 * A binding set only in an MCA parameter file is not visible to the
 * ranks, and counts as the default. */
#ifndef TPGEN_AFFINITY_H
#define TPGEN_AFFINITY_H
#include <sched.h>

typedef enum {
    BIND_NO_LAUNCHER = 0, /* started without mpirun/srun: keep the mask */
    BIND_SLURM,           /* srun: keep Slurm's mask */
    BIND_OMPI_EXPLICIT,   /* mpirun with a binding option: keep */
    BIND_OMPI_DEFAULT,    /* mpirun's default binding: take the rank's share */
    BIND_OMPI_UNBOUND,    /* mpirun did not bind (e.g. oversubscribed): keep */
    BIND_UNKNOWN          /* a launcher tpgen does not know: keep, maybe warn */
} bind_source;

/* How the rank was bound, from its environment (lookup: getenv, or a
 * stand-in for tests). */
bind_source affinity_classify(const char *(*lookup)(const char *name));
const char *affinity_source_name(bind_source s);

/* The mask a rank should run on. mine: its current mask; launcher: the mask
 * its launcher may use (NULL when not found); node_cpus: the node's online
 * CPUs. Returns the mask in *out and sets *warn when a narrow binding could
 * not be told from a default one. Pure (unit-tested with synthetic masks). */
void affinity_plan(bind_source src, const cpu_set_t *mine, const cpu_set_t *launcher, int local_rank,
                   int local_size, int node_cpus, cpu_set_t *out, int *warn);

/* Threads for rank `me` of n local ranks with final masks masks[0..n):
 * its CPUs divided by how many of the node's ranks share that very mask
 * (at least 1). */
int affinity_threads(const cpu_set_t *masks, int n, int me);

/* "0-3,8" (at most len bytes) */
void affinity_format(const cpu_set_t *m, char *buf, int len);

/* What affinity_setup decided for this rank (for `tpgen bench affinity`). */
typedef struct affinity_info {
    bind_source src;
    cpu_set_t before, after;  /* the mask at start-up and the one it runs on */
    int threads;              /* CPU backend threads (OMP_NUM_THREADS wins) */
    int from_env;             /* threads came from OMP_NUM_THREADS */
    int warned;               /* the node could not tell default from explicit */
} affinity_info;
const affinity_info *affinity_current(void);

/* Record the environment and the mask before MPI_Init (an MPI singleton
 * adds Open MPI variables of its own). Called first by dist_init. */
void affinity_early(void);

struct dist;
/* Apply the binding at start-up (dist_init): classify, re-bind when the
 * binding is the launcher's default, size the CPU backend's threads
 * (backend_set_cpu_threads), warn once per node when it cannot tell.
 * Collective over the node's ranks. */
void affinity_setup(struct dist *d);

#endif
