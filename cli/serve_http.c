/* The HTTP front of `tpgen serve` (serve_http.h) on libmicrohttpd: one
 * epoll polling thread serves every connection and never blocks; a
 * request waiting for its render is a suspended connection
 * (serve_conn.c), answered when MHD calls the handler again. */
#include "serve_http.h"
#include "serve_conn.h"
#include "serve_form.h"
#include "serve_stream.h"
#include "serve_ui.h"
#include "kernels/err.h"
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct serve_http {
    const serve_http_config *cfg;
    struct MHD_Daemon *d;
    serve_conns conns;
    volatile int ready;
    int active;                  /* requests being answered (atomic) */
    long started;
    int port;
};

/* per-request state kept by MHD between the calls of one request */
typedef struct req_ctx {
    char *body;
    size_t n, cap;
    int too_large;
    serve_form *form;            /* POST /v1/images/edits: the multipart body */
    int not_form;                /* edits without a multipart body */
    int answered;                /* a response was queued on the first call (401) */
    serve_conn *cn;              /* the connection's record */
    serve_job *job;              /* queued: answered once it is finished */
} req_ctx;

static const char k_oom_body[] =
    "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";

/* Answer with body (malloc'ed, taken over; NULL: out of memory, answered
 * 500 from a static body). m NULL: not counted (/health, /metrics). */
static enum MHD_Result send_body(struct MHD_Connection *c, serve_metrics *m, int status, const char *type,
                                 char *body) {
    struct MHD_Response *r = NULL;
    if (body) {
        r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
        if (!r) free(body);
    }
    if (!r) {
        status = 500;
        type = "application/json";
        r = MHD_create_response_from_buffer(sizeof k_oom_body - 1, (void *)k_oom_body, MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;   /* MHD closes the connection */
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "5");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    if (m) serve_metrics_count(m, serve_outcome_of(status));
    return ok;
}

static enum MHD_Result send_error(struct MHD_Connection *c, serve_metrics *m, const serve_error *e) {
    return send_body(c, m, e->status, "application/json", serve_error_json(e));
}

/* A file of the page (GET / and /ui/...), or NULL; not counted as a request. */
static const serve_ui_asset *ui_file(const serve_http *h, const char *url, const char *method) {
    return h->cfg->no_ui || strcmp(method, "GET") ? NULL : serve_ui_find(url);
}

static enum MHD_Result send_ui(struct MHD_Connection *c, const serve_ui_asset *a) {
    struct MHD_Response *r = MHD_create_response_from_buffer(a->size, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", a->type);
    for (int i = 0; serve_ui_headers[i]; i += 2) MHD_add_response_header(r, serve_ui_headers[i], serve_ui_headers[i + 1]);
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* "Authorization: Bearer TOKEN", the scheme in any case (RFC 7235). */
static int authorized(const serve_http *h, struct MHD_Connection *c) {
    const char *key = h->cfg->api_key;
    if (!key) return 1;
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!v || strncasecmp(v, "Bearer", 6) || (v[6] != ' ' && v[6] != '\t')) return 0;
    v += 6;
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    return serve_token_equal(v, n, key, strlen(key));
}

/* 48 random bits: the seed of a request that names none (any seed is
 * valid; 48 bits print short and survive a JSON double) */
static uint64_t random_seed(void) {
    uint64_t x = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&x, sizeof x, 1, f) != 1) x = (uint64_t)time(NULL) * 6364136223846793005ull;
    if (f) fclose(f);
    return x & ((1ull << 48) - 1);
}

/* The answer of a streamed request, sent at once: 200 and server-sent
 * events as the render pushes them (serve_stream.h); errors from here on
 * are an error event. */
static enum MHD_Result start_stream(struct MHD_Connection *c, serve_job *j) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, serve_stream_read,
                                                               j->stream, NULL);
    if (!r) return MHD_NO;   /* MHD closes the connection: the job is then gone */
    serve_stream_attach(j->stream, c);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");   /* a proxy in front must not hold the events back */
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* Queue a parsed request; its connection is suspended until the job is
 * finished, then answer() sends the result (a stream answers at once). */
