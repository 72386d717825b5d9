/* The one driver of a VAE pass over a group of ranks (vae_internal.h,
 * vae_group_pass), for the decoder and the encoder alike: the execution
 * plan is chosen here and nowhere else. A group of one runs the whole image
 * (vae_whole); a larger group splits the pass's unit rows into bands, one
 * per rank, and runs the banded strategy (vae_banded), the band's input
 * agreed before the first halo exchange and the bands' outputs gathered on
 * rank 0. */
#include "vae_internal.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

/* Rows [row0, row0 + rows) of every channel of p->in into x; the forward;
 * the first out_ch channels of its output into a malloc'd *out. */
static int run_rows(vae_run *r, const vae_pass *p, int64_t row0, int64_t rows, float **out, int64_t *h,
                    int64_t *w) {
    int64_t H_in = p->units * p->s_in;
    tensor x;
    int rc = vae_pool_get(r, p->in_ch, rows * p->in_cols, &x);
    for (int c = 0; c < p->in_ch && !rc; c++) {
        tensor dst = tensor_rows(&x, c, 1);
        rc = tensor_upload_f32(&dst, p->in + ((size_t)c * (size_t)H_in + (size_t)row0) * (size_t)p->in_cols);
    }
    /* the input is the prepare step: a band's is agreed before the first halo exchange (a group of one has
     * no collective to protect) */
    if (r->band) rc = dist_lockstep_begin(r->band->comm, rc);
    *h = rows, *w = p->in_cols;
    if (!rc) {
        rc = p->forward(r, &x, h, w);
        if (r->band) dist_lockstep_end();
    }
    if (!rc) {
        *out = xmalloc((size_t)p->out_ch * (size_t)(*h * *w) * sizeof(float));
        tensor keep = tensor_rows(&x, 0, p->out_ch);
        rc = tensor_download_f32(&keep, *out);
    }
    return rc;
}

int vae_agree(MPI_Comm group, int rc) {
    if (group == MPI_COMM_NULL) return rc ? -1 : 0;
    return dist_agree(group, rc);
}

int vae_group_pass(const vae_model *m, MPI_Comm group, const vae_pass *p, float *out) {
    int size = 1, rank = 0;
    if (group != MPI_COMM_NULL) MPI_Comm_size(group, &size), MPI_Comm_rank(group, &rank);
    vae_run r;
    float *mine = NULL;
    int64_t h, w;
    if (size == 1) {
        vae_run_begin(&r, m, &vae_whole, NULL);
        r.units = p->units, r.wl = p->wl;
        int rc = run_rows(&r, p, 0, p->units * p->s_in, &mine, &h, &w);
        vae_run_end(&r);
        if (!rc) memcpy(out, mine, (size_t)p->out_ch * (size_t)(h * w) * sizeof(float));
        free(mine);
        return rc ? tp_error_context("%s", p->what) : 0;
    }
    /* one band of at least one unit row per rank; with fewer rows than
     * ranks the last ranks sit out (they only wait for the agreement) */
    int n = size < p->units ? size : (int)p->units, active = rank < n, rc = 0;
    /* the GroupNorm protocol must be the same on every rank (ranks on different CPUs could differ) */
    int exact = op_rows_invariant(m->be, m->dt);
    MPI_Allreduce(MPI_IN_PLACE, &exact, 1, MPI_INT, MPI_MIN, group);
    MPI_Comm bc;
    MPI_Comm_split(group, active ? 0 : MPI_UNDEFINED, rank, &bc);
    if (active) {
        vae_band bd = {.comm = bc, .rank = rank, .size = n, .wl = p->wl};
        bd.b = xmalloc((size_t)(n + 1) * sizeof(int64_t));
        for (int k = 0; k <= n; k++)
            bd.b[k] = (int64_t)k * (p->units / n) + (k < p->units % n ? k : p->units % n);
        vae_run_begin(&r, m, &vae_banded, &bd);
        r.units = p->units, r.wl = p->wl, r.exact = exact;
        rc = run_rows(&r, p, p->s_in * bd.b[rank], p->s_in * (bd.b[rank + 1] - bd.b[rank]), &mine, &h, &w);
        vae_run_end(&r);
        /* the output's scale: its rows per unit row of the band */
        if (!rc) rc = vae_band_gather(&bd, h / (bd.b[rank + 1] - bd.b[rank]), mine, p->out_ch, out);
        free(bd.b);
        MPI_Comm_free(&bc);
    }
    free(mine);
    return dist_agree(group, rc ? tp_error_context("%s", p->what) : 0);
}
