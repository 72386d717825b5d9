/* `tpgen check` for a FLUX.3 transformer folder (cli/check_flux3.c). */
#ifndef TPGEN_CHECK_FLUX3_H
#define TPGEN_CHECK_FLUX3_H
#include "core/dist/dist.h"
#include "kernels/comm.h"
#include "kernels/ops.h"
#include <stdint.h>

/* The golden cases of cases_path (or, when NULL, seeded random inputs
 * against an unsharded copy on rank 0) through the TP forward of the
 * transformer in dir. Collective over d->tp_comm; prints the case lines
 * and the verdict on rank 0. Returns the exit status: 0 all cases within
 * tol, 1 otherwise or on an error (reported once). quantize_fp8: both the
 * sharded model and the unsharded reference load with --quantize fp8, and
 * with the LoRA adapters `loras` merged (their cases' outputs are the
 * adapted model's; rank 0 prints the adapter bytes each rank read). */
struct lora_spec;
int check_flux3(const char *dir, const char *cases_path, dtype_t precision, int quantize_fp8,
                const struct lora_spec *loras, int n_loras, double tol, uint64_t seed, const dist *d, backend *be,
                comm *c);

#endif