static enum MHD_Result submit(serve_http *h, struct MHD_Connection *c, req_ctx *rc, serve_job *j, int edit) {
    const serve_http_config *cfg = h->cfg;
    serve_error e;
    if (!j->req.has_seed) {   /* a request without a seed gets a fresh one, recorded in the PNG */
        j->req.seed = random_seed();
        j->req.has_seed = 1;
    }
    if (j->req.stream && !(j->stream = serve_stream_new(edit))) {
        serve_job_release(j);
        return send_body(c, cfg->metrics, 500, "application/json", NULL);
    }
    if (serve_conn_submit(&h->conns, rc->cn, c, j, !j->stream, &e)) {
        serve_job_release(j);
        return send_error(c, cfg->metrics, &e);
    }
    rc->job = j;
    return j->stream ? start_stream(c, j) : MHD_YES;
}

static enum MHD_Result answer(serve_http *h, struct MHD_Connection *c, req_ctx *rc) {
    const serve_http_config *cfg = h->cfg;
    serve_job *j = rc->job;
    rc->job = NULL;
    enum MHD_Result ok;
    if (j->status == 200)
        ok = send_body(c, cfg->metrics, 200, "application/json",
                       serve_images_json((long)time(NULL), (const uint8_t *const *)j->pngs, j->png_sizes, j->n_pngs));
    else
        ok = send_error(c, cfg->metrics, &j->err);
    serve_job_release(j);
    return ok;
}

static enum MHD_Result generations(serve_http *h, struct MHD_Connection *c, req_ctx *rc) {
    const serve_http_config *cfg = h->cfg;
    serve_error e;
    serve_job *j = calloc(1, sizeof *j);
    if (!j) return send_body(c, cfg->metrics, 500, "application/json", NULL);
    if (serve_parse_generation(rc->body ? rc->body : "", rc->n, &cfg->limits, &j->req, &e)) {
        free(j);
        return send_error(c, cfg->metrics, &e);
    }
    return submit(h, c, rc, j, 0);
}

static enum MHD_Result edits(serve_http *h, struct MHD_Connection *c, req_ctx *rc) {
    const serve_http_config *cfg = h->cfg;
    serve_error e;
    serve_job *j = calloc(1, sizeof *j);
    if (!j) return send_body(c, cfg->metrics, 500, "application/json", NULL);
    if (serve_form_finish(rc->form, &cfg->limits, &j->req, &e)) {
        free(j);
        return send_error(c, cfg->metrics, &e);
    }
    return submit(h, c, rc, j, 1);
}

/* The first call of a request: its headers are in, no body byte read yet.
 * A wrong key is refused here (401). */
