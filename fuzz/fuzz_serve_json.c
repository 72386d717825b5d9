/* libFuzzer harness: `tpgen serve`'s request parsers without HTTP. The
 * first byte picks the parser: even, the bytes after it as a
 * POST /v1/images/generations JSON body (serve_parse_generation); odd,
 * as the text fields of an edits form, one "key=value" per line (NUL
 * bytes kept), with (byte >> 1) % 12 reference images
 * (serve_parse_edit). Accepted requests keep stream boolean and
 * partial_images within 0..3 (the fields of a streamed answer). Every refusal must be a 4xx with a JSON error body;
 * a 5xx from request bytes is a finding (abort), except "out of memory"
 * under libFuzzer's malloc limit. */
#include "cli/serve_api.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEYS 40

static void check(int rc, const serve_request *r, const serve_error *e) {
    if (rc == 0) {
        if (!r->prompt || r->n < 1) {
            fprintf(stderr, "accepted without a prompt or n\n");
            abort();
        }
        /* the streaming fields (serve_stream.h): a boolean, and 0..3 partials */
        if ((r->stream != 0 && r->stream != 1) || r->partial_images < 0 || r->partial_images > SERVE_MAX_PARTIAL_IMAGES) {
            fprintf(stderr, "accepted stream %d, partial_images %d\n", r->stream, r->partial_images);
            abort();
        }
        return;
    }
    if (e->status >= 500 && !strstr(e->message, "out of memory")) {
        fprintf(stderr, "a %d from request bytes: %s\n", e->status, e->message);
        abort();
    }
    if (e->status < 400 || e->status > 599) {
        fprintf(stderr, "refused with status %d: %s\n", e->status, e->message);
        abort();
    }
    char *body = serve_error_json(e);
    json_t *back = body ? json_loads(body, 0, NULL) : NULL;
    if (body && !back) {   /* NULL body: out of memory, answered 500 by serve_http */
        fprintf(stderr, "the error body is not JSON: %s\n", body);
        abort();
    }
    json_decref(back);
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    serve_limits lim;
    serve_limits_default(&lim, "tiny");
    serve_request r;
    serve_error e = {0};
    if (!(data[0] & 1)) {
        int rc = serve_parse_generation((const char *)data + 1, size - 1, &lim, &r, &e);
        check(rc, &r, &e);
        if (!rc) serve_request_free(&r);
        return 0;
    }
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    char *keys[MAX_KEYS], *values[MAX_KEYS];
    int n = 0;
    for (char *line = text, *next; line && n < MAX_KEYS; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        char *eq = strchr(line, '=');
        if (!eq) continue;
        *eq = 0;
        keys[n] = line, values[n] = eq + 1, n++;
    }
    int n_images = (data[0] >> 1) % 12;
    uint8_t **imgs = calloc((size_t)n_images + 1, sizeof *imgs);
    size_t *sizes = calloc((size_t)n_images + 1, sizeof *sizes);
    char **names = calloc((size_t)n_images + 1, sizeof *names);
    for (int i = 0; imgs && sizes && names && i < n_images; i++) {
        imgs[i] = (uint8_t *)strdup("PNG");
        sizes[i] = 3;
        names[i] = serve_upload_name(NULL, i);
    }
    if (imgs && sizes && names) {
        int rc = serve_parse_edit(keys, values, n, &lim, imgs, sizes, names, n_images, &r, &e);
        check(rc, &r, &e);
        if (!rc) {
            serve_request_free(&r);   /* owns the images now */
            imgs = NULL, sizes = NULL, names = NULL;
            n_images = 0;
        }
    }
    for (int i = 0; i < n_images; i++) {
        if (imgs) free(imgs[i]);
        if (names) free(names[i]);
    }
    free(imgs), free(sizes), free(names);
    free(text);
    return 0;
}
