/* tokenizer.h - text <-> token ids: the byte tokenizer and GPT-2's byte-level
 * BPE (io/bpe_gpt2.c), behind one handle.
 *
 * A tokenizer is identified by its name (the algorithm: "bytes",
 * "gpt2-bpe") and its digest (the vocabulary: a SHA-256 of a canonical
 * serialisation, so the same vocabulary gives the same digest from
 * vocab.json + merges.txt, encoder.json + vocab.bpe or tokenizer.json).
 * Token files (io/tokens.h) and run configs (rank/train/run_config.h) record both.
 *
 * A handle is not thread-safe: encode keeps a cache of recent pre-tokens in
 * it. Use one handle per thread.
 */
#ifndef ST_TOKENIZER_H
#define ST_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct st_tokenizer st_tokenizer;

/* path: a directory holding vocab.json + merges.txt, or encoder.json +
 * vocab.bpe (OpenAI's names, same formats), or tokenizer.json (Hugging Face,
 * model type BPE with a ByteLevel pre-tokenizer); or a tokenizer.json file
 * itself; or the word "bytes" (the byte tokenizer, vocabulary 256, no
 * end-of-text token). NULL with st_error naming the file and problem (exit
 * code 4 = data). */
st_tokenizer *st_tokenizer_load(const char *path);
st_tokenizer *st_tokenizer_bytes(void);

/* Encode len bytes of text (any bytes). *ids is malloc'ed (the caller
 * frees), *n tokens. "<|endoftext|>" (any special token) in the text becomes
 * the special token only when allow_special is 1; with 0 it is ordinary text.
 * Invalid UTF-8: the regex runs over the valid stretches (PCRE2's
 * MATCH_INVALID_UTF) and each run of invalid bytes is one piece of its own,
 * byte-pair encoded, so decode gives back the exact bytes. 0 or -1 with
 * st_error. */
int st_tokenizer_encode(const st_tokenizer *t, const char *text, size_t len, int allow_special,
                        uint32_t **ids, size_t *n);
/* Decode ids to bytes: *out malloc'ed, NUL-terminated, *len bytes (without
 * the NUL). An id >= vocab is an error (exit 4). 0 or -1. */
int st_tokenizer_decode(const st_tokenizer *t, const uint32_t *ids, size_t n, char **out,
                        size_t *len);
/* Bytes of one token (for streaming output): pointer valid while t lives;
 * NULL (and *len 0) for an id outside the vocabulary. Not NUL-terminated. */
const char *st_tokenizer_token_bytes(const st_tokenizer *t, uint32_t id, size_t *len);
int st_tokenizer_vocab_size(const st_tokenizer *t);   /* 50257 for GPT-2 */
int64_t st_tokenizer_eot(const st_tokenizer *t);      /* 50256 for GPT-2; -1 when none */
const char *st_tokenizer_name(const st_tokenizer *t); /* "gpt2-bpe", "bytes" */
/* Hex SHA-256 (64 characters) of the canonical serialisation: "shardtrain
 * tokenizer v1\n", then the vocabulary (count, then per id a little-endian
 * uint32 length and the bytes), the merges in rank order (count, then left
 * and right id as uint32), the special tokens (count, then id). "bytes" has
 * a fixed digest (256 one-byte tokens, no merges, no specials). */
const char *st_tokenizer_digest(const st_tokenizer *t);
/* Write the tokenizer's files into dir (created if needed) under Hugging
 * Face names: vocab.json + merges.txt (from either spelling), or
 * tokenizer.json as loaded, byte for byte; each written to NAME.tmp and
 * renamed. Nothing for "bytes". 0 or -1. */
int st_tokenizer_write_dir(const st_tokenizer *t, const char *dir);
/* Write n files (names[i], data[i], lens[i] bytes) into dir the way
 * write_dir does: the tokens file's stored copies (io/tokens.h). */
int st_tokenizer_write_files(const char *dir, int n, const char *const *names,
                             const unsigned char *const *data, const size_t *lens);
/* The files write_dir writes: count, and file i's Hugging Face name and
 * bytes (valid while t lives). prep stores them in the token file. */
int st_tokenizer_file_count(const st_tokenizer *t);
int st_tokenizer_file(const st_tokenizer *t, int i, const char **name, const unsigned char **data,
                      size_t *len);
/* The path it was loaded from ("bytes" for the byte tokenizer). */
const char *st_tokenizer_path(const st_tokenizer *t);
void st_tokenizer_free(st_tokenizer *t);

#endif
