/* GGUF files as checkpoints and the block layout of quantised shards
 * (gguf_shard.h). */
#include "gguf_shard.h"
#include "gguf.h"
#include "kernels/err.h"
#include "kernels/quant.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor_info *)a)->name, ((const st_tensor_info *)b)->name);
}

int gguf_st_open(const char *path, st_file **out) {
    *out = NULL;
    gguf_file *g;
    if (gguf_open(path, &g)) return -1;
    st_file *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    f->fd = -1;
    f->file_size = g->file_size;
    f->data0 = g->data0;
    f->tensors = xcalloc((size_t)(g->n ? g->n : 1), sizeof *f->tensors);
    int rc = 0;
    for (int i = 0; i < g->n && !rc; i++) {
        const gguf_tensor *t = &g->tensors[i];
        st_tensor_info *s = &f->tensors[i];
        if (quant_dtype(t->type, &s->dtype)) {
            if (gguf_check_type(g, t)) { rc = -1; break; }
            s->dtype = DT_GGML;
            s->qtype = t->type;
        }
        s->name = xstrdup(t->name);
        s->ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++) s->shape[d] = t->shape[d];
        s->begin = t->begin, s->end = t->end;
        f->n++;
    }
    if (!rc && (f->fd = dup(g->fd)) < 0) rc = tp_error("%s: %s", path, strerror(errno));
    gguf_close(g);
    if (rc) { st_close(f); return -1; }
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_name);
    *out = f;
    return 0;
}

/* the segment of local columns [lc0, lc0 + n) stored from column c0 of a
 * file row, added once (pieces of other rows reuse it) */
static int add_seg(qshard *q, const quant_type *qt, int64_t lc0, int64_t n, int64_t c0, int64_t *len) {
    int64_t off, skip;
    quant_col_span(qt, c0, c0 + n, &off, len, &skip);
    for (int i = 0; i < q->n_seg; i++)
        if (q->seg[i].col0 == lc0 && q->seg[i].ncols == n && q->seg[i].skip == skip) return i;
    q->seg[q->n_seg] = (tensor_qseg){lc0, n, q->pitch, skip};
    q->pitch += *len;
    return q->n_seg++;
}

int qshard_plan(const st_tensor_info *ti, const shard_info *si, int tp, int rank, qshard *out) {
    memset(out, 0, sizeof *out);
    const quant_type *qt = quant_type_get(ti->qtype);
    if (ti->dtype != DT_GGML || !qt) return tp_error("tensor '%s' is not a GGUF block tensor", ti->name);
    if (ti->ndim > 2)
        return tp_error("tensor '%s': a quantised (%s) tensor of %d dimensions cannot be loaded (2 at most)", ti->name,
                        qt->name, ti->ndim);
    int64_t cols = si->global_cols, lcols = si->local_cols;
    uint64_t row_bytes = (uint64_t)quant_row_bytes(qt, cols);
    shard_piece pc[PLAN_MAX_PIECES];
    int np = plan_shard_pieces(si, tp, rank, pc);
    int whole = 0, split = 0, seg_of[PLAN_MAX_PIECES];
    int64_t len;
    for (int i = 0; i < np; i++) {
        const shard_piece *p = &pc[i];
        int rows_ok = p->src_off % cols == 0 && p->width % cols == 0 && lcols == cols &&
                      (p->height == 1 || (p->src_pitch % cols == 0 && p->dst_pitch % cols == 0));
        int cols_ok = p->src_off % cols + p->width <= cols && (p->height == 1 || p->src_pitch % cols == 0) &&
                      (p->height == 1 || p->dst_pitch == lcols);
        if (rows_ok) whole = 1;
        else if (cols_ok) split = 1;
        if ((!rows_ok && !cols_ok) || (whole && split))
            return tp_error("tensor '%s': this shard of a quantised (%s) tensor is neither whole rows nor a column "
                            "range of every row (plan piece %d); load a bf16 checkpoint for this split", ti->name,
                            qt->name, i);
        if (!rows_ok) seg_of[i] = add_seg(out, qt, p->dst_off % lcols, p->width, p->src_off % cols, &len);
    }
    if (whole) {
        out->pitch = (int64_t)row_bytes;
        out->n_seg = 1;
        out->seg[0] = (tensor_qseg){0, cols, 0, 0};
    }
    for (int i = 0; i < np; i++) {
        const shard_piece *p = &pc[i];
        qshard_run *r = &out->run[out->n_run++];
        r->height = p->height;
        if (whole) {   /* whole rows: each run is width / cols rows, one contiguous read */
            r->src = ti->begin + (uint64_t)(p->src_off / cols) * row_bytes;
            r->src_pitch = (uint64_t)(p->src_pitch / cols) * row_bytes;
            r->len = (size_t)(p->width / cols) * row_bytes;
            r->dst = (size_t)(p->dst_off / cols) * (size_t)out->pitch;
            r->dst_pitch = (size_t)(p->dst_pitch / cols) * (size_t)out->pitch;
        } else {       /* one row per run: the covering blocks of the piece's columns */
            int64_t off, len, skip;
            quant_col_span(qt, p->src_off % cols, p->src_off % cols + p->width, &off, &len, &skip);
            r->src = ti->begin + (uint64_t)(p->src_off / cols) * row_bytes + (uint64_t)off;
            r->src_pitch = (uint64_t)(p->src_pitch / cols) * row_bytes;
            r->len = (size_t)len;
            r->dst = (size_t)(p->dst_off / lcols) * (size_t)out->pitch + (size_t)out->seg[seg_of[i]].off;
            r->dst_pitch = (size_t)out->pitch;
        }
        out->bytes += (uint64_t)r->len * (uint64_t)r->height;
    }
    return 0;
}

int gguf_scan_finite(const st_file *f, const st_tensor_info *t, int64_t *first, int64_t *count) {
    const quant_type *qt = quant_type_get(t->qtype);
    int64_t cols = t->ndim ? t->shape[t->ndim - 1] : 1, rb = quant_row_bytes(qt, cols);
    int64_t rows = rb > 0 ? (int64_t)(t->end - t->begin) / rb : 0;
    int64_t chunk = (int64_t)(4u << 20) / (cols * 4) > 0 ? (int64_t)(4u << 20) / (cols * 4) : 1;   /* rows per read */
    uint8_t *raw = xmalloc((size_t)(chunk * rb));
    float *v = xmalloc((size_t)(chunk * cols) * sizeof(float));
    *first = -1, *count = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        if (st_read_range(f, t->begin + (uint64_t)(r0 * rb), raw, (size_t)(nr * rb))) {
            free(raw), free(v);
            return -1;
        }
        for (int64_t r = 0; r < nr; r++) quant_dequant_row(t->qtype, raw + r * rb, v + r * cols, cols);
        for (int64_t i = 0; i < nr * cols; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            if ((u & 0x7f800000u) != 0x7f800000u) continue;
            if (*first < 0) *first = r0 * cols + i;
            ++*count;
        }
    }
    free(raw), free(v);
    return 0;
}
