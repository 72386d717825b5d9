/* The f32 FMA micro-kernel of the packed GEMM (cpu_gemm_packed.c), written
 * once and included once per ISA with the vector type and width as
 * parameters, so the AVX2 and AVX-512F kernels are the same code:
 *
 *   UK_NAME    function name          UK_TARGET  attribute (or empty)
 *   UK_MR      rows of the C tile     UK_NV      vectors per row (NR = UK_NV * VW)
 *   UK_PF      prefetch distance for b, in k steps
 *   VEC, VW    vector type, floats per vector
 *   V_LOAD, V_STORE, V_FMA(a, b, c) = a*b + c, V_ADD, V_BCAST(p) = broadcast *p, V_ZERO
 *
 * c[MR][NR] (= or += when acc) a · b (+ bias[NR] when bias is not NULL),
 * with a the packed A micro-panel ([kc][MR] floats: MR rows of x per k) and
 * b the packed B micro-panel ([kc][NR] floats: NR weight rows per k). The
 * MR x NR tile lives in MR * NV vector registers for the whole k loop:
 * per k, NV loads of b, MR broadcasts of a and MR * NV FMAs. c is written
 * once, at the end (f32, row stride ldc); its lines are prefetched at the
 * start so that they arrive while the FMAs run. */

static UK_TARGET void UK_NAME(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                              int64_t ldc, int acc, const float *restrict bias) {
    VEC r[UK_MR][UK_NV];
#pragma GCC unroll 16
    for (int i = 0; i < UK_MR; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < UK_NV; j++) r[i][j] = V_ZERO();
#pragma GCC unroll 4
        for (int l = 0; l < UK_NV * VW + 15; l += 16) __builtin_prefetch(c + i * ldc + l, 1, 3);
    }
    for (int64_t k = 0; k < kc; k++) {
        VEC bv[UK_NV];
#pragma GCC unroll 4
        for (int j = 0; j < UK_NV; j++) bv[j] = V_LOAD(b + j * VW);
        /* the B micro-panel streams from L2 (the A one stays in L1): fetch it UK_PF k ahead */
#pragma GCC unroll 4
        for (int j = 0; j < UK_NV * VW; j += 16) __builtin_prefetch(b + UK_PF * UK_NV * VW + j, 0, 3);
#pragma GCC unroll 16
        for (int i = 0; i < UK_MR; i++) {
            VEC av = V_BCAST(a + i);
#pragma GCC unroll 4
            for (int j = 0; j < UK_NV; j++) r[i][j] = V_FMA(av, bv[j], r[i][j]);
        }
        a += UK_MR;
        b += UK_NV * VW;
    }
#pragma GCC unroll 16
    for (int i = 0; i < UK_MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < UK_NV; j++) {
            float *p = c + i * ldc + j * VW;
            VEC v = r[i][j];
            if (acc) v = V_ADD(v, V_LOAD(p));
            if (bias) v = V_ADD(v, V_LOAD(bias + j * VW));
            V_STORE(p, v);
        }
}

#undef UK_NAME
#undef UK_TARGET
#undef UK_MR
#undef UK_NV
#undef UK_PF
#undef VEC
#undef VW
#undef V_LOAD
#undef V_STORE
#undef V_FMA
#undef V_ADD
#undef V_BCAST
#undef V_ZERO
