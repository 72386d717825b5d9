/* Host-side pieces of the FLUX.2 transformer: config.json parsing, the
 * timestep sinusoid (§4.2) and the RoPE tables (§4.5). These are tiny next
 * to the GEMMs, so they run on the host in exactly the precision the
 * reference uses and are uploaded. */
#include "flux2.h"
#include "core/models/config_json.h"
#include "kernels/err.h"
#include "core/formats/checkpoint.h"
#include <stdio.h>
#include <math.h>
#include <string.h>

/* The largest value any field may take: far above every FLUX.2 model
 * (dev: 48 heads of 128, 8 + 48 layers, joint dim 15360) and low enough that
 * every product formed from them (D = heads * head_dim, M = D * mlp_ratio,
 * the weight sizes) fits an int64 comfortably. */
#define FLUX2_MAX_FIELD (1 << 20)
#define FLUX2_MAX_LAYERS 4096
#define FLUX2_MAX_D (1 << 20)
#define FLUX2_MAX_MLP_RATIO 64.0

/* Defaults are those of the diffusers class (the FLUX.2-dev values). */
int flux2_config_parse(const json_t *cfg, const char *where, flux2_config *c) {
    memset(c, 0, sizeof *c);
    if (!json_is_object(cfg)) return tp_error("%s: config is not a JSON object", where);
    double eps = 1e-6;
    if (cfg_int(cfg, "patch_size", 1, FLUX2_MAX_FIELD, where, &c->patch_size) ||
        cfg_int(cfg, "in_channels", 128, FLUX2_MAX_FIELD, where, &c->in_channels) ||
        cfg_int(cfg, "out_channels", c->in_channels, FLUX2_MAX_FIELD, where, &c->out_channels) ||
        cfg_int(cfg, "num_layers", 8, FLUX2_MAX_LAYERS, where, &c->num_layers) ||
        cfg_int(cfg, "num_single_layers", 48, FLUX2_MAX_LAYERS, where, &c->num_single_layers) ||
        cfg_int(cfg, "attention_head_dim", 128, FLUX2_MAX_FIELD, where, &c->head_dim) ||
        cfg_int(cfg, "num_attention_heads", 48, FLUX2_MAX_FIELD, where, &c->heads) ||
        cfg_int(cfg, "joint_attention_dim", 15360, FLUX2_MAX_FIELD, where, &c->joint_dim) ||
        cfg_int(cfg, "timestep_guidance_channels", 256, FLUX2_MAX_FIELD, where, &c->time_channels) ||
        cfg_num(cfg, "mlp_ratio", 3.0, where, &c->mlp_ratio) ||
        cfg_num(cfg, "rope_theta", 2000, where, &c->rope_theta) ||
        cfg_num(cfg, "eps", 1e-6, where, &eps) ||
        cfg_rope_axes(cfg, where, FLUX2_MAX_AXES, FLUX2_MAX_FIELD, &c->n_axes, c->axes_dims))
        return -1;
    c->eps = (float)eps;
    json_t *g = json_object_get(cfg, "guidance_embeds");
    if (g && !json_is_boolean(g)) return tp_error("%s: 'guidance_embeds' must be true or false", where);
    c->guidance_embeds = g ? json_is_true(g) : 1;

    struct { const char *name; int v; } pos[] = {
        {"patch_size", c->patch_size}, {"in_channels", c->in_channels}, {"out_channels", c->out_channels},
        {"attention_head_dim", c->head_dim}, {"num_attention_heads", c->heads},
        {"joint_attention_dim", c->joint_dim}, {"timestep_guidance_channels", c->time_channels}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0) return tp_error("%s: '%s' must be positive (got %d)", where, pos[i].name, pos[i].v);
    if (c->num_layers < 0 || c->num_single_layers < 0)
        return tp_error("%s: num_layers and num_single_layers must not be negative", where);
    if (c->time_channels % 2) return tp_error("%s: timestep_guidance_channels must be even", where);
    if (c->head_dim % 2) return tp_error("%s: attention_head_dim must be even (RoPE pairs)", where);
    int sum = 0;
    for (int i = 0; i < c->n_axes; i++) sum += c->axes_dims[i];
    if (sum != c->head_dim)
        return tp_error("%s: axes_dims_rope sum to %d but attention_head_dim is %d; they must be equal", where, sum,
                        c->head_dim);
    if (!(c->mlp_ratio > 0) || !(c->rope_theta > 0) || !(c->eps > 0) || !isfinite(c->rope_theta))
        return tp_error("%s: mlp_ratio, rope_theta and eps must be positive", where);
    if (c->mlp_ratio > FLUX2_MAX_MLP_RATIO)
        return tp_error("%s: mlp_ratio %g is out of range (above 0, at most %g)", where, c->mlp_ratio,
                        FLUX2_MAX_MLP_RATIO);
    if ((int64_t)c->heads * c->head_dim > FLUX2_MAX_D)
        return tp_error("%s: num_attention_heads %d x attention_head_dim %d is more than %d; the config is corrupt",
                        where, c->heads, c->head_dim, FLUX2_MAX_D);
    c->D = (int64_t)c->heads * c->head_dim;
    c->M = (int64_t)((double)c->D * c->mlp_ratio);   /* Python int() truncation */
    c->out_dim = (int64_t)c->patch_size * c->patch_size * c->out_channels;
    return 0;
}

