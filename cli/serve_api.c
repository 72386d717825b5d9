/* The images API's request and response bodies (serve_api.h). */
#include "serve_api.h"
#include "core/models/block_cache.h"
#include "kernels/err.h"
#include <jansson.h>
#include <utf8proc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void serve_limits_default(serve_limits *l, const char *model_id) {
    l->model_id = model_id;
    l->max_n = 4;
    l->max_side = 2048;
    l->max_pixels = (int64_t)2048 * 2048;
    l->max_steps = 200;
    l->max_prompt_bytes = 64 * 1024;   /* as a prompts-file line */
}

void serve_request_free(serve_request *r) {
    free(r->prompt);
    free(r->negative_prompt);
    free(r->cache);
    free(r->precision);
    free(r->rng);
    for (int i = 0; i < r->n_images; i++) {
        free(r->images[i]);
        free(r->image_names[i]);
    }
    free(r->images);
    free(r->image_sizes);
    free(r->image_names);
    memset(r, 0, sizeof *r);
}

int serve_error_set(serve_error *e, int status, const char *type, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    /* messages quote what the client sent, and truncation can cut a
     * character: the JSON body must still be UTF-8 */
    serve_utf8_scrub(e->message);
    serve_utf8_scrub(e->param);
    return -1;
}

size_t serve_utf8_check(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return SIZE_MAX;
}

void serve_utf8_scrub(char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) s[i++] = '?';
        else i += (size_t)k;
    }
}

