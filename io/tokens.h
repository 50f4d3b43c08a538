/* tokens.h - token data: shardtrain's HDF5 token file and llm.c .bin shards.
 *
 * HDF5 token file (written by `shardtrain prep`): datasets /train and /val,
 * 1-D, chunked, uint16 while vocab_size <= 65536 and uint32 beyond; root
 * attributes tokenizer (its name: "bytes", "gpt2-bpe", "hf-bpe",
 * "tiktoken-bpe"; older files say
 * "byte"), vocab_size (int), tokenizer_digest (hex SHA-256, io/tokenizer.h),
 * eot_token (int64, -1 when the tokenizer has none), source (string),
 * train_tokens, val_tokens (int64), val_fraction (double); group /tokenizer
 * holds the tokenizer's files (vocab.json + merges.txt, tokenizer.json, or
 * a rank file + shardtrain_tiktoken.json) as uint8 datasets.
 *
 * llm.c shard (.bin): a header of 256 int32 (magic 20240520, version,
 * token count, rest 0) followed by the tokens: uint16 for version 1 (GPT-2),
 * uint32 for version 2 (Llama 3; llm.c's dev/data/data_common.py).
 *
 * Files are opened read-only and never modified.
 */
#ifndef ST_TOKENS_H
#define ST_TOKENS_H

#include <stdint.h>

typedef struct st_token_source st_token_source;

/* Largest vocabulary a token file or model may have (ids are read as int;
 * rank/model/config.c takes the same bound). */
#define ST_TOKENS_MAX_VOCAB (1 << 24)

/* Open a split of a token file. path ends in .h5/.hdf5 (split is "train" or
 * "val") or .bin (split ignored: one shard is one split). vocab_size_out gets
 * the vocabulary recorded in the file (HDF5) or 0 when unknown (.bin).
 * NULL with st_error naming the file, the problem and the fix. */
st_token_source *st_tokens_open(const char *path, const char *split, int *vocab_size_out);
/* Number of tokens in the split. */
int64_t st_tokens_count(const st_token_source *s);
/* Copy n tokens starting at pos (0 <= pos, pos + n <= count) into out as int.
 * 0, or -1 with st_error. */
int st_tokens_read(st_token_source *s, int64_t pos, int64_t n, int *out);
const char *st_tokens_path(const st_token_source *s);
/* Bytes per stored token: 2 (uint16) or 4 (uint32). */
int st_tokens_width(const st_token_source *s);
void st_tokens_close(st_token_source *s);

/* Byte-level tokenizer + writer used by `shardtrain prep`: reads UTF-8 text
 * from input_path ("-" for stdin), token = byte value (vocabulary 256), last
 * val_fraction of the tokens become /val. Writes out_path via a temporary
 * file renamed into place, so a failed prep leaves no half file.
 * 0, or -1 with st_error. */
int st_prep_bytes(const char *input_path, const char *out_path, double val_fraction,
                  int64_t *train_tokens, int64_t *val_tokens);

/* Check prep's --out and --val-fraction before any work. 0 or -1. */
int st_prep_check_args(const char *out_path, double val_fraction);
/* Write n tokens (from tokenizer t; source label for the attribute) as a
 * token file at out_path (temporary file + rename), the last val_fraction
 * as /val: ids, or for the byte tokenizer (ids NULL) the bytes themselves.
 * 0 or -1 with st_error. */
struct st_tokenizer;
int st_prep_write(const char *out_path, const char *label, const uint32_t *ids,
                  const unsigned char *bytes, int64_t n,
                  const struct st_tokenizer *t, double val_fraction, int64_t *train_tokens,
                  int64_t *val_tokens);

/* What `shardtrain prep` did (st_prep_text). */
typedef struct {
  int documents;
  int64_t bytes, train_tokens, val_tokens;
  double seconds; /* tokenizing only */
} st_prep_stats;

/* prep of several inputs (io/prep_files.c): each input is a text file, "-"
 * (stdin) or a directory (its regular files, sorted by name, dot files
 * skipped); every file is one document. Documents are tokenized with the
 * tokenizer at tokenizer_path (st_tokenizer_load; "bytes" by default) and
 * joined with its end-of-text token between them; a tokenizer without one
 * (bytes) joins them with nothing between. 0 or -1 with st_error. */
int st_prep_text(const char *const *inputs, int n_inputs, const char *tokenizer_path,
                 const char *out_path, double val_fraction, st_prep_stats *stats);

/* The tokenizer a token file was made with. An HDF5 file without a digest
 * (older prep) with tokenizer "byte" is the byte tokenizer; .bin shards
 * and other files give known = 0. */
typedef struct {
  int known;
  char name[32];
  char digest[72];
  int vocab_size;
  int64_t eot;
} st_tokens_tokenizer;
/* 0, or -1 with st_error (exit 4) naming the file. */
int st_tokens_tokenizer_info(const char *path, st_tokens_tokenizer *info);
/* Write the tokenizer files stored in token file path (/tokenizer) into
 * dir (created if needed); *written gets how many (0 when none). */
int st_tokens_extract_tokenizer(const char *path, const char *dir, int *written);

/* Write tokens as an llm.c .bin shard (used by tests and for export):
 * version 1, uint16. st_write_llmc_bin32: version 2, uint32 (ids past 65535). */
int st_write_llmc_bin(const char *path, const uint16_t *tokens, int64_t n);
int st_write_llmc_bin32(const char *path, const uint32_t *tokens, int64_t n);

#endif
