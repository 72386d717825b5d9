/* BFL single-file FLUX.2 checkpoints (docs/spec/flux2-transformer.md Appendix A).
 * The golden diffusers checkpoint flux2-tiny-a is converted here to the BFL
 * layout (one file, BFL names, fused double-block qkv, swapped final-layer
 * halves) with the spec's table written out independently of the loader;
 * then the BFL load must match the diffusers load: derived config, golden
 * outputs, bytes each rank reads, and the local Q/K/V and norm_out bits.
 *
 * bfl_write_golden_as_bfl also serves tests/sh/bfl.sh: with TPGEN_BFL_OUT
 * set it writes the converted folder there (for `tpgen check`), leaving out
 * the tensor named by TPGEN_BFL_SKIP when that is set. */
#include "core/models/model_plan.h"
#include "test.h"
#include "core/formats/checkpoint.h"
#include "kernels/comm.h"
#include "kernels/err.h"
#include "core/models/flux2/flux2.h"
#include "core/models/flux2/flux2_impl.h"
#include "core/models/flux2/flux2_bfl_names.h"
#include "core/formats/safetensors.h"
#include "kernels/ops.h"
#include "plans/plan.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define BFL_FILE "flux2-tiny-bfl.safetensors"

/* One BFL tensor: the diffusers tensor(s) it is made of ("%d" = block).
 * Three sources are stacked along dim 0 (fused qkv); swap exchanges the two
 * row halves (final layer: BFL shift, scale vs diffusers scale, shift). */
typedef struct bfl_map {
    int scope;                 /* 0 top level, 1 per double block, 2 per single block */
    const char *bfl, *src[3];
    int swap;
} bfl_map;

static const bfl_map k_map[] = {
    {0, "img_in.weight", {"x_embedder.weight"}, 0},
    {0, "txt_in.weight", {"context_embedder.weight"}, 0},
    {0, "time_in.in_layer.weight", {"time_guidance_embed.timestep_embedder.linear_1.weight"}, 0},
    {0, "time_in.out_layer.weight", {"time_guidance_embed.timestep_embedder.linear_2.weight"}, 0},
    {0, "guidance_in.in_layer.weight", {"time_guidance_embed.guidance_embedder.linear_1.weight"}, 0},
    {0, "guidance_in.out_layer.weight", {"time_guidance_embed.guidance_embedder.linear_2.weight"}, 0},
    {0, "double_stream_modulation_img.lin.weight", {"double_stream_modulation_img.linear.weight"}, 0},
    {0, "double_stream_modulation_txt.lin.weight", {"double_stream_modulation_txt.linear.weight"}, 0},
    {0, "single_stream_modulation.lin.weight", {"single_stream_modulation.linear.weight"}, 0},
    {0, "final_layer.linear.weight", {"proj_out.weight"}, 0},
    {0, "final_layer.adaLN_modulation.1.weight", {"norm_out.linear.weight"}, 1},
    {1, "double_blocks.%d.img_attn.qkv.weight",
     {"transformer_blocks.%d.attn.to_q.weight", "transformer_blocks.%d.attn.to_k.weight",
      "transformer_blocks.%d.attn.to_v.weight"}, 0},
    {1, "double_blocks.%d.txt_attn.qkv.weight",
     {"transformer_blocks.%d.attn.add_q_proj.weight", "transformer_blocks.%d.attn.add_k_proj.weight",
      "transformer_blocks.%d.attn.add_v_proj.weight"}, 0},
    {1, "double_blocks.%d.img_attn.norm.query_norm.scale", {"transformer_blocks.%d.attn.norm_q.weight"}, 0},
    {1, "double_blocks.%d.img_attn.norm.key_norm.scale", {"transformer_blocks.%d.attn.norm_k.weight"}, 0},
    {1, "double_blocks.%d.txt_attn.norm.query_norm.scale", {"transformer_blocks.%d.attn.norm_added_q.weight"}, 0},
    {1, "double_blocks.%d.txt_attn.norm.key_norm.scale", {"transformer_blocks.%d.attn.norm_added_k.weight"}, 0},
    {1, "double_blocks.%d.img_attn.proj.weight", {"transformer_blocks.%d.attn.to_out.0.weight"}, 0},
    {1, "double_blocks.%d.txt_attn.proj.weight", {"transformer_blocks.%d.attn.to_add_out.weight"}, 0},
    {1, "double_blocks.%d.img_mlp.0.weight", {"transformer_blocks.%d.ff.linear_in.weight"}, 0},
    {1, "double_blocks.%d.img_mlp.2.weight", {"transformer_blocks.%d.ff.linear_out.weight"}, 0},
    {1, "double_blocks.%d.txt_mlp.0.weight", {"transformer_blocks.%d.ff_context.linear_in.weight"}, 0},
    {1, "double_blocks.%d.txt_mlp.2.weight", {"transformer_blocks.%d.ff_context.linear_out.weight"}, 0},
    {2, "single_blocks.%d.linear1.weight", {"single_transformer_blocks.%d.attn.to_qkv_mlp_proj.weight"}, 0},
    {2, "single_blocks.%d.linear2.weight", {"single_transformer_blocks.%d.attn.to_out.weight"}, 0},
    {2, "single_blocks.%d.norm.query_norm.scale", {"single_transformer_blocks.%d.attn.norm_q.weight"}, 0},
    {2, "single_blocks.%d.norm.key_norm.scale", {"single_transformer_blocks.%d.attn.norm_k.weight"}, 0},
};
#define N_MAP ((int)(sizeof k_map / sizeof k_map[0]))

