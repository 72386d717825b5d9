/* `tpgen bench load`: sharded vs naive checkpoint loading, and the
 * generator of FLUX.2-shaped checkpoints it (and the tests) run on.
 *
 *   tpgen bench load --make DIR --shape klein-4b [--sparse] [--shards N] [--seed S]
 *   mpirun -np N tpgen bench load --model DIR [--mode sharded|mmap|naive] [--cold] [--threads T] [--json]
 *
 * The generated checkpoint has the real tensor names and shapes (spec
 * docs/spec/flux2-transformer.md §2) with random BF16 data, or holes (--sparse: a
 * header-only file of the real size that costs no disk). */
#include "core/formats/weights.h"
#include "core/dist/dist.h"
#include "core/formats/gguf.h"
#include "core/formats/lora.h"
#include "kernels/err.h"
#include "core/models/model_plan.h"
#include "kernels/ops.h"
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct flux2_shape {
    const char *name;
    int heads, layers, single, joint_dim, guidance;
} flux2_shape;

/* docs/spec/flux2-transformer.md §1.1; head_dim 128, in_channels 128, timestep channels 256, mlp 3 */
static const flux2_shape k_shapes[] = {
    {"dev", 48, 8, 48, 15360, 1},
    {"klein-4b", 24, 5, 20, 7680, 0},
    {"klein-9b", 32, 8, 24, 12288, 0},
    {"small", 4, 2, 3, 256, 1},   /* quick runs: the same structure, 1/12 of klein's width */
};

typedef struct inventory {
    int n;
    st_write_tensor *t;
    char **names;
} inventory;

static void add(inventory *v, char *name, int64_t rows, int64_t cols) {
    v->t = xrealloc(v->t, (size_t)(v->n + 1) * sizeof *v->t);
    v->names = xrealloc(v->names, (size_t)(v->n + 1) * sizeof *v->names);
    v->names[v->n] = name;
    v->t[v->n] = (st_write_tensor){.name = name, .dtype = DT_BF16, .ndim = cols ? 2 : 1, .shape = {rows, cols}};
    v->n++;
}

