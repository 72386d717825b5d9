/* make-tiny's text encoders (textenc.h): a tiny random Qwen3 (klein) or
 * Mistral3 (dev) written into <model_dir>/text_encoder, with a tokenizer
 * copied from tests/data of the source tree into <model_dir>/tokenizer. */
#include "textenc.h"
#include "llm_internal.h"
#include "kernels/err.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The tokenizer files ship in tests/data/ of the source tree (`rel`): found
 * through $TPGEN_ROOT, next to the executable (build/tpgen ->
 * ../tests/data) or from the current directory. */
static char *find_data_dir(const char *rel) {
    char *cands[3] = {0};
    const char *root = getenv("TPGEN_ROOT");
    if (root) cands[0] = xasprintf("%s/%s", root, rel);
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        cands[1] = xasprintf("%s/../%s", exe, rel);
    }
    cands[2] = xstrdup(rel);
    char *found = NULL;
    for (int i = 0; i < 3; i++) {
        if (!found && cands[i]) {
            char *probe = xasprintf("%s/tokenizer.json", cands[i]);
            if (access(probe, R_OK) == 0) found = cands[i], cands[i] = NULL;
            free(probe);
        }
        free(cands[i]);
    }
    return found;
}

static int copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return tp_error("cannot read %s: %s", src, strerror(errno));
    char *tmp = xasprintf("%s.tmp", dst);
    FILE *out = fopen(tmp, "wb");
    int rc = out ? 0 : tp_error("cannot create %s: %s", tmp, strerror(errno));
    char buf[1 << 16];
    size_t k;
    while (!rc && (k = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, k, out) != k) rc = tp_error("writing %s: %s", tmp, strerror(errno));
    if (!rc && ferror(in)) rc = tp_error("reading %s failed", src);
    if (out && fclose(out) && !rc) rc = tp_error("writing %s: %s", tmp, strerror(errno));
    fclose(in);
    if (!rc && rename(tmp, dst)) rc = tp_error("cannot rename %s to %s: %s", tmp, dst, strerror(errno));
    if (rc) unlink(tmp);
    free(tmp);
    return rc;
}

static int make_dir(const char *path) {
    if (mkdir(path, 0755) && errno != EEXIST) return tp_error("cannot create folder %s: %s", path, strerror(errno));
    return 0;
}

/* The tiny hidden size: joint_attention_dim / 3 of make-tiny's transformer. */
/* hidden = joint_attention_dim / K (K hidden states stacked: 3 FLUX.2, 8 FLUX.3) */
static int tiny_hidden_k(const char *model_dir, int k, int align, int *hidden) {
    *hidden = TEXTENC_TINY_HIDDEN;
    char *path = xasprintf("%s/transformer/config.json", model_dir);
    int rc = 0;
    if (access(path, F_OK) == 0) {
        json_error_t je;
        json_t *cfg = json_load_file(path, 0, &je);
        json_int_t jd = cfg ? json_integer_value(json_object_get(cfg, "joint_attention_dim")) : 0;
        if (jd <= 0 || jd % (align * k))
            rc = tp_error("%s: joint_attention_dim must be a positive multiple of %d (%d x a hidden size divisible "
                          "by %d) for the tiny text encoder", path, align * k, k, align);
        else
            *hidden = (int)(jd / k);
        json_decref(cfg);
    }
    free(path);
    return rc;
}

static int tiny_hidden(const char *model_dir, int *hidden) { return tiny_hidden_k(model_dir, 3, 8, hidden); }

/* text_encoder/ from config c, tokenizer/ from the files of tests/data/<tok_rel> */
static int write_parts(const char *model_dir, const llm_config *c, unsigned seed, int sparse, const char *tok_rel,
                       const char *tok_what) {
    char *tok_src = find_data_dir(tok_rel);
    if (!tok_src)
        return tp_error("cannot find the %s tokenizer files (%s/ of the tpgen source tree); run from the source "
                        "folder or set TPGEN_ROOT to it", tok_what, tok_rel);
    char *te = xasprintf("%s/text_encoder", model_dir), *tk = xasprintf("%s/tokenizer", model_dir);
    int rc = make_dir(model_dir);
    if (!rc) rc = make_dir(te);
    if (!rc) rc = make_dir(tk);
    if (!rc) rc = llm_write_random(te, c, seed, sparse);
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; !rc && i < 2; i++) {
        char *src = xasprintf("%s/%s", tok_src, files[i]), *dst = xasprintf("%s/%s", tk, files[i]);
        rc = copy_file(src, dst);
        free(src), free(dst);
    }
    free(te), free(tk), free(tok_src);
    return rc ? tp_error_context("writing the tiny text encoder into %s", model_dir) : 0;
}

