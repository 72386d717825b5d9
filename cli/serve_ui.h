/* `tpgen serve`'s page (GET /): cli/ui/'s HTML, CSS and JavaScript,
 * compiled into the binary (scripts/embed-ui.sh writes them as C arrays at
 * build time), so that nothing is fetched from elsewhere and nothing is
 * built at run time. The page is a client of the API like any other
 * (docs/serve.md, "The page"). */
#ifndef TPGEN_SERVE_UI_H
#define TPGEN_SERVE_UI_H
#include <stddef.h>

typedef struct serve_ui_asset {
    const char *url;             /* "/ui/app.js" */
    const char *type;            /* its Content-Type */
    const unsigned char *data;
    size_t size;
} serve_ui_asset;

/* every file of cli/ui/, ended by an entry with url NULL (generated) */
extern const serve_ui_asset serve_ui_assets[];

/* The file a GET of url is answered with ("/" is /ui/index.html), or NULL. */
const serve_ui_asset *serve_ui_find(const char *url);

/* The headers every file of the page carries: a Content-Security-Policy that
 * lets it load only itself and talk only to this server, no framing, no
 * sniffing. NULL-terminated name/value pairs. */
extern const char *const serve_ui_headers[];

#endif
