/* `tpgen make-tiny --out DIR [--seed S] [--family klein|dev]`: a tiny random
 * FLUX.2-klein-style (default) or FLUX.2-dev-style pipeline folder in the
 * diffusers layout, for the demo, the tests and bug reports:
 * model_index.json, scheduler/, transformer/ (config.json + BF16
 * safetensors), vae/ and text_encoder/ + tokenizer/. The dev folder
 * differs in three places, as the real ones do: the transformer has a
 * guidance embedder (guidance_embeds true), the text encoder is a Mistral3
 * (31 layers, mini Tekken tokenizer) instead of a Qwen3, and
 * model_index.json names Flux2Pipeline without is_distilled. Also
 * DIR/prompt_embeds.safetensors: random prompt embeddings, so that the
 * folder can also be rendered with --prompt-embeds.
 * The weights are random: images show structured noise, not pictures. */
#include "commands.h"
#include "kernels/err.h"
#include "core/models/llm/textenc.h"
#include "core/models/vae/vae.h"
#include "core/rng.h"
#include "core/formats/safetensors.h"
#include "kernels/tensor.h"
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


/* the tiny transformer: D = 4 x 32, M = 3D, text width 96 = 3 x 32 (the
 * tiny text encoder's hidden size), 32 latent channels (8 VAE channels x 2x2) */
enum { T_IN = 32, T_JT = 96, T_CT = 64, T_EMBED_LEN = 16 };

/* the transformer's widths: tiny, or klein-4B's (D 3072 = 24 heads x 128,
 * MLP 9216) with 2 + 2 blocks and the tiny VAE and text encoder, for
 * benchmarks of whole runs at real widths (`--widths klein-4b`, 1.5 GB) */
typedef struct tiny_dims {
    int heads, hd, n_double, n_single, rope;   /* rope: each of the 4 axes */
} tiny_dims;
static tiny_dims g_dims = {4, 32, 1, 2, 8};
#define T_HEADS (g_dims.heads)
#define T_HD (g_dims.hd)
#define T_D (g_dims.heads * g_dims.hd)
#define T_M (3 * T_D)
#define T_DOUBLE (g_dims.n_double)
#define T_SINGLE (g_dims.n_single)

typedef struct tensor_list {
    st_write_tensor t[96];
    char *names[96];
    uint16_t *data[96];
    int n;
} tensor_list;

/* a BF16 tensor [rows, cols] (rows 0: 1-D [cols]) ~ N(0, 1/cols), or
 * 1 + N(0, 0.1) for norm weights */
static void add(tensor_list *l, tp_rng *g, const char *name, int64_t rows, int64_t cols, int norm) {
    size_t n = (size_t)(rows ? rows : 1) * (size_t)cols;
    float *f = xmalloc(n * sizeof *f);
    rng_randn_f32(g, f, n);
    uint16_t *b = xmalloc(n * sizeof *b);
    float scale = norm ? 0.1f : 1.0f / sqrtf((float)cols);
    for (size_t i = 0; i < n; i++) b[i] = f32_to_bf16((norm ? 1.0f : 0.0f) + scale * f[i]);
    free(f);
    st_write_tensor *t = &l->t[l->n];
    l->names[l->n] = xstrdup(name);
    l->data[l->n] = b;
    t->name = l->names[l->n];
    t->dtype = DT_BF16;
    t->ndim = rows ? 2 : 1;
    t->shape[0] = rows ? rows : cols;
    t->shape[1] = cols;
    t->data = b;
    l->n++;
}

/* guidance: FLUX.2-dev's guidance embedder (same shapes as the timestep
 * embedder), written after every other tensor so that the klein tensors of a
 * seed stay the same in both families */
