/* config.json fields (config_json.h). */
#include "config_json.h"
#include "kernels/err.h"
#include <math.h>

int cfg_int(const json_t *cfg, const char *key, int def, int64_t max, const char *where, int *out) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    double r = json_is_real(v) ? json_real_value(v) : 0;
    if (!json_is_integer(v) && !(json_is_real(v) && r == floor(r)))
        return tp_error("%s: field '%s' must be an integer", where, key);
    if (json_is_integer(v) ? json_integer_value(v) < 0 || json_integer_value(v) > max : !(r >= 0 && r <= (double)max))
        return tp_error("%s: field '%s' is out of range (0 to %lld); the config is corrupt", where, key,
                        (long long)max);
    *out = json_is_integer(v) ? (int)json_integer_value(v) : (int)r;
    return 0;
}

int cfg_num(const json_t *cfg, const char *key, double def, const char *where, double *out) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_number(v)) return tp_error("%s: field '%s' must be a number", where, key);
    *out = json_number_value(v);
    return 0;
}

int cfg_rope_axes(const json_t *cfg, const char *where, int max_axes, int64_t max_dim, int *n_axes, int *axes) {
    json_t *a = json_object_get(cfg, "axes_dims_rope");
    if (!a || json_is_null(a)) {
        *n_axes = 4;
        for (int i = 0; i < 4; i++) axes[i] = 32;
        return 0;
    }
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > (size_t)max_axes)
        return tp_error("%s: 'axes_dims_rope' must be a list of 1 to %d integers", where, max_axes);
    *n_axes = (int)json_array_size(a);
    for (int i = 0; i < *n_axes; i++) {
        json_t *e = json_array_get(a, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) <= 0 || json_integer_value(e) > max_dim ||
            json_integer_value(e) % 2)
            return tp_error("%s: axes_dims_rope[%d] must be a positive even integer", where, i);
        axes[i] = (int)json_integer_value(e);
    }
    return 0;
}