static void build_inventory(const flux2_shape *s, inventory *v) {
    int64_t hd = 128, D = s->heads * hd, M = 3 * D, Ct = 256, C = 128;
    memset(v, 0, sizeof *v);
    add(v, xstrdup("x_embedder.weight"), D, C);
    add(v, xstrdup("context_embedder.weight"), D, s->joint_dim);
    add(v, xstrdup("time_guidance_embed.timestep_embedder.linear_1.weight"), D, Ct);
    add(v, xstrdup("time_guidance_embed.timestep_embedder.linear_2.weight"), D, D);
    if (s->guidance) {
        add(v, xstrdup("time_guidance_embed.guidance_embedder.linear_1.weight"), D, Ct);
        add(v, xstrdup("time_guidance_embed.guidance_embedder.linear_2.weight"), D, D);
    }
    add(v, xstrdup("double_stream_modulation_img.linear.weight"), 6 * D, D);
    add(v, xstrdup("double_stream_modulation_txt.linear.weight"), 6 * D, D);
    add(v, xstrdup("single_stream_modulation.linear.weight"), 3 * D, D);
    add(v, xstrdup("norm_out.linear.weight"), 2 * D, D);
    add(v, xstrdup("proj_out.weight"), C, D);
    static const char *sq[] = {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"};
    static const char *nm[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
    for (int i = 0; i < s->layers; i++) {
        for (int j = 0; j < 8; j++) add(v, xasprintf("transformer_blocks.%d.attn.%s.weight", i, sq[j]), D, D);
        for (int j = 0; j < 4; j++) add(v, xasprintf("transformer_blocks.%d.attn.%s.weight", i, nm[j]), hd, 0);
        add(v, xasprintf("transformer_blocks.%d.ff.linear_in.weight", i), 2 * M, D);
        add(v, xasprintf("transformer_blocks.%d.ff.linear_out.weight", i), D, M);
        add(v, xasprintf("transformer_blocks.%d.ff_context.linear_in.weight", i), 2 * M, D);
        add(v, xasprintf("transformer_blocks.%d.ff_context.linear_out.weight", i), D, M);
    }
    for (int i = 0; i < s->single; i++) {
        add(v, xasprintf("single_transformer_blocks.%d.attn.to_qkv_mlp_proj.weight", i), 3 * D + 2 * M, D);
        add(v, xasprintf("single_transformer_blocks.%d.attn.norm_q.weight", i), hd, 0);
        add(v, xasprintf("single_transformer_blocks.%d.attn.norm_k.weight", i), hd, 0);
        add(v, xasprintf("single_transformer_blocks.%d.attn.to_out.weight", i), D, D + M);
    }
}

static void free_inventory(inventory *v) {
    for (int i = 0; i < v->n; i++) free(v->names[i]);
    free(v->names), free(v->t);
}

/* --fp8: the sharded linears (as mixed fp8 files have them) become
 * F8_E4M3 with a per-output-channel F32 `weight_scale` */
static int g_make_fp8;

static void make_fp8(inventory *v) {
    int n0 = v->n;
    for (int i = 0; i < n0; i++) {
        const char *n = v->names[i];
        if (v->t[i].ndim != 2 || strstr(n, ".norm") || (strncmp(n, "transformer_blocks.", 19) && strncmp(n, "single_transformer_blocks.", 26)))
            continue;
        v->t[i].dtype = DT_F8_E4M3;
        size_t ml = strlen(n) - strlen(".weight");
        add(v, xasprintf("%.*s.weight_scale", (int)ml, n), v->t[i].shape[0], 0);
        v->t[v->n - 1].dtype = DT_F32;
    }
}

typedef struct fill_ctx { unsigned seed; const st_write_tensor *t; } fill_ctx;

/* Random BF16 in about [-0.05, 0.05]: a fast xorshift per chunk, seeded by
 * tensor index and offset so the data do not depend on chunking. fp8
 * tensors get codes of ±2^-4..2^-1 (scaled by 2^-5 by their F32 scales). */
static int fill_random(void *ctx, int index, void *buf, size_t offset, size_t n) {
    const fill_ctx *fc = ctx;
    if (!buf) return 0;   /* every tensor is written */
    uint64_t x = fc->seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)index << 40) ^ (offset + 1);
    if (fc->t[index].dtype == DT_F8_E4M3) {
        uint8_t *q = buf;
        for (size_t i = 0; i < n; i++) x ^= x << 13, x ^= x >> 7, x ^= x << 17, q[i] = (uint8_t)(0x20 | (x & 0x1f) | ((x >> 8 & 1) << 7));
        return 0;
    }
    if (fc->t[index].dtype == DT_F32) {
        float *f = buf;
        for (size_t i = 0; i < n / 4; i++) f[i] = 1.0f / 32;
        return 0;
    }
    uint16_t *h = buf;
    for (size_t i = 0; i < n / 2; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        h[i] = (uint16_t)(0x3c00 | (x & 0x7f) | ((x >> 8 & 1) << 15) | ((x >> 9 & 3) << 7)); /* ±2^-7..2^-4 */
    }
    return 0;
}

/* --sparse: holes for the weights, but the small F32 fp8 scales get their
 * value (a zero scale is refused as a corrupt checkpoint) */
static int fill_sparse(void *ctx, int index, void *buf, size_t offset, size_t n) {
    const fill_ctx *fc = ctx;
    if (!buf) return fc->t[index].dtype == DT_F32 ? 0 : 1;
    return fill_random(ctx, index, buf, offset, n);
}

static int write_json(const char *path, json_t *j) {
    int rc = json_dump_file(j, path, JSON_INDENT(2)) ? tp_error("cannot write %s", path) : 0;
    json_decref(j);
    return rc;
}

/* mkdir -p */
static void make_dirs(const char *path) {
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') *s = 0, mkdir(p, 0755), *s = '/';
    mkdir(p, 0755);
    free(p);
}

