/* The connections of the HTTP front (serve_conn.h). */
#include "serve_conn.h"
#include "serve_stream.h"
#include "kernels/err.h"
#include <errno.h>
#include <stdatomic.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef enum { C_HEADERS, C_REQUEST, C_WAITING } conn_state;

struct serve_conn {
    serve_conn *prev, *next;
    serve_conns *cs;
    struct MHD_Connection *mc;
    int fd;
    conn_state state;
    int requests;                /* finished on this connection */
    double since;                /* when the state began */
    serve_job *job;              /* C_WAITING: the job it waits for */
    int suspended;               /* suspended, not yet resumed */
    int outstanding;             /* its jobs not finished: their on_done still comes (a stream's request
                                  * may end first, and the next one start) */
    int shut;                    /* shut down by the watcher */
    /* closed by MHD while suspended (only MHD_stop_daemon does that): the
     * job's on_done still comes, and frees the record */
    int closed;
};

static double header_timeout(const serve_conns *cs) {
    return cs->cfg->header_timeout_s > 0 ? cs->cfg->header_timeout_s : 10.0;
}
static double keepalive_timeout(const serve_conns *cs) {
    return cs->cfg->keepalive_timeout_s > 0 ? cs->cfg->keepalive_timeout_s : 5.0;
}
static int max_open(const serve_conns *cs) { return cs->cfg->max_connections > 0 ? cs->cfg->max_connections : 4096; }

/* "HOST:PORT", numeric only ("[::1]:8080", "0.0.0.0:8080"; localhost is 127.0.0.1) */
int serve_parse_listen(const char *listen, struct sockaddr_storage *ss, unsigned *len) {
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || !colon[1])
        return tp_error("--listen '%s': expected HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080", listen);
    size_t hl = (size_t)(colon - listen);
    if (hl >= sizeof host) return tp_error("--listen '%s': host too long", listen);
    memcpy(host, listen, hl);
    host[hl] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535) return tp_error("--listen '%s': port must be 0..65535", listen);
    memset(ss, 0, sizeof *ss);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        host[hl - 1] = 0;
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1)
            return tp_error("--listen '%s': '%s' is not an IPv6 address", listen, host + 1);
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        *len = sizeof *a;
        return 0;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
        return tp_error("--listen '%s': '%s' is not a numeric IPv4 address (use e.g. 127.0.0.1 or 0.0.0.0)", listen,
                        host);
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    *len = sizeof *a;
    return 0;
}

int serve_conns_listen(serve_conns *cs, const serve_http_config *cfg, int *port) {
    memset(cs, 0, sizeof *cs);
    cs->cfg = cfg;
    cs->listen_fd = -1;
    pthread_mutex_init(&cs->mu, NULL);
    struct sockaddr_storage ss;
    unsigned len;
    if (serve_parse_listen(cfg->listen, &ss, &len)) return -1;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0) return tp_error("cannot create a socket for %s: %s", cfg->listen, strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, len) || listen(fd, 1024)) {
        int err = errno;
        close(fd);
        return tp_error("cannot listen on %s: %s (address in use, or not an address of this machine); choose another "
                        "with --listen", cfg->listen, strerror(err));
    }
    struct sockaddr_storage got;
    socklen_t gl = sizeof got;
    getsockname(fd, (struct sockaddr *)&got, &gl);
    *port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                            : ((struct sockaddr_in *)&got)->sin_port);
    cs->listen_fd = fd;
    return 0;
}

