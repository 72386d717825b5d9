/* `tpgen serve` against hostile clients (issue 21), over a real socket on
 * 127.0.0.1 with a thread of the test playing the render loop: multipart
 * parts without a name, empty parts, invalid UTF-8, the API key checked
 * before any body byte is read, strict sizes, /health not counted. */
#include "test.h"
#include "cli/serve_api.h"
#include "cli/serve_http.h"
#include "cli/serve_queue.h"
#include "kernels/err.h"
#include <arpa/inet.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct { serve_queue *q; volatile int stop; } fake_loop;

/* plays the render loop: a job's single "PNG" is its prompt */
static void *loop_main(void *p) {
    fake_loop *f = p;
    while (!f->stop) {
        serve_job *j = serve_queue_take(f->q, 0.02);
        if (!j) continue;
        j->pngs = calloc(1, sizeof *j->pngs);
        j->png_sizes = calloc(1, sizeof *j->png_sizes);
        j->pngs[0] = (uint8_t *)strdup(j->req.prompt);
        j->png_sizes[0] = strlen(j->req.prompt);
        j->n_pngs = 1;
        j->status = 200;
        serve_job_finish(f->q, j);
    }
    return NULL;
}

typedef struct {
    serve_queue q;
    serve_metrics m;
    serve_http_config cfg;
    serve_http *h;
    fake_loop f;
    pthread_t t;
    int port;
} server;

static int server_start(server *s, const char *key) {
    memset(s, 0, sizeof *s);
    serve_queue_init(&s->q, 8);
    serve_metrics_init(&s->m, 1);
    s->cfg = (serve_http_config){.listen = "127.0.0.1:0", .api_key = key, .max_body_bytes = 4096,
                                 .max_upload_bytes = 1 << 20, .max_connections = 64, .queue = &s->q, .metrics = &s->m};
    serve_limits_default(&s->cfg.limits, "tiny");
    s->h = serve_http_start(&s->cfg);
    if (!s->h) return -1;
    serve_http_set_ready(s->h, 1);
    s->port = serve_http_port(s->h);
    s->f.q = &s->q;
    pthread_create(&s->t, NULL, loop_main, &s->f);
    return 0;
}

static void server_stop(server *s) {
    s->f.stop = 1;
    pthread_join(s->t, NULL);
    serve_http_stop(s->h);
    serve_queue_destroy(&s->q);
}

static int dial(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(s, (struct sockaddr *)&a, sizeof a)) {
        close(s);
        return -1;
    }
    return s;
}

/* Read an answer until the peer closes or timeout_ms passes; the status
 * (-1: none), *out the body (malloc'ed). */
static int read_answer(int s, int timeout_ms, char **out) {
    size_t n = 0, cap = 1 << 16;
    char *r = malloc(cap);
    struct pollfd p = {.fd = s, .events = POLLIN};
    while (poll(&p, 1, timeout_ms) > 0) {
        ssize_t k = read(s, r + n, cap - n - 1);
        if (k <= 0) break;
        n += (size_t)k;
        if (n + 1 >= cap) r = realloc(r, cap *= 2);
    }
    r[n] = 0;
    int status = -1;
    sscanf(r, "HTTP/1.%*d %d", &status);
    char *b = strstr(r, "\r\n\r\n");
    if (out) *out = strdup(b ? b + 4 : "");
    free(r);
    return status;
}

/* POST path with headers and a body of len bytes; the status, *out the body */
static int post(int port, const char *path, const char *headers, const char *body, size_t len, char **out) {
    int s = dial(port);
    if (s < 0) return -1;
    char *req = xasprintf("POST %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n",
                          path, headers ? headers : "", len);
    int st = -1;
    if (write(s, req, strlen(req)) == (ssize_t)strlen(req) && (!len || write(s, body, len) == (ssize_t)len))
        st = read_answer(s, 5000, out);
    free(req);
    close(s);
    return st;
}

