/* libFuzzer harness: a GGUF file parsed from memory (gguf_open_mem) and,
 * every 16th input, through a temporary file (gguf_open: the mmap path).
 * Its metadata is walked through the typed getters; each tensor of a type
 * tpgen decodes has its first block, a column range straddling a block edge
 * and (for small tensors) its whole data dequantised. Every 16th accepted
 * file is also written back with gguf_write (tensor data as holes) and must
 * parse again to the same keys and tensors (aborts otherwise). The file
 * inputs also open as a checkpoint's st_file (gguf_st_open), whose small
 * block tensors go through the weight scan (gguf_scan_finite). Every parsed
 * file's metadata also goes through the text-encoder configuration reader
 * (llm_gguf_config), and every 16th file through llm_gguf_adopt on a
 * checkpoint folder holding it (config + tensor renaming). Every parsed
 * file is also handed to the GGUF tokenizer loader (tok_from_gguf, the core
 * of tokenizer_load_gguf); a tokenizer that loads encodes a fixed text and
 * the input's first bytes, and every id it gives must name a token (aborts
 * otherwise). */
#include "core/formats/gguf.h"
#include "core/formats/gguf_shard.h"
#include "core/formats/checkpoint.h"
#include "core/models/llm/llm.h"
#include "core/models/tokenizer/tokenizer_int.h"
#include "kernels/err.h"
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_file[64];

static void walk(gguf_file *g) {
    for (int i = 0; i < g->n_kv; i++) {
        const char *k = g->kv[i].key, *s;
        uint32_t u32;
        int32_t i32;
        uint64_t u64, n;
        float f, *fv;
        int b;
        int64_t *iv;
        const gguf_str *ss;
        (void)gguf_get_str(g, k, &s), (void)gguf_get_u32(g, k, &u32), (void)gguf_get_i32(g, k, &i32);
        (void)gguf_get_u64(g, k, &u64), (void)gguf_get_f32(g, k, &f), (void)gguf_get_bool(g, k, &b);
        (void)gguf_get_arr_str(g, k, &ss, &n);
        if (gguf_get_arr_i64(g, k, &iv, &n) == 0) free(iv);
        if (gguf_get_arr_f32(g, k, &fv, &n) == 0) free(fv);
    }
    float out[2 * QUANT_MAX_BLOCK];
    for (int i = 0; i < g->n; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (gguf_find(g, t->name) == NULL) abort();   /* the name index must find every tensor */
        if (gguf_check_type(g, t)) continue;
        int64_t bs = t->qt->block;
        int64_t c1 = bs < t->row_len ? bs : t->row_len;
        (void)gguf_read_f32_block(g, t, 0, 1, 0, c1, out, NULL);
        if (t->row_len > bs) {   /* across the first block edge */
            int64_t c0 = bs / 2, e = bs + bs / 2 < t->row_len ? bs + bs / 2 : t->row_len;
            (void)gguf_read_f32_block(g, t, t->rows - 1, t->rows, c0, e, out, NULL);
        }
        if ((uint64_t)t->rows * (uint64_t)t->row_len <= 4096) {
            float *x;
            if (gguf_read_f32(g, t->name, &x, NULL) == 0) free(x);
        }
    }
}

static void encode_checked(const tokenizer *t, const char *s, size_t n) {
    int32_t *ids = NULL;
    int k = 0;
    if (tokenizer_encode(t, s, n, &ids, &k) == 0)
        for (int i = 0; i < k; i++) {
            int len;
            if (!tokenizer_token_bytes(t, ids[i], &len)) abort();   /* an id without a token */
        }
    free(ids);
}

/* the tokenizer from the file's tokenizer.ggml.* keys */
static void tokenizer_of(const gguf_file *g) {
    tokenizer *t = tok_from_gguf(g);
    if (!t) return;
    static const char text[] = "a red fox in the snow, 1024px <|im_start|>[INST] caf\xc3\xa9 e\xcc\x81  \n\t!";
    encode_checked(t, text, sizeof text - 1);
    if (g->mem) encode_checked(t, (const char *)g->mem, g->file_size < 64 ? (size_t)g->file_size : 64);
    if (tokenizer_pad_id(t) >= 0 && !tokenizer_token_bytes(t, tokenizer_pad_id(t), &(int){0})) abort();
    tokenizer_free(t);
}

