/* Golden FLUX.3 transformer cases (flux3_case.h). */
#include "flux3_case.h"
#include "golden_case.h"
#include "kernels/err.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void f3_case_free(f3_case *c) {
    free(c->x), free(c->txt), free(c->cond), free(c->ref), free(c->img_ids), free(c->txt_ids), free(c->cond_ids);
    memset(c, 0, sizeof *c);
}

int f3_case_read(const st_file *f, int k, f3_case *c) {
    char key[64];
    float *t = NULL, *tt = NULL;
    memset(c, 0, sizeof *c);
#define K(s) (snprintf(key, sizeof key, "case%d.%s", k, s), key)
    int rc = st_read_f32(f, K("hidden_states"), &c->x, NULL) || st_read_f32(f, K("encoder_hidden_states"), &c->txt, NULL) ||
             st_read_f32(f, K("timestep"), &t, NULL) || st_read_f32(f, K("output"), &c->ref, NULL) ||
             !(c->img_ids = golden_ids32(f, K("img_ids"), &c->N)) || !(c->txt_ids = golden_ids32(f, K("txt_ids"), &c->L));
    if (!rc && st_find(f, K("image_cond_hidden_states")))
        rc = st_read_f32(f, key, &c->cond, NULL) || !(c->cond_ids = golden_ids32(f, K("image_cond_ids"), &c->R));
    if (!rc && st_find(f, K("target_timestep"))) rc = st_read_f32(f, key, &tt, NULL), c->has_tt = 1;
#undef K
    if (!rc) c->ts = t[0], c->tt = tt ? tt[0] : 0;
    free(t), free(tt);
    if (rc) f3_case_free(c);
    return rc ? -1 : 0;
}

flux3_inputs f3_case_inputs(const f3_case *c) {
    return (flux3_inputs){.x = c->x, .img_ids = c->img_ids, .N = c->N, .txt = c->txt, .txt_ids = c->txt_ids,
                          .L = c->L, .cond = c->cond, .cond_ids = c->cond_ids, .R = c->R, .timestep = c->ts,
                          .target_timestep = c->has_tt ? &c->tt : NULL};
}

MPI_Comm f3_tp_group(int heads, int *tp) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int t = size;
    while (heads % t) t--;
    MPI_Comm g;
    MPI_Comm_split(MPI_COMM_WORLD, rank / t, rank, &g);
    MPI_Comm_size(g, tp);
    return g;
}
