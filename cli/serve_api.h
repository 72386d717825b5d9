/* `tpgen serve`, the request layer: the OpenAI images API's JSON bodies
 * parsed and validated into a render request, OpenAI-style error bodies, and
 * the responses. No HTTP and no model here (serve_http.c, serve_queue.c).
 *
 * POST /v1/images/generations takes the OpenAI fields `prompt`, `n`, `size`
 * ("WxH"), `response_format` (only "b64_json": a server that names no file
 * path cannot hand out URLs) and `model`, plus tpgen's run-spec keys of the
 * same names: `seed`, `steps`, `guidance`, `negative_prompt`, `precision`,
 * `rng`, `cache` (block caching, docs/cache.md); `stream` (true: server-sent events) and `partial_images` (0..3)
 * as OpenAI streams images. Any other field is a 400 naming it: a typo must not be silently
 * ignored. `initial_latents` is refused with its own message: a server never
 * reads a file a client names. */
#ifndef TPGEN_SERVE_API_H
#define TPGEN_SERVE_API_H
#include <stddef.h>
#include <stdint.h>

/* What the server accepts (from its start-up options and the model). */
typedef struct serve_limits {
    const char *model_id;        /* the id /v1/models lists; `model` must equal it when given */
    int max_n;                   /* images per request */
    int max_side;                /* pixels, each side */
    int64_t max_pixels;          /* width * height */
    int max_steps;
    size_t max_prompt_bytes;
} serve_limits;

void serve_limits_default(serve_limits *l, const char *model_id);

typedef struct serve_request {
    char *prompt;
    char *negative_prompt;       /* NULL: the model's default */
    int n;
    int width, height;           /* 0: the server's default size */
    int has_seed;
    uint64_t seed;               /* image k of the request gets seed + k */
    int steps;                   /* 0: the model's default */
    int has_guidance;
    double guidance;
    char *precision;             /* NULL: the server's */
    char *rng;                   /* "torch2" | "torch1"; NULL: the server's --rng */
    int stream;                  /* answer as server-sent events (serve_stream.h) */
    int partial_images;          /* 0..3: previews of each image while it renders (with stream) */
    char *cache;                 /* --cache SPEC for this request (checked); NULL: the server's --cache */
    /* POST /v1/images/edits: the reference images, in order (their bytes
     * as uploaded; names are display names for the PNG parameters, never
     * paths) */
    int n_images;
    uint8_t **images;
    size_t *image_sizes;
    char **image_names;
} serve_request;

/* partial_images at most (the OpenAI API's bound). */
#define SERVE_MAX_PARTIAL_IMAGES 3

/* References per edit request at most. */
#define SERVE_MAX_IMAGES 10

void serve_request_free(serve_request *r);

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}. */
typedef struct serve_error {
    int status;                  /* HTTP status */
    const char *type;            /* "invalid_request_error", "server_error", ... */
    char param[64];              /* the offending field, "" for none */
    char message[512];
} serve_error;

/* Fill e (status, type, param, printf message) and return -1. */
int serve_error_set(serve_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The offset of the first byte of s[0..n) that is not valid UTF-8, or
 * SIZE_MAX when it all is. */
size_t serve_utf8_check(const char *s, size_t n);
/* Replace each byte of s that is not part of valid UTF-8 with '?'. */
void serve_utf8_scrub(char *s);
/* The JSON body of an error (malloc'ed). */
char *serve_error_json(const serve_error *e);

/* Parse and validate a generations body. 0 ok (*out filled, free with
 * serve_request_free), -1 with *e filled (status 400). */
int serve_parse_generation(const char *body, size_t len, const serve_limits *lim, serve_request *out,
                           serve_error *e);

/* POST /v1/images/edits: the multipart form's text fields (keys[i] =
 * values[i], n of them) as a generations body, with the images added:
 * numbers where the API has numbers, the same checks and errors as
 * serve_parse_generation; at least one image (field image or image[]);
 * a `mask` is refused (FLUX.2 edits by reference, not by inpainting).
 * The image arrays are moved into out on success. */
int serve_parse_edit(char *const *keys, char *const *values, int n, const serve_limits *lim, uint8_t **images,
                     size_t *image_sizes, char **image_names, int n_images, serve_request *out, serve_error *e);
/* A display name for an uploaded file name: its last path part, with
 * characters other than [A-Za-z0-9._-] replaced by '_', at most 64 bytes;
 * "image-K.png" when nothing is left (malloc'ed). */
char *serve_upload_name(const char *filename, int k);

/* The response body: {"created": T, "data": [{"b64_json": ...}, ...]} for
 * n PNG files (malloc'ed). */
char *serve_images_json(long created, const uint8_t *const *pngs, const size_t *sizes, int n);
/* GET /v1/models (malloc'ed). */
char *serve_models_json(const char *model_id, long created);

/* Standard base64 of n bytes (malloc'ed, NUL-terminated). */
char *serve_base64(const uint8_t *p, size_t n);
/* Bearer-token check in time that does not depend on where the strings
 * differ (only on the length of the expected token). */
int serve_token_equal(const char *given, size_t given_len, const char *expected, size_t expected_len);

#endif
