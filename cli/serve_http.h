/* `tpgen serve`: the HTTP/1.1 front (libmicrohttpd) on world rank 0.
 * Requests are parsed and validated here (serve_api.c), queued
 * (serve_queue.c) and answered when the render loop finishes them.
 *
 *   POST /v1/images/generations   the OpenAI images API (serve_api.h)
 *   POST /v1/images/edits         multipart: prompt, image / image[] (references), options
 *   GET  /health                  200 {"status":"ready"} or 503 {"status":"loading"}
 *   GET  /v1/models               the served model
 *   GET  /metrics                 Prometheus text format
 *
 * With an API key every endpoint but /health needs `Authorization: Bearer
 * KEY` (compared in constant time). Bodies over max_body_bytes (edits:
 * max_upload_bytes) get 413. */
#ifndef TPGEN_SERVE_HTTP_H
#define TPGEN_SERVE_HTTP_H
#include "serve_queue.h"
#include <stddef.h>

typedef struct serve_http_config {
    const char *listen;          /* "HOST:PORT" ("127.0.0.1:8080", "[::1]:8080", "0.0.0.0:8080") */
    const char *api_key;         /* NULL: no authentication */
    size_t max_body_bytes;       /* JSON bodies */
    size_t max_upload_bytes;     /* multipart edits (reference images) */
    int max_connections;
    serve_limits limits;
    serve_queue *queue;
    serve_metrics *metrics;
} serve_http_config;

typedef struct serve_http serve_http;

/* Parse "HOST:PORT" (numeric host) into a socket address; -1 + tp_error. */
struct sockaddr_storage;
int serve_parse_listen(const char *listen, struct sockaddr_storage *ss, unsigned *len);

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
