/* Loading a tokenizer: find the file in a folder, read it, and hand it to
 * the loader of its format (a Hugging Face tokenizer.json or a
 * mistral-common tekken.json, told apart by content). */
#include "tokenizer_int.h"
#include "tokenizer_scan.h"
#include "kernels/err.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The whole file in memory: jansson's own file reader goes through getc. */
static char *read_whole(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        tp_error("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0, k;
    char *buf = xmalloc(cap);
    while ((k = fread(buf + n, 1, cap - n, f)) > 0)
        if ((n += k) == cap) buf = xrealloc(buf, cap *= 2);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        tp_error("cannot read %s", path);
        return NULL;
    }
    *len = n;
    return buf;
}

tokenizer *tok_load_json(const char *path, const char *config_path) { return tok_load_json_ex(path, config_path, 1); }

tokenizer *tok_load_json_ex(const char *path, const char *config_path, int fast_scan) {
    json_error_t jerr;
    size_t len;
    char *text = read_whole(path, &len);
    if (!text) return NULL;
    /* fast path: vocab and merges read directly, jansson parses the rest */
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[0x144];
    byte_unicode_tables(byte_to_cp, cp_to_byte);
    hf_fast fast = {0};
    int have_fast = fast_scan && hf_fast_scan(text, &len, cp_to_byte, &fast) == 0;
    if (fast_scan && !have_fast) hf_fast_free(&fast);
    /* duplicate keys are errors on both paths: jansson would keep the last
     * value, the scanner the first */
    json_t *root = json_loadb(text, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    tokenizer *t = NULL;
    if (!root)
        tp_error("%s:%d:%d: cannot read the tokenizer file: %s", path, jerr.line, jerr.column, jerr.text);
    else if (json_is_object(root) && json_object_get(root, "model"))
        t = tok_from_hf_json(root, path, config_path, have_fast ? &fast : NULL);
    else if (json_is_object(root) && json_is_array(json_object_get(root, "vocab")) && json_object_get(root, "config"))
        t = tok_from_tekken_json(root, path, config_path);
    else
        tp_error("%s is neither a Hugging Face tokenizer.json (no \"model\" key) nor a mistral-common "
                 "tekken.json (no \"config\" and \"vocab\")", path);
    json_decref(root);
    if (have_fast) hf_fast_free(&fast);
    return t;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int dir_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

tokenizer *tokenizer_load(const char *dir) {
    if (file_exists(dir)) { /* a tokenizer.json or tekken.json named directly */
        char *slash = strrchr(dir, '/');
        char *cfg = xasprintf("%.*stokenizer_config.json", slash ? (int)(slash - dir + 1) : 0, dir);
        tokenizer *t = tokenizer_load_files(dir, file_exists(cfg) ? cfg : NULL);
        free(cfg);
        return t;
    }
    if (!dir_exists(dir)) {
        tp_error("tokenizer folder '%s' does not exist; pass --model with a pipeline folder (containing "
                 "tokenizer/) or a folder holding tokenizer.json or tekken.json", dir);
        return NULL;
    }
    char *sub = xasprintf("%s/tokenizer", dir);
    const char *base = dir_exists(sub) ? sub : dir;
    char *hf = xasprintf("%s/tokenizer.json", base);
    char *tek = xasprintf("%s/tekken.json", base);
    char *cfg = xasprintf("%s/tokenizer_config.json", base);
    const char *config = file_exists(cfg) ? cfg : NULL;
    tokenizer *t = NULL;
    if (file_exists(hf)) t = tok_load_json(hf, config);
    else if (file_exists(tek)) t = tok_load_json(tek, config);
    else
        tp_error("no tokenizer in '%s': neither %s nor %s exists (a FLUX.2 pipeline folder has "
                 "tokenizer/tokenizer.json)", dir, hf, tek);
    free(sub), free(hf), free(tek), free(cfg);
    return t;
}

tokenizer *tokenizer_load_files(const char *json_path, const char *config_path) {
    if (!file_exists(json_path)) {
        tp_error("tokenizer file '%s' does not exist", json_path);
        return NULL;
    }
    return tok_load_json(json_path, config_path);
}
