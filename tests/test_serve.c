/* `tpgen serve`'s request layer, queue and HTTP front: request validation
 * (every field, unknown fields, bad JSON), base64 against the RFC 4648 test
 * vectors, the constant-time token check, the queue's 429/503 paths, and
 * the HTTP routes over a real socket. In the HTTP test a thread of the test
 * plays the render loop: it answers each job with bytes derived from its
 * request, so that the test can tell which request got which answer. */
#include "test.h"
#include "cli/serve_api.h"
#include "cli/serve_conn.h"
#include "cli/serve_http.h"
#include "cli/serve_queue.h"
#include "kernels/err.h"
#include <arpa/inet.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static serve_limits limits(void) {
    serve_limits l;
    serve_limits_default(&l, "tiny-klein");
    return l;
}

static int parse(const char *body, serve_request *r, serve_error *e) {
    serve_limits l = limits();
    return serve_parse_generation(body, strlen(body), &l, r, e);
}

TEST(serve_parse_accepts_openai_and_runspec_fields) {
    serve_request r;
    serve_error e;
    int rc = parse("{\"prompt\": \"a red fox\", \"n\": 2, \"size\": \"256x128\", \"response_format\": \"b64_json\", "
                   "\"model\": \"tiny-klein\", \"user\": \"u1\", \"seed\": 7, \"steps\": 3, \"guidance\": 2.5, "
                   "\"negative_prompt\": \"blur\", \"precision\": \"f32\", \"rng\": \"torch1\"}",
                   &r, &e);
    REQUIRE(rc == 0, "rejected: %s", e.message);
    CHECK(!strcmp(r.prompt, "a red fox") && r.n == 2 && r.width == 256 && r.height == 128, "fields");
    CHECK(r.has_seed && r.seed == 7 && r.steps == 3 && r.has_guidance && r.guidance == 2.5, "extensions");
    CHECK(!strcmp(r.negative_prompt, "blur") && !strcmp(r.precision, "f32") && r.rng && !strcmp(r.rng, "torch1"),
          "strings");
    serve_request_free(&r);
    REQUIRE(parse("{\"prompt\": \"\"}", &r, &e) == 0, "empty prompt (a valid FLUX.2 prompt): %s", e.message);
    CHECK(r.n == 1 && r.width == 0 && !r.has_seed && !r.has_guidance && !r.steps, "defaults");
    serve_request_free(&r);
}

