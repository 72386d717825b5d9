/* `tpgen encode`: run the pipeline's text encoder on one prompt and save
 * prompt_embeds [1, L, K*H] (f32; K = 3 for FLUX.2, 8 for FLUX.3), input_ids and attention_mask [1, L] (i64)
 * with st_write; `tpgen generate --prompt-embeds FILE` reads them back. */
#include "commands.h"
#include "kernels/comm.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include "core/formats/safetensors.h"
#include "core/models/llm/textenc.h"
#include "kernels/ops.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct encode_args {
    const char *model, *prompt, *out, *backend, *precision;
    int max_len, tp;
} encode_args;

static void encode_usage(FILE *f) {
    fprintf(f, "usage: mpirun -np N tpgen encode --model DIR --prompt TEXT --save-embeds FILE\n"
               "           [--max-sequence-length N] [--precision bf16|f32] [--tp N] [--backend cpu|cuda|auto]\n\n"
               "Runs the text encoder of the pipeline folder DIR (Qwen3 for FLUX.2-klein, Mistral for FLUX.2-dev,\n"
               "Qwen3-VL for FLUX.3), sharded over the --tp ranks of each group (default: all ranks), and writes\n"
               "prompt_embeds [1, L, K*H] (f32), input_ids and attention_mask [1, L] (i64) to FILE (safetensors).\n"
               "FLUX.2: L is --max-sequence-length (default 512). FLUX.3: L is the prompt's length rounded up to\n"
               "a multiple of 80, capped at --max-sequence-length (default 8192). Rank 0 writes the file.\n");
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < lo || x > hi)
        return tp_error("%s needs an integer from %d to %d (got '%s')", flag, lo, hi, v ? v : "");
    *out = (int)x;
    return 0;
}

/* 1: help printed; 0: ok; -1: error */
static int parse_args(int argc, char **argv, encode_args *a) {
    *a = (encode_args){.max_len = 0, .precision = "bf16", .backend = "auto"};   /* 0: the pipeline's default */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return 1;
        int takes = 1;
        if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--prompt")) a->prompt = v;
        else if (!strcmp(f, "--save-embeds")) a->out = v;
        else if (!strcmp(f, "--precision")) a->precision = v;
        else if (!strcmp(f, "--backend")) a->backend = v;
        else if (!strcmp(f, "--max-sequence-length")) { if (parse_int(f, v, 1, 8192, &a->max_len)) return -1; }
        else if (!strcmp(f, "--tp")) { if (parse_int(f, v, 1, 4096, &a->tp)) return -1; }
        else return tp_error("tpgen encode: unknown option '%s' (see tpgen encode --help)", f);
        if (takes && !v) return tp_error("tpgen encode: %s needs a value", f);
        i += takes;
    }
    if (!a->model) return tp_error("tpgen encode: --model DIR is required");
    if (!a->prompt) return tp_error("tpgen encode: --prompt TEXT is required");
    if (!a->out) return tp_error("tpgen encode: --save-embeds FILE is required");
    if (strcmp(a->precision, "bf16") && strcmp(a->precision, "f32"))
        return tp_error("tpgen encode: --precision must be bf16 or f32 (got '%s')", a->precision);
    return 0;
}

static int save(const encode_args *a, const textenc *t, int L, const float *embeds, const int32_t *ids,
                const int32_t *mask) {
    int64_t *ids64 = xmalloc((size_t)L * sizeof *ids64), *mask64 = xmalloc((size_t)L * sizeof *mask64);
    for (int i = 0; i < L; i++) ids64[i] = ids[i], mask64[i] = mask[i];
    st_write_tensor ts[3] = {
        {"prompt_embeds", DT_F32, 3, {1, L, textenc_embed_dim(t)}, embeds},
        {"input_ids", DT_I64, 2, {1, L}, ids64},
        {"attention_mask", DT_I64, 2, {1, L}, mask64},
    };
    char cap[32];
    snprintf(cap, sizeof cap, "%d", a->max_len ? a->max_len : textenc_max_len(t));
    const char *meta[] = {"text_encoder", textenc_kind(t), "precision", a->precision, "prompt", a->prompt,
                          "max_sequence_length", cap, NULL};
    int rc = st_write(a->out, ts, 3, meta);
    free(ids64), free(mask64);
    return rc;
}

/* textenc calls already agree inside their TP group; the other data-parallel
 * groups (which encode the same prompt) learn of a failure here. */
static int agree_groups(dist *d, int rc) { return d->dp > 1 ? dist_agree(d->world, rc) : rc; }

static int run_encode(const encode_args *a, dist *d) {
    backend *be = NULL;
    comm *c = NULL;
    textenc *t = NULL;
    load_stats st = {0};
    int rc = dist_agree(d->world, dist_set_tp(d, a->tp));
    if (!rc) rc = dist_agree(d->world, backend_select(a->backend, d->local_rank, d->local_size, &be));
    if (!rc && !(c = comm_create(d->tp_comm, be))) rc = -1;
    rc = dist_agree(d->world, rc);
    double t0 = MPI_Wtime();
    if (!rc) rc = agree_groups(d, textenc_load(a->model, be, c, strcmp(a->precision, "f32") ? DT_BF16 : DT_F32, &t, &st));
    double t1 = MPI_Wtime();
    float *embeds = NULL;
    int32_t *ids = NULL, *mask = NULL;
    int L = 0;   /* the window: max_len for FLUX.2, the padded prompt length for FLUX.3 */
    if (!rc) rc = agree_groups(d, textenc_window(t, a->prompt, a->max_len, &L));
    if (!rc) {
        ids = xmalloc((size_t)L * sizeof *ids), mask = xmalloc((size_t)L * sizeof *mask);
        embeds = xmalloc((size_t)L * textenc_embed_dim(t) * sizeof *embeds);
        rc = agree_groups(d, textenc_encode(t, a->prompt, L, embeds, ids, mask));
    }
    double t2 = MPI_Wtime();
    if (!rc) rc = dist_agree(d->world, d->world_rank == 0 ? save(a, t, L, embeds, ids, mask) : 0);
    if (!rc && d->world_rank == 0) {
        int n_real = 0;
        for (int i = 0; i < L; i++) n_real += mask[i] != 0;
        printf("encoded %d tokens (%d real) with the %s text encoder (hidden %d, tp %d, %s): load %.2f s "
               "(rank 0 read %.1f MB of the checkpoint, holds %.1f MB), encode %.2f s -> %s [1, %d, %d]\n",
               L, n_real, textenc_kind(t), textenc_hidden(t), d->tp, a->precision, t1 - t0,
               st.bytes_read / 1e6, textenc_bytes(t) / 1e6, t2 - t1, a->out, L, textenc_embed_dim(t));
    }
    free(embeds), free(ids), free(mask);
    textenc_free(t);
    comm_destroy(c);
    backend_destroy(be);
    return rc;
}

int cmd_encode(int argc, char **argv) {
    dist d;
    if (dist_init(&argc, &argv, &d)) {
        fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
        return 1;
    }
    encode_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc == 1) {
        if (d.world_rank == 0) encode_usage(stdout);
        dist_finalize(&d);
        return 0;
    }
    rc = dist_agree(d.world, rc);
    if (!rc) rc = run_encode(&a, &d);
    if (rc) dist_report_error(d.world);
    dist_finalize(&d);
    return rc ? 1 : 0;
}
