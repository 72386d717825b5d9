/* `tpgen serve`: the connections of the HTTP front (serve_http.c), kept so
 * that no client can exhaust them:
 *
 *   - the listening socket and an accept thread that hands connections to
 *     libmicrohttpd (MHD_add_connection) and answers those past
 *     max_connections with an immediate 503 and a close, never a wait in
 *     the TCP backlog (libmicrohttpd's own per-IP limit closes at once too);
 *   - a record per open connection (MHD's connection notifications);
 *   - a watcher thread, every 50 ms: a connection whose first request
 *     headers are not complete after header_timeout_s, or that idles
 *     between requests longer than keepalive_timeout_s, is shut down (a
 *     slowloris cannot hold a slot); a request waiting for its job whose
 *     client has hung up marks the job gone (the queue drops it, the render
 *     cancels it at the next step); *stop closes the queue at once.
 *
 * A waiting request is a suspended MHD connection: the job's on_done
 * resumes it, and MHD calls the handler again to answer. */
#ifndef TPGEN_SERVE_CONN_H
#define TPGEN_SERVE_CONN_H
#include "serve_http.h"
#include <microhttpd.h>
#include <pthread.h>

typedef struct serve_conn serve_conn;

typedef struct serve_conns {
    const serve_http_config *cfg;
    struct MHD_Daemon *d;
    int listen_fd;
    pthread_t acceptor, watcher;
    int threads;                 /* started: 1 acceptor, 2 both */
    volatile int quit, accepting;
    int n_open;                  /* open connections (atomic) */
    pthread_mutex_t mu;          /* the list, and each record's state, job and suspension */
    serve_conn *list;
} serve_conns;

/* Bind and listen on cfg->listen; *port the port bound. -1 + tp_error. */
int serve_conns_listen(serve_conns *cs, const serve_http_config *cfg, int *port);
/* Start the accept and watcher threads for daemon d (started with
 * MHD_USE_NO_LISTEN_SOCKET and serve_conns_notify). -1 + tp_error. */
int serve_conns_start(serve_conns *cs, struct MHD_Daemon *d);
/* Stop accepting (the listening socket is closed); open connections stay. */
void serve_conns_stop_accepting(serve_conns *cs);
/* Join the threads (after MHD_stop_daemon: no connection is left). */
void serve_conns_stop(serve_conns *cs);

/* MHD_OPTION_NOTIFY_CONNECTION (cls: the serve_conns). */
void serve_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode code);
/* The record of c (NULL when it could not be allocated). */
serve_conn *serve_conn_of(struct MHD_Connection *c);
/* The handler's first call of a request (its headers are in) and
 * MHD_OPTION_NOTIFY_COMPLETED (the request is over: the connection idles). */
void serve_conn_request_started(serve_conns *cs, serve_conn *cn);
void serve_conn_request_done(serve_conns *cs, serve_conn *cn);
/* Queue j for the request on connection c and, with suspend, suspend c
 * until j is finished (then MHD calls the handler again; a stream answers
 * at once and sleeps in its reader instead): 0, or -1 with e (429, 503)
 * and c not suspended. While j waits, a client that hangs up marks it gone. */
int serve_conn_submit(serve_conns *cs, serve_conn *cn, struct MHD_Connection *c, serve_job *j, int suspend,
                      serve_error *e);
/* Parse "HOST:PORT" (numeric host) into a socket address; -1 + tp_error. */
struct sockaddr_storage;
int serve_parse_listen(const char *listen, struct sockaddr_storage *ss, unsigned *len);

#endif