char *serve_error_json(const serve_error *e) {
    json_t *err = json_pack("{s:s, s:s, s:o, s:n}", "message", e->message, "type", e->type ? e->type : "server_error",
                            "param", e->param[0] ? json_string(e->param) : json_null(), "code");
    json_t *root = json_pack("{s:o}", "error", err);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

static int bad(serve_error *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(serve_error *e, const char *param, const char *fmt, ...) {
    char msg[sizeof e->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return serve_error_set(e, 400, "invalid_request_error", param, "%s", msg);
}

/* A JSON string field: no NUL inside (jansson allows \u0000), bounded. */
static int get_text(json_t *v, const char *key, size_t max, char **out, serve_error *e) {
    if (!json_is_string(v)) return bad(e, key, "'%s' must be a string", key);
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    if (memchr(s, 0, n)) return bad(e, key, "'%s' contains a NUL character at byte %zu", key, (size_t)((const char *)memchr(s, 0, n) - s));
    if (n > max) return bad(e, key, "'%s' is %zu bytes long; the limit is %zu", key, n, max);
    if (!(*out = strdup(s))) return serve_error_set(e, 500, "server_error", key, "out of memory");
    return 0;
}

static int get_int(json_t *v, const char *key, long long lo, long long hi, long long *out, serve_error *e) {
    if (!json_is_integer(v)) return bad(e, key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return bad(e, key, "'%s' is %lld; it must be between %lld and %lld", key, x, lo, hi);
    *out = x;
    return 0;
}

/* "WxH": digits, one 'x', digits, nothing else (no sign, space or
 * second 'x'); each side 1 to 5 digits. */
static int parse_wxh(const char *s, int *w, int *h) {
    int v[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        int digits = 0;
        for (; *s >= '0' && *s <= '9'; s++, digits++)
            if (digits < 5) v[k] = v[k] * 10 + (*s - '0');
        if (digits < 1 || digits > 5) return -1;
        if (k == 0 && *s++ != 'x') return -1;
    }
    if (*s) return -1;
    *w = v[0], *h = v[1];
    return 0;
}

static int parse_size(json_t *v, const serve_limits *lim, serve_request *r, serve_error *e) {
    if (!json_is_string(v)) return bad(e, "size", "'size' must be a string \"WIDTHxHEIGHT\" such as \"1024x1024\"");
    const char *s = json_string_value(v);
    if (!strcmp(s, "auto")) return 0;
    int w = 0, h = 0;
    if (parse_wxh(s, &w, &h))
        return bad(e, "size", "'size' is \"%.40s\"; expected \"WIDTHxHEIGHT\" in pixels, such as \"1024x768\"", s);
    if (w < 16 || h < 16 || w % 16 || h % 16)
        return bad(e, "size", "'size' %dx%d: width and height must be positive multiples of 16", w, h);
    if (w > lim->max_side || h > lim->max_side || (int64_t)w * h > lim->max_pixels)
        return bad(e, "size", "'size' %dx%d is larger than this server allows (each side at most %d, at most %lld pixels)",
                   w, h, lim->max_side, (long long)lim->max_pixels);
    r->width = w;
    r->height = h;
    return 0;
}

static int parse_field(const char *key, json_t *v, const serve_limits *lim, serve_request *r, serve_error *e) {
    long long x;
    if (!strcmp(key, "prompt")) return get_text(v, key, lim->max_prompt_bytes, &r->prompt, e);
    if (!strcmp(key, "negative_prompt")) return get_text(v, key, lim->max_prompt_bytes, &r->negative_prompt, e);
    if (!strcmp(key, "n")) {
        if (get_int(v, key, 1, lim->max_n, &x, e)) return -1;
        r->n = (int)x;
        return 0;
    }
    if (!strcmp(key, "size")) return parse_size(v, lim, r, e);
    if (!strcmp(key, "seed")) {
        if (get_int(v, key, 0, INT64_MAX, &x, e)) return -1;
        r->has_seed = 1;
        r->seed = (uint64_t)x;
        return 0;
    }
    if (!strcmp(key, "steps")) {
        if (get_int(v, key, 1, lim->max_steps, &x, e)) return -1;
        r->steps = (int)x;
        return 0;
    }
    if (!strcmp(key, "guidance")) {
        double g = json_number_value(v);
        if (!json_is_number(v) || !isfinite(g) || g < 0 || g > 100)
            return bad(e, key, "'guidance' must be a number between 0 and 100");
        r->has_guidance = 1;
        r->guidance = g;
        return 0;
    }
    if (!strcmp(key, "precision")) {
        const char *p = json_string_value(v);
        if (!p || (strcmp(p, "bf16") && strcmp(p, "f32"))) return bad(e, key, "'precision' must be \"bf16\" or \"f32\"");
        if (!(r->precision = strdup(p))) return serve_error_set(e, 500, "server_error", key, "out of memory");
        return 0;
    }
    if (!strcmp(key, "rng")) {
        const char *p = json_string_value(v);
        if (!p || (strcmp(p, "torch2") && strcmp(p, "torch1"))) return bad(e, key, "'rng' must be \"torch2\" or \"torch1\"");
        if (!(r->rng = strdup(p))) return serve_error_set(e, 500, "server_error", key, "out of memory");
        return 0;
    }
    if (!strcmp(key, "stream")) {   /* the OpenAI client sends false when not streaming */
        if (!json_is_boolean(v) && !json_is_null(v)) return bad(e, key, "'stream' must be true or false");
        r->stream = json_is_true(v);
        return 0;
    }
    if (!strcmp(key, "partial_images")) {   /* OpenAI: 0 to 3; without stream it changes nothing */
        if (json_is_null(v)) return 0;
        if (get_int(v, key, 0, SERVE_MAX_PARTIAL_IMAGES, &x, e)) return -1;
        r->partial_images = (int)x;
        return 0;
    }
    if (!strcmp(key, "cache")) {   /* checked here (key and values); against the model's blocks when rendered */
        const char *p = json_string_value(v);
        bc_spec s;
        if (!p) return bad(e, key, "'cache' must be a string such as \"balanced\" or \"fn=1,threshold=0.08\"");
        if (bc_spec_parse(p, &s)) {
            int rc = bad(e, key, "%s", tp_error_msg());
            tp_error_clear();
            return rc;
        }
        if (!(r->cache = strdup(p))) return serve_error_set(e, 500, "server_error", key, "out of memory");
        return 0;
    }
    if (!strcmp(key, "initial_latents"))
        return bad(e, key, "'initial_latents' is not accepted over HTTP: a server never reads a file a client names; "
                           "start from given latents with tpgen generate --initial-latents FILE[:TENSOR], or send a seed");
    if (!strcmp(key, "response_format")) {
        if (json_is_null(v)) return 0;
        const char *f = json_string_value(v);
        if (f && !strcmp(f, "b64_json")) return 0;
        if (f && !strcmp(f, "url"))
            return bad(e, key, "response_format \"url\" is not supported: this server keeps no files; use \"b64_json\"");
        return bad(e, key, "'response_format' must be \"b64_json\"");
    }
    if (!strcmp(key, "output_format")) {
        const char *f = json_string_value(v);
        if (f && !strcmp(f, "png")) return 0;
        return bad(e, key, "'output_format' must be \"png\": tpgen writes PNG files");
    }
    if (!strcmp(key, "model")) {
        const char *m = json_string_value(v);
        if (!m) return bad(e, key, "'model' must be a string");
        if (strcmp(m, lim->model_id))
            return bad(e, key, "model \"%.100s\" is not served here; this server serves \"%s\" (GET /v1/models)", m,
                       lim->model_id);
        return 0;
    }
    if (!strcmp(key, "user")) {   /* an OpenAI field for abuse tracking: accepted, not used */
        if (!json_is_string(v)) return bad(e, key, "'user' must be a string");
        return 0;
    }
    return bad(e, key,
               "unknown field '%.60s'; accepted: prompt, n, size, response_format, model, user, output_format, stream, "
               "partial_images, seed, steps, guidance, negative_prompt, precision, rng, cache",
               key);
}

int serve_parse_generation(const char *body, size_t len, const serve_limits *lim, serve_request *out,
                           serve_error *e) {
    memset(out, 0, sizeof *out);
    out->n = 1;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return bad(e, NULL, "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = bad(e, NULL, "the request body must be a JSON object such as {\"prompt\": \"a red fox\"}");
    } else {
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v) {
            if ((rc = parse_field(key, v, lim, out, e))) break;
        }
        if (!rc && !out->prompt) rc = bad(e, "prompt", "'prompt' is required");
    }
    json_decref(root);
    if (rc) serve_request_free(out);
    return rc;
}

int serve_parse_edit(char *const *keys, char *const *values, int n, const serve_limits *lim, uint8_t **images,
                     size_t *image_sizes, char **image_names, int n_images, serve_request *out, serve_error *e) {
    memset(out, 0, sizeof *out);
    json_t *root = json_object();
    int rc = 0;
    if (!root) return serve_error_set(e, 500, "server_error", NULL, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        const char *k = keys[i], *v = values[i];
        size_t at;
        if ((at = serve_utf8_check(k, strlen(k))) != SIZE_MAX)
            rc = bad(e, NULL, "a field name of the form is not valid UTF-8 text (at byte %zu)", at);
        else if ((at = serve_utf8_check(v, strlen(v))) != SIZE_MAX)
            rc = bad(e, k, "the field '%s' is not valid UTF-8 text (at byte %zu)", k, at);
        else if (!strcmp(k, "mask"))
            rc = bad(e, "mask", "masks are not supported: FLUX.2 edits by reference images and a prompt, not by inpainting");
        else if (json_object_get(root, k))
            rc = bad(e, k, "the field '%s' is given twice", k);
        if (rc) break;
        /* form values are text: numbers where the API takes numbers, so
         * that the generations checks apply (a non-number stays text and
         * gets their error) */
        char *end;
        json_t *jv = NULL;
        if (!strcmp(k, "n") || !strcmp(k, "steps") || !strcmp(k, "seed") || !strcmp(k, "partial_images")) {
            long long x = strtoll(v, &end, 10);
            if (*v && !*end) jv = json_integer(x);
        } else if (!strcmp(k, "guidance")) {
            double x = strtod(v, &end);
            if (*v && !*end) jv = json_real(x);
        } else if (!strcmp(k, "stream") && (!strcmp(v, "true") || !strcmp(v, "false"))) {
            jv = json_boolean(!strcmp(v, "true"));   /* the openai client's form value of a bool */
        }
        if (json_object_set_new(root, k, jv ? jv : json_string(v)))
            rc = serve_error_set(e, 500, "server_error", NULL, "out of memory");
    }
    char *body = rc ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!rc && !body) rc = serve_error_set(e, 500, "server_error", NULL, "out of memory");
    if (!rc) rc = serve_parse_generation(body, strlen(body), lim, out, e);
    free(body);
    if (!rc && n_images < 1)
        rc = bad(e, "image", "an edit needs at least one reference image (multipart file field 'image' or 'image[]')");
    if (!rc && n_images > SERVE_MAX_IMAGES)
        rc = bad(e, "image", "%d reference images; this server takes at most %d per request", n_images, SERVE_MAX_IMAGES);
    if (rc) {
        serve_request_free(out);
        return -1;
    }
    out->n_images = n_images;
    out->images = images;
    out->image_sizes = image_sizes;
    out->image_names = image_names;
    return 0;
}

char *serve_upload_name(const char *filename, int k) {
    const char *base = filename ? strrchr(filename, '/') : NULL;
    base = base ? base + 1 : filename ? filename : "";
    const char *b2 = strrchr(base, '\\');   /* a Windows client's path */
    if (b2) base = b2 + 1;
    char out[65];
    size_t n = 0;
    for (; *base && n < 64; base++) {
        char c = *base;
        int keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
                   c == '_';
        out[n++] = keep ? c : '_';
    }
    out[n] = 0;
    int empty = 1;
    for (size_t i = 0; i < n; i++)
        if (out[i] != '.' && out[i] != '_') empty = 0;
    char *r = malloc(80);
    if (!r) return NULL;
    if (empty) snprintf(r, 80, "image-%d.png", k + 1);
    else snprintf(r, 80, "%s", out);
    return r;
}

static const char k_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *serve_base64(const uint8_t *p, size_t n) {
    char *s = malloc((n + 2) / 3 * 4 + 1), *o = s;
    if (!s) return NULL;
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *o++ = k_b64[v >> 18];
        *o++ = k_b64[(v >> 12) & 63];
        *o++ = k_b64[(v >> 6) & 63];
        *o++ = k_b64[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
        *o++ = k_b64[v >> 18];
        *o++ = k_b64[(v >> 12) & 63];
        *o++ = i + 1 < n ? k_b64[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o = 0;
    return s;
}

char *serve_images_json(long created, const uint8_t *const *pngs, const size_t *sizes, int n) {
    json_t *data = json_array();
    for (int i = 0; i < n; i++) {
        char *b = serve_base64(pngs[i], sizes[i]);
        if (!b) {
            json_decref(data);
            return NULL;
        }
        json_array_append_new(data, json_pack("{s:s}", "b64_json", b));
        free(b);
    }
    json_t *root = json_pack("{s:I, s:o}", "created", (json_int_t)created, "data", data);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

char *serve_models_json(const char *model_id, long created) {
    json_t *root = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", model_id, "object",
                             "model", "created", (json_int_t)created, "owned_by", "tpgen");
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

int serve_token_equal(const char *given, size_t given_len, const char *expected, size_t expected_len) {
    /* compare over the expected length whatever was given, so the time
     * tells nothing about the first differing byte */
    unsigned diff = given_len != expected_len;
    for (size_t i = 0; i < expected_len; i++) {
        unsigned char g = i < given_len ? (unsigned char)given[i] : 0;
        diff |= g ^ (unsigned char)expected[i];
    }
    return diff == 0;
}
