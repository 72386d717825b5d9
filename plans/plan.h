/* The plan engine: a plan is a table of {glob, style, blocks} rules that
 * says how each tensor of a checkpoint is split across tp ranks. Tensors
 * that no rule matches are replicated. At most one '*' per glob, standing
 * for a block index. Blocks are proportions ("1,1") or sizes named by the
 * plan's symbols from the model config ("D,D,D,M,M").
 *
 * Validation (plan_validate) happens before any weight byte is read. */
#ifndef TPGEN_PLAN_H
#define TPGEN_PLAN_H
#include "core/formats/checkpoint.h"
#include <jansson.h>
#include <stdint.h>

typedef enum {
    STYLE_REPLICATED = 0,
    STYLE_COLWISE,              /* dim 0 (out features) split */
    STYLE_ROWWISE,              /* dim 1 (in features) split; output all-reduced */
    STYLE_ROWWISE_SPLIT_INPUT,  /* rowwise whose input arrives unsplit: the rank slices its input */
    STYLE_PACKED_COLWISE,       /* dim 0 split block by block */
    STYLE_PACKED_ROWWISE,       /* dim 1 split block by block */
} shard_style;

const char *shard_style_name(shard_style s);

typedef struct plan_rule {
    const char *glob;
    shard_style style;
    const char *blocks;         /* NULL, or "1,1" / "D,D,D,M,M" */
} plan_rule;

/* the largest tensor-parallel degree accepted (loops over tp values stop here) */
#define PLAN_MAX_TP 4096
#define PLAN_MAX_SYMBOLS 8

typedef struct plan {
    const char *model;                      /* "flux2", "qwen3", ... */
    const plan_rule *rules;
    int n_rules;
    int n_symbols;
    const char *sym_names[PLAN_MAX_SYMBOLS];
    int64_t sym_values[PLAN_MAX_SYMBOLS];
    /* divisibility: tp must divide each named count (e.g. attention heads) */
    int n_divisors;
    const char *div_names[4];
    int64_t div_values[4];
} plan;

/* Add a symbol / a divisor to a plan (plan_* constructors use these). */
void plan_add_symbol(plan *p, const char *name, int64_t value);
void plan_add_divisor(plan *p, const char *name, int64_t value);

/* The FLUX.2 transformer plan (spec flux2-transformer.md §7.2), with its
 * symbols (D, M) and divisors (heads) taken from config.json. */
int plan_flux2(const json_t *config, plan *out);
/* The same plan under the names of a Black Forest Labs single-file
 * checkpoint (spec Appendix A; plans/flux2_bfl_plan.c), and the test that
 * picks it: 1 when the checkpoint has BFL names (img_in.weight). */
int plan_flux2_bfl(const json_t *config, plan *out);
int plan_flux2_is_bfl(const checkpoint *c);
/* The FLUX.3 transformer's rule table (plans/flux3_plan.c), no symbols:
 * core/models/flux3.c adds D, M and the head divisor from the config. */
void plan_flux3_rules(plan *out);

/* The plan of a pipeline component ("transformer", "text_encoder", ...)
 * at degree tp, chosen by a small table in plan.c (add a row for a new
 * component). Some plans depend on tp and on the checkpoint's tensor
 * names (the LLM text encoders), and a component may load only some of
 * its tensors (want). Returns 1 with an empty plan when the component has
 * none (everything replicated), 0 when *out was filled, -1 on a bad config
 * or a tp the plan cannot take. Free with component_plan_free. */
typedef struct component_plan {
    plan p;
    int (*want)(const char *name, void *ctx);   /* tensors the component loads; NULL: all */
    void *want_ctx;
    void *storage;                              /* owned by the plan (rules, globs, want_ctx) */
} component_plan;
int plan_for_component(const char *component, const json_t *config, const checkpoint *c, int tp,
                       component_plan *out);
void component_plan_free(component_plan *cp);

/* How one tensor maps onto a rank. */
typedef struct shard_info {
    const st_tensor_info *info;
    shard_style style;
    int n_blocks;
    int64_t blocks[8];          /* absolute sizes along the split dim */
    int64_t global_rows, global_cols;   /* 2-D view: rows = shape[0], cols = prod(shape[1:]) */
    int64_t local_rows, local_cols;
    int rule;                   /* index of the matching rule, -1 when replicated */
    int64_t split_len;          /* length of the split dim (shape[0] or shape[1]) */
    int64_t unit;               /* elements per index of the split dim (row-major stride) */
} shard_info;

/* One piece of a rank's shard as a 2-D copy, in elements of the tensor:
 * `height` runs of `width` elements; run i starts at element
 * src_off + i*src_pitch of the stored tensor and goes to element
 * dst_off + i*dst_pitch of the local (contiguous) tensor. A contiguous
 * range is height 1. Spec flux2-transformer.md §8.2. */
typedef struct shard_piece {
    int64_t src_off, src_pitch, width, height, dst_off, dst_pitch;
} shard_piece;

#define PLAN_MAX_PIECES 8

/* The pieces rank `rank` of tp reads for shard si (in block order); returns
 * their number (1 for replicated, colwise and rowwise; one per block for
 * the packed styles). */
int plan_shard_pieces(const shard_info *si, int tp, int rank, shard_piece pieces[PLAN_MAX_PIECES]);

/* Elements of a tensor that a rank holds: local_rows * local_cols. */
static inline int64_t shard_local_numel(const shard_info *si) { return si->local_rows * si->local_cols; }

/* Look a symbol up ("D"); -1 when the plan has none of that name. */
int64_t plan_symbol(const plan *p, const char *name);

/* Resolve and validate a plan against a checkpoint for degree tp: every
 * glob must match at least one tensor, every divisibility rule must hold.
 * On failure the message names the tensor (or glob) and the rule. */
int plan_validate(const plan *p, const checkpoint *c, int tp);
/* The shard of tensor `t` under plan p at degree tp (p NULL: replicated). */
int plan_shard(const plan *p, const st_tensor_info *t, int tp, shard_info *out);

#endif