static char *golden_transformer(void) { return xasprintf("%s/flux2-tiny-a/model/transformer", test_golden_dir()); }

/* Build one BFL tensor from the diffusers checkpoint: names, shape, bytes. */
static int convert_one(const checkpoint *c, const bfl_map *e, int blk, st_write_tensor *out) {
    char name[160];
    snprintf(name, sizeof name, e->bfl, blk);
    const st_tensor_info *src[3] = {0};
    const st_file *f[3];
    int n = 0;
    size_t bytes = 0;
    for (; n < 3 && e->src[n]; n++) {
        char s[160];
        snprintf(s, sizeof s, e->src[n], blk);
        if (!(src[n] = checkpoint_find(c, s, &f[n]))) return tp_error("diffusers tensor %s missing", s);
        bytes += src[n]->end - src[n]->begin;
    }
    uint8_t *data = xmalloc(bytes);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (st_read_raw(f[i], src[i], data + off)) return free(data), -1;
        off += src[i]->end - src[i]->begin;
    }
    if (e->swap) {   /* exchange the two row halves */
        uint8_t *tmp = xmalloc(bytes / 2);
        memcpy(tmp, data, bytes / 2);
        memmove(data, data + bytes / 2, bytes / 2);
        memcpy(data + bytes / 2, tmp, bytes / 2);
        free(tmp);
    }
    *out = (st_write_tensor){.name = xstrdup(name), .dtype = src[0]->dtype, .ndim = src[0]->ndim, .data = data};
    memcpy(out->shape, src[0]->shape, sizeof out->shape);
    out->shape[0] *= n;
    return 0;
}

/* Write <dir>/BFL_FILE from the golden diffusers transformer, leaving out
 * the tensor named `skip` (NULL: none). Returns the number written or -1. */
