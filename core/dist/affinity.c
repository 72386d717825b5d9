/* CPU binding at start-up: see affinity.h for the rules. */
#include "affinity.h"
#include "dist.h"
#include "kernels/ops.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int set(const char *(*lookup)(const char *), const char *name) {
    const char *v = lookup(name);
    return v && *v;
}

static int has_pe(const char *v) {   /* "ppr:2:node:pe=4", "slot:PE=2" */
    for (; v && *v; v++)
        if (tolower((unsigned char)v[0]) == 'p' && tolower((unsigned char)v[1]) == 'e' && v[2] == '=') return 1;
    return 0;
}

bind_source affinity_classify(const char *(*lookup)(const char *)) {
    if (set(lookup, "OMPI_MCA_orte_launch") || set(lookup, "OMPI_MCA_orte_hnp_uri")) {
        if (set(lookup, "OMPI_MCA_hwloc_base_binding_policy") || set(lookup, "OMPI_MCA_hwloc_base_cpu_list") ||
            set(lookup, "OMPI_MCA_rmaps_base_cpus_per_rank") || has_pe(lookup("OMPI_MCA_rmaps_base_mapping_policy")))
            return BIND_OMPI_EXPLICIT;
        return set(lookup, "OMPI_MCA_orte_bound_at_launch") ? BIND_OMPI_DEFAULT : BIND_OMPI_UNBOUND;
    }
    if (set(lookup, "SLURM_STEP_ID") || set(lookup, "SLURM_STEPID")) return BIND_SLURM;
    static const char *k_launched[] = {"PMIX_RANK", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID",
                                       "PALS_RANKID", "MV2_COMM_WORLD_RANK"};
    for (size_t i = 0; i < sizeof k_launched / sizeof *k_launched; i++)
        if (set(lookup, k_launched[i])) return BIND_UNKNOWN;
    return BIND_NO_LAUNCHER;
}

const char *affinity_source_name(bind_source s) {
    switch (s) {
    case BIND_NO_LAUNCHER: return "no-launcher";
    case BIND_SLURM: return "slurm";
    case BIND_OMPI_EXPLICIT: return "ompi-explicit";
    case BIND_OMPI_DEFAULT: return "ompi-default";
    case BIND_OMPI_UNBOUND: return "ompi-unbound";
    default: return "unknown-launcher";
    }
}

void affinity_plan(bind_source src, const cpu_set_t *mine, const cpu_set_t *launcher, int local_rank,
                   int local_size, int node_cpus, cpu_set_t *out, int *warn) {
    *out = *mine;
    *warn = 0;
    if (local_size < 1) local_size = 1;
    int have = CPU_COUNT(mine);
    if (src == BIND_OMPI_DEFAULT && launcher && CPU_COUNT(launcher) > 0) {
        /* the local_rank-th of local_size contiguous slices of the launcher's
         * CPUs; with more ranks than CPUs, CPU local_rank mod n */
        int n = CPU_COUNT(launcher), lo, hi;
        if (local_size <= n) {
            lo = (int)((long)local_rank * n / local_size);
            hi = (int)((long)(local_rank + 1) * n / local_size);
        } else {
            lo = local_rank % n;
            hi = lo + 1;
        }
        CPU_ZERO(out);
        for (int c = 0, k = 0; c < CPU_SETSIZE && k < hi; c++)
            if (CPU_ISSET(c, launcher)) {
                if (k >= lo) CPU_SET(c, out);
                k++;
            }
        return;
    }
    /* a default binding we cannot widen, or a launcher we do not know:
     * warn when the rank holds less than its share of the node */
    if ((src == BIND_OMPI_DEFAULT || src == BIND_UNKNOWN) && node_cpus > 0) {
        int share = node_cpus / local_size;
        if (have < (share > 0 ? share : 1)) *warn = 1;
    }
}

int affinity_threads(const cpu_set_t *masks, int n, int me) {
    int same = 0;
    for (int i = 0; i < n; i++) same += CPU_EQUAL(&masks[i], &masks[me]) != 0;
    int t = CPU_COUNT(&masks[me]) / (same > 0 ? same : 1);
    return t > 0 ? t : 1;
}

