/* The dequantised twin of a GGUF file: every tensor as F32 with the values
 * gguf_read_f32 gives (bit-identical to gguf-py's dequantiser), same names,
 * one safetensors file. Shared by the FLUX.2 and FLUX.3 GGUF tests. */
#ifndef TPGEN_TEST_GGUF_TWIN_H
#define TPGEN_TEST_GGUF_TWIN_H

/* 0, or -1 + tp_error */
int gguf_twin_write(const char *gguf_path, const char *st_path);

#endif