int write_bfl(const char *dir, const char *skip);   /* also used by tests/test_fp8.c */
int write_bfl(const char *dir, const char *skip) {
    /* TPGEN_BFL_SRC: another diffusers transformer folder (tests/sh/components.sh converts klein-tiny's) */
    const char *env_src = getenv("TPGEN_BFL_SRC");
    char *src = env_src && *env_src ? xstrdup(env_src) : golden_transformer();
    checkpoint *c = NULL;
    char *cfgp = xasprintf("%s/config.json", src);
    json_t *cfg = json_load_file(cfgp, 0, NULL);
    free(cfgp);
    int rc = cfg ? checkpoint_open(src, &c) : tp_error("%s/config.json missing", src);
    free(src);
    int counts[3] = {1, (int)json_integer_value(json_object_get(cfg, "num_layers")),
                     (int)json_integer_value(json_object_get(cfg, "num_single_layers"))};   /* flux2-tiny-a: 2, 3 */
    int guidance = json_is_true(json_object_get(cfg, "guidance_embeds"));
    json_decref(cfg);
    if (rc) return -1;
    int n = 0, cap = 64;
    st_write_tensor *t = xcalloc((size_t)cap, sizeof *t);
    for (int i = 0; i < N_MAP && !rc; i++)
        for (int blk = 0; blk < counts[k_map[i].scope] && !rc; blk++) {
            if (!guidance && !strncmp(k_map[i].bfl, "guidance_in.", 12)) continue;
            if (n == cap) t = xrealloc(t, (size_t)(cap *= 2) * sizeof *t);
            rc = convert_one(c, &k_map[i], blk, &t[n]);
            if (!rc && skip && !strcmp(t[n].name, skip)) {
                free((void *)t[n].name), free((void *)t[n].data);
                continue;
            }
            if (!rc) n++;
        }
    checkpoint_close(c);
    mkdir(dir, 0755);
    char *path = xasprintf("%s/%s", dir, BFL_FILE);
    if (!rc) rc = st_write(path, t, n, NULL);
    free(path);
    for (int i = 0; i < n; i++) free((void *)t[i].name), free((void *)t[i].data);
    free(t);
    return rc ? -1 : n;
}

static json_t *golden_config(void) {
    char *src = golden_transformer(), *p = xasprintf("%s/config.json", src);
    json_t *j = json_load_file(p, 0, NULL);
    free(src), free(p);
    return j;
}

/* The converted file (and, with TPGEN_BFL_OUT, the folder for bfl.sh):
 * every diffusers tensor used once, 12 per double block, 4 per single. */
TEST(bfl_write_golden_as_bfl) {
    const char *env = getenv("TPGEN_BFL_OUT"), *skip = getenv("TPGEN_BFL_SKIP");   /* skip: a tensor to leave out */
    char *dir = env ? xstrdup(env) : xasprintf("%s/bfl", test_tmp_dir());
    int n = write_bfl(dir, skip && *skip ? skip : NULL);
    const char *src = getenv("TPGEN_BFL_SRC");
    if (src && *src) CHECK(n > 0, "converting %s: %s", src, tp_error_msg());   /* counts: checked by the loader */
    else CHECK(n == 11 + 12 * 2 + 4 * 3 - (skip && *skip), "wrote %d tensors: %s", n, tp_error_msg());
    free(dir);
}

/* core/models/flux2/flux2_bfl_names.c (`tpgen quantize --names bfl`) gives the
 * converter's tensors: the same names (sorted), shapes and source rows. */
TEST(bfl_names_library_matches_converter) {
    char *dir = xasprintf("%s/bfl-names", test_tmp_dir()), *src = golden_transformer();
    REQUIRE(write_bfl(dir, NULL) > 0, "convert: %s", tp_error_msg());
    checkpoint *c = NULL, *dc = NULL;
    REQUIRE(checkpoint_open(dir, &c) == 0 && checkpoint_open(src, &dc) == 0, "%s", tp_error_msg());
    CHECK(flux2_bfl_is_diffusers(dc) && !flux2_bfl_is_diffusers(c), "diffusers detection");
    flux2_bfl_tensor *t = NULL;
    int n = 0;
    REQUIRE(flux2_bfl_names(dc, &t, &n) == 0, "%s", tp_error_msg());
    CHECK(n == c->n, "%d BFL tensors, the converter wrote %d", n, c->n);
    for (int i = 0; i < n && i < c->n; i++) {
        const st_tensor_info *e = c->infos[i];
        int64_t rows = 0;
        for (int j = 0; j < t[i].n_src; j++) rows += dc->infos[t[i].src[j]]->shape[0];
        CHECK(!strcmp(t[i].name, e->name) && t[i].ndim == e->ndim &&
                  !memcmp(t[i].shape, e->shape, (size_t)e->ndim * sizeof *e->shape) && rows == e->shape[0] &&
                  t[i].swap == !strcmp(e->name, "final_layer.adaLN_modulation.1.weight"),
              "tensor %d: %s [%lld] vs the converter's %s [%lld]", i, t[i].name, (long long)t[i].shape[0], e->name,
              (long long)e->shape[0]);
    }
    flux2_bfl_names_free(t, n);
    CHECK(flux2_bfl_names(c, &t, &n) == -1 && strstr(tp_error_msg(), "not a diffusers FLUX.2 transformer"),
          "BFL input: %s", tp_error_msg());
    checkpoint_close(c), checkpoint_close(dc);
    free(src), free(dir);
}