static const char *k_form = "Content-Type: multipart/form-data; boundary=XyZ123\r\n";

static int edit(server *s, const char *body, char **out) {
    return post(s->port, "/v1/images/edits", k_form, body, strlen(body), out);
}

static int healthy(server *s) {
    int c = dial(s->port);
    if (c < 0) return 0;
    const char *req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    int st = write(c, req, strlen(req)) == (ssize_t)strlen(req) ? read_answer(c, 2000, NULL) : -1;
    close(c);
    return st == 200;
}

#define PART(name) "--XyZ123\r\nContent-Disposition: form-data; name=\"" name "\"\r\n\r\n"
#define FILEPART(name, file) \
    "--XyZ123\r\nContent-Disposition: form-data; name=\"" name "\"; filename=\"" file "\"\r\nContent-Type: image/png\r\n\r\n"

TEST(serve_form_hostile_parts_are_400s) {
    server s;
    REQUIRE(server_start(&s, NULL) == 0, "start: %s", tp_error_msg());
    char *b = NULL;
    /* the crash of issue 21: a part without Content-Disposition */
    int st = edit(&s, "--XyZ123\r\nContent-Type: text/plain\r\n\r\nnoname\r\n--XyZ123--\r\n", &b);
    CHECK(st == 400 && strstr(b, "no name"), "a part without a name: %d %s", st, b);
    free(b);
    CHECK(healthy(&s), "alive after a nameless part");
    st = edit(&s, PART("prompt") "a fox\r\n--XyZ123\r\n\r\nraw\r\n--XyZ123--\r\n", &b);
    CHECK(st == 400, "a part with no headers at all: %d %s", st, b);
    free(b);
    /* an empty image[] part is its own part, refused, even when the next one has the same name and file name */
    st = edit(&s, PART("prompt") "a fox\r\n" FILEPART("image[]", "a.png") "\r\n" FILEPART("image[]", "a.png")
                  "PNGDATA\r\n--XyZ123--\r\n", &b);
    CHECK(st == 400 && strstr(b, "reference image 1 (a.png) is empty"), "an empty part: %d %s", st, b);
    free(b);
    st = edit(&s, PART("prompt") "a fox\r\n" FILEPART("image", "") "\r\n--XyZ123--\r\n", &b);
    CHECK(st == 400 && strstr(b, "is empty"), "a lone empty image: %d %s", st, b);
    free(b);
    /* invalid UTF-8: 400 naming the field, never 500 */
    st = edit(&s, PART("prompt") "a \xff\xfe fox\r\n" FILEPART("image", "a.png") "PNG\r\n--XyZ123--\r\n", &b);
    CHECK(st == 400 && strstr(b, "\"param\":\"prompt\"") && strstr(b, "UTF-8"), "invalid UTF-8 prompt: %d %s", st, b);
    free(b);
    st = edit(&s, PART("pr\xc3") "x\r\n" FILEPART("image", "a.png") "PNG\r\n--XyZ123--\r\n", &b);
    CHECK(st == 400 && strstr(b, "UTF-8"), "invalid UTF-8 field name: %d %s", st, b);
    free(b);
    st = edit(&s, PART("size") "64x 64\r\n" PART("prompt") "x\r\n" FILEPART("image", "a.png") "PNG\r\n--XyZ123--\r\n", &b);
    CHECK(st == 400 && strstr(b, "\"param\":\"size\""), "size '64x 64' in a form: %d %s", st, b);
    free(b);
    /* a valid form still works: two references with the same name get told apart */
    st = edit(&s, PART("prompt") "a fox\r\n" FILEPART("image[]", "a.png") "PNG1\r\n" FILEPART("image[]", "a.png")
                  "PNG2\r\n--XyZ123--\r\n", &b);
    CHECK(st == 200 && strstr(b, "YSBmb3g="), "a valid edit: %d %s", st, b);   /* base64("a fox") */
    free(b);
    CHECK(healthy(&s), "alive at the end");
    server_stop(&s);
}

