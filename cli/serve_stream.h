/* `tpgen serve`: a request answered as server-sent events, as the OpenAI
 * images API streams (`"stream": true`, `partial_images` 0..3):
 *
 *   event: image_generation.partial_image   (image_edit.partial_image for edits)
 *   data: {"type", "b64_json", "partial_image_index", "size", "output_format",
 *          "background", "quality", "created_at"}
 *   event: image_generation.completed        (image_edit.completed)
 *   data: {"type", "b64_json", "size", "output_format", "background", "quality",
 *          "created_at", "usage"}
 *   event: error
 *   data: {"type": "error", "error": {"message", "type", "param", "code"}}
 *
 * With n > 1 the images come one after the other (image k has seed + k):
 * image k's partials (partial_image_index from 0 again), then its
 * completed event, then image k + 1's. The stream ends after the last
 * completed event, or with an error event.
 *
 * The render side pushes each image (serve_stream_image) as its PNG is
 * made; the HTTP side reads the formatted bytes (serve_stream_read) and
 * sleeps (a suspended connection) while there is nothing to send. A slow
 * reader cannot make the buffer grow: a partial is dropped while an earlier
 * partial is still waiting to be sent, so a stream holds at most one
 * partial beside its completed events (at most n, the request's own
 * images). Thread-safe. */
#ifndef TPGEN_SERVE_STREAM_H
#define TPGEN_SERVE_STREAM_H
#include "serve_api.h"
#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct serve_stream serve_stream;

/* edit: image_edit.* events instead of image_generation.*; NULL when out of memory. */
serve_stream *serve_stream_new(int edit);
void serve_stream_free(serve_stream *s);

/* The render side: image `image`'s partial (completed 0) or final PNG
 * (completed 1). Partials of an image are numbered in the order they are
 * sent. The size comes from the PNG's header. */
void serve_stream_image(serve_stream *s, int completed, int image, const uint8_t *png, size_t n);
/* The job is over: status 200 ends the stream, anything else sends e as an
 * error event first. Later pushes are ignored. */
void serve_stream_end(serve_stream *s, int status, const serve_error *e);

/* The HTTP side: the connection the events go to (c) until it is detached
 * (the request is over). */
void serve_stream_attach(serve_stream *s, struct MHD_Connection *c);
void serve_stream_detach(serve_stream *s);
/* An MHD content reader: up to max bytes; 0 after suspending the
 * connection until the next push (it is resumed then);
 * MHD_CONTENT_READER_END_OF_STREAM after the last event. */
ssize_t serve_stream_read(void *s, uint64_t pos, char *buf, size_t max);

/* Events pushed and partials dropped so far (tests, metrics). */
void serve_stream_counts(serve_stream *s, int *events, int *dropped);

/* The text of one event (malloc'ed, NUL-terminated; *len its length), for
 * the tests: kind 0 partial, 1 completed. */
char *serve_stream_event_text(int edit, int completed, int index, int width, int height, long created,
                              const uint8_t *png, size_t n, size_t *len);
char *serve_stream_error_text(const serve_error *e, size_t *len);

#endif