static enum MHD_Result first_call(serve_http *h, struct MHD_Connection *c, const char *url, const char *method,
                                  req_ctx *rc) {
    const serve_http_config *cfg = h->cfg;
    serve_error e;
    rc->cn = serve_conn_of(c);
    serve_conn_request_started(&h->conns, rc->cn);
    int edit = !strcmp(url, "/v1/images/edits") && !strcmp(method, "POST");
    /* the key before any body byte is read: a stranger's upload is
     * answered at once and never buffered (MHD then closes the
     * connection, discarding the rest of the body) */
    /* the page loads without the key (it holds no data, and calls nothing without one) */
    if (strcmp(url, "/health") && !ui_file(h, url, method) && !authorized(h, c)) {
        rc->answered = 1;
        serve_error_set(&e, 401, "invalid_request_error", NULL,
                        "missing or wrong API key: send the header 'Authorization: Bearer KEY'");
        return send_error(c, cfg->metrics, &e);
    }
    /* a body over the limit is read and counted, not kept, and answered
     * 413 at its end: an answer before the body would reach many clients
     * (Python's urllib among them) as a broken pipe instead of a 413 */
    if (edit) {
        rc->form = serve_form_create(c, cfg->max_upload_bytes);
        rc->not_form = !rc->form;
    }
    return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version;
    serve_http *h = cls;
    const serve_http_config *cfg = h->cfg;
    req_ctx *rc = *state;
    if (!rc) {   /* first call: headers only */
        rc = calloc(1, sizeof *rc);
        if (!rc) return MHD_NO;
        *state = rc;
        __atomic_add_fetch(&h->active, 1, __ATOMIC_SEQ_CST);
        return first_call(h, c, url, method, rc);
    }
    if (rc->answered) {   /* answered on the first call: nothing more is read */
        *upload_size = 0;
        return MHD_YES;
    }
    if (rc->job && rc->job->stream) return MHD_YES;   /* streaming: the reader sends */
    if (rc->job) {   /* resumed: the job is finished (never called while suspended, but be sure) */
        if (!serve_job_finished(rc->job)) return MHD_YES;
        return answer(h, c, rc);
    }
    if (*upload_size && rc->form) {
        serve_form_feed(rc->form, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {   /* body data: keep up to the limit, count the rest */
        if (rc->n + *upload_size > cfg->max_body_bytes) rc->too_large = 1;
        if (!rc->too_large) {
            if (rc->n + *upload_size + 1 > rc->cap) {
                size_t cap = (rc->n + *upload_size + 1) * 2;
                if (cap > cfg->max_body_bytes + 1) cap = cfg->max_body_bytes + 1;
                char *b = realloc(rc->body, cap);
                if (!b) return MHD_NO;
                rc->body = b;
                rc->cap = cap;
            }
            memcpy(rc->body + rc->n, upload, *upload_size);
            rc->n += *upload_size;
            rc->body[rc->n] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    serve_error e;
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (!get) return send_error(c, NULL, (serve_error[]){{405, "invalid_request_error", "", "use GET /health"}});
        return send_body(c, NULL, h->ready ? 200 : 503, "application/json",   /* a probe, not a request */
                         strdup(h->ready ? "{\"status\":\"ready\"}" : "{\"status\":\"loading\"}"));
    }
    if (rc->too_large) {
        serve_error_set(&e, 413, "invalid_request_error", NULL, "the request body is over this server's limit of %zu bytes",
                        cfg->max_body_bytes);
        return send_error(c, cfg->metrics, &e);
    }
    if (!strcmp(url, "/v1/models") && get)
        return send_body(c, cfg->metrics, 200, "application/json", serve_models_json(cfg->limits.model_id, h->started));
    if (!strcmp(url, "/metrics") && get)
        return send_body(c, NULL, 200, "text/plain; version=0.0.4",
                         serve_metrics_text(cfg->metrics, serve_queue_depth(cfg->queue)));
    int gen = !strcmp(url, "/v1/images/generations"), edit = !strcmp(url, "/v1/images/edits");
    if ((gen || edit) && post) {
        if (!h->ready) {
            serve_error_set(&e, 503, "server_error", NULL, "the model is still loading; poll GET /health");
            return send_error(c, cfg->metrics, &e);
        }
        if (serve_queue_closed(cfg->queue)) {   /* before parsing: a closing server answers at once */
            serve_error_set(&e, 503, "server_error", NULL, "the server is shutting down; retry against another instance");
            return send_error(c, cfg->metrics, &e);
        }
        if (gen) return generations(h, c, rc);
        if (rc->not_form) {
            serve_error_set(&e, 400, "invalid_request_error", NULL,
                            "an edit is a multipart/form-data body: fields prompt, image (or image[], one per reference "
                            "image), and the options of /v1/images/generations");
            return send_error(c, cfg->metrics, &e);
        }
        return edits(h, c, rc);
    }
    const serve_ui_asset *page = ui_file(h, url, method);
    if (page) return send_ui(c, page);
    int known = !strcmp(url, "/v1/models") || !strcmp(url, "/metrics") || gen || edit;
    if (known) {
        serve_error_set(&e, 405, "invalid_request_error", NULL, "%s is not allowed on %s", method, url);
        return send_error(c, cfg->metrics, &e);
    }
    serve_error_set(&e, 404, "invalid_request_error", NULL,
                    "no such endpoint %.200s; this server has POST /v1/images/generations, POST /v1/images/edits, GET /v1/models, GET /health, "
                    "GET /metrics%s",
                    url, h->cfg->no_ui ? "" : ", GET / (the page)");
    return send_error(c, cfg->metrics, &e);
}

static void completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode code) {
    (void)code;
    serve_http *h = cls;
    req_ctx *rc = *state;
    if (rc) {
        serve_conn_request_done(&h->conns, rc->cn);
        if (rc->job) {   /* a stream that ended or was cut, or a result never answered (the client had gone
                          * when MHD resumed the connection, or the daemon stops with the job out there) */
            serve_job *j = rc->job;
            if (j->stream) serve_stream_detach(j->stream);   /* no push resumes this connection any more */
            int done = serve_job_finished(j);
            if (h->cfg->metrics && (j->stream || done))
                serve_metrics_count(h->cfg->metrics, serve_outcome_of(done ? j->status : 499));
            serve_job_release(j);   /* not finished: marked gone, stopped at its next step, freed by the finisher */
        }
        __atomic_sub_fetch(&h->active, 1, __ATOMIC_SEQ_CST);
        serve_form_free(rc->form);
        free(rc->body);
        free(rc);
        *state = NULL;
    }
    (void)c;
}

/* libmicrohttpd's messages (a refused connection, a malformed request),
 * at most one a second: a flood of bad clients must not flood the log */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static double last;
    static long skipped;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    pthread_mutex_lock(&mu);
    double now = serve_now();
    if (last > 0 && now - last < 1.0) {
        skipped++;
    } else {
        if (skipped) fprintf(stderr, "tpgen: serve: libmicrohttpd: %s (%ld more messages in the last second not shown)\n",
                             msg, skipped);
        else fprintf(stderr, "tpgen: serve: libmicrohttpd: %s\n", msg);
        skipped = 0;
        last = now;
    }
    pthread_mutex_unlock(&mu);
}

serve_http *serve_http_start(const serve_http_config *cfg) {
    serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        tp_error("out of memory");
        return NULL;
    }
    h->cfg = cfg;
    h->started = (long)time(NULL);
    if (serve_conns_listen(&h->conns, cfg, &h->port)) {
        free(h);
        return NULL;
    }
    /* one epoll thread; connections come from our accept thread; a
     * waiting request is a suspended connection */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG;
    int max = cfg->max_connections > 0 ? cfg->max_connections : 4096;
    /* MHD's own limit above ours: our accept thread answers 503 first */
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, handle, h, MHD_OPTION_CONNECTION_LIMIT, (unsigned)(max + 64),
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)(cfg->max_connections_per_ip > 0 ? cfg->max_connections_per_ip : 0),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60, MHD_OPTION_NOTIFY_COMPLETED, completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, serve_conns_notify, &h->conns,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!h->d) {
        serve_conns_stop(&h->conns);
        free(h);
        tp_error("cannot start the HTTP server on %s (libmicrohttpd without epoll or suspend/resume?)", cfg->listen);
        return NULL;
    }
    if (serve_conns_start(&h->conns, h->d)) {
        serve_conns_stop_accepting(&h->conns);
        MHD_stop_daemon(h->d);
        serve_conns_stop(&h->conns);
        free(h);
        return NULL;
    }
    return h;
}