/* The JSON error body is UTF-8 even when the message quotes the client's
 * bytes and is cut inside a character. */
TEST(serve_error_bodies_stay_utf8) {
    serve_error e;
    char bad[700];
    memset(bad, 0, sizeof bad);
    for (int i = 0; i + 2 < 690; i += 2) bad[i] = (char)0xc3, bad[i + 1] = (char)0xa9;   /* é x 345 */
    serve_error_set(&e, 400, "invalid_request_error", "model", "model \"%s\" is not served here", bad);
    char *j = serve_error_json(&e);
    CHECK(j != NULL, "a message cut inside a character still makes a JSON body");
    free(j);
    serve_error_set(&e, 400, "invalid_request_error", "\xff\xfe", "bytes \xff here");
    j = serve_error_json(&e);
    CHECK(j && strstr(j, "bytes ? here"), "invalid bytes become '?': %s", j ? j : "(null)");
    free(j);
    CHECK(serve_utf8_check("ok \xc3\xa9", 5) == SIZE_MAX && serve_utf8_check("ok \xc3", 4) == 3 &&
              serve_utf8_check("\xed\xa0\x80", 3) == 0, "serve_utf8_check: valid, cut, surrogate");
}

TEST(serve_size_is_strict_wxh) {
    serve_limits l;
    serve_limits_default(&l, "tiny");
    const char *badv[] = {"64x 64", " 64x64", "64 x64", "64x64 ", "+64x64", "64x+64", "64X64", "64x64x16", "x64",
                          "64x", "-64x64", "123456x64", "6\xc3\xa9" "4x64"};
    for (size_t i = 0; i < sizeof badv / sizeof *badv; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"prompt\": \"a\", \"size\": \"%s\"}", badv[i]);
        serve_request r;
        serve_error e;
        int rc = serve_parse_generation(body, strlen(body), &l, &r, &e);
        CHECK(rc == -1 && e.status == 400 && !strcmp(e.param, "size"), "size \"%s\" refused", badv[i]);
        if (!rc) serve_request_free(&r);
    }
    serve_request r;
    serve_error e;
    const char *good = "{\"prompt\": \"a\", \"size\": \"0064x1024\"}";
    CHECK(serve_parse_generation(good, strlen(good), &l, &r, &e) == 0 && r.width == 64 && r.height == 1024,
          "0064x1024 is 64x1024: %s", e.message);
    serve_request_free(&r);
}

static long long metric(server *s, const char *auth, const char *name) {
    int c = dial(s->port);
    char *req = xasprintf("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n", auth ? auth : "");
    char *b = NULL;
    long long v = -1;
    if (write(c, req, strlen(req)) == (ssize_t)strlen(req) && read_answer(c, 2000, &b) == 200) {
        const char *p = strstr(b, name);
        if (p) v = atoll(p + strlen(name));
    }
    free(b);
    free(req);
    close(c);
    return v;
}

/* With a key: 401 on the headers alone, before any body byte is sent; the
 * Bearer scheme in any case; /health open and not counted. */