/* diffusers get_timestep_embedding with flip_sin_to_cos, shift 0, scale 1:
 * the exponent -ln(10000)·k is formed in fp32 (a Python float times an fp32
 * arange), divided by half, exponentiated in fp32. */
void flux2_sinusoid(float value, int channels, float *out) {
    int half = channels / 2;
    const float neg_log = (float)-log(10000.0);
    for (int k = 0; k < half; k++) {
        float expo = (neg_log * (float)k) / (float)half;
        float arg = value * expf(expo);
        out[k] = cosf(arg);
        out[half + k] = sinf(arg);
    }
}

/* Per axis a of width da: omega_k = 1 / theta^(2k/da) in float64; the id is
 * an fp32 integer promoted to float64; cos/sin in float64, rounded to f32
 * and repeated for both members of the pair (2k, 2k+1). */
void flux2_rope_table(const flux2_config *cfg, const int32_t *ids, int64_t n, float *cos_out, float *sin_out) {
    int hd = cfg->head_dim;
    for (int64_t t = 0; t < n; t++) {
        float *co = cos_out + t * hd, *si = sin_out + t * hd;
        int d0 = 0;
        for (int a = 0; a < cfg->n_axes; a++) {
            int da = cfg->axes_dims[a];
            double pos = (double)(float)ids[t * 4 + (a < 4 ? a : 3)];
            for (int k = 0; k < da / 2; k++) {
                double omega = 1.0 / pow(cfg->rope_theta, (double)(2 * k) / (double)da);
                double theta = pos * omega;
                float c = (float)cos(theta), s = (float)sin(theta);
                co[d0 + 2 * k] = co[d0 + 2 * k + 1] = c;
                si[d0 + 2 * k] = si[d0 + 2 * k + 1] = s;
            }
            d0 += da;
        }
    }
}

/* ---- the config of a checkpoint without config.json, from tensor shapes ---- */

/* The tensors the derivation reads, in BFL and in diffusers names. */
typedef struct {
    const char *kind;                  /* for messages */
    const char *img_in, *txt_in, *time_in, *final, *guidance;
    const char *double_fmt, *single_fmt; /* one tensor per block, to count them */
    const char *double_qnorm, *single_qnorm;
    const char *double_mlp_in;         /* [2M, D] */
    const char *single_fused;          /* [3D + 2M, D] */
} shape_names;

static const shape_names k_bfl_names = {
    "BFL", "img_in.weight", "txt_in.weight", "time_in.in_layer.weight", "final_layer.linear.weight",
    "guidance_in.in_layer.weight", "double_blocks.%d.img_attn.qkv.weight", "single_blocks.%d.linear1.weight",
    "double_blocks.0.img_attn.norm.query_norm.scale", "single_blocks.0.norm.query_norm.scale",
    "double_blocks.0.img_mlp.0.weight", "single_blocks.0.linear1.weight",
};

static const shape_names k_diffusers_names = {
    "diffusers-named", "x_embedder.weight", "context_embedder.weight", "time_guidance_embed.timestep_embedder.linear_1.weight",
    "proj_out.weight", "time_guidance_embed.guidance_embedder.linear_1.weight", "transformer_blocks.%d.attn.to_q.weight",
    "single_transformer_blocks.%d.attn.to_qkv_mlp_proj.weight", "transformer_blocks.0.attn.norm_q.weight",
    "single_transformer_blocks.0.attn.norm_q.weight", "transformer_blocks.0.ff.linear_in.weight",
    "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight",
};

/* Shape of a tensor as [rows, cols] (a 1-D [n] is [n, 1]); -1 when absent. */
static int bfl_shape(const checkpoint *c, const char *name, int64_t *rows, int64_t *cols) {
    const st_tensor_info *t = checkpoint_find(c, name, NULL);
    if (!t) return -1;
    *rows = t->ndim >= 1 ? t->shape[0] : 1;
    *cols = 1;
    for (int d = 1; d < t->ndim; d++) *cols *= t->shape[d];
    return 0;
}

