/* CPU implementations of the op interface (kernels/ops.h). Each function has
 * the signature of its vtable entry; cpu_backend.c puts them in the table. */
#ifndef TPGEN_CPU_OPS_H
#define TPGEN_CPU_OPS_H
#include "kernels/ops.h"

/* Set the OpenMP / OpenBLAS thread count for this process (<= 0: leave). */
void cpu_set_threads(int threads);

/* Testing hook: cap the scratch the tiled ops use (GEMM x chunks, the conv
 * im2col band) at `bytes` so that small tests cross tile boundaries;
 * 0 restores the defaults. */
void cpu_set_tile_budget(size_t bytes);
size_t cpu_tile_budget(size_t default_bytes);
/* A scratch buffer that stays allocated between calls (the kernels keep
 * theirs in _Thread_local variables, one per thread): at least `bytes`,
 * 64-byte aligned; exits with a message when memory runs out. */
typedef struct { void *p; size_t bytes; } cpu_scratch;
void *cpu_scratch_get(cpu_scratch *s, size_t bytes);

/* cpu_gemm.c */
void cpu_gemm(backend *, tensor *y, const tensor *x, const tensor *w, const tensor *bias);
/* 1 when the AVX512-BF16 GEMM kernel is compiled in and the CPU supports it */
int cpu_has_avx512bf16(void);
/* 1 when vdpbf16ps does more multiply-adds per second than f32 FMAs on
 * this CPU (cpu_gemm_bf16.c): AMD Zen 4/5 yes, Intel's cores no. */
int cpu_vdpbf16_preferred(void);
/* Which bf16 kernels run. AUTO (the default): AMX where the CPU has it,
 * the AVX512-BF16 kernels (GEMM, fp8 GEMM, attention, convolution) where
 * the CPU has them and cpu_vdpbf16_preferred, else the portable paths
 * (GEMM: the packed f32 path of cpu_gemm_packed.c; attention: widen to f32
 * + sgemm). PORTABLE: the portable paths only. VECTOR: the AVX512-BF16
 * kernels wherever the CPU has them. For benchmarks and tests. */
typedef enum { CPU_ROUTE_AUTO, CPU_ROUTE_PORTABLE, CPU_ROUTE_VECTOR } cpu_route;
void cpu_kernel_route(cpu_route r);
/* the AVX512-BF16 (vdpbf16ps) kernels run: the CPU has them and the route takes them */
int cpu_bf16_kernels_enabled(void);
/* the route allows the bf16 hardware kernels at all (AMX included): not PORTABLE, AVX512-BF16 present */
int cpu_bf16_hw_allowed(void);

/* cpu_attention.c */
void cpu_attention(backend *, tensor *o, const tensor *q, const tensor *k, const tensor *v,
                   const attn_params *p);

/* cpu_norm.c */
void cpu_layernorm_mod(backend *, tensor *y, const tensor *x, const tensor *shift,
                       const tensor *scale, float eps);
void cpu_rmsnorm(backend *, tensor *y, const tensor *x, const tensor *w, int group, float eps);
void cpu_group_norm(backend *, tensor *y, const tensor *x, const tensor *gamma,
                    const tensor *beta, int groups, float eps, int apply_silu);
void cpu_channel_sums(backend *, const tensor *x, const double *center, int p, double *out);
void cpu_channel_affine(backend *, tensor *y, const tensor *x, const float *a, const float *b, int apply_silu);

/* cpu_eltwise.c */
void cpu_copy(backend *, tensor *y, const tensor *x);
void cpu_rope(backend *, tensor *x, const tensor *cos, const tensor *sin, int head_dim, rope_mode mode);
void cpu_swiglu(backend *, tensor *y, const tensor *gate, const tensor *up);
void cpu_silu(backend *, tensor *y, const tensor *x);
void cpu_add(backend *, tensor *y, const tensor *a, const tensor *b);
void cpu_gated_add(backend *, tensor *x, const tensor *gate, const tensor *y);

/* cpu_layout.c */
void cpu_gather_rows(backend *, tensor *y, const tensor *table, const int32_t *ids, int64_t n,
                     int64_t row0);
void cpu_upsample2x(backend *, tensor *y, const tensor *x, int64_t h, int64_t wd);
void cpu_transpose(backend *, tensor *y, const tensor *x);

/* cpu_conv_wino.c: the f32 3x3 stride-1 convolution as Winograd F(4x4, 3x3).
 * Usable for k 3, stride 1, at least 8 input channels, unless turned off
 * (the hook below for tests, TPGEN_NO_WINOGRAD=1 for benchmarks). */
void cpu_conv_wino_force_off(int on);
int cpu_conv_wino_usable(int64_t cin, int k, int stride);
void cpu_conv_wino(tensor *y, const tensor *x, const tensor *w, const float *bias, int64_t h, int64_t wd);
/* cpu_conv.c */
/* Testing hook: keep the bf16 convolution off AMX (the vdpbf16ps route). */
void cpu_conv_amx_force_off(int on);
/* the bf16 convolution runs on AMX (cpu_conv_amx.c) */
int cpu_conv_amx_enabled(void);
void cpu_conv2d_down(backend *, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
                     int64_t h, int64_t wd);
/* op_channel_row_sums (cpu_norm.c) */
void cpu_channel_row_sums(backend *, const tensor *x, int64_t W, const double *center, int p, double *out);
/* op_rows_invariant (cpu_conv.c) */
int cpu_rows_invariant(backend *, dtype_t dt);
void cpu_conv2d(backend *, tensor *y, const tensor *x, const tensor *w, const tensor *bias,
                int64_t h, int64_t wd, int k);

#endif
