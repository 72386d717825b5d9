/* libFuzzer harness: a safetensors file (header + data) opened with
 * st_open, every tensor planned with the FLUX.2 plan at tp 1..4, and the
 * same bytes as the only file of a checkpoint folder (checkpoint_open);
 * the tensors are read back as f32 and i64; a FLUX.3 config (BFL or
 * diffusers names) is derived from the checkpoint's shapes and parsed
 * (flux3_config_from_shapes). */
#include "core/models/model_plan.h"
#include "core/formats/checkpoint.h"
#include "core/models/flux3/flux3.h"
#include "kernels/err.h"
#include "plans/plan.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64], g_file[128];

static void setup(void) {
    if (g_dir[0]) return;
    snprintf(g_dir, sizeof g_dir, "/tmp/tpgen-fuzz-st-%d", (int)getpid());
    mkdir(g_dir, 0700);
    snprintf(g_file, sizeof g_file, "%s/diffusion_pytorch_model.safetensors", g_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    FILE *f = fopen(g_file, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    st_file *st = NULL;
    if (st_open(g_file, &st) == 0) {
        json_t *cfg = json_pack("{s:i,s:i}", "num_attention_heads", 4, "attention_head_dim", 32);
        plan p;
        if (plan_flux2(cfg, &p) == 0)
            for (int i = 0; i < st->n; i++)
                for (int tp = 1; tp <= 4; tp++) {
                    shard_info si;
                    shard_piece pc[PLAN_MAX_PIECES];
                    if (plan_shard(&p, st_plan_tensor(&st->tensors[i]), tp, &si) == 0) plan_shard_pieces(&si, tp, tp - 1, pc);
                }
        json_decref(cfg);
        for (int i = 0; i < st->n_meta; i++) (void)st_meta(st, st->meta_keys[i]);
        /* the readers: sizes are bounded by the file, which is small here */
        for (int i = 0; i < st->n && i < 16; i++) {
            float *f = NULL;
            int64_t *v = NULL;
            if (st_read_f32(st, st->tensors[i].name, &f, NULL) == 0) free(f);
            if (st_read_i64(st, st->tensors[i].name, &v, NULL) == 0) free(v);
        }
        st_close(st);
    }
    checkpoint *c = NULL;
    if (checkpoint_open(g_dir, &c) == 0) {
        const char *pfx;
        if (flux3_checkpoint_names(c, &pfx)) {   /* BFL or diffusers FLUX.3 names */
            json_t *j = flux3_config_from_shapes(c);
            flux3_config fc;
            if (j) (void)flux3_config_parse(j, "fuzz", &fc);
            json_decref(j);
        }
        checkpoint_close(c);
    }
    return 0;
}
