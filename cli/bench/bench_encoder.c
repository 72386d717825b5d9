/* `tpgen bench encoder`: (1) text-encoder forward time for a 512-token
 * prompt on Qwen3-4B or Mistral Small 24B shapes (--shape) with random
 * in-memory weights, sharded over the
 * ranks of each TP group; (2) per-rank text-encoder bytes for klein-4B
 * (Qwen3-4B, 27 of 36 layers) and FLUX.2-dev (Mistral Small 24B, 30 of 40
 * layers) at several TP degrees, computed through the TP plan on
 * header-only (sparse) checkpoints with the real tensor shapes. */
#include "core/models/llm/llm_internal.h"
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "kernels/ops.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const llm_config k_qwen3_4b = {.arch = LLM_QWEN3, .hidden = 2560, .n_layers = 36, .n_heads = 32,
                                      .n_kv_heads = 8, .head_dim = 128, .ffn = 9728, .vocab = 151936,
                                      .eps = 1e-6f, .rope_theta = 1e6, .qk_norm = 1};
/* FLUX.3: the language model of Qwen3-VL-4B (the same widths, M-RoPE theta 5e6) */
static const llm_config k_qwen3vl_4b = {.arch = LLM_QWEN3VL, .hidden = 2560, .n_layers = 36, .n_heads = 32,
                                        .n_kv_heads = 8, .head_dim = 128, .ffn = 9728, .vocab = 151936,
                                        .eps = 1e-6f, .rope_theta = 5e6, .qk_norm = 1, .mrope_section = {24, 20, 20}};
static const llm_config k_mistral_24b = {.arch = LLM_MISTRAL, .hidden = 5120, .n_layers = 40, .n_heads = 32,
                                         .n_kv_heads = 8, .head_dim = 128, .ffn = 32768, .vocab = 131072,
                                         .eps = 1e-5f, .rope_theta = 1e9, .qk_norm = 0};

/* ---- (2) bytes through the plan ---- */

static void add_tensor(json_t *hdr, const char *name, int64_t rows, int64_t cols, uint64_t *off) {
    uint64_t bytes = (uint64_t)rows * (uint64_t)cols * 2;
    json_t *shape = rows == 1 ? json_pack("[I]", (json_int_t)cols) : json_pack("[I, I]", (json_int_t)rows, (json_int_t)cols);
    json_object_set_new(hdr, name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", "BF16", "shape", shape,
                                             "data_offsets", (json_int_t)*off, (json_int_t)(*off + bytes)));
    *off += bytes;
}

/* A BF16 checkpoint whose data area is a hole: the header has the real
 * names and shapes, so the plan and the loader's byte ranges are real. */
static int write_header_only(const char *path, const llm_config *c, const char *prefix, int extras) {
    json_t *hdr = json_object();
    uint64_t off = 0;
    char name[192];
    int64_t H = c->hidden, D = c->head_dim, q = (int64_t)c->n_heads * D, kv = (int64_t)c->n_kv_heads * D;
    snprintf(name, sizeof name, "%sembed_tokens.weight", prefix);
    add_tensor(hdr, name, c->vocab, H, &off);
    snprintf(name, sizeof name, "%snorm.weight", prefix);
    add_tensor(hdr, name, 1, H, &off);
    struct { const char *w; int64_t r, cols; } lt[] = {
        {"input_layernorm", 1, H}, {"post_attention_layernorm", 1, H}, {"self_attn.q_proj", q, H},
        {"self_attn.k_proj", kv, H}, {"self_attn.v_proj", kv, H}, {"self_attn.o_proj", H, q},
        {"mlp.gate_proj", c->ffn, H}, {"mlp.up_proj", c->ffn, H}, {"mlp.down_proj", H, c->ffn},
        {"self_attn.q_norm", 1, D}, {"self_attn.k_norm", 1, D}};
    for (int i = 0; i < c->n_layers; i++)
        for (int j = 0; j < (c->qk_norm ? 11 : 9); j++) {
            snprintf(name, sizeof name, "%slayers.%d.%s.weight", prefix, i, lt[j].w);
            add_tensor(hdr, name, lt[j].r, lt[j].cols, &off);
        }
    if (extras) {   /* what a Mistral3 checkpoint also holds and the encoder never reads */
        add_tensor(hdr, "language_model.lm_head.weight", c->vocab, H, &off);
        add_tensor(hdr, "vision_tower.transformer.layers.0.attention.q_proj.weight", 1024, 1024, &off);
    }
    char *js = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    uint64_t hl = strlen(js);
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(&hl, 8, 1, f) == 1 && fwrite(js, 1, hl, f) == hl ? 0 : -1;
    if (f) fclose(f);
    free(js);
    if (!rc && truncate(path, (off_t)(8 + hl + off))) rc = -1;
    return rc ? tp_error("cannot write %s", path) : 0;
}

