/* One case of the golden flux3-tiny transformer_cases files: the forward's
 * inputs (reference tokens and target timestep when the case has them) and
 * the expected output. Shared by the FLUX.3 transformer, fp8 and BFL tests. */
#ifndef TPGEN_TEST_FLUX3_CASE_H
#define TPGEN_TEST_FLUX3_CASE_H
#include "core/formats/safetensors.h"
#include "core/models/flux3/flux3.h"
#include <mpi.h>
#include <stdint.h>

typedef struct f3_case {
    float *x, *txt, *cond, *ref, ts, tt;
    int32_t *img_ids, *txt_ids, *cond_ids;
    int64_t N, L, R;
    int has_tt;
} f3_case;

/* caseK of f; 0, or -1 (c is then empty) */
int f3_case_read(const st_file *f, int k, f3_case *c);
void f3_case_free(f3_case *c);
flux3_inputs f3_case_inputs(const f3_case *c);
/* The largest tp <= np that divides `heads` (6: np 1 -> 1, 2 -> 2, 3 and 4
 * -> 3). Ranks are grouped by tp consecutive ranks; a remainder (rank 3 of
 * 4) is a group of its own at tp 1, so tp 3 and tp 1 both run at np 4.
 * *tp: this rank's group size. */
MPI_Comm f3_tp_group(int heads, int *tp);

#endif
