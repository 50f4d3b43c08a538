/* tokenizer_fallback.h - TEMPORARY: the part of io/tokenizer.h (branch tok)
 * that sample uses, for builds that do not have io/tokenizer.h yet; only the
 * byte tokenizer ("bytes") loads. CMakeLists.txt compiles
 * tokenizer_fallback.c only when io/tokenizer.h is absent; delete both
 * files once the tokenizer is merged. The declarations are exactly those of
 * io/tokenizer.h. */
#ifndef ST_TOKENIZER_FALLBACK_H
#define ST_TOKENIZER_FALLBACK_H

#include <stddef.h>
#include <stdint.h>

typedef struct st_tokenizer st_tokenizer;

st_tokenizer *st_tokenizer_load(const char *path);
int st_tokenizer_encode(const st_tokenizer *t, const char *text, size_t len, int allow_special,
                        uint32_t **ids, size_t *n);
int st_tokenizer_decode(const st_tokenizer *t, const uint32_t *ids, size_t n, char **out,
                        size_t *len);
const char *st_tokenizer_token_bytes(const st_tokenizer *t, uint32_t id, size_t *len);
int st_tokenizer_vocab_size(const st_tokenizer *t);
int64_t st_tokenizer_eot(const st_tokenizer *t);
void st_tokenizer_free(st_tokenizer *t);

#endif