static int plan_bytes(const char *label, const llm_config *base, const char *prefix, int extras, int n_run) {
    char dir[] = "/tmp/tpgen-bench-enc-XXXXXX";
    if (!mkdtemp(dir)) return tp_error("mkdtemp failed");
    char *path = xasprintf("%s/model.safetensors", dir);
    checkpoint *ck = NULL;
    llm_config c = *base;
    int rc = write_header_only(path, &c, prefix, extras);
    if (!rc) rc = checkpoint_open(dir, &ck);
    if (!rc) rc = llm_config_resolve_prefix(&c, ck);
    uint64_t file_bytes = 0;
    for (int i = 0; !rc && i < ck->n; i++) file_bytes += ck->infos[i]->end - ck->infos[i]->begin;
    if (!rc) printf("%s: checkpoint %.2f GB (BF16); encoder uses %d of %d layers\n", label, file_bytes / 1e9, n_run,
                    c.n_layers);
    llm_want want = {&c, n_run, 0};
    for (int tp = 1; !rc && tp <= 8; tp *= 2) {
        llm_plan p;
        rc = llm_plan_build(&c, tp, &p);
        if (!rc) rc = checkpoint_validate_plan(ck, &p.p, tp);
        uint64_t held = 0, sharded = 0;
        for (int i = 0; !rc && i < ck->n; i++) {
            if (!llm_want_tensor(ck->infos[i]->name, &want)) continue;
            shard_info si;
            rc = plan_shard(&p.p, st_plan_tensor(ck->infos[i]), tp, &si);
            uint64_t b = (uint64_t)si.local_rows * (uint64_t)si.local_cols * 2;
            held += b;
            if (si.style != STYLE_REPLICATED) sharded += b;
        }
        if (!rc) printf("  tp %d: %.2f GB per rank (%.2f GB sharded + %.2f MB replicated), freed before denoising\n",
                        tp, held / 1e9, sharded / 1e9, (held - sharded) / 1e6);
    }
    if (ck) checkpoint_close(ck);
    unlink(path);
    rmdir(dir);
    free(path);
    return rc;
}

/* ---- (1) forward time ---- */

/* The embedding stage alone (hidden state 0): gather, plus the all-reduce
 * when the table is vocab-sharded. A vocabulary tp does not divide falls
 * back to a replicated table (llm.h), which is how the two are compared. */
static int time_embedding(dist *d, backend *be, comm *c, int n_tokens, int vocab, dtype_t dt, double *best) {
    llm_config cfg = k_qwen3_4b;
    cfg.vocab = vocab;
    strcpy(cfg.prefix, "model.");
    llm *m = NULL;
    int rc = dist_agree(d->world, llm_init_random(&cfg, 0, be, c, dt, 99, &m));
    int32_t *ids = xmalloc((size_t)n_tokens * sizeof *ids);
    for (int i = 0; i < n_tokens; i++) ids[i] = (i * 131 + 7) % vocab;
    float *out = xmalloc((size_t)n_tokens * cfg.hidden * sizeof *out);
    int idx[1] = {0};
    *best = 1e30;
    for (int r = 0; !rc && r < 5; r++) {
        MPI_Barrier(d->world);
        double t0 = MPI_Wtime();
        rc = llm_forward(m, ids, NULL, n_tokens, idx, 1, out);
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, d->world);
        if (t < *best) *best = t;
    }
    llm_free(m);
    free(ids), free(out);
    return rc;
}

typedef struct { const char *name; const llm_config *cfg; int n_run; } encoder_shape;
static const encoder_shape k_shapes[] = {
    {"qwen3-4b", &k_qwen3_4b, 27},     /* klein-4B: hidden states 9/18/27 */
    {"mistral-24b", &k_mistral_24b, 30}, /* FLUX.2-dev: hidden states 10/20/30 */
};

