/* The edits form (serve_form.h). */
#include "serve_form.h"
#include <microhttpd.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FIELDS 32

struct serve_form {
    struct MHD_PostProcessor *pp;
    size_t max_bytes, seen;
    int too_large, bad;              /* bad: out of memory or too many parts */
    char *keys[MAX_FIELDS], *values[MAX_FIELDS];
    size_t value_len[MAX_FIELDS];
    int n_fields;
    uint8_t *images[SERVE_MAX_IMAGES + 1];
    size_t image_sizes[SERVE_MAX_IMAGES + 1];
    char *image_names[SERVE_MAX_IMAGES + 1];
    int n_images;                    /* counted past the limit, stored up to it */
    char *last_key;                  /* the part of the last call */
    int last_empty;                  /* the last call had no data, at offset 0 */
};

static int grow(uint8_t **p, size_t *len, const char *data, size_t n) {
    uint8_t *q = realloc(*p, *len + n + 1);
    if (!q) return -1;
    memcpy(q + *len, data, n);
    *len += n;
    q[*len] = 0;
    *p = q;
    return 0;
}

static enum MHD_Result on_part(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                               const char *content_type, const char *transfer_encoding, const char *data, uint64_t off,
                               size_t size) {
    (void)kind, (void)content_type, (void)transfer_encoding;
    serve_form *f = cls;
    int is_image = !strcmp(key, "image") || !strcmp(key, "image[]");
    /* a new part starts at offset 0; MHD may first call with no data at
     * offset 0 and then bring the data from offset 0 again */
    int fresh = off == 0 && !(f->last_empty && f->last_key && !strcmp(f->last_key, key));
    free(f->last_key);
    f->last_key = strdup(key);
    f->last_empty = off == 0 && size == 0;
    if (is_image) {
        if (fresh) {
            if (f->n_images++ >= SERVE_MAX_IMAGES) return MHD_YES;   /* counted, refused at finish */
            f->image_names[f->n_images - 1] = serve_upload_name(filename, f->n_images - 1);
        }
        int k = f->n_images - 1;
        if (k >= SERVE_MAX_IMAGES) return MHD_YES;
        if (size && grow(&f->images[k], &f->image_sizes[k], data, size)) f->bad = 1;
        return f->bad ? MHD_NO : MHD_YES;
    }
    if (fresh) {
        if (f->n_fields >= MAX_FIELDS) {
            f->bad = 1;
            return MHD_NO;
        }
        f->keys[f->n_fields] = strdup(key);
        f->values[f->n_fields] = strdup("");
        f->n_fields++;
    }
    int k = f->n_fields - 1;
    if (k < 0 || !f->keys[k] || !f->values[k]) {
        f->bad = 1;
        return MHD_NO;
    }
    if (size && grow((uint8_t **)&f->values[k], &f->value_len[k], data, size)) f->bad = 1;
    return f->bad ? MHD_NO : MHD_YES;
}

serve_form *serve_form_create(struct MHD_Connection *c, size_t max_bytes) {
    serve_form *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->max_bytes = max_bytes;
    f->pp = MHD_create_post_processor(c, 64 * 1024, on_part, f);
    if (!f->pp) {
        free(f);
        return NULL;
    }
    return f;
}

void serve_form_feed(serve_form *f, const char *data, size_t n) {
    f->seen += n;
    if (f->seen > f->max_bytes) f->too_large = 1;
    if (f->too_large || f->bad) return;
    if (MHD_post_process(f->pp, data, n) != MHD_YES) f->bad = 1;
}

int serve_form_finish(serve_form *f, const serve_limits *lim, serve_request *out, serve_error *e) {
    if (f->too_large)
        return serve_error_set(e, 413, "invalid_request_error", NULL,
                               "the request body is over this server's limit of %zu bytes for edits", f->max_bytes);
    if (f->bad)
        return serve_error_set(e, 400, "invalid_request_error", NULL,
                               "the multipart form could not be read (malformed, more than %d fields, or out of memory)",
                               MAX_FIELDS);
    for (int i = 0; i < f->n_fields; i++)
        if (!strcmp(f->keys[i], "mask"))
            return serve_error_set(e, 400, "invalid_request_error", "mask",
                                   "masks are not supported: FLUX.2 edits by reference images and a prompt, not by "
                                   "inpainting");
    for (int i = 0; i < f->n_fields; i++)
        if (strlen(f->values[i]) != f->value_len[i])
            return serve_error_set(e, 400, "invalid_request_error", f->keys[i], "the field '%s' contains a NUL byte",
                                   f->keys[i]);
    int stored = f->n_images < SERVE_MAX_IMAGES ? f->n_images : SERVE_MAX_IMAGES;
    for (int i = 0; i < stored; i++)
        if (!f->images[i])
            return serve_error_set(e, 400, "invalid_request_error", "image", "reference image %d is empty", i + 1);
    /* the display names must tell the references apart (the PNG parameters pair each with its sha256) */
    for (int i = 1; i < stored; i++)
        for (int k = 0; k < i; k++)
            if (f->image_names[i] && f->image_names[k] && !strcmp(f->image_names[i], f->image_names[k])) {
                char *u = malloc(strlen(f->image_names[i]) + 16);
                if (!u) return serve_error_set(e, 500, "server_error", NULL, "out of memory");
                sprintf(u, "%d-%s", i + 1, f->image_names[i]);
                free(f->image_names[i]);
                f->image_names[i] = u;
                break;
            }
    uint8_t **imgs = calloc((size_t)stored + 1, sizeof *imgs);
    size_t *sizes = calloc((size_t)stored + 1, sizeof *sizes);
    char **names = calloc((size_t)stored + 1, sizeof *names);
    if (!imgs || !sizes || !names) {
        free(imgs), free(sizes), free(names);
        return serve_error_set(e, 500, "server_error", NULL, "out of memory");
    }
    memcpy(imgs, f->images, sizeof *imgs * (size_t)stored);
    memcpy(sizes, f->image_sizes, sizeof *sizes * (size_t)stored);
    memcpy(names, f->image_names, sizeof *names * (size_t)stored);
    if (serve_parse_edit(f->keys, f->values, f->n_fields, lim, imgs, sizes, names, f->n_images, out, e)) {
        free(imgs), free(sizes), free(names);
        return -1;
    }
    /* moved into out */
    memset(f->images, 0, sizeof f->images);
    memset(f->image_names, 0, sizeof f->image_names);
    return 0;
}

void serve_form_free(serve_form *f) {
    if (!f) return;
    if (f->pp) MHD_destroy_post_processor(f->pp);
    free(f->last_key);
    for (int i = 0; i < f->n_fields; i++) free(f->keys[i]), free(f->values[i]);
    for (int i = 0; i <= SERVE_MAX_IMAGES; i++) free(f->images[i]), free(f->image_names[i]);
    free(f);
}