TEST(serve_auth_before_the_body) {
    server s;
    REQUIRE(server_start(&s, "k3y") == 0, "start: %s", tp_error_msg());
    int c = dial(s.port);
    REQUIRE(c >= 0, "connect");
    const char *hdr = "POST /v1/images/edits HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=XyZ123\r\n"
                      "Content-Length: 500000000\r\n\r\n";
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st = write(c, hdr, strlen(hdr)) == (ssize_t)strlen(hdr) ? read_answer(c, 3000, NULL) : -1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    CHECK(st == 401 && dt < 2.5, "a 500 MB upload without a key: 401 on the headers alone (got %d after %.2f s)", st, dt);
    close(c);
    c = dial(s.port);
    hdr = "POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Length: 100000000\r\n\r\n";
    st = write(c, hdr, strlen(hdr)) == (ssize_t)strlen(hdr) ? read_answer(c, 3000, NULL) : -1;
    CHECK(st == 401, "a wrong key with a 100 MB body announced: 401 at once, got %d", st);
    close(c);
    const char *js = "{\"prompt\": \"fox\"}";
    const char *ok_auth[] = {"Authorization: Bearer k3y\r\n", "Authorization: bearer k3y\r\n",
                             "Authorization: BEARER   k3y\r\n"};
    for (int i = 0; i < 3; i++) {
        char *b = NULL;
        st = post(s.port, "/v1/images/generations", ok_auth[i], js, strlen(js), &b);
        CHECK(st == 200, "%.*s: %d %s", (int)strlen(ok_auth[i]) - 2, ok_auth[i], st, b);
        free(b);
    }
    const char *bad_auth[] = {"Authorization: Bearerk3y\r\n", "Authorization: Basic k3y\r\n",
                              "Authorization: Bearer k3y2\r\n"};
    for (int i = 0; i < 3; i++) {
        char *b = NULL;
        st = post(s.port, "/v1/images/generations", bad_auth[i], js, strlen(js), &b);
        CHECK(st == 401, "%.*s: 401, got %d", (int)strlen(bad_auth[i]) - 2, bad_auth[i], st);
        free(b);
    }
    for (int i = 0; i < 5; i++) CHECK(healthy(&s), "/health without a key");
    const char *auth = "Authorization: Bearer k3y\r\n";
    long long okn = metric(&s, auth, "tpgen_requests_total{outcome=\"ok\"} ");
    long long unauth = metric(&s, auth, "tpgen_requests_total{outcome=\"unauthorized\"} ");
    long long total = 0;
    const char *outs[] = {"ok", "bad_request", "unauthorized", "not_found", "too_large", "queue_full", "unavailable",
                          "failed"};
    for (int i = 0; i < 8; i++) {
        char name[96];
        snprintf(name, sizeof name, "tpgen_requests_total{outcome=\"%s\"} ", outs[i]);
        total += metric(&s, auth, name);
    }
    CHECK(okn == 3 && unauth == 5 && total == 8, "counted: 3 ok, 5 unauthorized, no /health (got %lld, %lld, %lld)", okn,
          unauth, total);
    server_stop(&s);
}

/* ---- the queue drops work nobody waits for ---- */

static int g_notified;
static void count_done(serve_job *j, void *arg) {
    (void)j;
    __atomic_add_fetch((int *)arg, 1, __ATOMIC_SEQ_CST);
}

/* ---- a job has one owner at a time (serve_queue.h) ---- */

typedef struct { int calls, state, gone; } seen_t;
static void see_done(serve_job *j, void *arg) {
    seen_t *s = arg;
    s->calls++;
    s->state = atomic_load(&j->state);
    s->gone = j->gone;
}

static serve_job *new_job(seen_t *seen) {
    serve_job *j = calloc(1, sizeof *j);
    j->req.prompt = strdup("owned");   /* freed with the job: a leak or a double free shows under ASan */
    j->on_done = see_done;
    j->on_done_arg = seen;
    return j;
}

typedef struct { serve_queue *q; serve_job *j; } finisher_arg;
static void *finisher(void *p) {
    finisher_arg *a = p;
    serve_job_finish(a->q, a->j);
    return NULL;
}