static int write_configs(const char *dir, const flux2_shape *s) {
    char *tdir = xasprintf("%s/transformer", dir);
    make_dirs(tdir);
    json_t *cfg = json_pack("{s:i,s:i,s:n,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:[iiii],s:i,s:f,s:b,s:s}", "patch_size", 1,
                            "in_channels", 128, "out_channels", "num_layers", s->layers, "num_single_layers",
                            s->single, "attention_head_dim", 128, "num_attention_heads", s->heads,
                            "joint_attention_dim", s->joint_dim, "timestep_guidance_channels", 256, "mlp_ratio", 3.0,
                            "axes_dims_rope", 32, 32, 32, 32, "rope_theta", 2000, "eps", 1e-6, "guidance_embeds",
                            s->guidance, "_class_name", "Flux2Transformer2DModel");
    char *p = xasprintf("%s/config.json", tdir);
    int rc = write_json(p, cfg);
    free(p);
    p = xasprintf("%s/model_index.json", dir);
    if (!rc) rc = write_json(p, json_pack("{s:s,s:[ss]}", "_class_name", s->guidance ? "Flux2Pipeline" : "Flux2KleinPipeline",
                                          "transformer", "diffusers", "Flux2Transformer2DModel"));
    free(p), free(tdir);
    return rc;
}

/* --gguf TYPE (with --sparse): the transformer as one GGUF file of holes in
 * the ComfyUI-GGUF layout's choice of types: 1-D tensors and tensors of at
 * most 1024 values F32, 2-D weights whose rows are whole blocks TYPE, others
 * F16 (diffusers names; config.json alongside). */
static int g_make_gguf = -1;
static int write_gguf(const char *dir, const inventory *v) {
    gguf_write_tensor *t = xcalloc((size_t)v->n, sizeof *t);
    const quant_type *qt = quant_type_get(g_make_gguf);
    for (int i = 0; i < v->n; i++) {
        const st_write_tensor *s = &v->t[i];
        int64_t rows = s->ndim == 2 ? s->shape[0] : 1, cols = s->ndim == 2 ? s->shape[1] : s->shape[0];
        int type = s->ndim == 1 || rows * cols <= 1024 ? QUANT_F32 : cols % qt->block == 0 ? g_make_gguf : QUANT_F16;
        t[i] = (gguf_write_tensor){.name = s->name, .type = type, .ndim = s->ndim, .ne = {cols, rows, 1, 1}};
        if (s->ndim == 1) t[i].ne[1] = 1;
    }
    gguf_kv kv = {"general.architecture", {.type = GGUF_STRING, .str = {4, "flux"}}};
    char *path = xasprintf("%s/transformer/diffusion_pytorch_model.gguf", dir);
    int rc = gguf_write(path, &kv, 1, t, v->n, NULL, NULL);
    free(path), free(t);
    return rc;
}

/* Write DIR (model_index.json, transformer/config.json and the weights:
 * one file, or `shards` files + index with tensors dealt out shuffled). */
int flux2_make_checkpoint(const char *dir, const char *shape, int sparse, int shards, unsigned seed) {
    const flux2_shape *s = NULL;
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        if (!strcmp(shape, k_shapes[i].name)) s = &k_shapes[i];
    if (!s) return tp_error("unknown --shape '%s' (dev, klein-4b, klein-9b, small)", shape);
    if (shards < 1) shards = 1;
    if (write_configs(dir, s)) return -1;
    inventory v;
    build_inventory(s, &v);
    if (g_make_fp8) make_fp8(&v);
    if (g_make_gguf >= 0) {
        int rc = sparse && !g_make_fp8 && shards == 1 ? write_gguf(dir, &v)
                 : tp_error("bench load --make: --gguf TYPE writes one sparse file (--sparse, no --fp8 or --shards)");
        free_inventory(&v);
        return rc;
    }
    /* a fixed shuffle so shards mix tensors as real checkpoints do */
    for (int i = v.n - 1; i > 0; i--) {
        int j = (int)((seed * 2654435761u + (unsigned)i * 40503u) % (unsigned)(i + 1));
        st_write_tensor t = v.t[i];
        v.t[i] = v.t[j], v.t[j] = t;
    }
    json_t *wm = json_object();
    uint64_t total = 0;
    for (int i = 0; i < v.n; i++)
        total += dtype_size(v.t[i].dtype) * (uint64_t)v.t[i].shape[0] * (uint64_t)(v.t[i].ndim == 2 ? v.t[i].shape[1] : 1);
    int rc = 0, per = (v.n + shards - 1) / shards;
    for (int f = 0; f < shards && !rc; f++) {
        int lo = f * per, hi = lo + per < v.n ? lo + per : v.n;
        char *fname = shards == 1 ? xstrdup("diffusion_pytorch_model.safetensors")
                                  : xasprintf("diffusion_pytorch_model-%05d-of-%05d.safetensors", f + 1, shards);
        char *path = xasprintf("%s/transformer/%s", dir, fname);
        const char *meta[] = {"format", "pt", NULL};
        fill_ctx fc = {seed, v.t + lo};
        rc = st_write_stream(path, v.t + lo, hi - lo, meta, sparse ? fill_sparse : fill_random, &fc);
        for (int i = lo; i < hi; i++) json_object_set_new(wm, v.t[i].name, json_string(fname));
        free(path), free(fname);
    }
    if (!rc && shards > 1) {
        char *p = xasprintf("%s/transformer/diffusion_pytorch_model.safetensors.index.json", dir);
        rc = write_json(p, json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm));
        free(p);
    } else {
        json_decref(wm);
    }
    free_inventory(&v);
    return rc;
}

