/* `tpgen serve`'s streamed answers (cli/serve_stream.h): the request fields
 * stream and partial_images (JSON and the edit form), the steps that get a
 * partial image, the server-sent events' bytes parsed back as JSON with the
 * fields of openai-python's event types, the order of n > 1 images, the
 * error event, and the bound a slow reader meets (a partial dropped while
 * an earlier one waits). The stream is read as libmicrohttpd reads it,
 * through serve_stream_read, without a connection. */
#include "test.h"
#include "cli/serve_api.h"
#include "cli/serve_render.h"
#include "cli/serve_stream.h"
#include "core/image/png.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

TEST(serve_stream_request_fields) {
    serve_limits l;
    serve_limits_default(&l, "tiny");
    serve_request r;
    serve_error e;
    const char *ok = "{\"prompt\": \"a\", \"stream\": true, \"partial_images\": 3}";
    REQUIRE(serve_parse_generation(ok, strlen(ok), &l, &r, &e) == 0, "%s", e.message);
    CHECK(r.stream == 1 && r.partial_images == 3, "stream %d partial_images %d", r.stream, r.partial_images);
    serve_request_free(&r);
    const char *off = "{\"prompt\": \"a\", \"stream\": false, \"partial_images\": null}";
    REQUIRE(serve_parse_generation(off, strlen(off), &l, &r, &e) == 0, "%s", e.message);
    CHECK(r.stream == 0 && r.partial_images == 0, "stream false, partial_images null");
    serve_request_free(&r);
    const char *bad[][2] = {{"{\"prompt\": \"a\", \"stream\": \"yes\"}", "stream"},
                            {"{\"prompt\": \"a\", \"stream\": 1}", "stream"},
                            {"{\"prompt\": \"a\", \"partial_images\": 4}", "partial_images"},
                            {"{\"prompt\": \"a\", \"partial_images\": -1}", "partial_images"},
                            {"{\"prompt\": \"a\", \"partial_images\": 1.5}", "partial_images"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(serve_parse_generation(bad[i][0], strlen(bad[i][0]), &l, &r, &e) == -1 && e.status == 400 &&
                  !strcmp(e.param, bad[i][1]),
              "%s: 400 naming %s (got '%s')", bad[i][0], bad[i][1], e.param);
    /* the openai client's form values: "true", "3" */
    char *keys[] = {"prompt", "stream", "partial_images"}, *vals[] = {"a", "true", "2"};
    uint8_t **imgs = calloc(1, sizeof *imgs);
    size_t *sizes = calloc(1, sizeof *sizes);
    char **names = calloc(1, sizeof *names);
    imgs[0] = (uint8_t *)strdup("x"), sizes[0] = 1, names[0] = strdup("a.png");
    REQUIRE(serve_parse_edit(keys, vals, 3, &l, imgs, sizes, names, 1, &r, &e) == 0, "%s", e.message);
    CHECK(r.stream == 1 && r.partial_images == 2, "edit form: stream %d partial_images %d", r.stream, r.partial_images);
    serve_request_free(&r);
    char *v2[] = {"a", "True", "2"};
    CHECK(serve_parse_edit(keys, v2, 3, &l, NULL, NULL, NULL, 1, &r, &e) == -1 && !strcmp(e.param, "stream"),
          "edit form stream=True: 400 naming stream");
}

TEST(serve_stream_partial_steps_evenly_spaced) {
    /* written out: floor(k·steps/(P+1)), k = 1..P, kept within 1..steps-1 */
    struct { int steps, partials, want[3], n; } c[] = {
        {4, 3, {1, 2, 3}, 3}, {4, 1, {2}, 1}, {50, 3, {12, 25, 37}, 3}, {2, 3, {1}, 1}, {1, 3, {0}, 0}, {4, 0, {0}, 0},
        {28, 2, {9, 18}, 2}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        int got[64], n = 0;
        for (int s = 1; s <= c[i].steps; s++)
            if (serve_partial_step(s, c[i].steps, c[i].partials) && n < 64) got[n++] = s;
        int same = n == c[i].n;
        for (int k = 0; same && k < n; k++) same = got[k] == c[i].want[k];
        CHECK(same, "%d steps, %d partials: %d partial steps (want %d)", c[i].steps, c[i].partials, n, c[i].n);
    }
}

static uint8_t *test_png(int w, int h, size_t *n) {
    uint8_t *rgb = calloc((size_t)w * h * 3, 1), *png = NULL;
    for (int i = 0; i < w * h * 3; i++) rgb[i] = (uint8_t)(i * 7);
    if (png_encode_rgb(rgb, w, h, NULL, NULL, &png, n)) png = NULL;
    free(rgb);
    return png;
}

/* everything the stream has now, split into events: [type, parsed data] */
static int read_events(serve_stream *s, char types[][48], json_t **data, int max, int *ended) {
    char buf[1 << 16];
    size_t total = 0, cap = 1 << 20;
    char *all = malloc(cap);
    ssize_t k;
    *ended = 0;
    while ((k = serve_stream_read(s, 0, buf, 1000)) > 0) {   /* small reads: events split across them */
        if (total + (size_t)k + 1 > cap) all = realloc(all, cap *= 2);
        memcpy(all + total, buf, (size_t)k);
        total += (size_t)k;
    }
    if (k == MHD_CONTENT_READER_END_OF_STREAM) *ended = 1;
    all[total] = 0;
    int n = 0;
    for (char *p = all; *p && n < max;) {
        char *end = strstr(p, "\n\n");
        if (!end || strncmp(p, "event: ", 7)) break;
        *end = 0;
        char *nl = strchr(p, '\n');
        if (!nl || strncmp(nl + 1, "data: ", 6)) break;
        snprintf(types[n], 48, "%.*s", (int)(nl - p - 7), p + 7);
        data[n++] = json_loads(nl + 7, 0, NULL);
        p = end + 2;
    }
    free(all);
    return n;
}

TEST(serve_stream_events_order_and_fields) {
    size_t n1, n2;
    uint8_t *a = test_png(32, 16, &n1), *b = test_png(32, 16, &n2);
    REQUIRE(a && b, "test PNGs");
    serve_stream *s = serve_stream_new(0);
    /* n = 2, two partials each: read after every push (a reader keeping up) */
    char types[16][48];
    json_t *d[16];
    int n = 0, ended = 0;
    for (int img = 0; img < 2; img++) {
        for (int p = 0; p < 2; p++) {
            serve_stream_image(s, 0, img, a, n1);
            n += read_events(s, types + n, d + n, 16 - n, &ended);
        }
        serve_stream_image(s, 1, img, b, n2);
        n += read_events(s, types + n, d + n, 16 - n, &ended);
    }
    CHECK(!ended, "not ended before serve_stream_end");
    serve_stream_end(s, 200, NULL);
    n += read_events(s, types + n, d + n, 16 - n, &ended);
    CHECK(ended && n == 6, "6 events then the end (%d, ended %d)", n, ended);
    const char *want[] = {"partial_image", "partial_image", "completed"};
    for (int i = 0; i < n; i++) {
        char t[64];
        snprintf(t, sizeof t, "image_generation.%s", want[i % 3]);
        json_t *x = d[i];
        const char *b64 = json_string_value(json_object_get(x, "b64_json"));
        char *expect = serve_base64(i % 3 == 2 ? b : a, i % 3 == 2 ? n2 : n1);
        CHECK(x && !strcmp(types[i], t) && !strcmp(json_string_value(json_object_get(x, "type")), t) &&
                  !strcmp(json_string_value(json_object_get(x, "size")), "32x16") &&
                  !strcmp(json_string_value(json_object_get(x, "output_format")), "png") &&
                  json_is_integer(json_object_get(x, "created_at")) && b64 && !strcmp(b64, expect) &&
                  json_is_string(json_object_get(x, "background")) && json_is_string(json_object_get(x, "quality")),
              "event %d: %s with the fields of the API", i, types[i]);
        if (i % 3 < 2)
            CHECK(json_integer_value(json_object_get(x, "partial_image_index")) == i % 3,
                  "event %d: partial_image_index %d (from 0 for each image)", i, i % 3);
        else
            CHECK(json_is_object(json_object_get(x, "usage")) &&
                      json_is_integer(json_object_get(json_object_get(x, "usage"), "total_tokens")),
                  "event %d: usage", i);
        free(expect);
        json_decref(x);
    }
    serve_stream_free(s);
    free(a), free(b);
}

TEST(serve_stream_slow_reader_and_errors) {
    size_t n1;
    uint8_t *a = test_png(16, 16, &n1);
    REQUIRE(a, "test PNG");
    serve_stream *s = serve_stream_new(1);
    /* nobody reads: three partials and the completed image of one image */
    for (int p = 0; p < 3; p++) serve_stream_image(s, 0, 0, a, n1);
    serve_stream_image(s, 1, 0, a, n1);
    int events, dropped;
    serve_stream_counts(s, &events, &dropped);
    CHECK(events == 2 && dropped == 2, "a reader that is behind: 1 partial kept, 2 dropped, the completed kept "
          "(%d events, %d dropped)", events, dropped);
    serve_error e;
    serve_error_set(&e, 500, "server_error", NULL, "rendering failed: boom");
    serve_stream_end(s, 500, &e);
    serve_stream_image(s, 1, 1, a, n1);   /* after the end: ignored */
    char types[8][48];
    json_t *d[8];
    int ended;
    int n = read_events(s, types, d, 8, &ended);
    CHECK(n == 3 && ended && !strcmp(types[0], "image_edit.partial_image") &&
              json_integer_value(json_object_get(d[0], "partial_image_index")) == 0 &&
              !strcmp(types[1], "image_edit.completed") && !strcmp(types[2], "error"),
          "edit events, then the error event, then the end (%d events)", n);
    json_t *err = n == 3 ? json_object_get(d[2], "error") : NULL;
    CHECK(err && !strcmp(json_string_value(json_object_get(d[2], "type")), "error") &&
              !strcmp(json_string_value(json_object_get(err, "message")), "rendering failed: boom") &&
              !strcmp(json_string_value(json_object_get(err, "type")), "server_error") &&
              json_is_null(json_object_get(err, "param")),
          "the error event carries the error body (openai-python raises APIError on it)");
    for (int i = 0; i < n; i++) json_decref(d[i]);
    serve_stream_free(s);
    free(a);
}