int serve_http_port(const serve_http *h) { return h->port; }
void serve_http_set_ready(serve_http *h, int ready) { h->ready = ready; }

void serve_http_stop(serve_http *h) {
    if (!h) return;
    /* no new connections; the answers being sent (the last jobs, the 503s
     * of a closing queue) go out before the daemon stops, within 30 s */
    serve_conns_stop_accepting(&h->conns);
    for (int i = 0; i < 3000 && __atomic_load_n(&h->active, __ATOMIC_SEQ_CST) > 0; i++) {
        struct timespec t = {0, 10 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    MHD_stop_daemon(h->d);
    serve_conns_stop(&h->conns);
    free(h);
}

char *serve_read_api_key(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        tp_error("--api-key-file %s: cannot read it", path);
        return NULL;
    }
    struct stat st;
    if (!fstat(fileno(f), &st) && (st.st_mode & 077))
        fprintf(stderr, "tpgen: warning: --api-key-file %s can be read by other users (chmod 600 it)\n", path);
    char line[4096];
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    if (!got) {
        tp_error("--api-key-file %s is empty; put the key on its first line", path);
        return NULL;
    }
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t')) line[--n] = 0;
    if (!n) {
        tp_error("--api-key-file %s: the first line is blank; put the key there", path);
        return NULL;
    }
    char *key = strdup(line);
    if (!key) tp_error("out of memory reading --api-key-file %s", path);
    return key;
}
