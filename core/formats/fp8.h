/* fp8 checkpoints: the formats users download, read at checkpoint_open.
 *
 * A weight `<m>.weight` stored F8_E4M3 or F8_E5M2 is dequantised as
 * decode(code) x s, s from `<m>.weight_scale` or `<m>.scale_weight` (F32;
 * [] or [1]: one scale for the tensor; [out] or [out, 1]: one per output
 * row), or s = 1 when there is none (raw fp8). The other tensors of the
 * ComfyUI formats are not weights and are taken out of the checkpoint's
 * tensor list (so plans, tensor counts and inspect see only weights):
 * `scale_input`/`input_scale` (activation-quantisation hints for an fp8
 * GEMM), `<m>.comfy_quant` (uint8 JSON per layer), the legacy `scaled_fp8`
 * marker. Per-layer hints come from `.comfy_quant` and from the header's
 * `__metadata__` `_quantization_metadata` ({"layers": {m: {...}}}); unknown
 * fields are ignored.
 *
 * Every inconsistency is an error naming the tensor, found on every rank
 * from the headers and the (small) scale tensors alone: a scale on a
 * non-fp8 weight, an unknown scale layout, non-finite scales, two scale
 * spellings for one weight, a scale without its weight, a layer whose hint
 * names another format than its dtype, an unsupported hinted format, a
 * hinted or marker-flagged fp8 layer without a scale. */
#ifndef TPGEN_FP8_H
#define TPGEN_FP8_H
#include "checkpoint.h"
#include "kernels/tensor.h"
#include "plans/plan.h"

typedef struct fp8_layer {
    const st_tensor_info *scale;  /* the scale tensor (NULL: raw fp8, s = 1) */
    int per_row;                  /* one scale per output row */
    int64_t n_scale;              /* 1, or the weight's rows */
    float *values;                /* the scales as f32 (host; validated finite) */
    float input_scale;            /* scale_input/input_scale, 0 when absent (fp8-GEMM hint) */
    int flags;                    /* TQ_FULL_PRECISION_MM */
    const char *hint;             /* "comfy_quant", "_quantization_metadata", both or NULL */
} fp8_layer;

typedef struct fp8_info {
    fp8_layer **layer;            /* per tensor of the checkpoint (infos order); NULL: not fp8 */
    int n_fp8;                    /* fp8 weights */
    int n_aux;                    /* non-weight tensors taken out of the list */
    int n_scaled;                 /* fp8 weights with a scale */
    int marker;                   /* the scaled_fp8 marker: 0 none, 1 present, 2 full-precision matmul */
    uint64_t aux_bytes;           /* bytes of the taken-out tensors */
} fp8_info;

/* Called by checkpoint_open once the tensors are sorted: classify, take the
 * aux tensors out of c->infos, validate. 0 ok (c->fp8 NULL when the
 * checkpoint has no fp8 tensor and no fp8 metadata), -1 + tp_error. */
int fp8_scan(checkpoint *c);
void fp8_info_free(fp8_info *f);
void fp8_checkpoint_free(checkpoint *c);   /* checkpoint_close: the layers and the info */

/* The fp8 layer of tensor index k of c, or NULL. */
const fp8_layer *fp8_layer_of(const checkpoint *c, int k);

/* Attach the scales of rank `rank`'s shard si (tp ranks) of fp8 tensor k to
 * the local tensor t: per-tensor scales and row-split shards get every
 * value; per-row scales of a dim-0 split (colwise, packed colwise) follow
 * the rows the rank holds. *bytes = scale bytes held. No-op for a tensor
 * that is not fp8. */
int fp8_attach_scale(const checkpoint *c, int k, const shard_info *si, int tp, int rank, tensor *t,
                     uint64_t *bytes);
/* Scale bytes rank `rank` would hold for tensor k (weights_estimate). */
uint64_t fp8_scale_bytes(const checkpoint *c, int k, const shard_info *si, int tp);

/* --quantize fp8: 1 when a loaded tensor should be quantised (a sharded
 * linear weight, as mixed fp8 files have them; embeddings, norms,
 * modulation, embedders and the final layer stay as they are). */
int fp8_quantize_eligible(const st_tensor_info *t, const shard_info *si);
/* Replace t's data (bf16/f16/f32, on its backend) by E4M3 codes with one
 * absmax scale per row: s[r] = absmax(row)/448 (1 for an all-zero row),
 * code = fp8(clamp(x / s)). Works in bounded row chunks through the host. */
int fp8_quantize_tensor(tensor *t, const char *name);

#endif
