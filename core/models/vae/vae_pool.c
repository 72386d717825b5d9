/* What every run of the VAE blocks uses, whichever its strategy: the run's
 * activation pool, the per-op time accounting and the band height of a
 * convolution that goes in bands of output rows. */
#include "vae_internal.h"
#include "kernels/err.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

void vae_run_begin(vae_run *r, const vae_model *m, const vae_strategy *st, const vae_band *band) {
    memset(r, 0, sizeof *r);
    r->m = m, r->be = m->be, r->dt = m->dt, r->st = st, r->band = band;
    r->band_bytes = m->band_bytes, r->prof = m->prof;
    r->exact = op_rows_invariant(m->be, m->dt);
}

void vae_run_end(vae_run *r) {
    be_sync(r->be);
    for (int i = 0; i < VAE_POOL_MAX; i++) {
        be_free(r->be, r->pool[i].data);
        memset(&r->pool[i], 0, sizeof r->pool[i]);
    }
}

double vae_prof_begin(const vae_run *r) {
    if (!r->prof) return 0;
    be_sync(r->be);
    return omp_get_wtime();
}

void vae_prof_end(const vae_run *r, int slot, double t0) {
    if (!r->prof) return;
    be_sync(r->be);
    r->prof[slot] += omp_get_wtime() - t0;
}

/* Free the idle buffers (after the banded passes, whose band-sized
 * buffers would otherwise stay allocated through the next ResNet). */
void vae_pool_trim(vae_run *r) {
    for (int i = 0; i < VAE_POOL_MAX; i++)
        if (r->pool[i].data && !r->pool[i].busy) {
            be_free(r->be, r->pool[i].data);
            r->pool[i].data = NULL;
            r->pool[i].cap = 0;
        }
}

int vae_pool_get(vae_run *r, int64_t rows, int64_t cols, tensor *out) {
    size_t need = (size_t)rows * (size_t)cols * dtype_size(r->dt);
    int best = -1;
    for (int i = 0; i < VAE_POOL_MAX; i++) {
        vae_buf *b = &r->pool[i];
        if (b->data && !b->busy && b->cap >= need && (best < 0 || b->cap < r->pool[best].cap)) best = i;
    }
    if (best < 0) {
        /* nothing idle is big enough: give the idle buffers back first, so
         * that the peak stays near the live set */
        vae_pool_trim(r);
        for (int i = 0; i < VAE_POOL_MAX && best < 0; i++)
            if (!r->pool[i].data) best = i;
        if (best < 0) tp_fatal("vae: activation pool exhausted (more than %d live buffers)", VAE_POOL_MAX);
        r->pool[best].data = be_alloc(r->be, need ? need : 1);
        if (!r->pool[best].data) return tp_error_context("VAE activations");
        r->pool[best].cap = need;
    }
    r->pool[best].busy = 1;
    *out = tensor_wrap(r->be, r->dt, rows, cols, r->pool[best].data);
    return 0;
}

void vae_pool_put(vae_run *r, const tensor *t) {
    for (int i = 0; i < VAE_POOL_MAX; i++)
        if (r->pool[i].data == t->data && r->pool[i].busy) { r->pool[i].busy = 0; return; }
    tp_fatal("vae: buffer returned to the pool twice or not from it");
}

/* Output rows per band of a convolution: the band's (upsampled) input and
 * its output must fit in band_bytes, and in a quarter of the output's size
 * so that the bands never dominate the peak. (The backends' conv2d already
 * bounds its own im2col workspace.) */
int64_t vae_band_rows(const vae_run *r, int64_t cin, int64_t cout, int64_t H, int64_t W) {
    size_t es = dtype_size(r->dt), per_row = (size_t)W * (size_t)(cin + cout) * es;
    size_t budget = (size_t)cout * (size_t)H * (size_t)W * es / 4;
    if (r->band_bytes < budget) budget = r->band_bytes;
    int64_t rows = (int64_t)(budget / (per_row ? per_row : 1));
    return rows < 1 ? 1 : rows;
}