/* ---- the benchmark ---- */

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) v = atol(line + n + 1);
    if (f) fclose(f);
    return v;
}

/* Fraction of the checkpoint's pages already in the page cache: says
 * whether a measurement was a cold or a warm read. */
static double cached_fraction(const checkpoint *c) {
    double in = 0, all = 0;
    long pg = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < c->n_files; i++) {
        const st_file *f = c->files[i];
        size_t np = (f->file_size + (size_t)pg - 1) / (size_t)pg;
        void *m = np ? mmap(NULL, f->file_size, PROT_READ, MAP_SHARED, f->fd, 0) : MAP_FAILED;
        if (m == MAP_FAILED) continue;
        unsigned char *vec = xmalloc(np);
        if (mincore(m, f->file_size, vec) == 0)
            for (size_t k = 0; k < np; k++) in += vec[k] & 1;
        all += (double)np;
        free(vec);
        munmap(m, f->file_size);
    }
    return all > 0 ? in / all : 0;
}

/* Ask the kernel to drop this checkpoint's clean pages from the page cache
 * (only these files; dropping the whole cache needs root and is not done),
 * so that the next load reads from the disk. */
static void evict(const checkpoint *c) {
    for (int i = 0; i < c->n_files; i++) posix_fadvise(c->files[i]->fd, 0, 0, POSIX_FADV_DONTNEED);
}

/* The baseline: read each whole tensor into host memory, then copy out
 * this rank's slice (what a loader does without byte ranges). */
static int load_naive(const checkpoint *c, const plan *p, const load_opts *o, weights **w_out, load_stats *st,
                      tensor ***tensors) {
    memset(st, 0, sizeof *st);
    *w_out = NULL;
    double t0 = MPI_Wtime();
    if (checkpoint_validate_plan(c, p, o->tp)) return -1;
    tensor **ts = xcalloc((size_t)c->n, sizeof *ts);
    for (int k = 0; k < c->n; k++) {
        const st_file *f;
        const st_tensor_info *ti = checkpoint_find(c, c->infos[k]->name, &f);
        size_t sz = dtype_size(ti->dtype), nb = (size_t)(ti->end - ti->begin);
        shard_info si;
        if (plan_shard(p, st_plan_tensor(ti), o->tp, &si)) return -1;
        char *full = xmalloc(nb ? nb : 1);
        if (st_read_raw(f, ti, full)) { free(full); return -1; }
        st->bytes_read += nb;
        ts[k] = tensor_new(o->be, ti->dtype, si.local_rows, si.local_cols);
        if (!ts[k]) { free(full); return -1; }
        shard_piece pc[PLAN_MAX_PIECES];
        int np = plan_shard_pieces(&si, o->tp, o->rank, pc);
        for (int j = 0; j < np; j++)
            for (int64_t r = 0; r < pc[j].height; r++)
                memcpy((char *)ts[k]->data + (size_t)(pc[j].dst_off + r * pc[j].dst_pitch) * sz,
                       full + (size_t)(pc[j].src_off + r * pc[j].src_pitch) * sz, (size_t)pc[j].width * sz);
        st->bytes_held += tensor_nbytes(ts[k]);
        free(full);
    }
    st->n_tensors = c->n;
    st->seconds = MPI_Wtime() - t0;
    *tensors = ts;
    return 0;
}