static void build_transformer(tensor_list *l, tp_rng *g, int guidance) {
    const int D = T_D, M = T_M;
    add(l, g, "x_embedder.weight", D, T_IN, 0);
    add(l, g, "context_embedder.weight", D, T_JT, 0);
    add(l, g, "time_guidance_embed.timestep_embedder.linear_1.weight", D, T_CT, 0);
    add(l, g, "time_guidance_embed.timestep_embedder.linear_2.weight", D, D, 0);
    add(l, g, "double_stream_modulation_img.linear.weight", 6 * D, D, 0);
    add(l, g, "double_stream_modulation_txt.linear.weight", 6 * D, D, 0);
    add(l, g, "single_stream_modulation.linear.weight", 3 * D, D, 0);
    add(l, g, "norm_out.linear.weight", 2 * D, D, 0);
    add(l, g, "proj_out.weight", T_IN, D, 0);
    char nm[128];
    static const char *dsq[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj",
                                "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"};
    static const char *dnorm[] = {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"};
    for (int i = 0; i < T_DOUBLE; i++) {
        for (int k = 0; k < 8; k++) {
            snprintf(nm, sizeof nm, "transformer_blocks.%d.%s.weight", i, dsq[k]);
            add(l, g, nm, D, D, 0);
        }
        for (int k = 0; k < 4; k++) {
            snprintf(nm, sizeof nm, "transformer_blocks.%d.%s.weight", i, dnorm[k]);
            add(l, g, nm, 0, T_HD, 1);
        }
        static const char *ff[] = {"ff", "ff_context"};
        for (int k = 0; k < 2; k++) {
            snprintf(nm, sizeof nm, "transformer_blocks.%d.%s.linear_in.weight", i, ff[k]);
            add(l, g, nm, 2 * M, D, 0);
            snprintf(nm, sizeof nm, "transformer_blocks.%d.%s.linear_out.weight", i, ff[k]);
            add(l, g, nm, D, M, 0);
        }
    }
    for (int j = 0; j < T_SINGLE; j++) {
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj.weight", j);
        add(l, g, nm, 3 * D + 2 * M, D, 0);
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.to_out.weight", j);
        add(l, g, nm, D, D + M, 0);
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.norm_q.weight", j);
        add(l, g, nm, 0, T_HD, 1);
        snprintf(nm, sizeof nm, "single_transformer_blocks.%d.attn.norm_k.weight", j);
        add(l, g, nm, 0, T_HD, 1);
    }
    if (guidance) {
        add(l, g, "time_guidance_embed.guidance_embedder.linear_1.weight", D, T_CT, 0);
        add(l, g, "time_guidance_embed.guidance_embedder.linear_2.weight", D, D, 0);
    }
}

static void free_list(tensor_list *l) {
    for (int i = 0; i < l->n; i++) free(l->names[i]), free(l->data[i]);
}

static int make_dir(const char *path) {
    if (mkdir(path, 0755) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
        return tp_error("%s exists and is not a directory", path);
    }
    return tp_error("cannot create %s: %s", path, strerror(errno));
}

static int write_json(const char *path, json_t *j) {
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    json_decref(j);
    return rc ? tp_error("cannot write %s", path) : 0;
}

static json_t *transformer_config(int guidance) {
    return json_pack("{s:s, s:s, s:i, s:i, s:n, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:[i,i,i,i], s:i, s:f, s:b}",
                     "_class_name", "Flux2Transformer2DModel", "_diffusers_version", "0.40.0",
                     "patch_size", 1, "in_channels", T_IN, "out_channels", "num_layers", T_DOUBLE,
                     "num_single_layers", T_SINGLE, "attention_head_dim", T_HD, "num_attention_heads", T_HEADS,
                     "joint_attention_dim", T_JT, "timestep_guidance_channels", T_CT, "mlp_ratio", 3.0,
                     "axes_dims_rope", g_dims.rope, g_dims.rope, g_dims.rope, g_dims.rope, "rope_theta", 2000, "eps", 1e-6, "guidance_embeds", guidance);
}

static json_t *scheduler_config(void) {
    return json_pack("{s:s, s:i, s:f, s:i, s:f, s:i, s:f, s:b, s:s}", "_class_name",
                     "FlowMatchEulerDiscreteScheduler", "base_image_seq_len", 256, "base_shift", 0.5,
                     "max_image_seq_len", 4096, "max_shift", 1.15, "num_train_timesteps", 1000, "shift", 3.0,
                     "use_dynamic_shifting", 1, "time_shift_type", "exponential");
}

/* random prompt embeddings [1, 16, 96] for --prompt-embeds */
static int write_embeds(const char *dir, tp_rng *g) {
    size_t n = (size_t)T_EMBED_LEN * T_JT;
    float *e = xmalloc(n * sizeof *e);
    rng_randn_f32(g, e, n);
    st_write_tensor t = {.name = "prompt_embeds", .dtype = DT_F32, .ndim = 3, .shape = {1, T_EMBED_LEN, T_JT}, .data = e};
    const char *meta[] = {"note", "random embeddings written by tpgen make-tiny (no text encoder involved)", NULL};
    char *path = xasprintf("%s/prompt_embeds.safetensors", dir);
    int rc = st_write(path, &t, 1, meta);
    free(path);
    free(e);
    return rc;
}

/* What differs between the two families of tiny folders. */
typedef struct tiny_family {
    const char *name;            /* --family value */
    const char *title;           /* for the summary line */
    const char *pipeline_class;  /* model_index.json _class_name */
    int distilled;               /* model_index.json is_distilled: true (klein) or absent (dev) */
    int guidance_embeds;         /* the transformer embeds the guidance scale (dev) */
    int (*write_text_encoder)(const char *model_dir, unsigned seed);
    const char *te_class, *tok_class;
} tiny_family;

static tiny_family family_by_name(const char *name) {
    if (!strcmp(name, "dev"))
        return (tiny_family){"dev", "FLUX.2-dev", "Flux2Pipeline", 0, 1, textenc_write_tiny_mistral,
                             "Mistral3ForConditionalGeneration", "PixtralProcessor"};
    return (tiny_family){"klein", "FLUX.2-klein", "Flux2KleinPipeline", 1, 0, textenc_write_tiny,
                         "Qwen3ForCausalLM", "Qwen2TokenizerFast"};
}

static int write_transformer_and_scheduler(const char *dir, const tiny_family *fam, tp_rng *g) {
    char *sub = xasprintf("%s/transformer", dir), *sched = xasprintf("%s/scheduler", dir);
    int rc = make_dir(sub) || make_dir(sched);
    tensor_list l = {.n = 0};
    if (!rc) {
        build_transformer(&l, g, fam->guidance_embeds);
        char *p = xasprintf("%s/diffusion_pytorch_model.safetensors", sub);
        rc = st_write(p, l.t, l.n, NULL);
        free(p);
    }
    if (!rc) {
        char *p = xasprintf("%s/config.json", sub);
        rc = write_json(p, transformer_config(fam->guidance_embeds));
        free(p);
    }
    if (!rc) {
        char *p = xasprintf("%s/scheduler_config.json", sched);
        rc = write_json(p, scheduler_config());
        free(p);
    }
    free_list(&l);
    free(sub);
    free(sched);
    return rc ? -1 : 0;
}

static int write_model_index(const char *dir, const tiny_family *fam) {
    json_t *idx = json_pack("{s:s, s:s}", "_class_name", fam->pipeline_class, "_diffusers_version", "0.40.0");
    if (fam->distilled) json_object_set_new(idx, "is_distilled", json_true());
    json_object_set_new(idx, "scheduler", json_pack("[s,s]", "diffusers", "FlowMatchEulerDiscreteScheduler"));
    json_object_set_new(idx, "transformer", json_pack("[s,s]", "diffusers", "Flux2Transformer2DModel"));
    json_object_set_new(idx, "vae", json_pack("[s,s]", "diffusers", "AutoencoderKLFlux2"));
    json_object_set_new(idx, "text_encoder", json_pack("[s,s]", "transformers", fam->te_class));
    json_object_set_new(idx, "tokenizer", json_pack("[s,s]", "transformers", fam->tok_class));
    char *p = xasprintf("%s/model_index.json", dir);
    int rc = write_json(p, idx);
    free(p);
    return rc;
}

static int make_tiny(const char *dir, unsigned seed, const tiny_family *fam) {
    if (make_dir(dir)) return -1;
    tp_rng g;
    rng_seed(&g, seed);
    if (write_transformer_and_scheduler(dir, fam, &g) || write_embeds(dir, &g)) return -1;
    char *v = xasprintf("%s/vae", dir);
    int rc = vae_write_tiny(v, seed + 1);
    free(v);
    if (rc || fam->write_text_encoder(dir, seed + 2) || write_model_index(dir, fam)) return -1;
    printf("wrote a tiny random %s pipeline to %s: transformer (%d double + %d single blocks, D %d%s), vae, %s, and "
           "prompt_embeds.safetensors [1, %d, %d]\n", fam->title, dir, T_DOUBLE, T_SINGLE, T_D,
           fam->guidance_embeds ? ", guidance embeds" : "",
           fam->guidance_embeds ? "Mistral3 text encoder + Tekken tokenizer" : "Qwen3 text encoder + tokenizer",
           T_EMBED_LEN, T_JT);
    return 0;
}

/* --widths klein-4b-full / dev-full: every component at its real widths,
 * streamed to disk (a full klein-4B is 16 GB, dev 110 GB; --sparse leaves
 * the matrices as holes, a few MB on disk, for shape and load tests) */
static int make_full(const char *dir, const tiny_family *fam, unsigned seed, int sparse) {
    int dev = fam->guidance_embeds;
    if (make_dir(dir) || flux2_make_checkpoint(dir, dev ? "dev" : "klein-4b", sparse, 1, seed)) return -1;
    char *sched = xasprintf("%s/scheduler", dir), *p = xasprintf("%s/scheduler_config.json", sched),
         *v = xasprintf("%s/vae", dir);
    int rc = make_dir(sched) || write_json(p, scheduler_config()) || vae_write_flux2(v, seed + 1) ||
             textenc_write_full(dir, dev, seed + 2, sparse) || write_model_index(dir, fam);
    free(sched), free(p), free(v);
    if (rc) return -1;
    printf("wrote a full-size random %s pipeline to %s%s: transformer (%s widths), vae (128/256/512/512), %s\n",
           fam->title, dir, sparse ? " (sparse: the matrices are holes)" : "", dev ? "FLUX.2-dev" : "klein-4B",
           dev ? "Mistral Small 3.x language model (40 layers, H 5120) + mini Tekken tokenizer"
               : "Qwen3-4B (36 layers, H 2560) + Qwen3 tokenizer");
    return 0;
}

int cmd_make_tiny(int argc, char **argv) {
    const char *out = NULL, *family = "klein";
    int full = 0, sparse = 0, heads = 0;
    unsigned long seed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: tpgen make-tiny --out DIR [--seed S] [--family klein|dev] [--widths tiny|klein-4b|klein-4b-full|dev-full]\n"
                   "                      [--sparse] [--heads H]\n\n"
                   "Write a tiny random FLUX.2 pipeline folder (diffusers layout) to DIR:\n"
                   "transformer/, scheduler/, model_index.json, prompt_embeds.safetensors (random),\n"
                   "and vae/, text_encoder/, tokenizer/ when this build has them. Same seed, same files.\n\n"
                   "  --family klein   FLUX.2-klein (distilled, default): Qwen3 text encoder, no guidance input\n"
                   "  --family dev     FLUX.2-dev: transformer with guidance embeds, Mistral3 text encoder\n"
                   "                   (31 layers) with a mini Tekken tokenizer\n"
                   "  --widths klein-4b the transformer at klein-4B's widths (D 3072, 24 heads, MLP 9216), 2 double +\n"
                   "                   2 single blocks, 1.5 GB; VAE and text encoder stay tiny (benchmarks)\n"
                   "  --widths klein-4b-full  a complete full-size random FLUX.2-klein-4B: transformer (5 + 20 blocks),\n"
                   "                   Qwen3-4B (36 layers), the real VAE; 16 GB, streamed to disk\n"
                   "  --widths dev-full  the same for FLUX.2-dev (48 + 8 blocks, Mistral Small's 40 layers): 110 GB\n"
                   "  --sparse         with *-full: the weight matrices as holes (a few MB on disk), for shape and\n"
                   "                   loading tests\n"
                   "  --heads H        tiny widths with H attention heads of 32 (default 4; 1 to 24), e.g. 6 for\n"
                   "                   tests of degrees that divide 6 but not 4 (--sp 3)\n");
            return 0;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--family") && i + 1 < argc) {
            family = argv[++i];
            if (strcmp(family, "klein") && strcmp(family, "dev")) {
                fprintf(stderr, "tpgen: error: --family: expected klein or dev, got '%s'\n", family);
                return 2;
            }
        } else if (!strcmp(argv[i], "--widths") && i + 1 < argc) {
            const char *w = argv[++i];
            if (!strcmp(w, "klein-4b")) g_dims = (tiny_dims){24, 128, 2, 2, 32};
            else if (!strcmp(w, "klein-4b-full")) full = 1, family = "klein";
            else if (!strcmp(w, "dev-full")) full = 1, family = "dev";
            else if (strcmp(w, "tiny")) {
                fprintf(stderr, "tpgen: error: --widths: expected tiny, klein-4b, klein-4b-full or dev-full, got '%s'\n", w);
                return 2;
            }
        } else if (!strcmp(argv[i], "--heads") && i + 1 < argc) {
            char *end;
            long h = strtol(argv[++i], &end, 10);
            if (*end || h < 1 || h > 24) {
                fprintf(stderr, "tpgen: error: --heads: expected an integer from 1 to 24, got '%s'\n", argv[i]);
                return 2;
            }
            heads = (int)h;
        } else if (!strcmp(argv[i], "--sparse")) {
            sparse = 1;
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *end;
            errno = 0;
            seed = strtoul(argv[++i], &end, 10);
            if (errno || *end || seed > 0xffffffffUL) {
                fprintf(stderr, "tpgen: error: --seed: expected an integer from 0 to 4294967295, got '%s'\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "tpgen: error: make-tiny: unexpected argument '%s' (see tpgen make-tiny --help)\n", argv[i]);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "tpgen: error: make-tiny needs --out DIR\n");
        return 2;
    }
    if (heads && (full || g_dims.hd != 32)) {
        fprintf(stderr, "tpgen: error: make-tiny: --heads goes with the tiny widths (no --widths)\n");
        return 2;
    }
    if (heads) g_dims.heads = heads;
    if (sparse && !full) {
        fprintf(stderr, "tpgen: error: make-tiny: --sparse goes with --widths klein-4b-full or dev-full\n");
        return 2;
    }
    tiny_family fam = family_by_name(family);
    if (full ? make_full(out, &fam, (unsigned)seed, sparse) : make_tiny(out, (unsigned)seed, &fam)) {
        fprintf(stderr, "tpgen: error: make-tiny: %s\n", tp_error_msg());
        return 1;
    }
    return 0;
}