void affinity_format(const cpu_set_t *m, char *buf, int len) {
    int pos = 0;
    buf[0] = 0;
    for (int c = 0; c < CPU_SETSIZE && pos < len - 1;) {
        if (!CPU_ISSET(c, m)) { c++; continue; }
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, m)) e++;
        pos += snprintf(buf + pos, (size_t)(len - pos), e > c ? "%s%d-%d" : "%s%d", pos ? "," : "", c, e);
        c = e + 1;
    }
}

static const char *env_lookup(const char *name) { return getenv(name); }

/* The mask of the launcher (mpirun, orted, ...) among this process's
 * ancestors; its mask is what the job may use on this node. */
static int launcher_mask(cpu_set_t *m) {
    static const char *k_names[] = {"mpirun", "orterun", "mpiexec", "orted", "prterun", "prted"};
    pid_t pid = getppid();
    for (int depth = 0; depth < 8 && pid > 1; depth++) {
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) return -1;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *l = strchr(buf, '('), *r = strrchr(buf, ')');
        if (!l || !r || r < l) return -1;
        *r = 0;
        for (size_t i = 0; i < sizeof k_names / sizeof *k_names; i++)
            if (!strcmp(l + 1, k_names[i])) return sched_getaffinity(pid, sizeof *m, m) == 0 ? 0 : -1;
        char state;
        int ppid;
        if (sscanf(r + 2, "%c %d", &state, &ppid) != 2) return -1;
        pid = ppid;
    }
    return -1;
}

static affinity_info g_info;
static int g_early, g_early_ok;
const affinity_info *affinity_current(void) { return &g_info; }

void affinity_early(void) {
    affinity_info *a = &g_info;
    memset(a, 0, sizeof *a);
    a->src = affinity_classify(env_lookup);
    g_early_ok = sched_getaffinity(0, sizeof a->before, &a->before) == 0;
    g_early = 1;
}

void affinity_setup(struct dist *d) {
    affinity_info *a = &g_info;
    if (!g_early) affinity_early();
    g_early = 0;
    if (!g_early_ok) {
        CPU_ZERO(&a->before);   /* no affinity support: leave everything as it is */
        return;
    }
    cpu_set_t launcher, *lp = NULL;
    if (a->src == BIND_OMPI_DEFAULT && launcher_mask(&launcher) == 0) lp = &launcher;
    int node_cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    affinity_plan(a->src, &a->before, lp, d->local_rank, d->local_size, node_cpus, &a->after, &a->warned);
    if (!CPU_EQUAL(&a->after, &a->before) && sched_setaffinity(0, sizeof a->after, &a->after) != 0)
        a->after = a->before;
    cpu_set_t *all = calloc((size_t)d->local_size, sizeof *all);
    MPI_Allgather(&a->after, sizeof a->after, MPI_BYTE, all, sizeof a->after, MPI_BYTE, d->local_comm);
    a->threads = affinity_threads(all, d->local_size, d->local_rank);
    free(all);
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && atoi(env) > 0) a->threads = atoi(env), a->from_env = 1;
    backend_set_cpu_threads(a->threads);
    int warn = a->warned, any = 0;
    MPI_Allreduce(&warn, &any, 1, MPI_INT, MPI_MAX, d->local_comm);
    a->warned = any;
    if (any && d->local_rank == 0) {
        char m[128];
        affinity_format(&a->before, m, sizeof m);
        fprintf(stderr, "tpgen: warning: rank %d is bound to CPUs %s (%d of the node's %d) by %s, and tpgen cannot tell "
                        "whether that binding was asked for; if not, start it with `mpirun --bind-to none` or "
                        "`mpirun --map-by ppr:%d:node:pe=%d` so that each of the node's %d ranks gets its cores\n",
                d->world_rank, m, CPU_COUNT(&a->before), node_cpus,
                a->src == BIND_UNKNOWN ? "a launcher tpgen does not know" : "Open MPI (launcher not found)",
                d->local_size, node_cpus / d->local_size > 0 ? node_cpus / d->local_size : 1, d->local_size);
    }
}