TEST(serve_parse_rejects_bad_requests_naming_the_field) {
    static const struct { const char *body, *param, *words; } k[] = {
        {"{\"prompt\": \"x\"", "", "not valid JSON"},
        {"[1, 2]", "", "JSON object"},
        {"{\"n\": 1}", "prompt", "required"},
        {"{\"prompt\": 5}", "prompt", "string"},
        {"{\"prompt\": \"a\\u0000b\"}", "", "not valid JSON"},   /* jansson refuses \\u0000 */
        {"{\"prompt\": \"x\", \"prompt\": \"y\"}", "", "duplicate"},
        {"{\"prompt\": \"x\", \"n\": 0}", "n", "between 1 and 4"},
        {"{\"prompt\": \"x\", \"n\": 1.5}", "n", "integer"},
        {"{\"prompt\": \"x\", \"size\": \"100x100\"}", "size", "multiples of 16"},
        {"{\"prompt\": \"x\", \"size\": \"1024\"}", "size", "WIDTHxHEIGHT"},
        {"{\"prompt\": \"x\", \"size\": \"-16x16\"}", "size", "WIDTHxHEIGHT"},
        {"{\"prompt\": \"x\", \"size\": \"4096x4096\"}", "size", "larger than"},
        {"{\"prompt\": \"x\", \"response_format\": \"url\"}", "response_format", "b64_json"},
        {"{\"prompt\": \"x\", \"model\": \"dall-e-3\"}", "model", "tiny-klein"},
        {"{\"prompt\": \"x\", \"seed\": -1}", "seed", "between"},
        {"{\"prompt\": \"x\", \"steps\": 100000}", "steps", "between"},
        {"{\"prompt\": \"x\", \"guidance\": \"high\"}", "guidance", "number"},
        {"{\"prompt\": \"x\", \"precision\": \"fp8\"}", "precision", "bf16"},
        {"{\"prompt\": \"x\", \"output_format\": \"jpeg\"}", "output_format", "png"},
        {"{\"prompt\": \"x\", \"quality\": \"hd\"}", "quality", "unknown field"},
        {"{\"prompt\": \"x\", \"image\": \"/etc/passwd\"}", "image", "unknown field"},
        {"{\"prompt\": \"x\", \"rng\": \"cuda\"}", "rng", "torch2"},
        /* a server never reads a file a client names */
        {"{\"prompt\": \"x\", \"initial_latents\": \"/etc/passwd\"}", "initial_latents", "never reads a file"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        serve_request r;
        serve_error e;
        int rc = parse(k[i].body, &r, &e);
        CHECK(rc == -1 && e.status == 400, "%s: accepted", k[i].body);
        if (rc) {
            CHECK(!strcmp(e.param, k[i].param), "%s: param '%s', want '%s'", k[i].body, e.param, k[i].param);
            CHECK(strstr(e.message, k[i].words), "%s: message '%s' lacks '%s'", k[i].body, e.message, k[i].words);
        } else {
            serve_request_free(&r);
        }
    }
    /* the error body is OpenAI's shape */
    serve_error e;
    serve_error_set(&e, 400, "invalid_request_error", "size", "bad \"size\"");
    char *js = serve_error_json(&e);
    json_t *root = json_loads(js, 0, NULL);
    json_t *err = json_object_get(root, "error");
    CHECK(err && !strcmp(json_string_value(json_object_get(err, "message")), "bad \"size\"") &&
              !strcmp(json_string_value(json_object_get(err, "type")), "invalid_request_error") &&
              !strcmp(json_string_value(json_object_get(err, "param")), "size"),
          "error body %s", js);
    json_decref(root);
    free(js);
}

TEST(serve_base64_matches_rfc4648_vectors) {
    static const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *want[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        char *b = serve_base64((const uint8_t *)in[i], strlen(in[i]));
        CHECK(b && !strcmp(b, want[i]), "base64(\"%s\") = %s, want %s", in[i], b, want[i]);
        free(b);
    }
}

TEST(serve_token_equal_cases) {
    CHECK(serve_token_equal("secret", 6, "secret", 6), "equal");
    CHECK(!serve_token_equal("secreT", 6, "secret", 6), "last byte");
    CHECK(!serve_token_equal("secre", 5, "secret", 6), "prefix");
    CHECK(!serve_token_equal("secrets", 7, "secret", 6), "longer");
    CHECK(!serve_token_equal("", 0, "secret", 6), "empty");
}

TEST(serve_queue_full_and_closing) {
    serve_queue q;
    serve_queue_init(&q, 2);
    serve_job a = {0}, b = {0}, c = {0};
    serve_error e;
    CHECK(serve_queue_submit(&q, &a, &e) == 0 && serve_queue_submit(&q, &b, &e) == 0, "two fit");
    CHECK(serve_queue_submit(&q, &c, &e) == -1 && e.status == 429, "third: 429, got %d", e.status);
    CHECK(serve_queue_depth(&q) == 2, "depth");
    CHECK(serve_queue_take(&q, 0.01) == &a, "FIFO");
    CHECK(a.id == 1 && b.id == 2, "ids");
    serve_queue_close(&q);
    CHECK(serve_job_finished(&b) && b.status == 503, "queued job answered 503 at close");
    CHECK(serve_queue_submit(&q, &c, &e) == -1 && e.status == 503, "submit after close: 503");
    CHECK(serve_queue_take(&q, 0.01) == NULL, "closed and empty");
    serve_queue_destroy(&q);
}

/* ---- HTTP over a socket ---- */

typedef struct { serve_queue *q; serve_metrics *m; volatile int stop, pause; int served; } fake_loop;

/* plays the render loop: image k of a request is the bytes "PROMPT|SEED+k" */
static void *loop_main(void *p) {
    fake_loop *f = p;
    while (!f->stop) {
        if (f->pause) { usleep(1000); continue; }
        serve_job *j = serve_queue_take(f->q, 0.05);
        if (!j) continue;
        j->n_pngs = j->req.n;
        j->pngs = calloc((size_t)j->n_pngs, sizeof *j->pngs);
        j->png_sizes = calloc((size_t)j->n_pngs, sizeof *j->png_sizes);
        for (int k = 0; k < j->n_pngs; k++) {
            char buf[512];
            int n = snprintf(buf, sizeof buf, "%s|%llu", j->req.prompt, (unsigned long long)(j->req.seed + (uint64_t)k));
            j->pngs[k] = (uint8_t *)strdup(buf);
            j->png_sizes[k] = (size_t)n;
        }
        j->status = 200;
        f->served++;
        serve_job_finish(f->q, j);
    }
    return NULL;
}

/* one HTTP/1.0-style exchange; returns the status, *body the body (malloc'ed) */
static int http(int port, const char *method, const char *path, const char *headers, const char *body, char **out) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(s, (struct sockaddr *)&a, sizeof a)) { close(s); return -1; }
    size_t bl = body ? strlen(body) : 0;
    char *req = xasprintf("%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n", method,
                          path, headers ? headers : "", bl);
    if (write(s, req, strlen(req)) < 0 || (bl && write(s, body, bl) < 0)) { free(req); close(s); return -1; }
    free(req);
    size_t n = 0, cap = 1 << 16;
    char *r = malloc(cap);
    ssize_t k;
    while ((k = read(s, r + n, cap - n - 1)) > 0) {
        n += (size_t)k;
        if (n + 1 >= cap) r = realloc(r, cap *= 2);
    }
    r[n] = 0;
    close(s);
    int status = -1;
    sscanf(r, "HTTP/1.%*d %d", &status);
    char *b = strstr(r, "\r\n\r\n");
    *out = strdup(b ? b + 4 : "");
    free(r);
    return status;
}

