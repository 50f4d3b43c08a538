/* tokenizer_fallback.c - TEMPORARY byte tokenizer behind io/tokenizer.h's
 * names, until branch tok's io/tokenizer.c is merged (see
 * tokenizer_fallback.h). Token i is byte i; no end-of-text token. */
#include "launcher/tokenizer_fallback.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

struct st_tokenizer {
  char bytes[256];
};

st_tokenizer *st_tokenizer_load(const char *path) {
  if (strcmp(path, "bytes") != 0) {
    st_error_setc(ST_EXIT_DATA, "tokenizer %s: this build reads only the byte tokenizer "
                  "(\"bytes\"); GPT-2 BPE arrives with io/tokenizer.c", path);
    return NULL;
  }
  st_tokenizer *t = malloc(sizeof *t);
  if (!t) {
    st_error_set("out of host memory for the byte tokenizer");
    return NULL;
  }
  for (int i = 0; i < 256; i++) t->bytes[i] = (char)i;
  return t;
}

int st_tokenizer_encode(const st_tokenizer *t, const char *text, size_t len, int allow_special,
                        uint32_t **ids, size_t *n) {
  (void)t;
  *ids = malloc((len ? len : 1) * sizeof **ids);
  if (!*ids) return st_error_set("out of host memory for %zu tokens", len);
  for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
  *n = len;
  return 0;
}

int st_tokenizer_decode(const st_tokenizer *t, const uint32_t *ids, size_t n, char **out,
                        size_t *len) {
  (void)t;
  *out = malloc(n + 1);
  if (!*out) return st_error_set("out of host memory for %zu bytes", n);
  for (size_t i = 0; i < n; i++) {
    if (ids[i] > 255) {
      free(*out);
      *out = NULL;
      return st_error_setc(ST_EXIT_DATA, "token id %u is outside the byte tokenizer's 256",
                           ids[i]);
    }
    (*out)[i] = (char)ids[i];
  }
  (*out)[n] = 0;
  *len = n;
  return 0;
}

const char *st_tokenizer_token_bytes(const st_tokenizer *t, uint32_t id, size_t *len) {
  *len = id < 256 ? 1 : 0;
  return id < 256 ? &t->bytes[id] : NULL;
}

int st_tokenizer_vocab_size(const st_tokenizer *t) { return 256; }
int64_t st_tokenizer_eot(const st_tokenizer *t) { return -1; }
void st_tokenizer_free(st_tokenizer *t) { free(t); }
