/* bpe_gpt2.h - inside of a tokenizer handle (io/tokenizer.h), shared by the
 * loader (io/bpe_load.c), the encoder (io/bpe_gpt2.c) and the dispatch
 * (io/tokenizer.c). Not a public interface.
 *
 * Vocabulary files spell each token's bytes through GPT-2's byte-to-unicode
 * table (bytes_to_unicode in OpenAI's encoder.py: printable bytes stand for
 * themselves, the 68 others for U+0100 onwards); here every token is held as
 * its raw bytes, and merges as pairs of ids.
 */
#ifndef ST_BPE_GPT2_H
#define ST_BPE_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokenizer.h"

#define ST_TOK_MAX_FILES 2
#define ST_TOK_MAX_SPECIAL 64

typedef struct {
  char name[32]; /* Hugging Face name it is written under */
  unsigned char *data;
  size_t len;
} st_tok_file;

typedef struct bpe_cache bpe_cache;

struct st_tokenizer {
  int is_bytes;
  char name[32];
  char path[1024];
  char digest[72];
  int vocab;                  /* ids 0 .. vocab-1 */
  unsigned char **tok;        /* id -> bytes (tok_len[id] of them) */
  uint32_t *tok_len;
  int byte_id[256];           /* id of each single-byte token */
  /* bytes -> id: open addressing, id + 1 (0 = empty) */
  uint32_t *str_slot;
  uint64_t str_mask;
  /* merges in rank order: left id, right id, merged id */
  uint32_t n_merges;
  uint32_t (*merge)[3];
  /* open addressing on (left << 32 | right): rank + 1 (0 = empty) */
  uint64_t *pair_key;
  uint32_t *pair_rank;
  uint64_t pair_mask;
  /* special tokens, matched before the regex when allowed */
  int n_special;
  uint32_t special_id[ST_TOK_MAX_SPECIAL];
  int64_t eot;
  /* the files it was loaded from, for write_dir and prep */
  int n_files;
  st_tok_file files[ST_TOK_MAX_FILES];
  /* PCRE2 objects (pcre2_code *, pcre2_match_data *) and the cache */
  void *re, *md;
  bpe_cache *cache;
};

/* io/bpe_load.c: fill t (zeroed, path set) from the files at path. 0 or -1
 * with st_error (exit 4) naming the file. */
int st_bpe_load(st_tokenizer *t, const char *path);
/* Id of the token whose bytes are s[0..n), or -1 (a linear-time hash
 * lookup; built by st_bpe_index). */
int st_bpe_index(st_tokenizer *t);
int64_t st_bpe_lookup(const st_tokenizer *t, const unsigned char *s, size_t n);
/* io/bpe_gpt2.c: compile the regex, build the pair table and cache. */
int st_bpe_prepare(st_tokenizer *t);
int st_bpe_encode(const st_tokenizer *t, const unsigned char *text, size_t len, int allow_special,
                  uint32_t **ids, size_t *n);
void st_bpe_release(st_tokenizer *t);

#endif
