/* AVX512-BF16 GEMM (placeholder until the kernel lands: never usable). */
#include "cpu_gemm_bf16.h"
#include "cpu_ops.h"
#include "../../core/err.h"

int cpu_has_avx512bf16(void) { return 0; }
int cpu_gemm_bf16_usable(int64_t M, int64_t N, int64_t K) { return 0; }
void cpu_gemm_bf16(tensor *y, const tensor *x, const tensor *w, const float *bias) {
    tp_fatal("cpu_gemm_bf16: not available");
}