typedef struct bench_row {
    double seconds, cpu_seconds, cached;
    double bytes_read, bytes_held, rss_before_kb, peak_rss_kb;
    double lora_bytes, lora_piece;   /* --lora: adapter bytes read, largest piece (f32) */
} bench_row;

int lora_make_random(const char *transformer_dir, const char *out, int rank, int lokr_factor, unsigned seed);   /* bench_lora.c */

static void print_rows(const bench_row *rows, int n, const char *mode, int threads, const char *dir, int json) {
    if (json) {
        json_t *a = json_array();
        for (int r = 0; r < n; r++)
            json_array_append_new(a, json_pack("{s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "rank", r, "seconds", rows[r].seconds,
                                               "cpu_seconds", rows[r].cpu_seconds,
                                               "bytes_read", rows[r].bytes_read, "weight_bytes", rows[r].bytes_held,
                                               "peak_rss_bytes", rows[r].peak_rss_kb * 1024, "rss_before_bytes",
                                               rows[r].rss_before_kb * 1024, "page_cache_fraction", rows[r].cached));
        json_t *o = json_pack("{s:s,s:s,s:i,s:i,s:o}", "mode", mode, "model", dir, "tp", n, "threads", threads, "ranks", a);
        char *s = json_dumps(o, JSON_INDENT(1));
        printf("%s\n", s);
        free(s);
        json_decref(o);
        return;
    }
    printf("load %s, tp %d, %s, %d reader thread(s) per rank (page cache held %.0f%% of the checkpoint before the load)\n",
           dir, n, mode, threads, rows[0].cached * 100);
    if (rows[0].lora_bytes > 0) {   /* with an adapter the target is weights + largest adapter piece + 64 MB */
        printf("%4s %9s %9s %12s %12s %14s %12s %12s %6s\n", "rank", "seconds", "cpu s", "read GB", "LoRA MB",
               "LoRA piece MB", "weights GB", "peak RSS GB", "ok");
        for (int r = 0; r < n; r++) {
            double target = rows[r].bytes_held + rows[r].lora_piece + 64e6;
            printf("%4d %9.3f %9.3f %12.3f %12.2f %14.2f %12.3f %12.3f %6s\n", r, rows[r].seconds, rows[r].cpu_seconds,
                   rows[r].bytes_read / 1e9, rows[r].lora_bytes / 1e6, rows[r].lora_piece / 1e6,
                   rows[r].bytes_held / 1e9, rows[r].peak_rss_kb * 1024 / 1e9,
                   rows[r].peak_rss_kb * 1024 <= target ? "yes" : "NO");
        }
        return;
    }
    printf("%4s %9s %9s %12s %9s %12s %12s %12s %6s\n", "rank", "seconds", "cpu s", "read GB", "GB/s", "weights GB",
           "peak RSS GB", "target GB", "ok");
    for (int r = 0; r < n; r++) {
        double target = rows[r].bytes_held * 1.05 + 64e6;
        printf("%4d %9.3f %9.3f %12.3f %9.2f %12.3f %12.3f %12.3f %6s\n", r, rows[r].seconds, rows[r].cpu_seconds,
               rows[r].bytes_read / 1e9,
               rows[r].bytes_read / 1e9 / rows[r].seconds, rows[r].bytes_held / 1e9, rows[r].peak_rss_kb * 1024 / 1e9,
               target / 1e9, rows[r].peak_rss_kb * 1024 <= target ? "yes" : "NO");
    }
}