static const char *err_param(const char *body) {
    static char p[64];
    json_t *root = json_loads(body, 0, NULL);
    json_t *v = json_object_get(json_object_get(root, "error"), "param");
    snprintf(p, sizeof p, "%s", json_is_string(v) ? json_string_value(v) : "(none)");
    json_decref(root);
    return p;
}

TEST(serve_http_routes_auth_limits_and_queue) {
    serve_queue q;
    serve_metrics m;
    serve_queue_init(&q, 1);
    serve_metrics_init(&m, 2);
    serve_http_config cfg = {.listen = "127.0.0.1:0", .api_key = "k3y", .max_body_bytes = 4096,
                             .max_upload_bytes = 4096, .max_connections = 16,
                             .limits = limits(), .queue = &q, .metrics = &m};
    serve_http *h = serve_http_start(&cfg);
    REQUIRE(h, "start: %s", tp_error_msg());
    int port = serve_http_port(h);
    REQUIRE(port > 0, "port");
    fake_loop f = {.q = &q, .m = &m};
    pthread_t t;
    pthread_create(&t, NULL, loop_main, &f);
    const char *auth = "Authorization: Bearer k3y\r\n";
    char *b = NULL;

    CHECK(http(port, "GET", "/health", NULL, NULL, &b) == 503 && strstr(b, "loading"), "health while loading: %s", b);
    free(b);
    serve_http_set_ready(h, 1);
    CHECK(http(port, "GET", "/health", NULL, NULL, &b) == 200 && strstr(b, "ready"), "health (no key needed): %s", b);
    free(b);
    CHECK(http(port, "GET", "/v1/models", NULL, NULL, &b) == 401, "no key: 401");
    free(b);
    CHECK(http(port, "GET", "/v1/models", "Authorization: Bearer k3z\r\n", NULL, &b) == 401, "wrong key: 401");
    free(b);
    CHECK(http(port, "GET", "/v1/models", auth, NULL, &b) == 200 && strstr(b, "\"tiny-klein\""), "models: %s", b);
    free(b);
    CHECK(http(port, "GET", "/nope", auth, NULL, &b) == 404, "404");
    free(b);
    CHECK(http(port, "GET", "/v1/images/generations", auth, NULL, &b) == 405, "GET on a POST endpoint: 405");
    free(b);
    CHECK(http(port, "POST", "/v1/images/edits", auth, "{}", &b) == 400 && strstr(b, "multipart/form-data"),
          "edits with a JSON body: 400 asking for multipart: %s", b);
    free(b);
    CHECK(http(port, "POST", "/v1/images/generations", auth, "{\"prompt\": \"x\", \"size\": \"10x10\"}", &b) == 400 &&
              !strcmp(err_param(b), "size"), "bad size: 400 naming size: %s", b);
    free(b);
    char *big = malloc(8000);
    memset(big, 'a', 7999);
    big[7999] = 0;
    CHECK(http(port, "POST", "/v1/images/generations", auth, big, &b) == 413, "body over the limit: 413");
    free(b);
    free(big);

    /* two images of one request, seeds 5 and 6, in order */
    int st = http(port, "POST", "/v1/images/generations", auth, "{\"prompt\": \"fox\", \"n\": 2, \"seed\": 5}", &b);
    json_t *root = json_loads(b, 0, NULL);
    json_t *data = json_object_get(root, "data");
    CHECK(st == 200 && json_array_size(data) == 2, "generation: %d %s", st, b);
    if (json_array_size(data) == 2) {
        CHECK(!strcmp(json_string_value(json_object_get(json_array_get(data, 0), "b64_json")), "Zm94fDU="), "image 0");
        CHECK(!strcmp(json_string_value(json_object_get(json_array_get(data, 1), "b64_json")), "Zm94fDY="), "image 1");
    }
    json_decref(root);
    free(b);

    /* queue of 1: with the loop paused, one request waits and the next gets 429 */
    f.pause = 1;
    usleep(200000);   /* longer than the loop's take time-out: it is now paused, not inside a take */
    serve_job held = {0};
    serve_error e;
    serve_parse_generation("{\"prompt\": \"held\"}", 18, &cfg.limits, &held.req, &e);
    CHECK(serve_queue_submit(&q, &held, &e) == 0, "fill the queue");
    CHECK(http(port, "POST", "/v1/images/generations", auth, "{\"prompt\": \"y\"}", &b) == 429, "full queue: 429");
    free(b);
    f.pause = 0;
    serve_job_wait(&q, &held);
    CHECK(held.status == 200 && held.n_pngs == 1, "held job rendered after the pause");
    serve_job_free_result(&held);
    serve_request_free(&held.req);

    CHECK(http(port, "GET", "/metrics", auth, NULL, &b) == 200 && strstr(b, "tpgen_requests_total{outcome=\"ok\"} ") &&
              strstr(b, "tpgen_requests_total{outcome=\"queue_full\"} 1\n") &&
              strstr(b, "tpgen_requests_total{outcome=\"unauthorized\"} 2\n") && strstr(b, "tpgen_queue_depth 0\n") &&
              strstr(b, "tpgen_resident_bytes{rank=\"1\"} 0\n"),
          "metrics: %s", b);
    free(b);
    f.stop = 1;
    pthread_join(t, NULL);
    serve_http_stop(h);
    serve_queue_destroy(&q);
}

