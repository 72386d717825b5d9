/* libFuzzer harness: the bytes are one LoRA adapter file (safetensors),
 * opened with lora_set_open against three tiny transformers written once
 * by the harness: FLUX.2 with diffusers names (its proj_out stored raw
 * fp8, so the low-rank path runs too), FLUX.2 with BFL names (fused qkv,
 * the swapped final layer) and a FLUX.3 module table (its own renames and
 * refusals). Every accepted set goes through lora_estimate and the
 * per-shard merge (lora_merge_shard) of every rank at tp 1 (f32 shards)
 * and tp 2 (bf16 shards). The weights are tiny (D = 16), so an accepted
 * adapter is tiny too: its shapes must match. Weight 1, and -0.5 for
 * every 4th input (a negative weight through the scale checks).
 * FUZZ_VERBOSE=1 build-fuzz/fuzz_lora FILE... prints each model's verdict
 * (how a seed fares: fuzz/make-seeds.py). */
#include "core/models/model_plan.h"
#include "core/formats/checkpoint.h"
#include "core/formats/lora.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include "plans/plan.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* D = heads x head_dim = 16, M = 3 D = 48; in = 8 latent channels, 12 text
 * channels, 8 timestep channels */
#define D 16
#define M 48

typedef struct tiny_tensor { const char *name; int64_t rows, cols; } tiny_tensor;

static const tiny_tensor k_dif[] = {
    {"transformer_blocks.0.attn.to_q.weight", D, D},       {"transformer_blocks.0.attn.to_k.weight", D, D},
    {"transformer_blocks.0.attn.to_v.weight", D, D},       {"transformer_blocks.0.attn.add_q_proj.weight", D, D},
    {"transformer_blocks.0.attn.add_k_proj.weight", D, D}, {"transformer_blocks.0.attn.add_v_proj.weight", D, D},
    {"transformer_blocks.0.attn.to_out.0.weight", D, D},   {"transformer_blocks.0.attn.to_add_out.weight", D, D},
    {"transformer_blocks.0.ff.linear_in.weight", 2 * M, D}, {"transformer_blocks.0.ff.linear_out.weight", D, M},
    {"transformer_blocks.0.ff_context.linear_in.weight", 2 * M, D},
    {"transformer_blocks.0.ff_context.linear_out.weight", D, M},
    {"transformer_blocks.0.attn.norm_q.weight", 8, 0},
    {"single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight", 3 * D + 2 * M, D},
    {"single_transformer_blocks.0.attn.to_out.weight", D, D + M},
    {"x_embedder.weight", D, 8},                           {"context_embedder.weight", D, 12},
    {"time_guidance_embed.timestep_embedder.linear_1.weight", D, 8},
    {"time_guidance_embed.timestep_embedder.linear_2.weight", D, D},
    {"time_guidance_embed.guidance_embedder.linear_1.weight", D, 8},
    {"time_guidance_embed.guidance_embedder.linear_2.weight", D, D},
    {"double_stream_modulation_img.linear.weight", 6 * D, D},
    {"double_stream_modulation_txt.linear.weight", 6 * D, D},
    {"single_stream_modulation.linear.weight", 3 * D, D}, {"norm_out.linear.weight", 2 * D, D},
    {"proj_out.weight", 8, D},   /* stored F8_E4M3 (see write_model) */
};

static const tiny_tensor k_bfl[] = {
    {"double_blocks.0.img_attn.qkv.weight", 3 * D, D},     {"double_blocks.0.txt_attn.qkv.weight", 3 * D, D},
    {"double_blocks.0.img_attn.proj.weight", D, D},        {"double_blocks.0.txt_attn.proj.weight", D, D},
    {"double_blocks.0.img_mlp.0.weight", 2 * M, D},        {"double_blocks.0.img_mlp.2.weight", D, M},
    {"double_blocks.0.txt_mlp.0.weight", 2 * M, D},        {"double_blocks.0.txt_mlp.2.weight", D, M},
    {"single_blocks.0.linear1.weight", 3 * D + 2 * M, D}, {"single_blocks.0.linear2.weight", D, D + M},
    {"img_in.weight", D, 8},                               {"txt_in.weight", D, 12},
    {"time_in.in_layer.weight", D, 8},                     {"time_in.out_layer.weight", D, D},
    {"guidance_in.in_layer.weight", D, 8},                 {"guidance_in.out_layer.weight", D, D},
    {"double_stream_modulation_img.lin.weight", 6 * D, D}, {"double_stream_modulation_txt.lin.weight", 6 * D, D},
    {"single_stream_modulation.lin.weight", 3 * D, D},     {"final_layer.adaLN_modulation.1.weight", 2 * D, D},
    {"final_layer.linear.weight", 8, D},
};

/* a FLUX.3 module table (diffusers names): enough for is_flux3_checkpoint
 * and the renames of ai-toolkit BFL FLUX.3 names */
static const tiny_tensor k_f3[] = {
    {"x_embedders.image.weight", D, 8},
    {"early_stream_modulations.image.linear.weight", 6 * D, D},
    {"mode_blocks.0.attn.to_q.weight", D, D},               {"mode_blocks.0.attn.to_k.weight", D, D},
    {"mode_blocks.0.attn.to_v.weight", D, D},               {"mode_blocks.0.attn.to_out.0.weight", D, D},
    {"mode_blocks.0.ff.linear_in.weight", 2 * M, D},        {"mode_blocks.0.ff.linear_out.weight", D, M},
    {"single_transformer_blocks.0.attn.to_q.weight", D, D}, {"single_transformer_blocks.0.attn.to_out.0.weight", D, D},
    {"proj_out.weight", 8, D},
};