static int bfl_req(const checkpoint *c, const shape_names *nm, const char *name, int64_t *rows, int64_t *cols) {
    if (!bfl_shape(c, name, rows, cols)) return 0;
    return tp_error("%s: %s checkpoint has no tensor %s (needed to derive the config; the file is incomplete, "
                    "or put the model's diffusers config.json next to it)", c->dir, nm->kind, name);
}

/* Blocks are numbered 0..n-1 without gaps; count them by one tensor each. */
static int bfl_count(const checkpoint *c, const char *fmt) {
    char name[128];
    int n = 0;
    for (;; n++) {
        snprintf(name, sizeof name, fmt, n);
        if (!checkpoint_find(c, name, NULL)) return n;
    }
}

static json_t *config_from_shapes(const checkpoint *c, const shape_names *nm) {
    int64_t D, cin, Dt, Jt, Dc, Ct, out_dim, Dp, hd, one, M2, Dm;
    if (bfl_req(c, nm, nm->img_in, &D, &cin) || bfl_req(c, nm, nm->txt_in, &Dt, &Jt) ||
        bfl_req(c, nm, nm->time_in, &Dc, &Ct) || bfl_req(c, nm, nm->final, &out_dim, &Dp))
        return NULL;
    int layers = bfl_count(c, nm->double_fmt);
    int singles = bfl_count(c, nm->single_fmt);
    if (layers + singles == 0)
        return tp_error("%s: %s checkpoint has no block 0 (neither %s nor %s)", c->dir, nm->kind,
                        nm->double_fmt, nm->single_fmt), NULL;
    /* head_dim from the QK-norm scale [hd], the MLP width from a fused MLP input [2M, D] */
    if (bfl_req(c, nm, layers ? nm->double_qnorm : nm->single_qnorm, &hd, &one)) return NULL;
    if (layers ? bfl_req(c, nm, nm->double_mlp_in, &M2, &Dm) : bfl_req(c, nm, nm->single_fused, &M2, &Dm)) return NULL;
    if (!layers) M2 -= 3 * D;   /* the single block's fused input is [3D + 2M, D] */
    if (D <= 0 || D > FLUX2_MAX_D || Dt != D || Dc != D || Dp != D || Dm != D || one != 1 || hd <= 0 || D % hd || hd % 8 || M2 <= 0 || M2 % 2)
        return tp_error("%s: %s checkpoint shapes are inconsistent (%s [%lld, %lld], %s [%lld, %lld], "
                        "%s [%lld, %lld], head_dim %lld, MLP in [%lld, %lld]); supply a config.json",
                        c->dir, nm->kind, nm->img_in, (long long)D, (long long)cin, nm->txt_in, (long long)Dt,
                        (long long)Jt, nm->time_in, (long long)Dc, (long long)Ct, (long long)hd, (long long)M2,
                        (long long)Dm), NULL;
    int64_t M = M2 / 2, ax = hd / 4;
    double ratio = (double)M / (double)D;
    if ((int64_t)((double)D * ratio) != M)
        return tp_error("%s: MLP width %lld is not int(D * ratio) for any ratio; supply a config.json", c->dir,
                        (long long)M), NULL;
    /* Not in the shapes: FLUX.2 uses patch 1 (latents are already 2x2
     * packed), four equal RoPE axes ([32,32,32,32] at head_dim 128),
     * theta 2000 and eps 1e-6, the diffusers defaults. */
    return json_pack("{s:i, s:I, s:I, s:i, s:i, s:I, s:I, s:I, s:I, s:f, s:[I,I,I,I], s:i, s:f, s:b}",
                     "patch_size", 1, "in_channels", (json_int_t)cin,
                     "out_channels", (json_int_t)out_dim, "num_layers", layers, "num_single_layers", singles,
                     "attention_head_dim", (json_int_t)hd, "num_attention_heads", (json_int_t)(D / hd),
                     "joint_attention_dim", (json_int_t)Jt, "timestep_guidance_channels", (json_int_t)Ct, "mlp_ratio",
                     ratio, "axes_dims_rope", (json_int_t)ax, (json_int_t)ax, (json_int_t)ax, (json_int_t)ax,
                     "rope_theta", 2000, "eps", 1e-6, "guidance_embeds", checkpoint_find(c, nm->guidance, NULL) != NULL);
}

json_t *flux2_config_from_bfl(const checkpoint *c) { return config_from_shapes(c, &k_bfl_names); }

int flux2_checkpoint_is_diffusers(const checkpoint *c) {
    return checkpoint_find(c, k_diffusers_names.img_in, NULL) && checkpoint_find(c, k_diffusers_names.txt_in, NULL);
}

json_t *flux2_config_from_diffusers(const checkpoint *c) { return config_from_shapes(c, &k_diffusers_names); }
