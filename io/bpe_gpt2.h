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

#define ST_TOK_MAX_FILES 3
/* Llama 3 reserves 256 special ids, Qwen 208 */
#define ST_TOK_MAX_SPECIAL 1024

/* The three byte-level BPE algorithms (tokenizer.h names them). */
enum {
  ST_TOK_GPT2 = 0, /* "gpt2-bpe": GPT-2's pattern, merges in rank order */
  ST_TOK_HF,       /* "hf-bpe": tokenizer.json with a Split regex, merges in rank order */
  ST_TOK_TIKTOKEN  /* "tiktoken-bpe": a rank file; merges implied by the ranks */
};

typedef struct {
  char name[32]; /* Hugging Face name it is written under */
  unsigned char *data;
  size_t len;
} st_tok_file;

typedef struct bpe_cache bpe_cache;

struct st_tokenizer {
  int is_bytes;
  int kind;                   /* ST_TOK_GPT2 / ST_TOK_HF / ST_TOK_TIKTOKEN */
  /* pre-tokenizer pattern as the files give it (NULL: GPT-2's); part of
   * the identity. Compiled after rewriting \s for PCRE2 (bpe_gpt2.c). */
  char *pattern;
  /* a pre-token that is itself a (non-special) token is that token, as
   * tiktoken does and tokenizer.json's ignore_merges asks */
  int whole_piece;
  /* 1: text is put in NFC before the pre-tokenizer (tokenizer.json's
   * normalizer, io/text_nfc.h); part of the identity */
  int nfc;
  unsigned char *is_special;  /* per id: 1 for special tokens (whole_piece skips them) */
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
  /* merges in rank order: left id, right id, merged id (tiktoken: none;
   * the pair table is built from the ranks and a pair's rank is the id of
   * its concatenation) */
  uint32_t n_merges;
  uint32_t (*merge)[3];
  /* open addressing on (left << 32 | right): rank + 1 (0 = empty) */
  uint64_t *pair_key;
  uint32_t *pair_rank;
  uint64_t pair_mask;
  /* special tokens, matched before the regex when allowed; special_by_byte
   * orders them by first byte, longest first, from special_start[b] */
  int n_special;
  uint32_t special_id[ST_TOK_MAX_SPECIAL];
  uint32_t special_by_byte[ST_TOK_MAX_SPECIAL];
  int special_start[257];
  int64_t eot;
  /* the files it was loaded from, for write_dir and prep */
  int n_files;
  st_tok_file files[ST_TOK_MAX_FILES];
  /* PCRE2 objects (pcre2_code *, pcre2_match_data *, pcre2_match_context *,
   * pcre2_jit_stack *) and the cache */
  void *re, *md, *mctx, *jstack;
  bpe_cache *cache;
};

/* io/bpe_load.c: fill t (zeroed, path set) from the files at path. 0 or -1
 * with st_error (exit 4) naming the file. */
int st_bpe_load(st_tokenizer *t, const char *path, const char *preset);
/* io/bpe_tiktoken.c: a tiktoken rank file (base64 token, space, rank per
 * line) at path, with the pattern and special tokens of preset ("llama3",
 * "qwen"; NULL: from a tokenizer.json / tokenizer_config.json beside it).
 * load_config: the same from a shardtrain_tiktoken.json (what prep stores
 * beside the rank file: its name, the pattern, the special tokens).
 * 0 or -1 with st_error (exit 4) naming the file and line. */
int st_tiktoken_load(st_tokenizer *t, const char *path, const char *preset);
int st_tiktoken_load_config(st_tokenizer *t, const char *config_path);
/* 1 when the file at path starts like a rank file (its first line is
 * base64, one space, a decimal rank). */
int st_tiktoken_sniff(const char *path);
/* bpe_load.c helpers shared with bpe_tiktoken.c */
struct cJSON;
/* The "normalizer" of the JSON object j (a tokenizer.json, or the
 * shardtrain_tiktoken.json prep writes): none (absent, null, an empty
 * Sequence) or NFC (alone or the only kind inside a Sequence) sets t->nfc.
 * Any other normalizer is refused by name, and so is NFC where this build
 * lacks ICU (naming the package) or where an added token has "normalized"
 * true (those are matched after normalising, which this tokenizer does not
 * do). 0 or -1 with st_error (exit 4) naming file. */
int st_bpe_read_normalizer(st_tokenizer *t, const char *file, const struct cJSON *j);
int st_bpe_read_whole(const char *path, unsigned char **data, size_t *len);
int st_bpe_add_file(st_tokenizer *t, const char *path, const char *hf_name);
/* The end-of-text id: the first of <|endoftext|>, <|end_of_text|> in the
 * vocabulary (-1 when neither), marked special. */
void st_bpe_find_eot(st_tokenizer *t);
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
