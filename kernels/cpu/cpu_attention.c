/* Flash-style attention on the CPU: for each (head, tile of BQ query rows)
 * the keys are streamed in tiles of BK with an online softmax, so the
 * memory per thread is O(BQ·BK + (BQ+2·BK)·hd) whatever the sequence length
 * (the VAE's 16384-token single-head attention included). Scores and the
 * P·V products are single-threaded sgemm calls on the tiles; the OpenMP
 * threads share out the (head, query tile) pairs. fp32 throughout, o is
 * rounded once. */
#include "cpu_ops.h"
#include "cpu_rows.h"
#include "cpu_vecmath.h"
#include "cpu_gemm_bf16.h"
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { BQ = 64, BK = 512 };

typedef struct {
    float *q, *o, *s, *k, *v, *m, *l;  /* q,o [BQ,hd]; s [BQ,BK]; k,v [BK,hd]; m,l [BQ] */
    uint32_t *kpanel;                  /* bf16 path: a key tile packed as panels [BK/32][hd/2][32] */
} attn_scratch;

/* bf16 q and k on an AVX512-BF16 CPU: the scores run on vdpbf16ps (exact
 * products, fp32 sums); P·V stays an fp32 sgemm so the softmax is fp32. */
static int use_bf16_scores(const tensor *q, const tensor *k, int hd) {
    return q->dtype == DT_BF16 && k->dtype == DT_BF16 && hd % 2 == 0 && cpu_bf16_kernels_enabled();
}

/* s[i][j] = q_i · k_j for the nq query rows at qrow and the nk keys at krow (bf16) */
static void scores_bf16(const tensor *q, const tensor *k, int64_t i0, int64_t nq, int64_t j0, int64_t nk,
                        int64_t qc, int64_t kc, int hd, attn_scratch *w) {
    const uint16_t *qrow = (const uint16_t *)row_ptr(q, i0) + qc;
    for (int64_t p0 = 0; p0 < nk; p0 += BF16_PANEL_ROWS) {
        int64_t np = nk - p0 < BF16_PANEL_ROWS ? nk - p0 : BF16_PANEL_ROWS;
        bf16_pack_panel((const uint16_t *)row_ptr(k, j0 + p0) + kc, k->ld, np, hd / 2, w->kpanel);
        bf16_panel_gemm(qrow, q->ld, nq, w->kpanel, BF16_PANEL_ROWS, hd / 2, w->s + p0, BK, np);
    }
}

static void scratch_init(attn_scratch *w, int hd) {
    w->q = xmalloc(sizeof(float) * BQ * hd);
    w->o = xmalloc(sizeof(float) * BQ * hd);
    w->s = xmalloc(sizeof(float) * BQ * BK);
    w->k = xmalloc(sizeof(float) * BK * hd);
    w->v = xmalloc(sizeof(float) * BK * hd);
    w->m = xmalloc(sizeof(float) * BQ);
    w->l = xmalloc(sizeof(float) * BQ);
    w->kpanel = xmalloc(sizeof(uint32_t) * BF16_PANEL_ROWS * (size_t)(hd / 2 + 1));
}

static void scratch_free(attn_scratch *w) {
    free(w->q); free(w->o); free(w->s); free(w->k); free(w->v); free(w->m); free(w->l); free(w->kpanel);
}

/* n rows from r0 of columns [c0, c0+hd) of t as f32: direct for f32 tensors. */
static const float *tile_f32(const tensor *t, int64_t r0, int64_t n, int64_t c0, int hd, float *buf, int64_t *ld) {
    if (t->dtype == DT_F32) { *ld = t->ld; return (const float *)row_ptr(t, r0) + c0; }
    for (int64_t r = 0; r < n; r++) row_f32(t, r0 + r, c0, hd, buf + r * hd);
    *ld = hd;
    return buf;
}

/* Online-softmax update of rows [0,nq) with the score tile s [nq, nk] for
 * keys [j0, j0+nk): masks, new running max, rescaling of o and l. On return
 * s holds the probabilities exp(s - m). */
static void softmax_tile(attn_scratch *w, int64_t nq, int64_t nk, int hd, int64_t i0, int64_t j0,
                         const attn_params *p, const int32_t *valid) {
    for (int64_t i = 0; i < nq; i++) {
        float *s = w->s + i * BK;
        float mx = scale_max(s, nk, p->scale);
        int64_t last = p->causal ? i0 + i + p->q_pos0 : INT64_MAX; /* last visible key */
        if (valid || j0 + nk - 1 > last) { /* masked keys in this tile */
            mx = -INFINITY;
            for (int64_t j = 0; j < nk; j++) {
                if (j0 + j > last || (valid && !valid[j0 + j])) s[j] = -INFINITY;
                if (s[j] > mx) mx = s[j];
            }
        }
        float m_new = w->m[i] > mx ? w->m[i] : mx;
        if (m_new == -INFINITY) { /* nothing visible yet: p = 0 */
            for (int64_t j = 0; j < nk; j++) s[j] = 0.0f;
            continue;
        }
        float corr = expf(w->m[i] - m_new); /* exp(-inf) = 0 on the first visible tile */
        w->l[i] = w->l[i] * corr + exp_sum(s, nk, m_new);
        w->m[i] = m_new;
        if (corr != 1.0f) scale_row(w->o + i * hd, hd, corr);
    }
}

