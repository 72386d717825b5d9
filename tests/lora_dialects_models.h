/* The two tiny transformers of the flux2-lora-dialects golden set, regenerated
 * bit for bit from their stored headers (tests/test_lora_dialects.c). */
#ifndef TPGEN_TEST_LORA_DIALECTS_MODELS_H
#define TPGEN_TEST_LORA_DIALECTS_MODELS_H

/* OUT/transformer and OUT/transformer_dev (config.json + weights); 0, or -1 + tp_error */
int lora_dialects_write_models(const char *out);

#endif
