/* tokens.h - token data: shardtrain's HDF5 token file and llm.c .bin shards.
 *
 * HDF5 token file (written by `shardtrain prep`): datasets /train and /val,
 * uint16, 1-D, chunked; root attributes tokenizer (string), vocab_size (int),
 * source (string), train_tokens, val_tokens (int64), val_fraction (double).
 *
 * llm.c shard (.bin): a header of 256 int32 (magic 20240520, version 1,
 * token count, rest 0) followed by uint16 tokens.
 *
 * Files are opened read-only and never modified.
 */
#ifndef ST_TOKENS_H
#define ST_TOKENS_H

#include <stdint.h>

typedef struct st_token_source st_token_source;

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
void st_tokens_close(st_token_source *s);

/* Byte-level tokenizer + writer used by `shardtrain prep`: reads UTF-8 text
 * from input_path ("-" for stdin), token = byte value (vocabulary 256), last
 * val_fraction of the tokens become /val. Writes out_path via a temporary
 * file renamed into place, so a failed prep leaves no half file.
 * 0, or -1 with st_error. */
int st_prep_bytes(const char *input_path, const char *out_path, double val_fraction,
                  int64_t *train_tokens, int64_t *val_tokens);

/* Write tokens as an llm.c .bin shard (used by tests and for export). */
int st_write_llmc_bin(const char *path, const uint16_t *tokens, int64_t n);

#endif