static void attend_tile(tensor *o, const tensor *q, const tensor *k, const tensor *v, const attn_params *p,
                        const int32_t *valid, int h, int64_t i0, attn_scratch *w) {
    int hd = p->head_dim;
    int64_t Sq = q->rows, Sk = k->rows, nq = Sq - i0 < BQ ? Sq - i0 : BQ, ldq = hd, ldk, ldv;
    int kvh = h / (p->n_q_heads / p->n_kv_heads);
    int bf16_scores = use_bf16_scores(q, k, hd);
    const float *qt = bf16_scores ? NULL : tile_f32(q, i0, nq, (int64_t)h * hd, hd, w->q, &ldq);
    /* a short last tile runs as a whole one (zero rows below): every sgemm has BQ rows, so a query row's
     * result does not depend on how many rows came with it (OpenBLAS picks its kernels by shape), and a VAE
     * band's queries come out as the whole image's (the bf16 scores are per row already) */
    int64_t mq = BQ;
    if (!bf16_scores && nq < BQ) {
        if (qt != w->q)
            for (int64_t i = 0; i < nq; i++) memcpy(w->q + i * hd, qt + i * ldq, sizeof(float) * (size_t)hd);
        memset(w->q + nq * hd, 0, sizeof(float) * (size_t)(BQ - nq) * hd);
        qt = w->q, ldq = hd;
    }
    for (int64_t i = 0; i < mq; i++) { w->m[i] = -INFINITY; w->l[i] = 0.0f; }
    memset(w->o, 0, sizeof(float) * (size_t)mq * hd);
    int64_t kend = Sk;
    if (p->causal && i0 + nq - 1 + p->q_pos0 + 1 < kend) kend = i0 + nq - 1 + p->q_pos0 + 1;
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        int64_t nk = kend - j0 < BK ? kend - j0 : BK;
        if (bf16_scores) {
            scores_bf16(q, k, i0, nq, j0, nk, (int64_t)h * hd, (int64_t)kvh * hd, hd, w);
            for (int64_t i = nq; i < mq; i++) memset(w->s + i * BK, 0, sizeof(float) * (size_t)nk);
        } else {
            const float *kt = tile_f32(k, j0, nk, (int64_t)kvh * hd, hd, w->k, &ldk);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)mq, (int)nk, hd, 1.0f, qt, (int)ldq, kt,
                        (int)ldk, 0.0f, w->s, BK);
        }
        softmax_tile(w, mq, nk, hd, i0, j0, p, valid);
        const float *vt = tile_f32(v, j0, nk, (int64_t)kvh * hd, hd, w->v, &ldv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)mq, hd, (int)nk, 1.0f, w->s, BK, vt, (int)ldv,
                    1.0f, w->o, hd);
    }
    for (int64_t i = 0; i < nq; i++) { /* rows that saw no key get 0 (SDPA) */
        float inv = w->l[i] > 0.0f ? 1.0f / w->l[i] : 0.0f;
        float *orow = w->o + i * hd;
        for (int d = 0; d < hd; d++) orow[d] *= inv;
        row_store(o, i0 + i, (int64_t)h * hd, hd, orow);
    }
}

void cpu_attention(backend *be, tensor *o, const tensor *q, const tensor *k, const tensor *v,
                   const attn_params *p) {
    int hd = p->head_dim, Hq = p->n_q_heads, Hkv = p->n_kv_heads;
    CPU_REQUIRE(hd > 0 && Hq > 0 && Hkv > 0 && Hq % Hkv == 0, "op_attention: heads %d/%d, head_dim %d", Hq, Hkv, hd);
    CPU_REQUIRE(q->cols == (int64_t)Hq * hd && o->cols == q->cols && o->rows == q->rows,
                "op_attention: q/o must be [Sq, %d]", Hq * hd);
    CPU_REQUIRE(k->cols == (int64_t)Hkv * hd && v->cols == k->cols && v->rows == k->rows,
                "op_attention: k/v must be [Sk, %d] with the same Sk", Hkv * hd);
    const int32_t *valid = NULL;
    if (p->key_valid) {
        CPU_REQUIRE(p->key_valid->dtype == DT_I32 && p->key_valid->rows * p->key_valid->cols == k->rows,
                    "op_attention: key_valid must be I32 [1, %lld]", (long long)k->rows);
        valid = p->key_valid->data;
    }
    int64_t Sq = q->rows, nqt = (Sq + BQ - 1) / BQ, work = (int64_t)Hq * nqt;
#pragma omp parallel if (work > 1)
    {
        attn_scratch w;
        scratch_init(&w, hd);
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < work; t++)
            attend_tile(o, q, k, v, p, valid, (int)(t / nqt), (t % nqt) * BQ, &w);
        scratch_free(&w);
    }
}