TEST(serve_listen_addresses) {
    struct sockaddr_storage ss;
    unsigned len;
    CHECK(serve_parse_listen("127.0.0.1:8080", &ss, &len) == 0 && ss.ss_family == AF_INET, "v4");
    CHECK(serve_parse_listen("[::1]:8080", &ss, &len) == 0 && ss.ss_family == AF_INET6, "v6");
    CHECK(serve_parse_listen("localhost:1", &ss, &len) == 0, "localhost");
    CHECK(serve_parse_listen("8080", &ss, &len) == -1, "no host");
    CHECK(serve_parse_listen("example.com:80", &ss, &len) == -1, "names are refused (numeric only)");
    CHECK(serve_parse_listen("127.0.0.1:70000", &ss, &len) == -1, "port range");
}

/* the edits form's fields become a generations request: numbers where the
 * API has numbers, the same errors; images required, masks refused */
TEST(serve_parse_edit_fields_and_images) {
    serve_limits l = limits();
    serve_error e;
    serve_request r;
    char *keys[] = {"prompt", "seed", "steps", "guidance", "size"}, *vals[] = {"a fox", "12", "3", "2.5", "64x80"};
    uint8_t **imgs = calloc(2, sizeof *imgs);
    size_t *sizes = calloc(2, sizeof *sizes);
    char **names = calloc(2, sizeof *names);
    imgs[0] = (uint8_t *)strdup("PNGDATA");
    sizes[0] = 7;
    names[0] = strdup("fox.png");
    REQUIRE(serve_parse_edit(keys, vals, 5, &l, imgs, sizes, names, 1, &r, &e) == 0, "%s", e.message);
    CHECK(!strcmp(r.prompt, "a fox") && r.has_seed && r.seed == 12 && r.steps == 3 && r.has_guidance &&
              r.guidance == 2.5 && r.width == 64 && r.height == 80 && r.n_images == 1 && r.image_sizes[0] == 7 &&
              !strcmp(r.image_names[0], "fox.png"),
          "fields of the form");
    serve_request_free(&r);
    char *k2[] = {"prompt", "steps"}, *v2[] = {"a", "two"};
    CHECK(serve_parse_edit(k2, v2, 2, &l, NULL, NULL, NULL, 0, &r, &e) == -1 && e.status == 400 &&
              !strcmp(e.param, "steps"), "steps 'two': 400 naming steps, got '%s'", e.param);
    CHECK(serve_parse_edit(k2, v2, 1, &l, NULL, NULL, NULL, 0, &r, &e) == -1 && !strcmp(e.param, "image"),
          "no image: 400 naming image, got '%s'", e.param);
    char *k3[] = {"prompt", "mask"}, *v3[] = {"a", "x"};
    CHECK(serve_parse_edit(k3, v3, 2, &l, NULL, NULL, NULL, 1, &r, &e) == -1 && !strcmp(e.param, "mask"),
          "a mask: 400 naming mask");
    char *k4[] = {"prompt", "prompt"}, *v4[] = {"a", "b"};
    CHECK(serve_parse_edit(k4, v4, 2, &l, NULL, NULL, NULL, 1, &r, &e) == -1 && strstr(e.message, "twice"),
          "a field twice: 400");
    CHECK(serve_parse_edit(k2, v2, 1, &l, NULL, NULL, NULL, SERVE_MAX_IMAGES + 1, &r, &e) == -1 &&
              strstr(e.message, "at most"), "too many references: 400");
}

TEST(serve_upload_names_are_never_paths) {
    const char *in[] = {"fox.png", "../../etc/passwd", "C:\\Users\\me\\cat.jpg", "a b;$(rm).png", "", NULL, "...", "/"};
    const char *want[] = {"fox.png", "passwd", "cat.jpg", "a_b___rm_.png", "image-5.png", "image-6.png", "image-7.png",
                          "image-8.png"};
    for (int i = 0; i < 8; i++) {
        char *n = serve_upload_name(in[i], i);
        CHECK(n && !strcmp(n, want[i]), "upload name %d: '%s' -> '%s', expected '%s'", i, in[i] ? in[i] : "(null)",
              n ? n : "(null)", want[i]);
        free(n);
    }
}
