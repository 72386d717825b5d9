/* The CPU-binding rules (core/dist/affinity.h) on synthetic environments and
 * masks: which bindings are kept, how a default one is re-bound, how
 * threads are counted, and when tpgen warns. */
#include "test.h"
#include "core/dist/affinity.h"
#include <string.h>

/* a fake environment: "NAME=VALUE" entries, NULL-terminated */
static const char **g_env;
static const char *fake_getenv(const char *name) {
    size_t n = strlen(name);
    for (const char **e = g_env; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}
static bind_source classify(const char **env) {
    g_env = env;
    return affinity_classify(fake_getenv);
}

/* mask of CPUs [lo, hi) */
static cpu_set_t range(int lo, int hi) {
    cpu_set_t m;
    CPU_ZERO(&m);
    for (int c = lo; c < hi; c++) CPU_SET(c, &m);
    return m;
}
static int is_range(const cpu_set_t *m, int lo, int hi) {
    cpu_set_t r = range(lo, hi);
    return CPU_EQUAL(m, &r);
}

TEST(affinity_classify_launchers) {
    const char *none[] = {"HOME=/root", NULL};
    CHECK(classify(none) == BIND_NO_LAUNCHER, "no launcher");
    const char *ompi_default[] = {"OMPI_MCA_orte_launch=1", "OMPI_MCA_orte_bound_at_launch=1", NULL};
    CHECK(classify(ompi_default) == BIND_OMPI_DEFAULT, "mpirun's default binding");
    const char *ompi_unbound[] = {"OMPI_MCA_orte_launch=1", NULL};
    CHECK(classify(ompi_unbound) == BIND_OMPI_UNBOUND, "mpirun without a binding (oversubscribed)");
    const char *bind_core[] = {"OMPI_MCA_orte_launch=1", "OMPI_MCA_orte_bound_at_launch=1",
                               "OMPI_MCA_hwloc_base_binding_policy=core", NULL};
    CHECK(classify(bind_core) == BIND_OMPI_EXPLICIT, "--bind-to core");
    const char *bind_none[] = {"OMPI_MCA_orte_launch=1", "OMPI_MCA_hwloc_base_binding_policy=none", NULL};
    CHECK(classify(bind_none) == BIND_OMPI_EXPLICIT, "--bind-to none");
    const char *pe[] = {"OMPI_MCA_orte_hnp_uri=1.0;tcp://x", "OMPI_MCA_orte_bound_at_launch=1",
                        "OMPI_MCA_rmaps_base_mapping_policy=ppr:2:node:pe=4", NULL};
    CHECK(classify(pe) == BIND_OMPI_EXPLICIT, "--map-by ppr:2:node:pe=4");
    const char *PE[] = {"OMPI_MCA_orte_launch=1", "OMPI_MCA_orte_bound_at_launch=1",
                        "OMPI_MCA_rmaps_base_mapping_policy=slot:PE=2", NULL};
    CHECK(classify(PE) == BIND_OMPI_EXPLICIT, "--map-by slot:PE=2");
    const char *map_only[] = {"OMPI_MCA_orte_launch=1", "OMPI_MCA_orte_bound_at_launch=1",
                              "OMPI_MCA_rmaps_base_mapping_policy=ppr:2:node", NULL};
    CHECK(classify(map_only) == BIND_OMPI_DEFAULT, "a mapping without pe= leaves the default binding");
    const char *cpulist[] = {"OMPI_MCA_orte_launch=1", "OMPI_MCA_orte_bound_at_launch=1",
                             "OMPI_MCA_hwloc_base_cpu_list=0,2", NULL};
    CHECK(classify(cpulist) == BIND_OMPI_EXPLICIT, "--cpu-list");
    const char *slurm[] = {"SLURM_JOB_ID=7", "SLURM_STEP_ID=0", "SLURM_CPU_BIND=quiet,cores", "PMIX_RANK=1", NULL};
    CHECK(classify(slurm) == BIND_SLURM, "srun");
    /* mpirun inside an allocation: the ranks see Slurm's variables too, Open MPI decides */
    const char *mpirun_in_slurm[] = {"SLURM_JOB_ID=7", "SLURM_STEP_ID=0", "OMPI_MCA_orte_launch=1",
                                     "OMPI_MCA_orte_bound_at_launch=1", NULL};
    CHECK(classify(mpirun_in_slurm) == BIND_OMPI_DEFAULT, "mpirun inside Slurm");
    const char *hydra[] = {"PMI_RANK=0", "PMI_SIZE=2", NULL};
    CHECK(classify(hydra) == BIND_UNKNOWN, "MPICH hydra");
    const char *prte[] = {"PMIX_RANK=0", "OMPI_COMM_WORLD_SIZE=2", NULL};
    CHECK(classify(prte) == BIND_UNKNOWN, "Open MPI 5 (prterun)");
}

TEST(affinity_default_binding_takes_the_share) {
    cpu_set_t out, core0 = range(0, 1), node2 = range(0, 2), node16 = range(0, 16);
    int warn;
    /* mpirun -np 1 on 2 cores: bound to core 0, takes both */
    affinity_plan(BIND_OMPI_DEFAULT, &core0, &node2, 0, 1, 2, &out, &warn);
    CHECK(is_range(&out, 0, 2) && !warn, "np 1 on 2 cores: %d CPUs", CPU_COUNT(&out));
    /* mpirun -np 2 on 16 cores: halves */
    cpu_set_t c1 = range(1, 2);
    affinity_plan(BIND_OMPI_DEFAULT, &core0, &node16, 0, 2, 16, &out, &warn);
    CHECK(is_range(&out, 0, 8), "np 2 rank 0 on 16 cores: %d CPUs", CPU_COUNT(&out));
    affinity_plan(BIND_OMPI_DEFAULT, &c1, &node16, 1, 2, 16, &out, &warn);
    CHECK(is_range(&out, 8, 16), "np 2 rank 1 on 16 cores: %d CPUs", CPU_COUNT(&out));
    /* uneven: 3 ranks on 8 cores -> 2, 3, 3 contiguous, all covered */
    cpu_set_t node8 = range(0, 8), all;
    CPU_ZERO(&all);
    int sizes[3];
    for (int r = 0; r < 3; r++) {
        affinity_plan(BIND_OMPI_DEFAULT, &core0, &node8, r, 3, 8, &out, &warn);
        sizes[r] = CPU_COUNT(&out);
        cpu_set_t both;
        CPU_AND(&both, &all, &out);
        CHECK(CPU_COUNT(&both) == 0, "rank %d overlaps another rank", r);
        CPU_OR(&all, &all, &out);
    }
    CHECK(CPU_EQUAL(&all, &node8) && sizes[0] == 2 && sizes[1] == 3 && sizes[2] == 3, "3 ranks on 8: %d %d %d",
          sizes[0], sizes[1], sizes[2]);
    /* a launcher with a sparse mask (a Slurm allocation of CPUs 4,5,10,11): slices of those */
    cpu_set_t sparse;
    CPU_ZERO(&sparse);
    CPU_SET(4, &sparse), CPU_SET(5, &sparse), CPU_SET(10, &sparse), CPU_SET(11, &sparse);
    affinity_plan(BIND_OMPI_DEFAULT, &core0, &sparse, 1, 2, 16, &out, &warn);
    CHECK(CPU_COUNT(&out) == 2 && CPU_ISSET(10, &out) && CPU_ISSET(11, &out), "sparse launcher mask");
    /* more ranks than CPUs: one CPU each, round robin */
    affinity_plan(BIND_OMPI_DEFAULT, &core0, &node2, 3, 4, 2, &out, &warn);
    CHECK(is_range(&out, 1, 2), "rank 3 of 4 on 2 CPUs gets CPU 1");
    /* default binding but no launcher found: kept, and a warning */
    affinity_plan(BIND_OMPI_DEFAULT, &core0, NULL, 0, 1, 16, &out, &warn);
    CHECK(CPU_EQUAL(&out, &core0) && warn, "launcher not found: kept=%d warn=%d", CPU_EQUAL(&out, &core0), warn);
}

TEST(affinity_explicit_bindings_are_kept) {
    cpu_set_t out, core3 = range(3, 4), node16 = range(0, 16), half = range(0, 8);
    int warn;
    bind_source kept[] = {BIND_OMPI_EXPLICIT, BIND_SLURM, BIND_NO_LAUNCHER, BIND_OMPI_UNBOUND, BIND_UNKNOWN};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        affinity_plan(kept[i], &core3, &node16, 0, 1, 16, &out, &warn);
        CHECK(CPU_EQUAL(&out, &core3), "%s: mask changed", affinity_source_name(kept[i]));
        CHECK(warn == (kept[i] == BIND_UNKNOWN), "%s: warn %d", affinity_source_name(kept[i]), warn);
    }
    /* an unknown launcher that gave the rank its share: no warning */
    affinity_plan(BIND_UNKNOWN, &half, NULL, 0, 2, 16, &out, &warn);
    CHECK(CPU_EQUAL(&out, &half) && !warn, "unknown launcher, full share: warn %d", warn);
}

TEST(affinity_thread_counts) {
    cpu_set_t m[4];
    m[0] = m[1] = range(0, 16);   /* --bind-to none: two ranks see the whole node, split it */
    CHECK(affinity_threads(m, 2, 0) == 8 && affinity_threads(m, 2, 1) == 8, "shared mask: %d",
          affinity_threads(m, 2, 0));
    m[0] = range(0, 8), m[1] = range(8, 16);   /* disjoint: each its own */
    CHECK(affinity_threads(m, 2, 0) == 8 && affinity_threads(m, 2, 1) == 8, "disjoint masks");
    m[0] = m[1] = m[2] = range(0, 2), m[3] = range(2, 3);   /* 3 share 2 CPUs: at least 1 thread */
    CHECK(affinity_threads(m, 4, 0) == 1 && affinity_threads(m, 4, 3) == 1, "oversubscribed");
    char buf[64];
    cpu_set_t f = range(0, 4);
    CPU_SET(8, &f), CPU_SET(10, &f), CPU_SET(11, &f);
    affinity_format(&f, buf, sizeof buf);
    CHECK(!strcmp(buf, "0-3,8,10-11"), "format: %s", buf);
}
