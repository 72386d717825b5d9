/* libFuzzer harness: the bytes are one checkpoint file with fp8 hints,
 * opened with checkpoint_open (its fp8 scan: the `_quantization_metadata`
 * header JSON, the U8 `.comfy_quant` tensors, the scale tensors and every
 * consistency check). An accepted checkpoint is checked and every fp8
 * layer's scales are attached to each rank's shard (fp8_attach_scale) at
 * tp 1 and 2 through the FLUX.2 plan of its names (diffusers or BFL), and
 * must agree with fp8_scale_bytes (aborts otherwise). Files with names
 * behind model.diffusion_model. (ComfyUI saves) are read as their
 * diffusion model, as tpgen reads them; their hints may carry the prefix.
 * FUZZ_VERBOSE=1 build-fuzz/fuzz_fp8 FILE... prints each file's verdict. */
#include "core/models/model_plan.h"
#include "core/formats/checkpoint.h"
#include "core/formats/fp8.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include "plans/plan.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_file[64];
static backend *g_be;

/* An accepted checkpoint's fp8 layers are consistent with its tensors. */
static void check_layers(const checkpoint *c) {
    if (!c->fp8) return;
    int n_fp8 = 0, n_scaled = 0;
    for (int k = 0; k < c->n; k++) {
        const fp8_layer *L = fp8_layer_of(c, k);
        if (!L) continue;
        const st_tensor_info *w = c->infos[k];
        if (!dtype_is_fp8(w->dtype)) abort();   /* a layer is an fp8 tensor */
        n_fp8++, n_scaled += L->scale != NULL;
        int64_t rows = w->ndim >= 2 ? w->shape[0] : 1;
        if (!L->values || L->n_scale != (L->per_row ? rows : 1)) abort();
        for (int64_t i = 0; i < L->n_scale; i++)
            if (L->scale && !(L->values[i] > 0)) abort();   /* scales are validated positive and finite */
    }
    if (n_fp8 != c->fp8->n_fp8 || n_scaled != c->fp8->n_scaled) abort();
}

/* Each rank's scales at tp 1 and 2, on a shard of the plan's shape. */
static void attach_all(const checkpoint *c, const plan *p) {
    for (int k = 0; k < c->n; k++) {
        const st_tensor_info *ti = c->infos[k];
        if (!fp8_layer_of(c, k)) continue;
        for (int tp = 1; tp <= 2; tp++) {
            shard_info si;
            if (plan_shard(p, st_plan_tensor(ti), tp, &si)) continue;
            if (si.local_rows * si.local_cols > (1 << 16)) continue;   /* the shard's bytes are not read here */
            for (int rank = 0; rank < tp; rank++) {
                tensor *t = tensor_new(g_be, ti->dtype, si.local_rows, si.local_cols);
                uint64_t bytes;
                if (!t) abort();
                if (fp8_attach_scale(c, k, &si, tp, rank, t, &bytes) == 0 && bytes != fp8_scale_bytes(c, k, &si, tp))
                    abort();   /* the estimate and the load agree */
                tensor_free(t);
            }
        }
    }
}

static void open_one(const char *path) {
    checkpoint *c = NULL;
    int rc = checkpoint_open(path, &c);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "fp8: %s (%d fp8 layers)\n", rc ? tp_error_msg() : "accepted", !rc && c->fp8 ? c->fp8->n_fp8 : 0);
    if (rc) return;
    check_layers(c);
    json_t *cfg = json_pack("{s:i,s:i}", "num_attention_heads", 2, "attention_head_dim", 8);
    plan p;
    if ((checkpoint_is_bfl(c) ? plan_flux2_bfl(cfg, &p) : plan_flux2(cfg, &p)) == 0) attach_all(c, &p);
    json_decref(cfg);
    checkpoint_close(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_file[0]) {
        snprintf(g_file, sizeof g_file, "/tmp/tpgen-fuzz-fp8-%d.safetensors", (int)getpid());
        g_be = backend_cpu_create(1);
    }
    FILE *f = fopen(g_file, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    open_one(g_file);
    return 0;
}
