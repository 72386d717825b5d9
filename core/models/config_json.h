/* Reading a model's config.json: range-checked fields with the class's
 * defaults, shared by the transformer configs (flux2_host.c, flux3.c).
 * Every error names `where` (the file) and the field. */
#ifndef TPGEN_CONFIG_JSON_H
#define TPGEN_CONFIG_JSON_H
#include <jansson.h>
#include <stdint.h>

/* An integer field (an integral real is accepted), 0..max, checked as
 * int64 before it becomes an int; def when absent or null. */
int cfg_int(const json_t *cfg, const char *key, int def, int64_t max, const char *where, int *out);
/* A number field; def when absent or null. */
int cfg_num(const json_t *cfg, const char *key, double def, const char *where, double *out);
/* axes_dims_rope: 1..max_axes positive even integers up to max_dim
 * (absent: 4 axes of 32, the FLUX layout (t, h, w, l) at head_dim 128). */
int cfg_rope_axes(const json_t *cfg, const char *where, int max_axes, int64_t max_dim, int *n_axes, int *axes);

#endif
