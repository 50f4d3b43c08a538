/* token_shards.h - a training set of one or many token files (shards).
 *
 * A spec names the shards: a single file (.bin / .h5 / .hdf5), a glob
 * ("dir/train_*.bin", matches sorted by name), a directory (its .bin, .h5
 * and .hdf5 files, sorted by name, dot files skipped) or @LIST (a text file
 * of one path per line; blank lines and lines starting with # skipped,
 * relative paths relative to the list's directory). Every shard is opened
 * once here (io/tokens.h) and kept open; all must agree in token width
 * (2 or 4 bytes) and in the vocabulary and tokenizer they record.
 *
 * A shard of n tokens holds (n - 1) / T sequences of length T: sequence i
 * is tokens [i*T, i*T + T] (inputs and next-token targets), so one file of
 * the old single-file loader reads exactly the windows it read before.
 *
 * Errors (exit 4, ST_EXIT_DATA) name the spec or the file: a glob matching
 * nothing, a directory without token files, a list entry that cannot be
 * read, a shard of another width or vocabulary, a shard shorter than one
 * sequence (T + 1 tokens) in a set of several (a single file may hold fewer:
 * nseq is then 0 and the trainer's batch check names it). docs/data.md.
 */
#ifndef ST_TOKEN_SHARDS_H
#define ST_TOKEN_SHARDS_H

#include <stdint.h>

#include "io/tokens.h"

typedef struct {
  char *path;
  st_token_source *src;
  int64_t tokens;       /* tokens in the split */
  int64_t nseq;         /* (tokens - 1) / T */
  int64_t bytes;        /* file size */
  uint64_t digest;      /* st_shards_file_digest */
  int hdf5;             /* 1: an HDF5 token file (split read), 0: llm.c .bin */
} st_shard;

typedef struct {
  int n;
  st_shard *s;
  int width;            /* bytes per stored token: 2 or 4 */
  int vocab_size;       /* recorded by the shards (0: none records one, .bin) */
  int64_t total_seq;    /* sum of nseq */
  int64_t total_tokens;
  char first_path[1024];/* shard 0 (for the tokenizer of the run) */
} st_shard_set;

/* Expand spec into paths (malloc'd array of malloc'd strings, sorted as
 * described above). *n > 0 on success. 0, or -1 with st_error (exit 4)
 * naming the spec. */
int st_shards_expand(const char *spec, char ***paths, int *n);
void st_shards_free_paths(char **paths, int n);

/* Open every shard of spec (split "train" or "val" for HDF5 files) for
 * sequences of T tokens. 0, or -1 with st_error (exit 4) naming the file. */
int st_shards_open(st_shard_set *set, const char *spec, const char *split, int T);
void st_shards_close(st_shard_set *set);

/* Read sequence seq (0 <= seq < nseq) of shard `shard`: T + 1 tokens into
 * out. Thread-safe for different sets; one set is read by one thread at a
 * time. 0, or -1 with st_error naming the file. */
int st_shards_read_seq(st_shard_set *set, int shard, int64_t seq, int T, int *out);

/* The cheap identity of a file: FNV-1a 64 over its size and up to 64 KiB
 * at its start, middle and end. 0, or -1 with st_error. */
int st_shards_file_digest(const char *path, int64_t *bytes, uint64_t *digest);

/* The set's identity as JSON (malloc'd): [{"path":..,"bytes":..,
 * "tokens":..,"digest":"16 hex"}...], what a checkpoint records. */
char *st_shards_identity_json(const st_shard_set *set);

#endif
