/* Golden transformer cases (golden_case.h). */
#include "golden_case.h"
#include "kernels/err.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int32_t *golden_ids32(const st_file *f, const char *name, int64_t *n) {
    int64_t *v;
    const st_tensor_info *info;
    if (st_read_i64(f, name, &v, &info)) return NULL;
    *n = st_numel(info) / 4;
    int32_t *r = xmalloc((size_t)st_numel(info) * 4);
    for (int64_t i = 0; i < st_numel(info); i++) r[i] = (int32_t)v[i];
    free(v);
    return r;
}

int golden_case_read(const st_file *f, int k, golden_case *c) {
    char key[64];
    float *t = NULL, *g = NULL;
#define K(s) (snprintf(key, sizeof key, "case%d.%s", k, s), key)
    int rc = st_read_f32(f, K("hidden_states"), &c->x, NULL) || st_read_f32(f, K("encoder_hidden_states"), &c->txt, NULL) ||
             st_read_f32(f, K("timestep"), &t, NULL) || st_read_f32(f, K("guidance"), &g, NULL) ||
             !(c->img_ids = golden_ids32(f, K("img_ids"), &c->N)) || !(c->txt_ids = golden_ids32(f, K("txt_ids"), &c->L));
#undef K
    if (!rc) c->ts = t[0], c->g = g[0];
    free(t), free(g);
    return rc ? -1 : 0;
}

int golden_case_read_ref(const st_file *f, const char *key, golden_case *c) {
    return st_read_f32(f, key, &c->ref, NULL) ? -1 : 0;
}

void golden_case_free(golden_case *c) {
    free(c->x), free(c->txt), free(c->ref), free(c->img_ids), free(c->txt_ids);
    memset(c, 0, sizeof *c);
}

int golden_case_ids(const st_file *f, int c, int n, int32_t *ids, int32_t *mask) {
    char name[96];
    int64_t *v = NULL;
    const st_tensor_info *info;
    snprintf(name, sizeof name, "case%d.input_ids", c);
    if (st_read_i64(f, name, &v, &info) || st_numel(info) != n) return free(v), -1;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)v[i];
    free(v);
    snprintf(name, sizeof name, "case%d.attention_mask", c);
    if (st_read_i64(f, name, &v, &info) || st_numel(info) != n) return free(v), -1;
    for (int i = 0; i < n; i++) mask[i] = (int32_t)v[i];
    free(v);
    return 0;
}

double golden_block_rel(const float *out, int K, int k, const float *ref, int n, int H, const int32_t *row_ok) {
    double num = 0, den = 0;
    for (int t = 0; t < n; t++) {
        if (row_ok && !row_ok[t]) continue;
        for (int d = 0; d < H; d++) {
            double a = out[((size_t)t * K + k) * H + d], b = ref[(size_t)t * H + d];
            num += (a - b) * (a - b), den += b * b;
        }
    }
    return num != num ? INFINITY : sqrt(num / (den > 0 ? den : 1));
}
