/* `tpgen serve`: the multipart/form-data body of POST /v1/images/edits,
 * read with libmicrohttpd's post processor as it arrives: text fields and
 * the uploaded reference images (fields `image` or `image[]`), then turned
 * into a request by serve_parse_edit (serve_api.h). */
#ifndef TPGEN_SERVE_FORM_H
#define TPGEN_SERVE_FORM_H
#include "serve_api.h"
#include <stddef.h>

struct MHD_Connection;
typedef struct serve_form serve_form;

/* NULL when the request is not multipart/form-data (or out of memory). */
serve_form *serve_form_create(struct MHD_Connection *c, size_t max_bytes);
/* Feed body bytes; past max_bytes the rest is only counted (then finish
 * answers 413). */
void serve_form_feed(serve_form *f, const char *data, size_t n);
/* The whole body has arrived: the request, or -1 with e (400/413). */
int serve_form_finish(serve_form *f, const serve_limits *lim, serve_request *out, serve_error *e);
void serve_form_free(serve_form *f);

#endif