/* past the limit: an answer right away, then the close */
static void refuse(serve_conns *cs, int fd) {
    static const char body[] = "{\"error\":{\"message\":\"this server has too many open connections; retry later\","
                               "\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    char msg[512];
    int n = snprintf(msg, sizeof msg, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Retry-After: 5\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s", sizeof body - 1, body);
    if (send(fd, msg, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) { /* the close says it anyway */ }
    shutdown(fd, SHUT_WR);
    close(fd);
    serve_metrics *m = cs->cfg->metrics;
    if (m) {
        pthread_mutex_lock(&m->mu);
        m->connections_refused++;
        pthread_mutex_unlock(&m->mu);
    }
}

static void *accept_main(void *p) {
    serve_conns *cs = p;
    while (__atomic_load_n(&cs->accepting, __ATOMIC_ACQUIRE)) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        int fd = accept4(cs->listen_fd, (struct sockaddr *)&a, &al, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                struct timespec t = {0, 10 * 1000 * 1000};   /* out of descriptors: let some close */
                nanosleep(&t, NULL);
                continue;
            }
            break;   /* the socket was shut down: stop */
        }
        if (__atomic_load_n(&cs->n_open, __ATOMIC_ACQUIRE) >= max_open(cs)) {
            refuse(cs, fd);
            continue;
        }
        /* on failure (the per-IP limit, MHD's own limit) MHD has closed fd */
        MHD_add_connection(cs->d, fd, (struct sockaddr *)&a, al);
    }
    return NULL;
}

/* Still there? A peer that closed reads as EOF; pipelined bytes as data. */
static int hung_up(int fd) {
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k > 0) return 0;
    if (k == 0) return 1;
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

static void *watch_main(void *p) {
    serve_conns *cs = p;
    int closed_queue = 0;
    while (!__atomic_load_n(&cs->quit, __ATOMIC_ACQUIRE)) {
        struct timespec t = {0, 50 * 1000 * 1000};
        nanosleep(&t, NULL);
        double now = serve_now();
        int gone = 0, open_now = 0;
        pthread_mutex_lock(&cs->mu);
        for (serve_conn *c = cs->list; c; c = c->next) {
            open_now++;
            if (c->shut) continue;
            double limit = c->state != C_HEADERS ? 0 : c->requests ? keepalive_timeout(cs) : header_timeout(cs);
            if (limit > 0 && now - c->since > limit) {
                shutdown(c->fd, SHUT_RDWR);   /* MHD sees the end and closes it */
                c->shut = 1;
            } else if (c->state == C_WAITING && c->job && !serve_job_finished(c->job) && !c->job->gone && hung_up(c->fd)) {
                c->job->gone = 1;
                gone++;
            }
        }
        pthread_mutex_unlock(&cs->mu);
        serve_metrics *m = cs->cfg->metrics;
        if (m) {
            pthread_mutex_lock(&m->mu);
            m->open_connections = open_now;
            pthread_mutex_unlock(&m->mu);
        }
        /* queued jobs nobody waits for: gone, or past their deadline */
        serve_queue_drop_abandoned(cs->cfg->queue);
        (void)gone;
        if (!closed_queue && cs->cfg->stop && *cs->cfg->stop) {
            serve_queue_close(cs->cfg->queue);   /* 503 to the queued and to new requests, now */
            closed_queue = 1;
        }
    }
    return NULL;
}

int serve_conns_start(serve_conns *cs, struct MHD_Daemon *d) {
    cs->d = d;
    cs->accepting = 1;
    if (pthread_create(&cs->acceptor, NULL, accept_main, cs)) return tp_error("cannot start the accept thread");
    cs->threads = 1;
    if (pthread_create(&cs->watcher, NULL, watch_main, cs)) return tp_error("cannot start the watcher thread");
    cs->threads = 2;
    return 0;
}

void serve_conns_stop_accepting(serve_conns *cs) {
    if (cs->listen_fd < 0) return;
    __atomic_store_n(&cs->accepting, 0, __ATOMIC_RELEASE);
    shutdown(cs->listen_fd, SHUT_RDWR);   /* wakes accept() */
    if (cs->threads >= 1) pthread_join(cs->acceptor, NULL);
    close(cs->listen_fd);
    cs->listen_fd = -1;
}

void serve_conns_stop(serve_conns *cs) {
    serve_conns_stop_accepting(cs);
    __atomic_store_n(&cs->quit, 1, __ATOMIC_RELEASE);
    if (cs->threads >= 2) pthread_join(cs->watcher, NULL);
    cs->threads = 0;
    pthread_mutex_destroy(&cs->mu);
}