/* The config derived from the BFL shapes equals the golden config.json. */
TEST(bfl_config_derived_from_shapes) {
    char *dir = xasprintf("%s/bfl-cfg", test_tmp_dir());
    REQUIRE(write_bfl(dir, NULL) > 0, "convert: %s", tp_error_msg());
    checkpoint *c = NULL, *dc = NULL;
    char *src = golden_transformer();
    REQUIRE(checkpoint_open(dir, &c) == 0 && checkpoint_open(src, &dc) == 0, "%s", tp_error_msg());
    CHECK(checkpoint_is_bfl(c) && !checkpoint_is_bfl(dc), "BFL detection");
    CHECK(flux2_checkpoint_is_diffusers(dc) && !flux2_checkpoint_is_diffusers(c), "diffusers-name detection");
    json_t *derived = flux2_config_from_bfl(c), *golden = golden_config();
    /* the diffusers-named golden file derives the same config from its own names */
    json_t *derived_d = flux2_config_from_diffusers(dc);
    flux2_config a, b, d;
    REQUIRE(derived && golden && derived_d, "derive: %s", tp_error_msg());
    REQUIRE(flux2_config_parse(derived, "derived", &a) == 0 && flux2_config_parse(golden, "golden", &b) == 0 &&
                flux2_config_parse(derived_d, "derived (diffusers)", &d) == 0,
            "%s", tp_error_msg());
    const flux2_config *both[2] = {&a, &d};
    for (int k = 0; k < 2; k++) {
        const flux2_config *x = both[k];
        CHECK(x->patch_size == b.patch_size && x->in_channels == b.in_channels && x->out_channels == b.out_channels &&
                  x->num_layers == b.num_layers && x->num_single_layers == b.num_single_layers &&
                  x->head_dim == b.head_dim && x->heads == b.heads && x->joint_dim == b.joint_dim &&
                  x->time_channels == b.time_channels && x->mlp_ratio == b.mlp_ratio && x->n_axes == b.n_axes &&
                  !memcmp(x->axes_dims, b.axes_dims, sizeof x->axes_dims) && x->rope_theta == b.rope_theta &&
                  x->eps == b.eps && x->guidance_embeds == b.guidance_embeds && x->D == b.D && x->M == b.M,
              "%s config differs from config.json: %s", k ? "diffusers-derived" : "BFL-derived",
              json_dumps(k ? derived_d : derived, JSON_COMPACT));
    }
    json_decref(derived_d);
    /* the BFL plan is the diffusers plan's split: qkv packed [D, D, D] */
    component_plan cp;
    REQUIRE(plan_for_component("transformer", derived, c, 4, &cp) == 0 && checkpoint_validate_plan(c, &cp.p, 4) == 0, "%s",
            tp_error_msg());
    shard_info si;
    const st_tensor_info *qkv = checkpoint_find(c, "double_blocks.1.txt_attn.qkv.weight", NULL);
    REQUIRE(qkv && plan_shard(&cp.p, st_plan_tensor(qkv), 4, &si) == 0, "%s", tp_error_msg());
    CHECK(si.style == STYLE_PACKED_COLWISE && si.n_blocks == 3 && si.blocks[0] == a.D && si.local_rows == 3 * a.D / 4,
          "qkv shard: %s, %d blocks, local rows %lld", shard_style_name(si.style), si.n_blocks,
          (long long)si.local_rows);
    component_plan_free(&cp);
    json_decref(derived), json_decref(golden);
    checkpoint_close(c), checkpoint_close(dc);
    free(src), free(dir);
}

/* ---- the BFL load against the diffusers load, at tp = np ---- */

static int all_ok(int ok) {
    int r;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

/* A folder every rank sees: rank 0's temporary folder, broadcast. */
static char *shared_dir(const char *tag) {
    char buf[512] = {0};
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) snprintf(buf, sizeof buf, "%s/%s", test_tmp_dir(), tag);
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    return xstrdup(buf);
}

