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

#endif
