/* One case of a golden transformer_cases file (flux2-tiny-a): the inputs of
 * a transformer forward and, when asked for, its expected output. Shared by
 * the transformer, fp8 and LoRA tests. */
#ifndef TPGEN_TEST_GOLDEN_CASE_H
#define TPGEN_TEST_GOLDEN_CASE_H
#include "core/formats/safetensors.h"
#include <stdint.h>

typedef struct golden_case {
    float *x, *txt, *ref, ts, g;   /* ref: NULL unless read */
    int32_t *img_ids, *txt_ids;
    int64_t N, L;
} golden_case;

/* an I64 ids tensor [n, 4] as int32 (malloc'ed); NULL + tp_error */
int32_t *golden_ids32(const st_file *f, const char *name, int64_t *n);
/* the inputs of caseK (hidden_states, encoder_hidden_states, timestep,
 * guidance, img_ids, txt_ids); 0 or -1 */
int golden_case_read(const st_file *f, int k, golden_case *c);
/* the expected output from tensor `key` of f into c->ref; 0 or -1 */
int golden_case_read_ref(const st_file *f, const char *key, golden_case *c);
void golden_case_free(golden_case *c);

/* caseC.input_ids and caseC.attention_mask (I64 [1, n] or [n]) as int32; 0 or -1 */
int golden_case_ids(const st_file *f, int c, int n, int32_t *ids, int32_t *mask);
/* relative L2 of column block k of a stacked [n, K*H] output against ref
 * [n, H], over the rows where row_ok (NULL: all); INFINITY for NaN */
double golden_block_rel(const float *out, int K, int k, const float *ref, int n, int H, const int32_t *row_ok);

#endif