TEST(serve_job_one_owner) {
    serve_queue q;
    serve_queue_init(&q, 8);
    serve_error e;
    /* a refused request frees its own job */
    seen_t seen = {0};
    {
        serve_job *j = new_job(&seen);
        serve_job_release(j);
        CHECK(seen.calls == 0, "a job never submitted: freed by its request, no on_done");
    }
    /* the finisher first: the request answers and frees */
    serve_job *j = new_job(&seen);
    CHECK(serve_queue_submit(&q, j, &e) == 0 && atomic_load(&j->state) == JOB_QUEUED, "queued");
    CHECK(serve_queue_take(&q, 0.01) == j && atomic_load(&j->state) == JOB_RENDERING, "taken: rendering");
    j->status = 200;
    serve_job_finish(&q, j);
    CHECK(seen.calls == 1 && seen.state == JOB_FINISHING && !seen.gone, "on_done runs while the finisher holds it");
    CHECK(atomic_load(&j->state) == JOB_DONE && serve_job_finished(j), "then it is the request's");
    serve_job_release(j);
    /* the request first (its client left mid-render): marked gone, freed by the finisher after on_done */
    seen = (seen_t){0};
    j = new_job(&seen);
    serve_queue_submit(&q, j, &e);
    serve_queue_take(&q, 0.01);
    serve_job_release(j);
    serve_job_finish(&q, j);
    CHECK(seen.calls == 1 && seen.state == (JOB_FINISHING | JOB_RELEASED) && seen.gone, "released first: gone, on_done still told");
    /* a queued job whose request let go: dropped by the queue, freed there */
    seen = (seen_t){0};
    j = new_job(&seen);
    serve_queue_submit(&q, j, &e);
    serve_job_release(j);
    CHECK(serve_queue_drop_abandoned(&q) == 1 && seen.calls == 1 && seen.state == (JOB_FINISHING | JOB_RELEASED),
          "released while queued: dropped and freed by the queue");
    /* both sides let go at once, many times: exactly one frees (ASan/LSan see a double free or a leak) */
    int bad = 0;
    for (int i = 0; i < 400; i++) {
        seen = (seen_t){0};
        j = new_job(&seen);
        serve_queue_submit(&q, j, &e);
        serve_queue_take(&q, 0.01);
        finisher_arg a = {&q, j};
        pthread_t t;
        pthread_create(&t, NULL, finisher, &a);
        serve_job_release(j);
        pthread_join(t, NULL);
        bad += seen.calls != 1;
    }
    CHECK(bad == 0, "racing release and finish: on_done once each time (%d bad)", bad);
    serve_queue_destroy(&q);
}

TEST(serve_queue_drops_abandoned_jobs) {
    serve_queue q;
    serve_queue_init(&q, 8);
    serve_error e;
    serve_job a = {0}, b = {0}, c = {0}, d = {0};
    serve_job *all[] = {&a, &b, &c, &d};
    g_notified = 0;
    for (int i = 0; i < 4; i++) {
        all[i]->on_done = count_done;
        all[i]->on_done_arg = &g_notified;
        CHECK(serve_queue_submit(&q, all[i], &e) == 0, "submit %d", i);
    }
    b.gone = 1;                          /* its client hung up */
    c.deadline = serve_now() - 1;        /* past its deadline */
    CHECK(serve_queue_drop_abandoned(&q) == 2 && serve_queue_depth(&q) == 2, "two dropped, two left");
    CHECK(serve_job_finished(&b) && b.status == 499 && serve_job_finished(&c) && c.status == 504 && strstr(c.err.message, "--request-timeout"),
          "gone: 499, past the deadline: 504 (%d %d)", b.status, c.status);
    CHECK(g_notified == 2, "both waiters told, got %d", g_notified);
    d.gone = 1;                          /* take skips it too */
    CHECK(serve_queue_take(&q, 0.01) == &a, "a is next");
    CHECK(serve_queue_take(&q, 0.01) == NULL && serve_job_finished(&d) && d.status == 499, "d dropped by take, never returned");
    serve_job f = {0};
    f.on_done = count_done;
    f.on_done_arg = &g_notified;
    CHECK(serve_queue_submit(&q, &f, &e) == 0, "submit f");
    serve_queue_close(&q);
    CHECK(serve_job_finished(&f) && f.status == 503 && g_notified == 4, "close: 503 and told (%d)", g_notified);
    CHECK(serve_queue_closed(&q), "closed");
    CHECK(serve_job_abandoned(&a, serve_now()) == 0, "a is still wanted");
    serve_queue_destroy(&q);
}