static int bench_usage(void) {
    printf("usage: tpgen bench load --make DIR --shape dev|klein-4b|klein-9b|small [--sparse] [--fp8] [--shards N] [--seed S]\n"
           "       tpgen bench load --make DIR --shape S --sparse --gguf Q4_K   (one sparse GGUF transformer file)\n"
           "       mpirun -np N tpgen bench load --model DIR [--mode sharded|mmap|naive] [--cold] [--threads T] [--json]\n\n"
           "--make writes a FLUX.2-shaped BF16 checkpoint (random data, or holes with --sparse); --fp8: its sharded\n"
           "linears F8_E4M3 with per-output-channel F32 weight_scale tensors, as mixed fp8 files are.\n"
           "--model loads DIR/transformer at tp = number of ranks; every rank reports its load time,\n"
           "bytes read, weight bytes and peak RSS. One mode per run (peak RSS is per process).\n"
           "--cold first evicts the checkpoint's pages from the page cache (posix_fadvise DONTNEED).\n"
           "--threads T reads with T threads per rank (load_opts.io_threads, default %d; sharded and mmap modes).\n"
           "--lora FILE[:W] merges a LoRA adapter into each rank's shard during the load (sharded/mmap modes);\n"
           "--make-lora FILE --rank R --model DIR writes a random rank-R PEFT adapter on every block Linear;\n"
           "with --lokr-factor F a LyCORIS LoKr instead (lokr_w1 [F, F], lokr_w2 [out/F, in/F], both full).\n",
           WEIGHTS_IO_THREADS);
    return 0;
}

static int run_load(dist *d, const char *dir, const char *mode, int json, int cold, int threads, const char *lora) {
    char *tdir = xasprintf("%s/transformer", dir);
    model_dir *m = NULL;
    checkpoint *c = NULL;
    json_t *cfg = NULL;
    plan p;
    int rc = model_dir_open(dir, &m);
    if (!rc) rc = (cfg = model_dir_config(m, "transformer")) ? 0 : -1;
    if (!rc) rc = plan_flux2(cfg, &p);
    if (!rc) rc = checkpoint_open(tdir, &c);
    bench_row row = {0};
    if (!rc && cold && d->world_rank == 0) evict(c);
    MPI_Barrier(d->world);
    if (!rc) row.cached = cached_fraction(c);
    backend *be = backend_cpu_create(1);
    load_opts o = {.tp = d->world_size, .rank = d->world_rank, .be = be, .dtype = DT_BF16,
                   .use_mmap = !strcmp(mode, "mmap"), .io_threads = threads};
    load_stats st = {0};
    weights *w = NULL;
    tensor **naive = NULL;
    lora_spec ls_spec = {0};
    lora_set *ls = NULL;
    MPI_Barrier(d->world);
    row.rss_before_kb = (double)status_kb("VmRSS");
    double cpu0 = cpu_seconds(), t_lora = MPI_Wtime();
    if (!rc && lora && strcmp(mode, "naive")) {
        rc = lora_spec_parse(lora, &ls_spec) || lora_set_open(&ls_spec, 1, c, d->world_rank == 0, &ls);
        o.transform = lora_merge_shard, o.transform_ctx = ls;
    } else if (!rc && lora) rc = tp_error("--lora needs --mode sharded or mmap");
    t_lora = MPI_Wtime() - t_lora;
    if (!rc) rc = !strcmp(mode, "naive") ? load_naive(c, &p, &o, &w, &st, &naive) : weights_load(c, &p, &o, &w, &st);
    row.peak_rss_kb = (double)status_kb("VmHWM");
    row.cpu_seconds = cpu_seconds() - cpu0;
    row.seconds = st.seconds + t_lora, row.bytes_read = (double)st.bytes_read, row.bytes_held = (double)st.bytes_held;
    if (ls) row.lora_bytes = (double)(ls->ad[0].bytes_read + ls->ad[0].bytes_alpha), row.lora_piece = (double)ls->max_piece;
    lora_set_free(ls);
    lora_specs_free(&ls_spec, 1);
    rc = dist_agree(d->world, rc);
    if (!rc) {
        bench_row *rows = d->world_rank == 0 ? xcalloc((size_t)d->world_size, sizeof *rows) : NULL;
        MPI_Gather(&row, sizeof row, MPI_BYTE, rows, sizeof row, MPI_BYTE, 0, d->world);
        if (d->world_rank == 0) print_rows(rows, d->world_size, mode, threads, dir, json);
        free(rows);
    } else {
        dist_report_error(d->world);
    }
    for (int k = 0; naive && c && k < c->n; k++) tensor_free(naive[k]);
    free(naive);
    weights_free(w);
    backend_destroy(be);
    checkpoint_close(c);
    json_decref(cfg);
    model_dir_close(m);
    free(tdir);
    return rc ? 1 : 0;
}

