/* Byte-level BPE tokenizer shared by Qwen3 (FLUX.2-klein) and Mistral/Tekken
 * (FLUX.2-dev). One engine; the differences between the two are data read
 * from the files (regex, normaliser, added tokens, ignore_merges, merges).
 *
 * Loading: tokenizer_load(dir) accepts a pipeline folder (uses dir/tokenizer/)
 * or a tokenizer folder. It reads tokenizer.json (HF "fast" format, model type
 * BPE with a ByteLevel pre-tokenizer) plus tokenizer_config.json when present;
 * if only tekken.json (mistral-common format) is there, that is used instead.
 *
 * Encoding (docs/spec/flux2-text-vae.md §5.1): added tokens are matched first
 * (leftmost, longest), the text between them is NFC-normalised when the file
 * says so, split by the pre-tokenizer regex (PCRE2, UTF+UCP), and each piece
 * is BPE-merged on its raw UTF-8 bytes (the GPT-2 byte<->unicode mapping is
 * undone at load time, so no per-call remapping is needed).
 *
 * A loaded tokenizer is read-only: encoding from several threads at once is
 * safe. */
#ifndef TPGEN_TOKENIZER_H
#define TPGEN_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

typedef enum {
    TOKENIZER_QWEN,     /* has <|im_start|>: the klein chat template applies */
    TOKENIZER_MISTRAL,  /* has [INST] and <s>: the dev (Mistral) layout applies */
    TOKENIZER_OTHER
} tokenizer_family;

typedef enum { TOKENIZER_PAD_RIGHT = 0, TOKENIZER_PAD_LEFT = 1 } tokenizer_side;

/* Load from a pipeline folder, a tokenizer folder, or a tokenizer.json /
 * tekken.json path (its folder's tokenizer_config.json is read if present).
 * Returns NULL after
 * tp_error() (missing files named with their paths, unsupported model types,
 * malformed JSON with file and line). Free with tokenizer_free. */
tokenizer *tokenizer_load(const char *dir);
/* Load one file explicitly: a tokenizer.json (config_path may be NULL) or a
 * tekken.json (detected from its content). */
tokenizer *tokenizer_load_files(const char *json_path, const char *config_path);
/* Load from a GGUF file's tokenizer.ggml.* metadata (a llama.cpp text-encoder
 * GGUF: model "gpt2", pre-tokenizer "qwen2" or "tekken"); ids equal those of
 * the tokenizer.json the file was converted from. NULL after tp_error naming
 * the file and key. */
tokenizer *tokenizer_load_gguf(const char *gguf_path);
void tokenizer_free(tokenizer *t);

/* Encode UTF-8 text (no chat template, no padding). *ids is malloc'ed and
 * owned by the caller (NULL when *n == 0). Invalid UTF-8 -> -1 with the byte
 * offset in the message. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, int *n);

/* Properties read from the files. */
tokenizer_family tokenizer_get_family(const tokenizer *t);
int tokenizer_vocab_size(const tokenizer *t);      /* 1 + largest id */
int tokenizer_pad_id(const tokenizer *t);          /* -1 when the files name none */
/* tokenizer_config.json padding_side; without it: left for tokenizer classes
 * that pad left by default (LlamaTokenizerFast, as converted Mistral
 * tokenizers are, and mistral-common's, which a lone tekken.json is), else
 * right */
tokenizer_side tokenizer_padding_side(const tokenizer *t);
tokenizer_side tokenizer_truncation_side(const tokenizer *t); /* default right */
/* Id of an exact token string (added token or vocabulary entry in raw
 * bytes), -1 if absent. */
int tokenizer_token_id(const tokenizer *t, const char *s);
/* Raw bytes of token `id` (not NUL-terminated), NULL for an unknown id. */
const char *tokenizer_token_bytes(const tokenizer *t, int id, int *len);
/* Where the tokenizer came from ("…/tokenizer.json" or "…/tekken.json"). */
const char *tokenizer_source(const tokenizer *t);

#endif