static int same_bits(const tensor *a, const tensor *b) {
    if (a->rows != b->rows || a->cols != b->cols || a->dtype != b->dtype) return 0;
    size_t n = tensor_nbytes(a);
    void *x = xmalloc(n), *y = xmalloc(n);
    int ok = tensor_download_raw(a, x) == 0 && tensor_download_raw(b, y) == 0 && !memcmp(x, y, n);
    free(x), free(y);
    return ok;
}

/* Bytes of the file's tensors that a plan shards (at tp 1: all of them). */
static uint64_t sharded_bytes(const checkpoint *c, const plan *p) {
    uint64_t s = 0;
    for (int i = 0; i < c->n; i++) {
        shard_info si;
        if (plan_shard(p, st_plan_tensor(c->infos[i]), 1, &si) == 0 && si.style != STYLE_REPLICATED)
            s += c->infos[i]->end - c->infos[i]->begin;
    }
    return s;
}

static void check_bytes(const char *dir, const load_stats *ls, int tp) {
    checkpoint *c = NULL;
    json_t *cfg = golden_config();
    plan p;
    REQUIRE(checkpoint_open(dir, &c) == 0 && cfg && plan_flux2_bfl(cfg, &p) == 0, "%s", tp_error_msg());
    uint64_t total = 0, sh = sharded_bytes(c, &p);
    for (int i = 0; i < c->n; i++) total += c->infos[i]->end - c->infos[i]->begin;
    CHECK(ls->bytes_sharded == sh / (uint64_t)tp && ls->bytes_replicated == total - sh &&
              ls->bytes_read == ls->bytes_replicated + ls->bytes_sharded,
          "bytes read %llu = replicated %llu + sharded %llu; expected %llu + %llu/%d",
          (unsigned long long)ls->bytes_read, (unsigned long long)ls->bytes_replicated,
          (unsigned long long)ls->bytes_sharded, (unsigned long long)(total - sh), (unsigned long long)sh, tp);
    checkpoint_close(c);
    json_decref(cfg);
}

static void compare_weights(const flux2_model *bfl, const flux2_model *ref) {
    for (int i = 0; i < ref->cfg.num_layers; i++) {
        const flux2_double_w *a = &bfl->dbl[i], *b = &ref->dbl[i];
        CHECK(same_bits(a->to_q, b->to_q) && same_bits(a->to_k, b->to_k) && same_bits(a->to_v, b->to_v) &&
                  same_bits(a->add_q, b->add_q) && same_bits(a->add_k, b->add_k) && same_bits(a->add_v, b->add_v),
              "block %d: local Q/K/V shard differs from the diffusers layout's", i);
    }
    CHECK(same_bits(bfl->norm_out, ref->norm_out), "norm_out (swapped final-layer halves) differs");
}

static float *run_case(flux2_model *m, const st_file *f, int k, double *err, size_t *n_out) {
    char key[64];
    float *x = NULL, *txt = NULL, *ref = NULL, *t = NULL, *g = NULL, *out = NULL;
    int64_t *ii = NULL, *ti = NULL;
    const st_tensor_info *xi, *tinfo;
#define K(s) (snprintf(key, sizeof key, "case%d.%s", k, s), key)
    int rc = st_read_f32(f, K("hidden_states"), &x, &xi) || st_read_f32(f, K("encoder_hidden_states"), &txt, &tinfo) ||
             st_read_f32(f, K("output"), &ref, NULL) || st_read_f32(f, K("timestep"), &t, NULL) ||
             st_read_f32(f, K("guidance"), &g, NULL) || st_read_i64(f, K("img_ids"), &ii, NULL) ||
             st_read_i64(f, K("txt_ids"), &ti, NULL);
#undef K
    if (!rc) {
        int64_t N = st_numel(xi) / m->cfg.in_channels, L = st_numel(tinfo) / m->cfg.joint_dim;
        int32_t *i32 = xmalloc((size_t)(N + L) * 4 * sizeof *i32);
        for (int64_t i = 0; i < N * 4; i++) i32[i] = (int32_t)ii[i];
        for (int64_t i = 0; i < L * 4; i++) i32[N * 4 + i] = (int32_t)ti[i];
        size_t n = (size_t)(N * m->cfg.out_dim);
        *n_out = n;
        out = xmalloc(n * sizeof *out);
        for (size_t i = 0; i < n; i++) out[i] = NAN;
        rc = flux2_forward(m, x, N, i32, txt, L, i32 + N * 4, t[0], g, out);
        *err = rc ? INFINITY : rel_l2(out, ref, n);
        free(i32);
    }
    free(x), free(txt), free(ref), free(t), free(g), free(ii), free(ti);
    if (rc) free(out), out = NULL;
    return out;
}

