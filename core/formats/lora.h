/* LoRA adapters applied to each rank's own shard at load time.
 *
 * An adapter file (safetensors) in one of the formats users have is read
 * header-first: its format is detected from the key names as diffusers'
 * Flux2LoraLoaderMixin.lora_state_dict does (diffusers/PEFT `transformer.`,
 * PEFT `base_model.model.`, ai-toolkit `diffusion_model.` with BFL names,
 * kohya `lora_unet_`), every module is mapped onto a tensor of the
 * checkpoint being loaded (diffusers or BFL layout) and every shape, rank
 * and alpha is checked before any weight byte is read (lora_set_open).
 *
 * Each mapped module becomes one or more segments: "rows [row0, row0+n) of
 * checkpoint tensor T get coef * B[brow0 : brow0+n] @ A", coef = the user's
 * weight times the format's scale. A fused BFL qkv LoRA is three segments
 * on a diffusers checkpoint (lora_A shared, lora_B chunked in 3, as
 * diffusers' converter splits it); a BFL final-layer LoRA on a diffusers
 * checkpoint is two segments with the (shift, scale) halves swapped.
 *
 * During weights_load the merge hook (lora_merge_shard, core/formats/lora_merge.c)
 * reads only the rows of B and the columns of A that the rank's shard
 * touches, adds the deltas in f32 and rounds once to the stored dtype. A
 * tensor stored fp8 or GGUF-quantised is not merged: the same pieces become
 * low-rank terms of the weight (kernels/tensor.h), added by op_gemm. */
#ifndef TPGEN_LORA_H
#define TPGEN_LORA_H
#include "checkpoint.h"
#include "kernels/tensor.h"
#include "plans/plan.h"
#include <stdint.h>

#define LORA_MAX_ADAPTERS 16
/* the largest |weight x alpha / rank| accepted: real adapters are far below
 * (scales of 0.1 to 100); beyond it the merge is noise or overflows */
#define LORA_MAX_SCALE 1e6

/* What the user asked for: --lora FILE[:WEIGHT] or a run-spec entry. */
typedef struct lora_spec {
    char *path;
    double weight;
} lora_spec;

/* Parse "FILE[:WEIGHT]" (weight default 1.0, negative allowed; a path with
 * a ':' whose tail is not a number is taken whole). */
int lora_spec_parse(const char *arg, lora_spec *out);
void lora_specs_free(lora_spec *s, int n);

typedef enum {
    LORA_FMT_PEFT = 0,          /* transformer.<diffusers module>.lora_A/B.weight */
    LORA_FMT_PEFT_PREFIX,       /* base_model.model.<module>.lora_A/B.weight */
    LORA_FMT_AITK,              /* diffusion_model.<BFL module>.lora_A/B (or lora_down/up).weight */
    LORA_FMT_KOHYA,             /* lora_unet_<BFL module, '_'>.lora_down/up.weight + .alpha */
    LORA_FMT_BARE,              /* module names without a prefix */
    LORA_FMT_LYCORIS,           /* lycoris_<diffusers module, '.' -> '_'>.<param> (LyCORIS save_weights) */
} lora_format;

/* What a module's delta is (docs/lora.md, docs/spec/lora-dialects.md):
 * LoRA B@A; LoKr kron(w1, w2), each factor full or a product w_a@w_b; LoHa
 * (w1a@w1b) * (w2a@w2b) elementwise; a ComfyUI `.diff`, the full delta. */
typedef enum { LORA_KIND_LORA = 0, LORA_KIND_LOKR, LORA_KIND_LOHA, LORA_KIND_DIFF } lora_kind;
const char *lora_kind_name(lora_kind k);
/* the factor slots of a LoKr / LoHa / diff segment */
enum { LK_W1, LK_W1A, LK_W1B, LK_W2, LK_W2A, LK_W2B, LK_N };
const char *lora_format_name(lora_format f);

typedef struct lora_segment {
    int adapter;                /* index in the set */
    const char *tensor;         /* checkpoint tensor name (owned) */
    int64_t row0, nrows;        /* target rows of that tensor */
    lora_kind kind;
    const st_tensor_info *a, *b;/* LoRA: lora_A [r, in], lora_B [out, r] in the adapter file */
    const st_tensor_info *x[LK_N]; /* LoKr: w1 | w1_a, w1_b; w2 | w2_a, w2_b. LoHa: w1_a, w1_b, w2_a, w2_b
                                  in LK_W1A, LK_W1B, LK_W2A, LK_W2B. diff: LK_W1 (1-D: one column) */
    int64_t cols;               /* the module's input width (its delta is [rows of B, cols]) */
    int64_t brow0;              /* first row of B (of the module's delta) used */
    int64_t rank;               /* LoRA / LoHa rank; LoKr: the decomposed factor's rank, 0 when both are full */
    double coef;                /* weight * scale */
    char *module;               /* the adapter's module name (messages, inspect) */
} lora_segment;

typedef struct lora_adapter {
    char *path;
    double weight;
    st_file *f;
    lora_format fmt;
    int64_t rank;               /* largest rank of its modules */
    double scale;               /* scale of its modules; NAN when they differ */
    int n_modules;              /* adapter modules mapped (a fused qkv counts once) */
    int n_dora_dropped;
    unsigned kinds;             /* 1 << lora_kind of its modules */
    int n_ignored;              /* .diff_b keys ignored (FLUX has no biases) */
    int n_unmatched;            /* modules that match no weight (only with lora_set_open_inspect) */
    char **unmatched;
    uint64_t bytes_read;        /* A/B bytes read by this rank (merge) */
    uint64_t bytes_alpha;       /* alpha scalars read at open */
} lora_adapter;

typedef struct lora_set {
    int n;
    lora_adapter ad[LORA_MAX_ADAPTERS];
    int n_seg;
    lora_segment *seg;          /* sorted by tensor name */
    size_t max_piece;           /* largest A or B piece read (bytes, f32) */
    struct backend *merge_be;   /* host backend of the merge when shards live on a device */
    int inspect;                /* list modules that match nothing instead of refusing the adapter */
    int structured_terms;       /* LoKr/LoHa blocks on quantised weights kept as low-rank terms, */
    int dense_terms;            /* and blocks kept as a dense delta (lora_merge.c) */
} lora_set;

/* Open and validate the adapters against checkpoint ck (its names tell the
 * layout: BFL when checkpoint_is_bfl). Reads headers and alpha scalars
 * only. Errors name the adapter file and key. Warnings (DoRA keys dropped)
 * go to stderr when `verbose`. */
int lora_set_open(const lora_spec *specs, int n, const checkpoint *ck, int verbose, lora_set **out);
/* The same for `inspect --lora`: a module that matches no weight of ck is
 * listed (ad->unmatched) rather than refused; every other error stands. */
int lora_set_open_inspect(const lora_spec *specs, int n, const checkpoint *ck, int verbose, lora_set **out);
void lora_set_free(lora_set *s);

/* The weights_load hook (load_opts.transform): merge every segment of the
 * tensor ti into the rank's shard t (core/formats/lora_merge.c). */
int lora_merge_shard(void *set, const st_tensor_info *ti, const shard_info *si, int tp, int rank, tensor *t);

/* Bytes rank `rank` of tp reads from each adapter (bytes[adapter]) through
 * plan p, without reading: the same pieces the merge reads. */
int lora_estimate(const lora_set *s, const checkpoint *ck, const plan *p, int tp, int rank, uint64_t *bytes);

#endif
