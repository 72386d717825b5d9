/* libFuzzer harness: the bytes as the body of POST /v1/images/edits
 * (multipart/form-data, boundary "XyZ123"), sent over a kept-alive
 * connection on 127.0.0.1 to the real HTTP front (serve_http: libmicrohttpd,
 * its post processor, serve_form, serve_parse_edit) with a thread that
 * plays the render loop and answers every job 200. Any 5xx, or no answer
 * at all, is a finding (abort); a crash inside the server is one anyway. */
#include "cli/serve_http.h"
#include "kernels/err.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static serve_queue g_q;
static serve_metrics g_m;
static serve_http_config g_cfg;
static int g_port, g_sock = -1;

static void *loop_main(void *p) {
    (void)p;
    for (;;) {
        serve_job *j = serve_queue_take(&g_q, 1.0);
        if (!j) continue;
        j->status = 200;   /* no images: the answer is {"data": []} */
        serve_job_finish(&g_q, j);
    }
    return NULL;
}

static void setup(void) {
    if (g_port) return;
    serve_queue_init(&g_q, 64);
    serve_metrics_init(&g_m, 1);
    g_cfg = (serve_http_config){.listen = "127.0.0.1:0", .max_body_bytes = 1 << 16, .max_upload_bytes = 1 << 17,
                                .max_connections = 64, .queue = &g_q, .metrics = &g_m};
    serve_limits_default(&g_cfg.limits, "tiny");
    serve_http *h = serve_http_start(&g_cfg);
    if (!h) {
        fprintf(stderr, "fuzz_serve_form: %s\n", tp_error_msg());
        abort();
    }
    serve_http_set_ready(h, 1);
    g_port = serve_http_port(h);
    pthread_t t;
    pthread_create(&t, NULL, loop_main, NULL);
}

static void hang_up(void) {
    if (g_sock < 0) return;
    struct linger l = {1, 0};   /* reset: no TIME_WAIT per run on this side */
    setsockopt(g_sock, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(g_sock);
    g_sock = -1;
}

static int dial(void) {
    if (g_sock >= 0) return 0;
    g_sock = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(g_sock, (struct sockaddr *)&a, sizeof a)) {
        hang_up();
        return -1;
    }
    int one = 1;   /* no Nagle wait between the request's pieces */
    setsockopt(g_sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}

static int send_all(const void *p, size_t n) {
    for (const char *c = p; n;) {
        ssize_t k = send(g_sock, c, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        c += k, n -= (size_t)k;
    }
    return 0;
}

/* One exchange: the status, or -1 when the server closed before answering. */
static int exchange(const uint8_t *data, size_t size, int *closes) {
    if (dial()) return -1;
    static char *req;
    static size_t req_cap;
    if (req_cap < size + 256 && !(req = realloc(req, req_cap = size + 256))) abort();
    int hl = snprintf(req, 256, "POST /v1/images/edits HTTP/1.1\r\nHost: fuzz\r\nContent-Type: "
                      "multipart/form-data; boundary=XyZ123\r\nContent-Length: %zu\r\n\r\n", size);
    memcpy(req + hl, data, size);
    if (send_all(req, (size_t)hl + size)) return -1;
    static char buf[1 << 16];
    size_t n = 0;
    long want = -1;
    struct pollfd p = {.fd = g_sock, .events = POLLIN};
    while (poll(&p, 1, 5000) > 0) {
        ssize_t k = recv(g_sock, buf + n, sizeof buf - 1 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = 0;
        char *end = strstr(buf, "\r\n\r\n");
        if (end && want < 0) {
            char *cl = strcasestr(buf, "Content-Length:");
            want = (long)(end + 4 - buf) + (cl ? atol(cl + 15) : 0);
            *closes = strcasestr(buf, "Connection: close") != NULL;
        }
        if (want >= 0 && (long)n >= want) break;
        if (n + 1 >= sizeof buf) break;
    }
    buf[n] = 0;
    int status = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) return -1;
    if (status >= 500 && !strstr(buf, "out of memory")) {
        fprintf(stderr, "fuzz_serve_form: %d from form bytes:\n%.2000s\n", status, buf);
        abort();
    }
    return status;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    int closes = 0;
    int st = exchange(data, size, &closes);
    if (st < 0) {   /* a closed kept-alive connection: try once more on a fresh one */
        hang_up();
        closes = 0;
        st = exchange(data, size, &closes);
        if (st < 0) {
            fprintf(stderr, "fuzz_serve_form: no answer to a %zu-byte form\n", size);
            abort();
        }
    }
    if (closes) hang_up();
    return 0;
}
