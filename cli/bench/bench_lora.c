/* A random LoRA adapter for the load benchmark (`tpgen bench load
 * --make-lora FILE --rank R --model DIR`): PEFT/diffusers layout (the keys
 * diffusers' save_lora_weights writes), BF16, lora_A and lora_B of rank R
 * for every Linear inside the blocks of DIR/transformer (double-block
 * q/k/v, out, added q/k/v, add-out, both MLPs; single-block fused
 * projections), values ~ U(+-2^-4) so a merged model stays finite. */
#include "core/formats/checkpoint.h"
#include "kernels/err.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int block_linear(const char *name) {
    static const char *sfx[] = {".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight", ".attn.to_out.0.weight",
                                ".attn.add_q_proj.weight", ".attn.add_k_proj.weight", ".attn.add_v_proj.weight",
                                ".attn.to_add_out.weight", ".ff.linear_in.weight", ".ff.linear_out.weight",
                                ".ff_context.linear_in.weight", ".ff_context.linear_out.weight",
                                ".attn.to_qkv_mlp_proj.weight", ".attn.to_out.weight"};
    if (strncmp(name, "transformer_blocks.", 19) && strncmp(name, "single_transformer_blocks.", 26)) return 0;
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof sfx / sizeof *sfx; i++) {
        size_t l = strlen(sfx[i]);
        if (n > l && !strcmp(name + n - l, sfx[i])) return 1;
    }
    return 0;
}

static int fill_lora(void *ctx, int index, void *buf, size_t offset, size_t n) {
    uint64_t x = *(unsigned *)ctx * 0x9E3779B97F4A7C15ull ^ ((uint64_t)index << 40) ^ (offset + 1);
    uint16_t *h = buf;
    for (size_t i = 0; i < n / 2; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        h[i] = (uint16_t)(0x3c00 | (x & 0x7f) | ((x >> 8 & 1) << 15) | ((x >> 9 & 3) << 7));
    }
    return 0;
}

/* A LoKr on the same modules (--lokr-factor F): LyCORIS names, both factors
 * full (scale 1): lokr_w1 [F, F], lokr_w2 [out/F, in/F]. */
static int lokr_tensors(const st_tensor_info *ti, int factor, st_write_tensor *t) {
    if (ti->shape[0] % factor || ti->shape[1] % factor)
        return tp_error("%s [%lld, %lld] is not divisible by --lokr-factor %d", ti->name, (long long)ti->shape[0],
                        (long long)ti->shape[1], factor);
    char *u = xasprintf("%.*s", (int)(strlen(ti->name) - strlen(".weight")), ti->name);
    for (char *p = u; *p; p++) if (*p == '.') *p = '_';
    t[0] = (st_write_tensor){.name = xasprintf("lycoris_%s.lokr_w1", u), .dtype = DT_BF16, .ndim = 2,
                             .shape = {factor, factor}};
    t[1] = (st_write_tensor){.name = xasprintf("lycoris_%s.lokr_w2", u), .dtype = DT_BF16, .ndim = 2,
                             .shape = {ti->shape[0] / factor, ti->shape[1] / factor}};
    free(u);
    return 0;
}

int lora_make_random(const char *transformer_dir, const char *out, int rank, int lokr_factor, unsigned seed) {
    if (rank < 1) return tp_error("--rank must be positive");
    checkpoint *c;
    if (checkpoint_open(transformer_dir, &c)) return -1;
    st_write_tensor *t = xcalloc((size_t)c->n * 2 + 1, sizeof *t);
    int n = 0, rc = 0;
    for (int k = 0; k < c->n && !rc; k++) {
        const st_tensor_info *ti = c->infos[k];
        if (ti->ndim != 2 || !block_linear(ti->name)) continue;
        if (lokr_factor > 0) {
            if (!(rc = lokr_tensors(ti, lokr_factor, t + n))) n += 2;
            continue;
        }
        size_t l = strlen(ti->name) - strlen(".weight");
        t[n++] = (st_write_tensor){.name = xasprintf("transformer.%.*s.lora_A.weight", (int)l, ti->name),
                                   .dtype = DT_BF16, .ndim = 2, .shape = {rank, ti->shape[1]}};
        t[n++] = (st_write_tensor){.name = xasprintf("transformer.%.*s.lora_B.weight", (int)l, ti->name),
                                   .dtype = DT_BF16, .ndim = 2, .shape = {ti->shape[0], rank}};
    }
    char meta[96];
    snprintf(meta, sizeof meta, "{\"transformer.r\": %d, \"transformer.lora_alpha\": %d}", rank, rank);
    const char *kv[] = {"lora_adapter_metadata", meta, NULL};
    if (!rc) rc = n ? st_write_stream(out, t, n, lokr_factor > 0 ? NULL : kv, fill_lora, &seed)
                    : tp_error("%s: no block Linear found (not a diffusers-layout FLUX.2 transformer)", transformer_dir);
    for (int i = 0; i < n; i++) free((void *)t[i].name);
    free(t);
    checkpoint_close(c);
    return rc;
}
