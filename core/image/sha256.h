/* SHA-256 of a file (nettle), as lowercase hex: the PNG parameters and the
 * metrics name LoRA adapters and reference images by it. */
#ifndef TPGEN_SHA256_H
#define TPGEN_SHA256_H

/* 0, or -1 + tp_error naming the file. */
int file_sha256(const char *path, char hex[65]);

#endif
