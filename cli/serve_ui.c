/* `tpgen serve`'s page: finding its embedded files (serve_ui.h). */
#include "serve_ui.h"
#include <string.h>

const char *const serve_ui_headers[] = {
    "Content-Security-Policy",
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options", "nosniff",
    "Referrer-Policy", "no-referrer",
    "Cache-Control", "no-cache",
    NULL};

const serve_ui_asset *serve_ui_find(const char *url) {
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) url = "/ui/index.html";
    for (const serve_ui_asset *a = serve_ui_assets; a->url; a++)
        if (!strcmp(a->url, url)) return a;
    return NULL;
}
