/* `tpgen serve`: the HTTP/1.1 front (libmicrohttpd) on world rank 0.
 * Requests are parsed and validated here (serve_api.c), queued
 * (serve_queue.c) and answered when the render loop finishes them.
 *
 *   POST /v1/images/generations   the OpenAI images API (serve_api.h)
 *   POST /v1/images/edits         multipart: prompt, image / image[] (references), options
 *   GET  /health                  200 {"status":"ready"} or 503 {"status":"loading"}
 *   GET  /v1/models               the served model
 *   GET  /metrics                 Prometheus text format
 *   GET  /  (and /ui/...)         the page (serve_ui.h), unless turned off
 *
 * With an API key every endpoint but /health and the page's files needs
 * `Authorization: Bearer KEY` (compared in constant time), checked on the request's headers
 * before any body byte is read. Bodies over max_body_bytes (edits:
 * max_upload_bytes) get 413.
 *
 * One polling thread (epoll) serves every connection and never blocks: a
 * request waiting for its render is a suspended connection, resumed when
 * the job is finished. An accept thread refuses connections past
 * max_connections with an immediate 503; a watcher thread enforces the
 * header and keep-alive deadlines, notices clients that hang up while
 * their request waits (the job is then dropped or cancelled), and closes
 * the queue as soon as *stop is set. */
#ifndef TPGEN_SERVE_HTTP_H
#define TPGEN_SERVE_HTTP_H
#include "serve_queue.h"
#include <signal.h>
#include <stddef.h>

typedef struct serve_http_config {
    const char *listen;          /* "HOST:PORT" ("127.0.0.1:8080", "[::1]:8080", "0.0.0.0:8080") */
    const char *api_key;         /* NULL: no authentication */
    int no_ui;                   /* GET / is a 404 (--no-ui) */
    size_t max_body_bytes;       /* JSON bodies */
    size_t max_upload_bytes;     /* multipart edits (reference images) */
    int max_connections;         /* open at once; more get 503 at accept (0: 4096) */
    int max_connections_per_ip;  /* 0: no per-address limit; past it a connection is closed at accept */
    double header_timeout_s;     /* a new connection's first request headers, complete (0: 10 s) */
    double keepalive_timeout_s;  /* an idle kept-alive connection's next request headers (0: 5 s) */
    double request_timeout_s;    /* a request's deadline from its arrival: queued or rendering (0: none) */
    volatile sig_atomic_t *stop; /* NULL ok: when set, the queue is closed at once (503 to queued and new) */
    serve_limits limits;
    serve_queue *queue;
    serve_metrics *metrics;
} serve_http_config;

typedef struct serve_http serve_http;

/* Start listening (threads of its own); NULL + tp_error when the address
 * cannot be bound. The config must outlive the server. */
serve_http *serve_http_start(const serve_http_config *cfg);
/* The port actually bound (useful with port 0). */
int serve_http_port(const serve_http *h);
/* Mark the model loaded (GET /health answers ready). */
void serve_http_set_ready(serve_http *h, int ready);
/* Stop accepting connections and join the server's threads (requests being
 * answered finish first). */
void serve_http_stop(serve_http *h);

/* Read an API key file: the first line, trailing whitespace dropped;
 * an error for an empty or unreadable file, a warning when others can read it. */
char *serve_read_api_key(const char *path);

#endif
