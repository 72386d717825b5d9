/* The flux2-lora-dialects golden set (tests/data/golden/flux2-lora-dialects.tar.xz,
 * tests/tools/pack_lora_dialects.py): its two tiny transformers are not stored
 * but regenerated here bit for bit. The upstream generator drew every weight,
 * in the file's (sorted) tensor order, as torch.randn(shape)/sqrt(fan_in) (f32
 * division), QK-norm scales as 1 + 0.1*randn, with torch.manual_seed(0) for
 * klein and 1 for dev; core/rng.c is torch's CPU generator. The written file is
 * the stored header plus those values, and must match the manifest's sha256.
 * tests/sh/lora_dialects.sh runs it with TPGEN_LORA_DIALECTS_OUT set. */
#include "test.h"
#include "lora_dialects_models.h"
#include "core/image/sha256.h"
#include "core/rng.h"
#include "kernels/err.h"
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = xmalloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

typedef struct { const char *name; int64_t begin, numel, fan; int norm; } gen_t;

static int by_begin(const void *a, const void *b) {
    const gen_t *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Write DIR/diffusion_pytorch_model.safetensors from the stored header. */
static int make_model(const char *src, const char *dst, uint64_t seed) {
    char *hp = xasprintf("%s/diffusion_pytorch_model.header", src);
    size_t hn;
    char *hdr = slurp(hp, &hn);
    free(hp);
    if (!hdr) return tp_error("%s: no stored header", src);
    json_error_t je;
    json_t *h = json_loadb(hdr, hn, 0, &je);
    if (!h) { free(hdr); return tp_error("%s: header is not JSON (%s)", src, je.text); }
    gen_t *t = xcalloc(json_object_size(h) + 1, sizeof *t);
    int n = 0;
    const char *k;
    json_t *v;
    int64_t end = 0;
    json_object_foreach(h, k, v) {
        if (!strcmp(k, "__metadata__")) continue;
        json_t *sh = json_object_get(v, "shape");
        t[n] = (gen_t){k, json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 0)), 1, 1, 0};
        for (size_t i = 0; i < json_array_size(sh); i++) t[n].numel *= json_integer_value(json_array_get(sh, i));
        if (json_array_size(sh) == 2) t[n].fan = json_integer_value(json_array_get(sh, 1));
        else t[n].norm = 1;
        if (t[n].begin + 4 * t[n].numel > end) end = t[n].begin + 4 * t[n].numel;
        n++;
    }
    qsort(t, (size_t)n, sizeof *t, by_begin);
    char *data = xcalloc((size_t)end + 1, 1);
    tp_rng g;
    rng_seed(&g, seed);
    for (int i = 0; i < n; i++) {
        float *w = (float *)(data + t[i].begin);
        rng_randn_f32(&g, w, (size_t)t[i].numel);
        float d = (float)sqrt((double)t[i].fan);
        for (int64_t j = 0; j < t[i].numel; j++) w[j] = t[i].norm ? 1.0f + 0.1f * w[j] : w[j] / d;
    }
    mkdir(dst, 0755);
    char *op = xasprintf("%s/diffusion_pytorch_model.safetensors", dst);
    FILE *f = fopen(op, "wb");
    uint64_t len = hn;
    int rc = f && fwrite(&len, 8, 1, f) == 1 && fwrite(hdr, 1, hn, f) == hn && fwrite(data, 1, (size_t)end, f) == (size_t)end
                 ? 0 : tp_error("cannot write %s", op);
    if (f && fclose(f)) rc = tp_error("cannot write %s", op);
    free(op), free(data), free(t), free(hdr);
    json_decref(h);
    return rc;
}

static int copy_file(const char *from, const char *to) {
    size_t n;
    char *b = slurp(from, &n);
    if (!b) return tp_error("cannot read %s", from);
    FILE *f = fopen(to, "wb");
    int rc = f && fwrite(b, 1, n, f) == n ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(b);
    return rc ? tp_error("cannot write %s", to) : 0;
}

int lora_dialects_write_models(const char *out) {
    char *src = xasprintf("%s/flux2-lora-dialects", test_golden_dir());
    static const char *dirs[] = {"transformer", "transformer_dev"};
    int rc = mkdir(out, 0755) && errno != EEXIST ? tp_error("cannot create %s", out) : 0;
    for (int i = 0; i < 2 && !rc; i++) {
        char *s = xasprintf("%s/%s", src, dirs[i]), *d = xasprintf("%s/%s", out, dirs[i]);
        char *cs = xasprintf("%s/config.json", s), *cd = xasprintf("%s/config.json", d);
        rc = make_model(s, d, (uint64_t)i);   /* klein: seed 0, dev: seed 1 */
        if (!rc) rc = copy_file(cs, cd);
        if (rc) tp_error_context("%s", dirs[i]);
        free(s), free(d), free(cs), free(cd);
    }
    free(src);
    return rc;
}

TEST(lora_dialects_make_models) {
    const char *env = getenv("TPGEN_LORA_DIALECTS_OUT");
    char *out = env ? xstrdup(env) : xasprintf("%s/dialects", test_tmp_dir());
    char *mp = xasprintf("%s/flux2-lora-dialects/manifest.json", test_golden_dir());
    json_t *man = json_load_file(mp, 0, NULL);
    CHECK(man != NULL, "cannot read %s", mp);
    int rc = lora_dialects_write_models(out);
    CHECK(rc == 0, "%s", tp_error_msg());
    static const char *dirs[] = {"transformer", "transformer_dev"};
    for (int i = 0; man && !rc && i < 2; i++) {
        char *key = xasprintf("%s/diffusion_pytorch_model.safetensors", dirs[i]);
        char *file = xasprintf("%s/%s", out, key), hex[65] = {0};
        const char *want = json_string_value(json_object_get(json_object_get(man, "sha256"), key));
        CHECK(want && !file_sha256(file, hex) && !strcmp(hex, want), "%s: sha256 %s, the manifest says %s", file, hex,
              want ? want : "(none)");
        free(key), free(file);
    }
    json_decref(man);
    free(mp), free(out);
}