/* write g back and reparse: the same keys, value types and tensors */
static void rewrite(const gguf_file *g) {
    static char out[64];
    if (!out[0]) snprintf(out, sizeof out, "/tmp/tpgen-fuzz-gguf-%d.out.gguf", (int)getpid());
    gguf_write_tensor *t = calloc((size_t)g->n + 1, sizeof *t);
    for (int i = 0; i < g->n; i++)
        t[i] = (gguf_write_tensor){g->tensors[i].name, g->tensors[i].type, g->tensors[i].ndim,
                                   {g->tensors[i].ne[0], g->tensors[i].ne[1], g->tensors[i].ne[2], g->tensors[i].ne[3]},
                                   NULL};
    gguf_file *h;
    if (gguf_write(out, g->kv, g->n_kv, t, g->n, NULL, NULL) == 0) {
        if (gguf_open(out, &h)) abort();   /* a file the writer made from a valid one must open */
        if (h->n != g->n || h->n_kv != g->n_kv || h->alignment != g->alignment) abort();
        for (int i = 0; i < g->n_kv; i++)
            if (strcmp(h->kv[i].key, g->kv[i].key) || h->kv[i].v.type != g->kv[i].v.type) abort();
        for (int i = 0; i < g->n; i++)
            if (strcmp(h->tensors[i].name, g->tensors[i].name) || h->tensors[i].type != g->tensors[i].type ||
                memcmp(h->tensors[i].ne, g->tensors[i].ne, sizeof h->tensors[i].ne))
                abort();
        gguf_close(h);
        unlink(out);
    }
    free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned calls;
    gguf_file *g = NULL;
    if (gguf_open_mem(data, size, "fuzz.gguf", &g) == 0) {
        walk(g);
        llm_config cfg;
        if (llm_gguf_config(g, "fuzz.gguf", &cfg) == 0 &&
            (cfg.hidden <= 0 || cfg.n_heads <= 0 || cfg.n_kv_heads <= 0 || cfg.n_heads % cfg.n_kv_heads || cfg.vocab <= 0))
            abort();   /* an accepted configuration is consistent */
        tokenizer_of(g);
        gguf_close(g);
    }
    if (calls++ % 16 == 0) {
        if (!g_file[0]) snprintf(g_file, sizeof g_file, "/tmp/tpgen-fuzz-gguf-%d.gguf", (int)getpid());
        FILE *f = fopen(g_file, "wb");
        if (!f) return 0;
        fwrite(data, 1, size, f);
        fclose(f);
        if (gguf_open(g_file, &g) == 0) {
            walk(g);
            rewrite(g);
            gguf_close(g);
        }
        /* the same file as a checkpoint's st_file (core/formats/gguf_shard.c):
         * entries, and the weight scan of each small block tensor */
        st_file *sf;
        if (gguf_st_open(g_file, &sf) == 0) {
            for (int i = 0; i < sf->n; i++) {
                const st_tensor_info *t = &sf->tensors[i];
                int64_t first, count;
                if (t->dtype == DT_GGML && t->end - t->begin <= (1u << 20) && gguf_scan_finite(sf, t, &first, &count))
                    abort();   /* its bytes are inside the file: the read cannot fail */
            }
            st_close(sf);
        }
        /* as a text encoder's checkpoint folder: configuration and renaming */
        static char dir[80], in_dir[128];
        if (!dir[0]) {
            snprintf(dir, sizeof dir, "/tmp/tpgen-fuzz-gguf-%d.d", (int)getpid());
            snprintf(in_dir, sizeof in_dir, "%s/model.gguf", dir);
            mkdir(dir, 0700);
        }
        unlink(in_dir);
        if (link(g_file, in_dir) == 0) {
            checkpoint *ck;
            llm_config cfg;
            if (checkpoint_open(dir, &ck) == 0) {
                if (llm_gguf_adopt(ck, NULL, &cfg) == 0 && !checkpoint_find(ck, "model.embed_tokens.weight", NULL))
                    abort();   /* accepted means token_embd was there and is renamed */
                checkpoint_close(ck);
            }
            unlink(in_dir);
        }
    }
    return 0;
}
