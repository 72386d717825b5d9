/* The plan engine: a plan is a table of {glob, style, blocks, if_divides} rules that
 * says how each tensor of a checkpoint is split across tp ranks. Tensors
 * that no rule matches are replicated. At most one '*' per glob, standing
 * for a block index. Blocks are proportions ("1,1") or sizes named by the
 * plan's symbols ("D,D,D,M,M").
 *
 * The engine knows no model and no file format: a model hands it a rule
 * table (plans/<model>_plan.c) with the symbols and divisors it reads from
 * its config, and a format hands it tensor names and shapes (plan_tensor).
 * Validation (plan_validate) happens before any weight byte is read. */
#ifndef TPGEN_PLAN_H
#define TPGEN_PLAN_H
#include <stddef.h>
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
    const char *if_divides;     /* NULL, or a symbol: the rule holds only when tp divides its value
                                   (otherwise the tensor is replicated) */
} plan_rule;

/* A model's rule table: data, in plans/<model>_plan.c. */
typedef struct plan_table {
    const char *model;
    const plan_rule *rules;
    int n_rules;
} plan_table;

extern const plan_table plan_table_flux2;       /* FLUX.2 transformer, diffusers names (D, M) */
extern const plan_table plan_table_flux2_bfl;   /* the same under Black Forest Labs names */
extern const plan_table plan_table_qwen3;       /* Qwen3 text encoder (KV, V), globs behind a prefix */
extern const plan_table plan_table_mistral;     /* Mistral Small 3.x language model (KV, V) */
extern const plan_table plan_table_qwen3vl;     /* Qwen3-VL language model, FLUX.3 (KV, V) */
extern const plan_table plan_table_flux3;       /* FLUX.3 transformer (D, M) */
extern const plan_table plan_table_flux3_bfl;   /* the same under Black Forest Labs names */

/* One tensor as the engine sees it: a name and a row-major shape. */
typedef struct plan_tensor {
    const char *name;
    int ndim;
    const int64_t *shape;
} plan_tensor;

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

/* A plan instantiated from a table for one checkpoint and degree tp:
 * rules whose if_divides symbol tp does not divide are dropped and every
 * glob gets `prefix` in front (e.g. "model." for an LLM). Set the symbols
 * and divisors of b->p first (plan_add_*), then call plan_use_table. The
 * plan points into *b: do not copy a plan_built after filling it. */
#define PLAN_MAX_RULES 24
typedef struct plan_built {
    plan p;
    plan_rule rules[PLAN_MAX_RULES];
    char globs[PLAN_MAX_RULES][160];
} plan_built;
int plan_use_table(plan_built *b, const plan_table *t, const char *prefix, int tp);

/* How one tensor maps onto a rank. */
typedef struct shard_info {
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
 * range is height 1. docs/spec/flux2-transformer.md §8.2. */
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

/* Resolve and validate a plan against the n tensors of a checkpoint
 * (`where`: its name in messages) for degree tp: every glob must match at
 * least one tensor, every divisibility rule must hold. On failure the
 * message names the tensor (or glob) and the rule. */
int plan_validate(const plan *p, const plan_tensor *tensors, int n, const char *where, int tp);
/* The shard of tensor `t` under plan p at degree tp (p NULL: replicated). */
int plan_shard(const plan *p, plan_tensor t, int tp, shard_info *out);

#endif
