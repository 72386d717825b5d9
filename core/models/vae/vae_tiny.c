/* vae_write_tiny: a tiny random AutoencoderKLFlux2 decoder folder, written
 * through the same name/shape binding the loader uses, so that the file
 * always matches what vae_load expects. */
#include "vae_internal.h"
#include "kernels/err.h"
#include "core/formats/safetensors.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct rec_entry {
    char *name;
    int ndim;
    int64_t shape[4];
    uint16_t *data;     /* bf16 */
} rec_entry;

typedef struct rec_ctx {
    rec_entry *e;
    int n;
    uint64_t rng;
    tensor dummy;       /* what the getter hands back: vae_bind only stores pointers */
} rec_ctx;

static const tensor *rec_get(void *vctx, const char *name, int64_t rows, int64_t cols, int k) {
    rec_ctx *rc = vctx;
    rc->e = xrealloc(rc->e, (size_t)(rc->n + 1) * sizeof *rc->e);
    rec_entry *e = &rc->e[rc->n++];
    memset(e, 0, sizeof *e);
    e->name = xstrdup(name);
    if (k > 0) {
        e->ndim = 4;
        e->shape[0] = rows; e->shape[1] = cols / (k * k); e->shape[2] = k; e->shape[3] = k;
    } else if (rows == 1) {
        e->ndim = 1;
        e->shape[0] = cols;
    } else {
        e->ndim = 2;
        e->shape[0] = rows; e->shape[1] = cols;
    }
    size_t n = (size_t)rows * (size_t)cols;
    float *f = xmalloc(n * sizeof(float));
    vae_random_values(name, rows, cols, &rc->rng, f);
    e->data = xmalloc(n * sizeof(uint16_t));
    convert_from_f32(e->data, DT_BF16, f, n);
    free(f);
    return &rc->dummy;
}

static int make_dirs(const char *path) {
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0777) && errno != EEXIST) break;
        *s = '/';
    }
    int rc = mkdir(p, 0777) && errno != EEXIST ? tp_error("could not create folder %s: %s", p, strerror(errno)) : 0;
    free(p);
    return rc;
}

static void tiny_config(vae_config *c) {
    memset(c, 0, sizeof *c);
    c->latent_channels = 8;
    c->n_blocks = 4;
    int blocks[4] = {32, 32, 64, 64};
    memcpy(c->block_out, blocks, sizeof blocks);
    c->layers_per_block = 1;
    c->norm_groups = 8;
    c->out_channels = 3;
    c->mid_attention = 1;
    c->post_quant_conv = 1;
    c->bn_eps = 1e-4f;
    c->norm_eps = 1e-6f;
    c->in_channels = 3;
    c->enc_n_blocks = 4;
    memcpy(c->enc_block_out, blocks, sizeof blocks);
    c->quant_conv = 1;
    c->enc_blocks_ok = 1;
}

static int write_random(const char *vae_dir, const vae_config *cfgp, unsigned seed);

int vae_write_tiny(const char *vae_dir, unsigned seed) {
    vae_config cfg;
    tiny_config(&cfg);
    return write_random(vae_dir, &cfg, seed);
}

int vae_write_flux2(const char *vae_dir, unsigned seed) {
    vae_config cfg;
    vae_flux2_config(&cfg);
    return write_random(vae_dir, &cfg, seed);
}

static int write_random(const char *vae_dir, const vae_config *cfgp, unsigned seed) {
    vae_config cfg = *cfgp;
    if (make_dirs(vae_dir)) return -1;
    vae_model v = {.cfg = cfg};
    rec_ctx rc = {.rng = 0x7a11ull ^ ((uint64_t)seed << 24)};
    rec_get(&rc, "bn.running_mean", 1, vae_bn_channels(&cfg), 0);
    rec_get(&rc, "bn.running_var", 1, vae_bn_channels(&cfg), 0);
    int err = vae_bind(&v, rec_get, &rc);
    /* the encoder after the decoder: the decoder's random values stay what they were without it */
    if (!err) err = vae_bind_encoder(&v, rec_get, &rc);
    st_write_tensor *t = xcalloc((size_t)rc.n + 1, sizeof *t);
    for (int i = 0; i < rc.n; i++) {
        t[i].name = rc.e[i].name;
        t[i].dtype = DT_BF16;
        t[i].ndim = rc.e[i].ndim;
        memcpy(t[i].shape, rc.e[i].shape, sizeof rc.e[i].shape);
        t[i].data = rc.e[i].data;
    }
    /* the training counter diffusers keeps next to the statistics; the decoder ignores it */
    static const int64_t batches = 1000;
    t[rc.n] = (st_write_tensor){.name = "bn.num_batches_tracked", .dtype = DT_I64, .ndim = 0, .data = &batches};
    static const char *const meta[] = {"format", "pt", NULL};
    char *st_path = xasprintf("%s/diffusion_pytorch_model.safetensors", vae_dir);
    char *cfg_path = xasprintf("%s/config.json", vae_dir);
    if (!err) err = st_write(st_path, t, rc.n + 1, meta);
    if (!err) err = vae_config_write(&cfg, cfg_path);
    for (int i = 0; i < rc.n; i++) {
        free(rc.e[i].name);
        free(rc.e[i].data);
    }
    free(rc.e);
    free(t);
    free(st_path);
    free(cfg_path);
    return err;
}