int textenc_write_tiny(const char *model_dir, unsigned seed) {
    int H;
    if (tiny_hidden(model_dir, &H)) return -1;
    /* the shape of golden/klein-tiny: 28 layers so that (9, 18, 27) apply, real vocabulary */
    llm_config c = {.arch = LLM_QWEN3, .hidden = H, .n_layers = 28, .n_heads = 4, .n_kv_heads = 2,
                    .head_dim = H / 4, .ffn = 2 * H, .vocab = 151936, .eps = 1e-6f, .rope_theta = 1e6,
                    .qk_norm = 1};
    return write_parts(model_dir, &c, seed, 0, "tests/data/qwen3-tokenizer", "Qwen3");
}

int textenc_write_tiny_mistral(const char *model_dir, unsigned seed) {
    int H;
    if (tiny_hidden(model_dir, &H)) return -1;
    /* 31 layers so that dev's hidden states (10, 20, 30) exist; Mistral Small's eps and rope theta; the
     * vocabulary covers the mini Tekken tokenizer's 1269 tokens */
    llm_config c = {.arch = LLM_MISTRAL, .hidden = H, .n_layers = 31, .n_heads = 4, .n_kv_heads = 2,
                    .head_dim = H / 4, .ffn = 2 * H, .vocab = TEXTENC_TINY_MISTRAL_VOCAB, .eps = 1e-5f,
                    .rope_theta = 1e9};
    return write_parts(model_dir, &c, seed, 0, "tests/data/tekken-mini/hf", "mini Tekken");
}

int textenc_write_tiny_qwen3vl(const char *model_dir, unsigned seed) {
    int H;
    if (tiny_hidden_k(model_dir, 8, 2, &H)) return -1;
    /* 4 heads (2 KV) of H/4 when H is a multiple of 8, else 2 heads (2 KV) of 8, which Qwen3's explicit
     * head_dim allows (golden flux3-tiny's joint 80: H 10), so that tp 2 works either way */
    int heads = H % 8 == 0 ? 4 : 2, hd = H % 8 == 0 ? H / 4 : 8;
    /* 33 layers so that hidden state 32 is an intermediate one (as in the real 36-layer model); Qwen3-VL's
     * rope theta; the real vocabulary for the Qwen3 tokenizer's ids */
    llm_config c = {.arch = LLM_QWEN3VL, .hidden = H, .n_layers = 33, .n_heads = heads,
                    .n_kv_heads = 2, .head_dim = hd, .ffn = 2 * H, .vocab = 151936,
                    .eps = 1e-6f, .rope_theta = 5e6, .qk_norm = 1};
    return write_parts(model_dir, &c, seed, 0, "tests/data/qwen3-tokenizer", "Qwen3");
}

/* The real encoders' shapes (docs/spec/flux2-text-vae.md §3.5, §3.6): Qwen3-4B
 * for klein-4B, Mistral Small 3.x (24B, language model only) for dev. */
int textenc_write_full(const char *model_dir, int dev, unsigned seed, int sparse) {
    llm_config q = {.arch = LLM_QWEN3, .hidden = 2560, .n_layers = 36, .n_heads = 32, .n_kv_heads = 8,
                    .head_dim = 128, .ffn = 9728, .vocab = 151936, .eps = 1e-6f, .rope_theta = 1e6, .qk_norm = 1};
    llm_config m = {.arch = LLM_MISTRAL, .hidden = 5120, .n_layers = 40, .n_heads = 32, .n_kv_heads = 8,
                    .head_dim = 128, .ffn = 32768, .vocab = 131072, .eps = 1e-5f, .rope_theta = 1e9};
    return dev ? write_parts(model_dir, &m, seed, sparse, "tests/data/tekken-mini/hf", "mini Tekken")
               : write_parts(model_dir, &q, seed, sparse, "tests/data/qwen3-tokenizer", "Qwen3");
}