int bench_load(int argc, char **argv) {
    const char *make = NULL, *shape = "klein-4b", *model = NULL, *mode = "sharded", *lora = NULL, *make_lora = NULL;
    int lora_rank = 64, lokr_factor = 0;
    int sparse = 0, shards = 1, json = 0, cold = 0, threads = WEIGHTS_IO_THREADS;
    unsigned seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return bench_usage();
        else if (!strcmp(a, "--sparse")) sparse = 1;
        else if (!strcmp(a, "--fp8")) g_make_fp8 = 1;
        else if (v && !strcmp(a, "--gguf")) {
            for (int id = 0; id < 64 && g_make_gguf < 0; id++)
                if (quant_supported(id) && quant_type_get(id)->block > 1 && !strcmp(v, quant_type_name(id))) g_make_gguf = id;
            if (g_make_gguf < 0) { fprintf(stderr, "tpgen: error: --gguf takes a block type (%s)\n", quant_supported_list()); return 2; }
            i++;
        }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--cold")) cold = 1;
        else if (v && !strcmp(a, "--make")) make = v, i++;
        else if (v && !strcmp(a, "--shape")) shape = v, i++;
        else if (v && !strcmp(a, "--model")) model = v, i++;
        else if (v && !strcmp(a, "--mode")) mode = v, i++;
        else if (v && !strcmp(a, "--lora")) lora = v, i++;
        else if (v && !strcmp(a, "--make-lora")) make_lora = v, i++;
        else if (v && !strcmp(a, "--rank")) lora_rank = atoi(v), i++;
        else if (v && !strcmp(a, "--lokr-factor")) lokr_factor = atoi(v), i++;
        else if (v && !strcmp(a, "--shards")) shards = atoi(v), i++;
        else if (v && !strcmp(a, "--threads")) threads = atoi(v), i++;
        else if (v && !strcmp(a, "--seed")) seed = (unsigned)strtoul(v, NULL, 10), i++;
        else { fprintf(stderr, "tpgen: error: bench load: unknown or incomplete option '%s'\n", a); return 2; }
    }
    if (make) {
        if (flux2_make_checkpoint(make, shape, sparse, shards, seed)) {
            fprintf(stderr, "tpgen: error: %s\n", tp_error_msg());
            return 1;
        }
        printf("wrote %s (%s%s)\n", make, shape, sparse ? ", sparse" : "");
        return 0;
    }
    if (!model) { bench_usage(); return 2; }
    if (make_lora) {
        char *tdir = xasprintf("%s/transformer", model);
        int rc = lora_make_random(tdir, make_lora, lora_rank, lokr_factor, seed);
        free(tdir);
        if (rc) { fprintf(stderr, "tpgen: error: %s\n", tp_error_msg()); return 1; }
        if (lokr_factor > 0) printf("wrote %s (LoKr, factor %d, both factors full, on every block Linear of %s)\n",
                                    make_lora, lokr_factor, model);
        else printf("wrote %s (rank %d on every block Linear of %s)\n", make_lora, lora_rank, model);
        return 0;
    }
    if (strcmp(mode, "sharded") && strcmp(mode, "mmap") && strcmp(mode, "naive")) {
        fprintf(stderr, "tpgen: error: --mode must be sharded, mmap or naive\n");
        return 2;
    }
    dist d;
    if (dist_init(&argc, &argv, &d)) { fprintf(stderr, "tpgen: error: %s\n", tp_error_msg()); return 1; }
    int rc = run_load(&d, model, mode, json, cold, threads, lora);
    dist_finalize(&d);
    return rc;
}