typedef struct model {
    checkpoint *ck;
    plan p;
} model;

static model g_m[3];
static const char *k_model_name[3] = {"flux2-diffusers", "flux2-bfl", "flux3"};
static backend *g_be;
static char g_dir[64], g_file[128];

/* Write a tiny checkpoint (zeros; a 1-D tensor when cols is 0) and open it. */
static void write_model(model *m, const char *tag, const tiny_tensor *t, int n, int fp8_last) {
    st_write_tensor w[32];
    for (int i = 0; i < n; i++) {
        dtype_t dt = fp8_last && i == n - 1 ? DT_F8_E4M3 : DT_BF16;
        int64_t ne = t[i].rows * (t[i].cols ? t[i].cols : 1);
        w[i] = (st_write_tensor){.name = t[i].name, .dtype = dt, .ndim = t[i].cols ? 2 : 1,
                                 .data = xcalloc((size_t)ne, dtype_size(dt))};
        w[i].shape[0] = t[i].rows, w[i].shape[1] = t[i].cols;
    }
    char *path = xasprintf("%s/%s.safetensors", g_dir, tag);
    json_t *cfg = json_pack("{s:i,s:i,s:f}", "num_attention_heads", 2, "attention_head_dim", D / 2, "mlp_ratio", 3.0);
    if (st_write(path, w, n, NULL) || checkpoint_open(path, &m->ck) ||
        (checkpoint_is_bfl(m->ck) ? plan_flux2_bfl(cfg, &m->p) : plan_flux2(cfg, &m->p))) {
        fprintf(stderr, "fuzz_lora: the tiny model %s: %s\n", path, tp_error_msg());
        abort();
    }
    json_decref(cfg);
    for (int i = 0; i < n; i++) free((void *)w[i].data);
    free(path);
}

static void setup(void) {
    if (g_dir[0]) return;
    snprintf(g_dir, sizeof g_dir, "/tmp/tpgen-fuzz-lora-%d", (int)getpid());
    mkdir(g_dir, 0700);
    snprintf(g_file, sizeof g_file, "%s/adapter.safetensors", g_dir);
    g_be = backend_cpu_create(1);
    write_model(&g_m[0], "flux2-diffusers", k_dif, (int)(sizeof k_dif / sizeof k_dif[0]), 1);
    write_model(&g_m[1], "flux2-bfl", k_bfl, (int)(sizeof k_bfl / sizeof k_bfl[0]), 0);
    write_model(&g_m[2], "flux3", k_f3, (int)(sizeof k_f3 / sizeof k_f3[0]), 0);
}

/* Merge the set into every rank's shard of each tensor it targets. A
 * failure is an answer (non-finite values are refused at the merge). */
static void merge_all(lora_set *s, const model *m, int tp) {
    dtype_t dt = tp == 1 ? DT_F32 : DT_BF16;
    for (int i = 0; i < s->n_seg; i++) {
        if (i && !strcmp(s->seg[i].tensor, s->seg[i - 1].tensor)) continue;   /* sorted: once per tensor */
        const st_tensor_info *ti = checkpoint_find(m->ck, s->seg[i].tensor, NULL);
        if (!ti) abort();   /* a segment names a tensor of the checkpoint */
        shard_info si;
        if (plan_shard(&m->p, st_plan_tensor(ti), tp, &si)) {
            if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "  plan tp %d: %s\n", tp, tp_error_msg());
            continue;
        }
        for (int rank = 0; rank < tp; rank++) {
            tensor *t = tensor_new(g_be, dtype_is_fp8(ti->dtype) ? ti->dtype : dt, si.local_rows, si.local_cols);
            if (!t) abort();
            memset(t->data, 0, (size_t)(si.local_rows * si.local_cols) * dtype_size(t->dtype));
            if (lora_merge_shard(s, ti, &si, tp, rank, t) && getenv("FUZZ_VERBOSE"))
                fprintf(stderr, "  merge tp %d rank %d: %s\n", tp, rank, tp_error_msg());
            tensor_free(t);
        }
    }
    for (int rank = 0; rank < tp; rank++) {
        uint64_t bytes[LORA_MAX_ADAPTERS];
        (void)lora_estimate(s, m->ck, &m->p, tp, rank, bytes);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned calls;
    setup();
    FILE *f = fopen(g_file, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    lora_spec sp = {g_file, calls++ % 4 == 3 ? -0.5 : 1.0};
    for (int k = 0; k < 3; k++) {
        lora_set *s = NULL;
        int rc = lora_set_open(&sp, 1, g_m[k].ck, 0, &s);
        if (getenv("FUZZ_VERBOSE"))
            fprintf(stderr, "%s: %s\n", k_model_name[k], rc ? tp_error_msg() : "accepted");
        if (rc) continue;
        if (s->n != 1 || s->ad[0].n_modules < 1 || s->n_seg < s->ad[0].n_modules) abort();   /* accepted: something to merge */
        merge_all(s, &g_m[k], 1);
        merge_all(s, &g_m[k], 2);
        lora_set_free(s);
    }
    return 0;
}