void serve_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode code) {
    serve_conns *cs = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        __atomic_add_fetch(&cs->n_open, 1, __ATOMIC_ACQ_REL);
        serve_conn *cn = calloc(1, sizeof *cn);
        *socket_context = cn;
        if (!cn) return;   /* served without deadlines; requests on it are answered 503 */
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        cn->cs = cs;
        cn->mc = c;
        cn->fd = fi ? fi->connect_fd : -1;
        cn->state = C_HEADERS;
        cn->since = serve_now();
        pthread_mutex_lock(&cs->mu);
        cn->next = cs->list;
        if (cs->list) cs->list->prev = cn;
        cs->list = cn;
        pthread_mutex_unlock(&cs->mu);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        __atomic_sub_fetch(&cs->n_open, 1, __ATOMIC_ACQ_REL);
        serve_conn *cn = *socket_context;
        if (!cn) return;
        pthread_mutex_lock(&cs->mu);
        if (cn->prev) cn->prev->next = cn->next;
        else cs->list = cn->next;
        if (cn->next) cn->next->prev = cn->prev;
        int pending = cn->outstanding > 0;   /* its job's on_done will still come */
        cn->closed = 1;
        pthread_mutex_unlock(&cs->mu);
        if (!pending) free(cn);
        *socket_context = NULL;
    }
}

serve_conn *serve_conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

void serve_conn_request_started(serve_conns *cs, serve_conn *cn) {
    if (!cn) return;
    pthread_mutex_lock(&cs->mu);
    cn->state = C_REQUEST;
    cn->since = serve_now();
    pthread_mutex_unlock(&cs->mu);
}

void serve_conn_request_done(serve_conns *cs, serve_conn *cn) {
    if (!cn) return;
    pthread_mutex_lock(&cs->mu);
    cn->state = C_HEADERS;
    cn->requests++;
    cn->job = NULL;
    cn->since = serve_now();
    pthread_mutex_unlock(&cs->mu);
}

/* the job is finished (render side, or the queue): wake its connection.
 * The job is the finisher's until this returns (serve_queue.h): its
 * request may have let go already (a stream whose client left, or a
 * connection closed by MHD_stop_daemon), and the next request on the
 * connection may have started. */
static void job_done(serve_job *j, void *arg) {
    serve_conn *cn = arg;
    serve_conns *cs = cn->cs;
    serve_stream_end(j->stream, j->status, &j->err);   /* its last event (an error, or none) */
    int released = atomic_load(&j->state) & JOB_RELEASED;
    pthread_mutex_lock(&cs->mu);
    int resume = !j->stream && cn->suspended && !released && !cn->closed;
    if (!j->stream) cn->suspended = 0;
    cn->outstanding--;
    if (cn->job == j) cn->job = NULL;
    int free_cn = cn->closed && cn->outstanding == 0;
    struct MHD_Connection *mc = cn->mc;
    pthread_mutex_unlock(&cs->mu);
    if (free_cn) free(cn);
    /* outside the lock: MHD takes its own; a suspended connection stays
     * open (and cn with it) until it is resumed */
    if (resume) MHD_resume_connection(mc);
}

int serve_conn_submit(serve_conns *cs, serve_conn *cn, struct MHD_Connection *c, serve_job *j, int suspend,
                      serve_error *e) {
    if (!cn)
        return serve_error_set(e, 503, "server_error", NULL, "the server is out of memory; retry later");
    j->on_done = job_done;
    j->on_done_arg = cn;
    double rt = cs->cfg->request_timeout_s;
    if (rt > 0) j->deadline = serve_now() + rt;
    /* suspended before the job can finish: the lock keeps job_done from
     * resuming a connection that is not suspended yet */
    pthread_mutex_lock(&cs->mu);
    int rc = serve_queue_submit(cs->cfg->queue, j, e);
    if (!rc) {
        cn->state = C_WAITING;
        cn->job = j;
        cn->outstanding++;
        cn->suspended = suspend;
        if (suspend) MHD_suspend_connection(c);
    }
    pthread_mutex_unlock(&cs->mu);
    return rc;
}
