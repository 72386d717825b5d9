/* `tpgen serve`: the multipart/form-data body of POST /v1/images/edits:
 * text fields and the uploaded reference images (fields `image` or
 * `image[]`), read with libmicrohttpd's post processor and turned into a
 * request by serve_parse_edit (serve_api.h).
 *
 * The body is kept as it arrives (up to max_bytes) and parsed in one pass
 * at the end: given its input in one piece, the post processor calls back
 * once per part at offset 0 (then with later offsets for a long part), so
 * that an empty part is a part of its own. Fed piecewise it may call twice
 * at offset 0 for one part, which cannot be told from an empty part
 * followed by another of the same name. */
#ifndef TPGEN_SERVE_FORM_H
#define TPGEN_SERVE_FORM_H
#include "serve_api.h"
#include <stddef.h>

struct MHD_Connection;
typedef struct serve_form serve_form;

/* NULL when the request is not multipart/form-data with a usable boundary
 * (or out of memory). */
serve_form *serve_form_create(struct MHD_Connection *c, size_t max_bytes);
/* Feed body bytes; past max_bytes the rest is only counted (then finish
 * answers 413). */
void serve_form_feed(serve_form *f, const char *data, size_t n);
/* The whole body has arrived: the request, or -1 with e (400/413; 500 only
 * when out of memory). */
int serve_form_finish(serve_form *f, const serve_limits *lim, serve_request *out, serve_error *e);
void serve_form_free(serve_form *f);

#endif
