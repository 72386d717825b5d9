/* A request answered as server-sent events (serve_stream.h). */
#include "serve_stream.h"
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct chunk {
    struct chunk *next;
    char *p;
    size_t n, off;               /* bytes, and how many of them are sent */
    int partial;
} chunk;

struct serve_stream {
    pthread_mutex_t mu;
    int edit;
    chunk *head, *tail;
    int ended;                   /* no more events after the queued ones */
    int image, partials;         /* the image being pushed, its partials sent so far */
    int events, dropped;
    struct MHD_Connection *c;    /* attached: where the events go */
    int sleeping;                /* c is suspended until the next push */
};

serve_stream *serve_stream_new(int edit) {
    serve_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    s->edit = edit;
    s->image = -1;
    return s;
}

void serve_stream_free(serve_stream *s) {
    if (!s) return;
    for (chunk *k = s->head, *next; k; k = next) {
        next = k->next;
        free(k->p);
        free(k);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* "event: TYPE\ndata: JSON\n\n" (malloc'ed) */
static char *event_text(const char *type, json_t *data, size_t *len) {
    char *js = json_dumps(data, JSON_COMPACT);
    json_decref(data);
    if (!js) return NULL;
    size_t n = strlen(type) + strlen(js) + 20;
    char *out = malloc(n);
    if (out) *len = (size_t)snprintf(out, n, "event: %s\ndata: %s\n\n", type, js);
    free(js);
    return out;
}

char *serve_stream_event_text(int edit, int completed, int index, int width, int height, long created,
                              const uint8_t *png, size_t n, size_t *len) {
    char type[48], size[32];
    snprintf(type, sizeof type, "%s.%s", edit ? "image_edit" : "image_generation",
             completed ? "completed" : "partial_image");
    snprintf(size, sizeof size, "%dx%d", width, height);
    char *b64 = serve_base64(png, n);
    if (!b64) return NULL;
    /* the fields of openai-python's ImageGen{PartialImage,Completed}Event;
     * usage: tpgen counts no tokens, so zeros */
    json_t *d = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I}", "type", type, "b64_json", b64, "size", size,
                          "output_format", "png", "background", "opaque", "quality", "auto", "created_at",
                          (json_int_t)created);
    free(b64);
    if (!d) return NULL;
    if (completed)
        json_object_set_new(d, "usage",
                            json_pack("{s:i, s:{s:i, s:i}, s:i, s:i}", "input_tokens", 0, "input_tokens_details",
                                      "image_tokens", 0, "text_tokens", 0, "output_tokens", 0, "total_tokens", 0));
    else
        json_object_set_new(d, "partial_image_index", json_integer(index));
    return event_text(type, d, len);
}

char *serve_stream_error_text(const serve_error *e, size_t *len) {
    /* the body of a non-streamed error under "error", with "type": "error"
     * beside it: openai-python raises APIError(error.message) on it */
    json_t *err = json_pack("{s:s, s:s, s:o, s:n}", "message", e->message, "type", e->type ? e->type : "server_error",
                            "param", e->param[0] ? json_string(e->param) : json_null(), "code");
    json_t *d = err ? json_pack("{s:s, s:o}", "type", "error", "error", err) : NULL;
    return d ? event_text("error", d, len) : NULL;
}

/* width and height from the PNG's IHDR (0 when it is not one) */
static void png_size(const uint8_t *p, size_t n, int *w, int *h) {
    *w = *h = 0;
    if (n < 24 || memcmp(p + 12, "IHDR", 4)) return;
    *w = (int)((uint32_t)p[16] << 24 | (uint32_t)p[17] << 16 | (uint32_t)p[18] << 8 | p[19]);
    *h = (int)((uint32_t)p[20] << 24 | (uint32_t)p[21] << 16 | (uint32_t)p[22] << 8 | p[23]);
}

/* queue a chunk and wake the reader; called with s->mu held, unlocks it */
static void push_unlock(serve_stream *s, char *text, size_t n, int partial) {
    chunk *k = text ? calloc(1, sizeof *k) : NULL;
    if (k) {
        k->p = text, k->n = n, k->partial = partial;
        if (s->tail) s->tail->next = k;
        else s->head = k;
        s->tail = k;
        s->events++;
    } else {
        free(text);   /* out of memory: the event is lost, the stream goes on */
    }
    struct MHD_Connection *wake = s->sleeping ? s->c : NULL;
    s->sleeping = 0;
    pthread_mutex_unlock(&s->mu);
    if (wake) MHD_resume_connection(wake);   /* outside the lock: MHD takes its own */
}

/* is a partial still waiting (not wholly sent)? */
static int partial_waiting(const serve_stream *s) {
    for (const chunk *k = s->head; k; k = k->next)
        if (k->partial && k->off < k->n) return 1;
    return 0;
}

void serve_stream_image(serve_stream *s, int completed, int image, const uint8_t *png, size_t n) {
    if (!s) return;
    int w, h;
    png_size(png, n, &w, &h);
    pthread_mutex_lock(&s->mu);
    if (s->ended) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    if (image != s->image) s->image = image, s->partials = 0;
    if (!completed && partial_waiting(s)) {   /* the reader is behind: it gets the next one instead */
        s->dropped++;
        pthread_mutex_unlock(&s->mu);
        return;
    }
    int index = completed ? 0 : s->partials++;
    pthread_mutex_unlock(&s->mu);
    size_t len = 0;   /* formatted outside the lock: base64 of a large PNG takes a while */
    char *text = serve_stream_event_text(s->edit, completed, index, w, h, (long)time(NULL), png, n, &len);
    pthread_mutex_lock(&s->mu);
    push_unlock(s, text, len, !completed);
}

void serve_stream_end(serve_stream *s, int status, const serve_error *e) {
    if (!s) return;
    size_t len = 0;
    char *text = status != 200 ? serve_stream_error_text(e, &len) : NULL;
    pthread_mutex_lock(&s->mu);
    if (s->ended) {
        free(text);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->ended = 1;
    if (text) {
        push_unlock(s, text, len, 0);
        return;
    }
    push_unlock(s, NULL, 0, 0);   /* no event; wakes the reader to end the stream */
}

void serve_stream_attach(serve_stream *s, struct MHD_Connection *c) {
    pthread_mutex_lock(&s->mu);
    s->c = c;
    pthread_mutex_unlock(&s->mu);
}

void serve_stream_detach(serve_stream *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->c = NULL;
    s->sleeping = 0;
    pthread_mutex_unlock(&s->mu);
}

ssize_t serve_stream_read(void *p, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    serve_stream *s = p;
    pthread_mutex_lock(&s->mu);
    size_t got = 0;
    while (s->head && got < max) {
        chunk *k = s->head;
        size_t take = k->n - k->off < max - got ? k->n - k->off : max - got;
        memcpy(buf + got, k->p + k->off, take);
        got += take;
        k->off += take;
        if (k->off < k->n) break;
        s->head = k->next;
        if (!s->head) s->tail = NULL;
        free(k->p);
        free(k);
    }
    ssize_t r = (ssize_t)got;
    if (!got && s->ended) {
        r = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (!got && s->c) {
        /* nothing to send yet: the connection sleeps until the next push
         * (suspended under the lock, so that a push cannot slip between) */
        s->sleeping = 1;
        MHD_suspend_connection(s->c);
    }
    pthread_mutex_unlock(&s->mu);
    return r;
}

void serve_stream_counts(serve_stream *s, int *events, int *dropped) {
    pthread_mutex_lock(&s->mu);
    *events = s->events;
    *dropped = s->dropped;
    pthread_mutex_unlock(&s->mu);
}
