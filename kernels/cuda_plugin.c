/* The CUDA backend is a plugin: kernels/cuda/ is built into
 * libtpgen-cuda.so beside the tpgen binary and opened with dlopen the first
 * time a GPU is asked for. Linking cuBLAS/cuBLASLt/NCCL into tpgen itself
 * would cost every rank ~220 MB of resident memory at start-up (measured:
 * cuBLASLt alone is ~150 MB), CPU runs included; and a machine without the
 * CUDA libraries can still run the CPU backend.
 *
 * The plugin is found at $TPGEN_CUDA_PLUGIN, else next to the executable.
 * On a machine without /dev/nvidiactl it is never opened. */
#include "ops.h"
#include "comm.h"
#include "err.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct {
    int tried;
    void *handle;
    char path[4096];
    char why[1024];
    int (*device_count)(void);
    backend *(*create)(int);
    comm *(*create_nccl)(MPI_Comm, backend *);
} g_plugin;

static const char *plugin_path(void) {
    if (g_plugin.path[0]) return g_plugin.path;
    char exe[4000];
    const char *env = getenv("TPGEN_CUDA_PLUGIN");
    if (env && *env) {
        snprintf(g_plugin.path, sizeof g_plugin.path, "%s", env);
        return g_plugin.path;
    }
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return "libtpgen-cuda.so";
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(g_plugin.path, sizeof g_plugin.path, "%s/libtpgen-cuda.so", exe);
    return g_plugin.path;
}

int tpgen_has_cuda(void) { return access(plugin_path(), R_OK) == 0; }

/* Open the plugin once; 0 on success, else -1 with g_plugin.why set. */
static int plugin_open(void) {
    if (g_plugin.tried) return g_plugin.handle ? 0 : -1;
    g_plugin.tried = 1;
    const char *path = plugin_path();
    if (access(path, R_OK) != 0) {
        snprintf(g_plugin.why, sizeof g_plugin.why,
                 "this tpgen was built without the CUDA backend (no %s); use --backend cpu or rebuild with CUDA=1", path);
        return -1;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_plugin.why, sizeof g_plugin.why,
                 "the CUDA backend %s could not be loaded (%s): are the CUDA runtime, cuBLAS and NCCL libraries "
                 "installed? Use --backend cpu otherwise", path, dlerror());
        return -1;
    }
    *(void **)&g_plugin.device_count = dlsym(h, "cudaplug_device_count");
    *(void **)&g_plugin.create = dlsym(h, "cudaplug_backend_create");
    *(void **)&g_plugin.create_nccl = dlsym(h, "cudaplug_comm_create_nccl");
    if (!g_plugin.device_count || !g_plugin.create || !g_plugin.create_nccl) {
        snprintf(g_plugin.why, sizeof g_plugin.why, "%s is not a tpgen CUDA backend of this version (rebuild it)", path);
        dlclose(h);
        return -1;
    }
    g_plugin.handle = h;
    return 0;
}

int backend_cuda_device_count(void) {
    if (!tpgen_has_cuda()) return 0;
    /* no NVIDIA driver on this machine: do not pay for loading the libraries */
    if (access("/dev/nvidiactl", F_OK) != 0 && !getenv("TPGEN_CUDA_PLUGIN")) return 0;
    return plugin_open() ? 0 : g_plugin.device_count();
}

backend *backend_cuda_create(int device) {
    if (plugin_open()) {
        tp_error("%s", g_plugin.why);
        return NULL;
    }
    return g_plugin.create(device);
}

comm *comm_create_nccl(MPI_Comm group, struct backend *be) {
    if (plugin_open()) {
        tp_error("%s", g_plugin.why);
        return NULL;
    }
    return g_plugin.create_nccl(group, be);
}
