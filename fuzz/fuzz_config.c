/* libFuzzer harness: the bytes as a transformer config.json (config parser
 * and plan, FLUX.2 and FLUX.3), a text-encoder config.json, a VAE config.json, a
 * model_index.json (model_dir_open, and as a (modular_)model_index.json
 * the family table of core/model_family.c under FLUX.2 and FLUX.3 transformers) and a sharded checkpoint's
 * *.safetensors.index.json (checkpoint_open next to one valid shard). */
#include "core/models/model_plan.h"
#include "core/tp_pipe.h"
#include "core/formats/checkpoint.h"
#include "kernels/err.h"
#include "core/models/flux2/flux2.h"
#include "core/models/flux3/flux3.h"
#include "core/models/llm/llm.h"
#include "core/models/vae/vae.h"
#include "plans/plan.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64], g_ckpt[96];

static void write_file(const char *dir, const char *name, const void *data, size_t size) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f) fwrite(data, 1, size, f), fclose(f);
}

static void setup(void) {
    if (g_dir[0]) return;
    snprintf(g_dir, sizeof g_dir, "/tmp/tpgen-fuzz-cfg-%d", (int)getpid());
    snprintf(g_ckpt, sizeof g_ckpt, "%s/transformer", g_dir);
    mkdir(g_dir, 0700);
    mkdir(g_ckpt, 0700);
    /* one shard holding tensor "w" [2, 2] BF16 */
    static const char hdr[] = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}";
    uint8_t buf[8 + sizeof hdr - 1 + 8] = {0};
    buf[0] = (uint8_t)(sizeof hdr - 1);
    memcpy(buf + 8, hdr, sizeof hdr - 1);
    write_file(g_ckpt, "a.safetensors", buf, sizeof buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    json_error_t e;
    json_t *cfg = json_loadb((const char *)data, size, 0, &e);
    if (cfg) {
        flux2_config fc;
        plan p;
        (void)flux2_config_parse(cfg, "fuzz", &fc);
        if (plan_flux2(cfg, &p) == 0) {
            checkpoint empty = {.dir = "fuzz"};
            for (int tp = 1; tp <= 8; tp *= 2) (void)checkpoint_validate_plan(&empty, &p, tp);
        }
        flux3_config f3;
        if (flux3_config_parse(cfg, "fuzz", &f3) == 0 && flux3_plan(&f3, &p) == 0) {
            checkpoint empty = {.dir = "fuzz"};
            for (int tp = 1; tp <= 8; tp++) (void)checkpoint_validate_plan(&empty, &p, tp);
        }
        llm_config lc;
        (void)llm_config_parse(cfg, "fuzz", &lc);
        vae_config vc;
        (void)vae_config_parse(cfg, "fuzz", &vc);
        for (int k = 0; k < 8; k++) {
            family_input in = {.index = cfg, .index_path = "fuzz/modular_model_index.json",
                               .transformer_class = k & 4 ? "Flux3Transformer2DModel" : k & 2 ? NULL : "Flux2Transformer2DModel",
                               .guidance_embeds = k & 1, .flow_map = k & 1, .config_path = "fuzz/config.json"};
            model_family f;
            const char *name;
            char w[256];
            if (model_family_resolve(&in, &f, &name, w, sizeof w) == 0 && (!name || !model_family_name(f))) abort();
        }
        json_decref(cfg);
    }
    write_file(g_dir, "model_index.json", data, size);
    model_dir *m = NULL;
    if (model_dir_open(g_dir, &m) == 0) {
        (void)model_dir_flag(m, "is_distilled", 0);
        model_dir_close(m);
    }
    write_file(g_ckpt, "diffusion_pytorch_model.safetensors.index.json", data, size);
    checkpoint *c = NULL;
    if (checkpoint_open(g_ckpt, &c) == 0) checkpoint_close(c);
    return 0;
}