TEST_MPI(bfl_load_matches_diffusers_layout) {
    char *dir = shared_dir("bfl-mpi"), *ddir = golden_transformer();
    int rank, np;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    int wrote = rank ? 1 : write_bfl(dir, NULL) > 0;
    CHECK(wrote, "convert: %s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_WORLD, be);
    flux2_model *bm = NULL, *dm = NULL;
    load_stats ls = {0}, dls = {0};
    int ok = all_ok(wrote) && all_ok(flux2_load(dir, be, c, DT_F32, &bm, &ls) == 0);
    CHECK(ok, "BFL load at tp %d: %s", np, tp_error_msg());
    ok = ok && all_ok(flux2_load(ddir, be, c, DT_F32, &dm, &dls) == 0);
    CHECK(ok || !bm, "diffusers load: %s", tp_error_msg());
    st_file *f = NULL;
    char *cases = xasprintf("%s/flux2-tiny-a/transformer_cases.safetensors", test_golden_dir());
    ok = ok && all_ok(st_open(cases, &f) == 0);
    if (ok) {
        check_bytes(dir, &ls, np);
        CHECK(ls.bytes_read == dls.bytes_read && ls.bytes_sharded == dls.bytes_sharded,
              "BFL rank reads %llu bytes, diffusers %llu", (unsigned long long)ls.bytes_read,
              (unsigned long long)dls.bytes_read);
        compare_weights(bm, dm);
        for (int k = 0; k < 3; k++) {
            double eb = 0, ed = 0;
            size_t n = 0;
            float *ob = run_case(bm, f, k, &eb, &n), *od = run_case(dm, f, k, &ed, &n);
            CHECK(ob && od && eb <= 1e-4 && ed <= 1e-4, "case%d tp %d: rel_err BFL %.3g, diffusers %.3g: %s", k, np,
                  eb, ed, tp_error_msg());
            if (ob && od) {
                double d = max_abs_diff(ob, od, n);
                CHECK(d == 0, "case%d tp %d: BFL and diffusers outputs differ by %.3g", k, np, d);
            }
            free(ob), free(od);
        }
    }
    if (f) st_close(f);
    flux2_free(bm), flux2_free(dm);
    comm_destroy(c);
    backend_destroy(be);
    free(cases), free(dir), free(ddir);
}

/* A BFL file missing a tensor: the load fails on every rank naming it. */
TEST(bfl_missing_tensor_named) {
    char *dir = xasprintf("%s/bfl-missing", test_tmp_dir());
    const char *gone = "double_blocks.1.txt_attn.qkv.weight";
    REQUIRE(write_bfl(dir, gone) > 0, "convert: %s", tp_error_msg());
    backend *be = backend_cpu_create(1);
    comm *c = comm_create_mpi(MPI_COMM_SELF, be);
    flux2_model *m = NULL;
    CHECK(flux2_load(dir, be, c, DT_F32, &m, NULL) != 0 && !m && strstr(tp_error_msg(), gone) &&
              strstr(tp_error_msg(), "tensors"),
          "missing %s not named: %s", gone, tp_error_msg());
    /* without img_in the file is not recognised as BFL and has no config */
    char *dir2 = xasprintf("%s/bfl-noimg", test_tmp_dir());
    REQUIRE(write_bfl(dir2, "img_in.weight") > 0, "convert: %s", tp_error_msg());
    CHECK(flux2_load(dir2, be, c, DT_F32, &m, NULL) != 0 && !m && strstr(tp_error_msg(), "config.json"),
          "no config: %s", tp_error_msg());
    comm_destroy(c);
    backend_destroy(be);
    free(dir), free(dir2);
}
