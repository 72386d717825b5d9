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
    char *body;                      /* the body as it arrived, up to max_bytes */
    size_t n, cap;
    int too_large, oom;
    serve_error err;                 /* the first problem of a part (status 0: none) */
    char *keys[MAX_FIELDS], *values[MAX_FIELDS];
    size_t value_len[MAX_FIELDS];
    int n_fields;
    uint8_t *images[SERVE_MAX_IMAGES + 1];
    size_t image_sizes[SERVE_MAX_IMAGES + 1];
    char *image_names[SERVE_MAX_IMAGES + 1];
    int n_images;                    /* counted past the limit, stored up to it */
    int in_image;                    /* the current part is an image (1) or a field (0), -1 before any */
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

static enum MHD_Result refuse(serve_form *f, const char *param, const char *msg) {
    if (!f->err.status) serve_error_set(&f->err, 400, "invalid_request_error", param, "%s", msg);
    return MHD_NO;
}

static enum MHD_Result out_of_memory(serve_form *f) {
    f->oom = 1;
    return MHD_NO;
}

/* Called once per part at offset 0 (the whole body is given in one call,
 * serve_form.h), then at later offsets for the rest of a long part. key,
 * filename and content type are whatever the client sent: any may be NULL. */
static enum MHD_Result on_part(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                               const char *content_type, const char *transfer_encoding, const char *data, uint64_t off,
                               size_t size) {
    (void)kind, (void)content_type, (void)transfer_encoding;
    serve_form *f = cls;
    if (!key || !*key)
        return refuse(f, NULL, "a part of the multipart form has no name (each part needs a header "
                               "'Content-Disposition: form-data; name=\"FIELD\"')");
    if (size && !data) return refuse(f, key, "a part of the multipart form could not be read");
    int is_image = !strcmp(key, "image") || !strcmp(key, "image[]");
    if (off == 0) {   /* a new part */
        f->in_image = is_image;
        if (is_image) {
            if (f->n_images++ >= SERVE_MAX_IMAGES) return MHD_YES;   /* counted, refused at finish */
            int k = f->n_images - 1;
            if (!(f->image_names[k] = serve_upload_name(filename, k))) return out_of_memory(f);
        } else {
            if (f->n_fields >= MAX_FIELDS) return refuse(f, NULL, "the multipart form has more than 32 fields");
            int k = f->n_fields;
            f->keys[k] = strdup(key);
            f->values[k] = strdup("");
            f->n_fields++;   /* counted now, so that free releases whatever was allocated */
            if (!f->keys[k] || !f->values[k]) return out_of_memory(f);
        }
    } else if (f->in_image != is_image) {
        return refuse(f, key, "the multipart form's parts are out of order");
    }
    if (is_image) {
        int k = f->n_images - 1;
        if (k >= SERVE_MAX_IMAGES) return MHD_YES;
        if (size && grow(&f->images[k], &f->image_sizes[k], data, size)) return out_of_memory(f);
        return MHD_YES;
    }
    int k = f->n_fields - 1;
    if (k < 0 || strcmp(f->keys[k], key)) return refuse(f, key, "the multipart form's parts are out of order");
    if (size && grow((uint8_t **)&f->values[k], &f->value_len[k], data, size)) return out_of_memory(f);
    return MHD_YES;
}

serve_form *serve_form_create(struct MHD_Connection *c, size_t max_bytes) {
    serve_form *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->max_bytes = max_bytes;
    f->in_image = -1;
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
    if (f->too_large || f->oom) {
        free(f->body);   /* nothing of it is used: answered 413 (or 500) */
        f->body = NULL;
        f->n = f->cap = 0;
        return;
    }
    if (f->n + n > f->cap) {
        size_t cap = f->cap ? f->cap : 64 * 1024;
        while (cap < f->n + n) cap *= 2;
        if (cap > f->max_bytes) cap = f->max_bytes;
        char *b = realloc(f->body, cap);
        if (!b) {
            f->oom = 1;
            return;
        }
        f->body = b;
        f->cap = cap;
    }
    memcpy(f->body + f->n, data, n);
    f->n += n;
}

/* A field's value is text: no NUL (UTF-8 is checked by serve_parse_edit). */
static int check_text(const serve_form *f, int i, serve_error *e) {
    if (strlen(f->values[i]) != f->value_len[i])
        return serve_error_set(e, 400, "invalid_request_error", f->keys[i], "the field '%s' contains a NUL byte",
                               f->keys[i]);
    return 0;
}

int serve_form_finish(serve_form *f, const serve_limits *lim, serve_request *out, serve_error *e) {
    memset(out, 0, sizeof *out);
    if (f->too_large)
        return serve_error_set(e, 413, "invalid_request_error", NULL,
                               "the request body is over this server's limit of %zu bytes for edits", f->max_bytes);
    int done = f->oom ? MHD_NO : MHD_post_process(f->pp, f->body ? f->body : "", f->n);
    free(f->body);
    f->body = NULL;
    if (f->oom) return serve_error_set(e, 500, "server_error", NULL, "out of memory reading the multipart form");
    if (f->err.status) {
        *e = f->err;
        return -1;
    }
    if (done != MHD_YES)
        return serve_error_set(e, 400, "invalid_request_error", NULL, "the multipart form could not be read (malformed)");
    for (int i = 0; i < f->n_fields; i++)
        if (!strcmp(f->keys[i], "mask"))
            return serve_error_set(e, 400, "invalid_request_error", "mask",
                                   "masks are not supported: FLUX.2 edits by reference images and a prompt, not by "
                                   "inpainting");
    for (int i = 0; i < f->n_fields; i++)
        if (check_text(f, i, e)) return -1;
    int stored = f->n_images < SERVE_MAX_IMAGES ? f->n_images : SERVE_MAX_IMAGES;
    for (int i = 0; i < stored; i++)
        if (!f->images[i])
            return serve_error_set(e, 400, "invalid_request_error", "image", "reference image %d (%s) is empty", i + 1,
                                   f->image_names[i]);
    /* the display names must tell the references apart (the PNG parameters pair each with its sha256) */
    for (int i = 1; i < stored; i++)
        for (int k = 0; k < i; k++)
            if (!strcmp(f->image_names[i], f->image_names[k])) {
                size_t len = strlen(f->image_names[i]) + 16;
                char *u = malloc(len);
                if (!u) return serve_error_set(e, 500, "server_error", NULL, "out of memory");
                snprintf(u, len, "%d-%s", i + 1, f->image_names[i]);
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
    free(f->body);
    for (int i = 0; i < f->n_fields; i++) free(f->keys[i]), free(f->values[i]);
    for (int i = 0; i <= SERVE_MAX_IMAGES; i++) free(f->images[i]), free(f->image_names[i]);
    free(f);
}
