/* f32 -> GGUF block quantisers for `tpgen quantize` (docs/gguf.md
 * "tpgen quantize"): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, each
 * bit-identical to gguf-py 0.19.0's quantiser (gguf/quants.py: f32
 * arithmetic step by step, round-half-away for Q8_0 (np_roundf), trunc(x +
 * 0.5) for the 4/5-bit types, the scale rounded to f16 to nearest even),
 * and the type rules of ComfyUI-GGUF's converter; Q2_K..Q6_K as ggml's
 * imatrix-less reference quantisers (quantize_row_q*_K_ref), IQ4_NL and
 * IQ4_XS as ggml_quantize_chunk without an imatrix (quantize_iq4_nl /
 * quantize_iq4_xs) compute them in f32, checked against
 * tests/tools/kquant_ref.py. */
#ifndef TPGEN_GGUF_QUANTIZE_H
#define TPGEN_GGUF_QUANTIZE_H
#include <stdint.h>

/* 1 when gguf_quantize_row can write type (a ggml type id). */
int gguf_quantize_supported(int type);
/* "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K, IQ4_NL, IQ4_XS" */
const char *gguf_quantize_supported_list(void);
/* The ggml type id of a name ("q8_0" or "Q8_0"), -1 when ggml has none. */
int gguf_quantize_type_id(const char *name);

/* The type a tensor of ndim dims (ne fastest first) is written as when T is
 * asked for: 1-D tensors and tensors of <= 1024 values F32, rows that are
 * not whole blocks of T F16, everything else T. */
int gguf_quantize_pick(int type, int ndim, const int64_t *ne);

/* Quantise n values (whole blocks of type) into out (n / block * bytes
 * bytes). type must be supported. */
void gguf_quantize_row(int type, const float *x, int64_t n, void *out);

#endif