static int time_forward(dist *d, const encoder_shape *shape, int n_tokens, int layers, int reps, dtype_t dt) {
    backend *be = NULL;
    if (backend_select("cpu", d->local_rank, d->local_size, &be)) return -1;
    comm *c = comm_create_mpi(d->tp_comm, be);
    llm_config cfg = *shape->cfg;
    cfg.vocab = 4096;   /* gather cost does not depend on the table size; keeps setup short */
    strcpy(cfg.prefix, "model.");
    llm *m = NULL;
    size_t base = be->bytes_in_use;
    int rc = dist_agree(d->world, llm_init_random(&cfg, layers, be, c, dt, 1234, &m));
    int32_t *ids = xmalloc((size_t)n_tokens * sizeof *ids), *mask = xmalloc((size_t)n_tokens * sizeof *mask);
    for (int i = 0; i < n_tokens; i++) ids[i] = (i * 131 + 7) % cfg.vocab, mask[i] = i < n_tokens * 3 / 4;
    int idx[1] = {layers};
    float *out = xmalloc((size_t)n_tokens * cfg.hidden * sizeof *out);
    double best = 1e30, ar = 0;
    for (int r = 0; !rc && r < reps; r++) {
        c->allreduce_seconds = 0;
        MPI_Barrier(d->world);
        double t0 = MPI_Wtime();
        rc = llm_forward(m, ids, mask, n_tokens, idx, 1, out);
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, d->world);
        if (t < best) best = t, ar = c->allreduce_seconds;
    }
    size_t held = m ? (size_t)llm_bytes(m) : 0, peak = be->peak_bytes;
    llm_free(m);
    if (!rc && d->world_rank == 0)
        printf("%s shapes, %s weights, %d tokens, tp %d: %d layers in %.3f s (%.3f s/layer, all-reduce %.1f%%) "
               "-> %d layers ~ %.1f s (extrapolated); weights %.2f GB/rank, peak %.2f GB, after free %.3f GB\n",
               shape->name, dt == DT_BF16 ? "bf16" : "f32", n_tokens, d->tp, layers, best, best / layers,
               100 * ar / best, shape->n_run, best / layers * shape->n_run, held / 1e9, peak / 1e9,
               (be->bytes_in_use - base) / 1e9);
    double t_shard = 0, t_repl = 0;
    if (shape->cfg != &k_qwen3_4b) goto done;   /* the embedding comparison is about the Qwen3 table */
    if (!rc) rc = time_embedding(d, be, c, n_tokens, 4096, dt, &t_shard);
    if (!rc) rc = time_embedding(d, be, c, n_tokens, 4097, dt, &t_repl);
    if (!rc && d->world_rank == 0)
        printf("embedding stage (%d tokens, tp %d): vocab-sharded %.2f ms (with tp > 1 incl. an all-reduce of %.1f MB), "
               "replicated %.2f ms; a replicated Qwen3-4B table costs %.2f GB more per rank than a sharded one\n",
               n_tokens, d->tp, t_shard * 1e3, n_tokens * cfg.hidden * 4 / 1e6, t_repl * 1e3,
               (double)k_qwen3_4b.vocab * k_qwen3_4b.hidden * dtype_size(dt) * (1 - 1.0 / d->tp) / 1e9);
done:
    free(ids), free(mask), free(out);
    comm_destroy(c);
    backend_destroy(be);
    return rc;
}

int bench_encoder(int argc, char **argv) {
    int tokens = 512, layers = 2, reps = 2, tp = 0, skip_time = 0;
    const char *prec = "bf16";
    const encoder_shape *shape = &k_shapes[0];
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--tokens")) tokens = atoi(v), i++;
        else if (!strcmp(argv[i], "--layers")) layers = atoi(v), i++;
        else if (!strcmp(argv[i], "--reps")) reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--tp")) tp = atoi(v), i++;
        else if (!strcmp(argv[i], "--precision")) prec = v, i++;
        else if (!strcmp(argv[i], "--bytes-only")) skip_time = 1;
        else if (!strcmp(argv[i], "--shape") && (!strcmp(v, "qwen3-4b") || !strcmp(v, "mistral-24b")))
            shape = &k_shapes[strcmp(v, "qwen3-4b") ? 1 : 0], i++;
        else {
            printf("usage: mpirun -np N tpgen bench encoder [--shape qwen3-4b|mistral-24b] [--tokens 512] [--layers 2]\n"
                   "                                        [--reps 2] [--tp N] [--precision bf16|f32] [--bytes-only]\n"
                   "Times --layers layers of the shape (random weights) and extrapolates to the layers the\n"
                   "pipeline runs (27 of Qwen3-4B for klein, 30 of Mistral Small for FLUX.2-dev);\n"
                   "then prints per-rank text-encoder bytes for klein-4B and FLUX.2-dev through the TP plan.\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (tokens < 1 || layers < 1 || layers > 36 || reps < 1) {
        fprintf(stderr, "tpgen: error: bench encoder: bad --tokens/--layers/--reps\n");
        return 2;
    }
    dist d;
    if (dist_init(&argc, &argv, &d)) return fprintf(stderr, "tpgen: error: %s\n", tp_error_msg()), 1;
    int rc = dist_agree(d.world, dist_set_tp(&d, tp));
    if (!rc && !skip_time) rc = time_forward(&d, shape, tokens, layers, reps, strcmp(prec, "f32") ? DT_BF16 : DT_F32);
    if (!rc && d.world_rank == 0) {
        rc = plan_bytes("klein-4B text encoder (Qwen3-4B)", &k_qwen3_4b, "model.", 0, 27);
        if (!rc) rc = plan_bytes("FLUX.2-dev text encoder (Mistral Small 3.x 24B)", &k_mistral_24b,
                                 "language_model.model.", 1, 30);
        if (!rc) rc = plan_bytes("FLUX.3 text encoder (Qwen3-VL-4B language model)", &k_qwen3vl_4b,
                                 "model.language_model.", 0, 32);
    }
    rc = dist_agree(d.world, rc);
    if (rc) dist_report_error(d.world);
    dist_finalize(&d);
    return rc ? 1 : 0;
}
