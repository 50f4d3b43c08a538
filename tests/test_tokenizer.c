/* test_tokenizer.c - the tokenizer interface (io/tokenizer.h) without
 * GPT-2's files: the byte tokenizer, and a small byte-level BPE the test
 * writes (256 byte tokens, "ab", "abc", " a", <|endoftext|>) in both
 * spellings, vocab.json + merges.txt and tokenizer.json. GPT-2 parity itself
 * is e2e_tokenizer_parity. */
#define _XOPEN_SOURCE 700
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/tokenizer.h"
#include "util/error.h"
#include "util/fsutil.h"

/* Pins the canonical serialisation: a change to it changes every digest
 * recorded in token files and checkpoints. */
#define BYTES_DIGEST "49a82ee50ea855f1ab0c6a087dd4a3b7d93339c22212817f8b5918fb602dab44"

static char g_dir[64];

static int make_dir(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/st_tokenizer_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int remove_dir(void **state) {
  (void)state;
  return st_rm_rf(g_dir);
}

static void write_text(const char *dir, const char *name, const char *text) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* GPT-2's bytes_to_unicode: the code point that spells byte b. */
static int cp_of(int b) {
  int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  if (printable) return b;
  int n = 0;
  for (int c = 0; c < b; c++)
    if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) n++;
  return 256 + n;
}

/* JSON string body for the byte-level token of byte b. */
static void json_char(char *out, int b) {
  int cp = cp_of(b);
  if (cp == '"' || cp == '\\') sprintf(out, "\\%c", cp);
  else if (cp < 0x80) sprintf(out, "%c", cp);
  else sprintf(out, "%c%c", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F));
}

/* {"<byte 0>": 0, ..., "<byte 255>": 255, "ab": 256, "abc": 257, "Ġa": 258,
 * "<|endoftext|>": 259} (Ġ = U+0120 spells the space). */
static char *vocab_json(void) {
  char *s = malloc(8192), c[8];
  strcpy(s, "{");
  for (int b = 0; b < 256; b++) {
    json_char(c, b);
    sprintf(s + strlen(s), "\"%s\": %d, ", c, b);
  }
  strcat(s, "\"ab\": 256, \"abc\": 257, \"\xc4\xa0" "a\": 258, \"<|endoftext|>\": 259}");
  return s;
}

static const char k_merges[] = "#version: 0.2\na b\nab c\n\xc4\xa0 a\n";

static void make_bpe_dir(const char *dir) {
  assert_int_equal(st_mkdir_p(dir), 0);
  char *v = vocab_json();
  write_text(dir, "vocab.json", v);
  free(v);
  write_text(dir, "merges.txt", k_merges);
}

static void encode(const st_tokenizer *t, const char *text, size_t len, int special,
                   const uint32_t *want, size_t nwant) {
  uint32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(st_tokenizer_encode(t, text, len, special, &ids, &n), 0);
  assert_int_equal(n, nwant);
  for (size_t i = 0; ids && i < n && i < nwant; i++) assert_int_equal(ids[i], want[i]);
  char *back;
  size_t blen;
  assert_int_equal(st_tokenizer_decode(t, ids, n, &back, &blen), 0);
  assert_int_equal(blen, len);
  assert_memory_equal(back, text, len);
  assert_int_equal(back[blen], 0);
  free(back);
  free(ids);
}

static void test_bytes(void **state) {
  (void)state;
  st_tokenizer *t = st_tokenizer_load("bytes");
  assert_non_null(t);
  assert_string_equal(st_tokenizer_name(t), "bytes");
  assert_int_equal(st_tokenizer_vocab_size(t), 256);
  assert_int_equal(st_tokenizer_eot(t), -1);
  assert_string_equal(st_tokenizer_digest(t), BYTES_DIGEST);
  const uint32_t want[] = {0, 255, 'a', '<'};
  encode(t, "\0\xff" "a<", 4, 1, want, 4);
  size_t len;
  assert_non_null(st_tokenizer_token_bytes(t, 255, &len));
  assert_int_equal(len, 1);
  assert_null(st_tokenizer_token_bytes(t, 256, &len));
  const uint32_t bad[] = {256};
  char *out;
  assert_int_equal(st_tokenizer_decode(t, bad, 1, &out, &len), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_DATA);
  assert_int_equal(st_tokenizer_file_count(t), 0);
  char dir[128];
  snprintf(dir, sizeof dir, "%s/bytes_out", g_dir);
  assert_int_equal(st_tokenizer_write_dir(t, dir), 0);
  assert_false(st_path_exists(dir)); /* nothing for bytes */
  st_tokenizer_free(t);
}

/* sample's text of each id: bytes for ids < 256, "<|id:N|>" past the byte
 * tokenizer (a model of 300 ids), never nothing */
static void test_token_text(void **state) {
  (void)state;
  st_tokenizer *t = st_tokenizer_load("bytes");
  assert_non_null(t);
  char buf[ST_TOKEN_TEXT_BUF];
  size_t len = 99;
  const char *b = st_tokenizer_token_text(t, 'A', buf, &len);
  assert_int_equal(len, 1);
  assert_int_equal(b[0], 'A');
  b = st_tokenizer_token_text(t, 0, buf, &len); /* NUL is a byte like any other */
  assert_int_equal(len, 1);
  assert_int_equal(b[0], 0);
  b = st_tokenizer_token_text(t, 256, buf, &len);
  assert_int_equal(len, 10);
  assert_memory_equal(b, "<|id:256|>", len);
  b = st_tokenizer_token_text(t, 1000, buf, &len);
  assert_int_equal(len, 11);
  assert_memory_equal(b, "<|id:1000|>", len);
  b = st_tokenizer_token_text(t, UINT32_MAX, buf, &len);
  assert_int_equal(len, 17);
  assert_memory_equal(b, "<|id:4294967295|>", len);
  st_tokenizer_free(t);
}

static void test_bpe_encode(void **state) {
  (void)state;
  char dir[128];
  snprintf(dir, sizeof dir, "%s/bpe", g_dir);
  make_bpe_dir(dir);
  st_tokenizer *t = st_tokenizer_load(dir);
  assert_non_null(t);
  assert_string_equal(st_tokenizer_name(t), "gpt2-bpe");
  assert_int_equal(st_tokenizer_vocab_size(t), 260);
  assert_int_equal(st_tokenizer_eot(t), 259);
  /* "abc" " ab" " a": a+b first (rank 0), so " ab" is [" ", "ab"], not ["Ġa", "b"] */
  const uint32_t w1[] = {257, 32, 256, 258};
  encode(t, "abc ab a", 8, 0, w1, 4);
  const uint32_t w2[] = {'x', 259, 'y'};
  encode(t, "x<|endoftext|>y", 15, 1, w2, 3);
  const uint32_t w3[] = {'x', '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>', 'y'};
  encode(t, "x<|endoftext|>y", 15, 0, w3, 15); /* ordinary text when not allowed */
  const uint32_t w4[] = {255, 256, 254}; /* invalid UTF-8 round trips */
  encode(t, "\xff" "ab\xfe", 4, 0, w4, 3);
  encode(t, "", 0, 0, NULL, 0);
  size_t len;
  const char *b = st_tokenizer_token_bytes(t, 258, &len);
  assert_int_equal(len, 2);
  assert_memory_equal(b, " a", 2);
  st_tokenizer_free(t);
}

static void test_bpe_spellings_same_digest(void **state) {
  (void)state;
  char dir[128], out[128], json_dir[128];
  snprintf(dir, sizeof dir, "%s/bpe2", g_dir);
  snprintf(out, sizeof out, "%s/bpe2_written", g_dir);
  snprintf(json_dir, sizeof json_dir, "%s/bpe2_json", g_dir);
  make_bpe_dir(dir);
  st_tokenizer *t = st_tokenizer_load(dir);
  assert_non_null(t);
  /* write_dir gives back loadable files with the same identity */
  assert_int_equal(st_tokenizer_write_dir(t, out), 0);
  st_tokenizer *u = st_tokenizer_load(out);
  assert_non_null(u);
  assert_string_equal(st_tokenizer_digest(u), st_tokenizer_digest(t));
  /* tokenizer.json of the same vocabulary */
  assert_int_equal(st_mkdir_p(json_dir), 0);
  char *v = vocab_json();
  char *j = malloc(strlen(v) + 1024);
  sprintf(j, "{\"added_tokens\": [{\"id\": 259, \"content\": \"<|endoftext|>\", \"special\": true}],"
             " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
             " \"use_regex\": true}, \"model\": {\"type\": \"BPE\", \"vocab\": %s,"
             " \"merges\": [\"a b\", [\"ab\", \"c\"], \"\xc4\xa0 a\"]}}", v);
  write_text(json_dir, "tokenizer.json", j);
  free(v);
  free(j);
  st_tokenizer *w = st_tokenizer_load(json_dir);
  assert_non_null(w);
  assert_string_equal(st_tokenizer_digest(w), st_tokenizer_digest(t));
  assert_int_equal(st_tokenizer_eot(w), 259);
  const uint32_t w1[] = {257, 32, 256, 258};
  encode(w, "abc ab a", 8, 0, w1, 4);
  assert_int_not_equal(strcmp(st_tokenizer_digest(t), BYTES_DIGEST), 0);
  st_tokenizer_free(t);
  st_tokenizer_free(u);
  st_tokenizer_free(w);
}

static void expect_load_error(const char *dir, const char *needle) {
  assert_null(st_tokenizer_load(dir));
  assert_int_equal(st_error_exit_code(), ST_EXIT_DATA);
  if (!strstr(st_error_msg(), needle)) fail_msg("'%s' lacks '%s'", st_error_msg(), needle);
  assert_null(strchr(st_error_msg(), '\n'));
}

static void test_bpe_malformed(void **state) {
  (void)state;
  char dir[128];
  snprintf(dir, sizeof dir, "%s/bad_merge", g_dir);
  make_bpe_dir(dir);
  write_text(dir, "merges.txt", "a b\nab zz\n");
  expect_load_error(dir, "merges.txt: merge 2 \"ab zz\"");
  snprintf(dir, sizeof dir, "%s/bad_hole", g_dir);
  make_bpe_dir(dir);
  write_text(dir, "vocab.json", "{\"a\": 0, \"b\": 2}");
  expect_load_error(dir, "vocab.json: no token has id 1");
  snprintf(dir, sizeof dir, "%s/bad_array", g_dir);
  make_bpe_dir(dir);
  write_text(dir, "vocab.json", "[\"a\"]");
  expect_load_error(dir, "vocab.json: the vocabulary is not a JSON object");
  snprintf(dir, sizeof dir, "%s/only_vocab", g_dir);
  make_bpe_dir(dir);
  char path[256];
  snprintf(path, sizeof path, "%s/merges.txt", dir);
  unlink(path);
  expect_load_error(dir, "no merges.txt");
  snprintf(dir, sizeof dir, "%s/normalizer", g_dir);
  assert_int_equal(st_mkdir_p(dir), 0);
  write_text(dir, "tokenizer.json", "{\"normalizer\": {\"type\": \"Lowercase\"}, "
             "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, "
             "\"merges\": []}}");
  expect_load_error(dir, "tokenizer.json: has a normalizer (Lowercase)");
  write_text(dir, "tokenizer.json", "{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, \"model\": "
             "{\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
  expect_load_error(dir, "pre_tokenizer is Metaspace, not ByteLevel");
  snprintf(dir, sizeof dir, "%s/missing", g_dir);
  expect_load_error(dir, "does not exist");
}

/* ---- tiktoken rank files --------------------------------------------------- */

static void b64(const unsigned char *in, size_t n, char *out) {
  static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t k = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t w = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                 (i + 2 < n ? in[i + 2] : 0);
    out[k++] = a[w >> 18];
    out[k++] = a[(w >> 12) & 63];
    out[k++] = i + 1 < n ? a[(w >> 6) & 63] : '=';
    out[k++] = i + 2 < n ? a[w & 63] : '=';
  }
  out[k] = 0;
}

/* 256 byte tokens (rank = byte), then "ab" 256, "abc" 257, " a" 258, "bc" 259. */
static void make_rank_file(const char *path, const char *extra) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  char e[16];
  for (int b = 0; b < 256; b++) {
    unsigned char c = (unsigned char)b;
    b64(&c, 1, e);
    fprintf(f, "%s %d\n", e, b);
  }
  const char *more[] = {"ab", "abc", " a", "bc"};
  for (int i = 0; i < 4; i++) {
    b64((const unsigned char *)more[i], strlen(more[i]), e);
    fprintf(f, "%s %d\n", e, 256 + i);
  }
  fputs(extra, f);
  fclose(f);
}

static const char k_tj_beside[] =
    "{\"added_tokens\": [{\"id\": 260, \"content\": \"<|endoftext|>\"}, {\"id\": 261, "
    "\"content\": \"<|im_start|>\"}], \"pre_tokenizer\": {\"type\": \"Sequence\", "
    "\"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \" ?\\\\p{L}+|\\\\s+\"}, "
    "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"use_regex\": "
    "false}]}}";

/* A fresh g_dir/SUB holding tokenizer.model (make_rank_file with extra);
 * the folder into dir, the file's path into path. */
static void rank_dir(const char *sub, const char *extra, char dir[128], char path[256]) {
  snprintf(dir, 128, "%s/%s", g_dir, sub);
  assert_int_equal(st_mkdir_p(dir), 0);
  snprintf(path, 256, "%s/tokenizer.model", dir);
  make_rank_file(path, extra);
}

/* st_tokenizer_load that must succeed: the failure's message otherwise. */
static st_tokenizer *load_ok(const char *spec) {
  st_tokenizer *t = st_tokenizer_load(spec);
  if (!t) fail_msg("%s: %s", spec, st_error_msg());
  return t;
}

static void test_rank_file(void **state) {
  (void)state;
  char dir[128], path[256];
  rank_dir("rank", "", dir, path);
  /* no pattern anywhere: refused, naming both fixes */
  expect_load_error(path, ":llama3 or");
  assert_non_null(strstr(st_error_msg(), "tokenizer.json beside it"));
  /* a tokenizer.json beside it gives the pattern and the special tokens */
  write_text(dir, "tokenizer.json", k_tj_beside);
  st_tokenizer *t = load_ok(path);
  assert_string_equal(st_tokenizer_name(t), "tiktoken-bpe");
  assert_int_equal(st_tokenizer_vocab_size(t), 262);
  assert_int_equal(st_tokenizer_eot(t), 260);
  /* tiktoken's rule, the lowest-ranked pair whose bytes are a token:
   * "abcxbc" merges ab (256), then ab+c = "abc" (257), then bc (259);
   * " abc" merges ab (256) before " a" (258), then "abc": [" ", "abc"] */
  const uint32_t w1[] = {257, 'x', 259, ' ', 257};
  encode(t, "abcxbc abc", 10, 0, w1, 5);
  const uint32_t w2[] = {261, 'x', 260};
  encode(t, "<|im_start|>x<|endoftext|>", 26, 1, w2, 3);
  const uint32_t w3[] = {'<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't', '|', '>'};
  encode(t, "<|im_start|>", 12, 0, w3, 12);
  assert_int_equal(st_tokenizer_file_count(t), 2);
  /* write_dir: the rank file and shardtrain_tiktoken.json load back as the same */
  char out[128];
  snprintf(out, sizeof out, "%s/rank_out", g_dir);
  assert_int_equal(st_tokenizer_write_dir(t, out), 0);
  st_tokenizer *u = load_ok(out);
  assert_string_equal(st_tokenizer_digest(u), st_tokenizer_digest(t));
  encode(u, "abcxbc abc", 10, 0, w1, 5);
  /* the same ranks with another pattern: another tokenizer */
  write_text(dir, "tokenizer.json", "{\"added_tokens\": [{\"id\": 260, \"content\": "
             "\"<|endoftext|>\"}, {\"id\": 261, \"content\": \"<|im_start|>\"}], "
             "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
             "\"Split\", \"pattern\": {\"Regex\": \"\\\\p{L}+|\\\\s+\"}, \"behavior\": "
             "\"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}}");
  st_tokenizer *v = load_ok(path);
  assert_string_not_equal(st_tokenizer_digest(v), st_tokenizer_digest(t));
  st_tokenizer_free(t);
  st_tokenizer_free(u);
  st_tokenizer_free(v);
}

/* A pattern that can match the empty string ("\p{L}+||\s+": an empty
 * alternative, from a file) loses no byte: what an empty match stands
 * before is encoded with the bytes between matches (tiktoken would drop
 * it), so decode gives back the text; found by tests/fuzz. */
static void test_pattern_matching_empty(void **state) {
  (void)state;
  char dir[128], path[256];
  rank_dir("rank_empty", "", dir, path);
  write_text(dir, "tokenizer.json", "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
             "{\"Regex\": \"\\\\p{L}+||\\\\s+\"}}}");
  st_tokenizer *t = load_ok(path);
  /* "abc" and " " match; the empty matches before "1", "." and the two-byte
   * "\xc3\xa9" leave them to the bytes between matches */
  const char text[] = "abc 12.\xc3\xa9" "abc";
  const uint32_t want[] = {257, ' ', '1', '2', '.', 0xc3, 0xa9, 257};
  encode(t, text, sizeof text - 1, 0, want, 8);
  char *back = NULL;
  size_t n = 0;
  uint32_t *ids = NULL;
  size_t k = 0;
  assert_int_equal(st_tokenizer_encode(t, text, sizeof text - 1, 0, &ids, &k), 0);
  assert_int_equal(st_tokenizer_decode(t, ids, k, &back, &n), 0);
  assert_int_equal(n, sizeof text - 1);
  assert_memory_equal(back, text, n);
  free(ids);
  free(back);
  st_tokenizer_free(t);
}

#ifdef SHARDTRAIN_HAVE_ICU
/* A rank file takes the NFC normalizer of the tokenizer.json beside it, and
 * the shardtrain_tiktoken.json it is stored with keeps it. */
static void test_rank_file_nfc(void **state) {
  (void)state;
  char dir[128], path[256], out[128];
  rank_dir("rank_nfc", "w6k= 260\n", dir, path); /* U+00E9 (C3 A9) is rank 260 */
  write_text(dir, "tokenizer.json", "{\"normalizer\": {\"type\": \"NFC\"}, \"added_tokens\": "
             "[{\"id\": 261, \"content\": \"<|endoftext|>\", \"normalized\": false}], "
             "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
             "\"Split\", \"pattern\": {\"Regex\": \" ?\\\\p{L}+|\\\\s+\"}, \"behavior\": "
             "\"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}}");
  st_tokenizer *t = load_ok(path);
  assert_string_equal(st_tokenizer_normalizer(t), "NFC");
  const uint32_t w[] = {260};
  uint32_t *ids;
  size_t n;
  assert_int_equal(st_tokenizer_encode(t, "e\xcc\x81", 3, 0, &ids, &n), 0); /* e + U+0301 */
  assert_int_equal(n, 1);
  assert_int_equal(ids[0], w[0]);
  free(ids);
  snprintf(out, sizeof out, "%s/rank_nfc_out", g_dir);
  assert_int_equal(st_tokenizer_write_dir(t, out), 0);
  st_tokenizer *u = load_ok(out);
  assert_string_equal(st_tokenizer_digest(u), st_tokenizer_digest(t));
  assert_string_equal(st_tokenizer_normalizer(u), "NFC");
  /* without the normalizer the same ranks are another tokenizer */
  write_text(dir, "tokenizer.json", "{\"added_tokens\": [{\"id\": 261, \"content\": "
             "\"<|endoftext|>\"}], \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": "
             "[{\"type\": \"Split\", \"pattern\": {\"Regex\": \" ?\\\\p{L}+|\\\\s+\"}, "
             "\"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}}");
  st_tokenizer *v = load_ok(path);
  assert_string_equal(st_tokenizer_normalizer(v), "none");
  assert_string_not_equal(st_tokenizer_digest(v), st_tokenizer_digest(t));
  st_tokenizer_free(t);
  st_tokenizer_free(u);
  st_tokenizer_free(v);
}
#endif

static void test_rank_file_malformed(void **state) {
  (void)state;
  char dir[128], path[256];
  snprintf(dir, sizeof dir, "%s/rank_bad", g_dir);
  assert_int_equal(st_mkdir_p(dir), 0);
  snprintf(path, sizeof path, "%s/a.tiktoken", dir);
  char spec[300];
  make_rank_file(path, "YWJj 300\n"); /* rank 300: ranks 260..299 missing */
  snprintf(spec, sizeof spec, "%s:qwen", path);
  expect_load_error(spec, "no token has rank/id 260");
  make_rank_file(path, "YWJ! 260\n");
  expect_load_error(spec, "a.tiktoken: line 261: \"YWJ!\" is not base64");
  make_rank_file(path, "YWJjZA== 260 extra\n");
  expect_load_error(spec, "line 261 \"YWJjZA== 260 extra\" is not \"base64 rank\"");
  make_rank_file(path, "YWI= 260\n"); /* "ab" twice; a pattern but no specials beside it */
  write_text(dir, "tokenizer.json", "{\"pre_tokenizer\": {\"type\": \"Sequence\", "
             "\"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}}]}}");
  expect_load_error(path, "ids 256 and 260 are the same bytes");
  snprintf(spec, sizeof spec, "%s/tokenizer.json", dir);
  unlink(spec);
  /* Llama 3's special ids are far past this file: a hole, named */
  make_rank_file(path, "");
  snprintf(spec, sizeof spec, "%s:llama3", path);
  expect_load_error(spec, "has a hole");
  snprintf(spec, sizeof spec, "%s:gpt5", path);
  assert_null(st_tokenizer_load(spec));
  assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
  assert_non_null(strstr(st_error_msg(), "llama3 and qwen"));
  /* a preset on something that is not a rank file */
  snprintf(dir, sizeof dir, "%s/bpe_preset", g_dir);
  make_bpe_dir(dir);
  snprintf(path, sizeof path, "%s/vocab.json:qwen", dir);
  expect_load_error(path, "applies to rank files only");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bytes),
      cmocka_unit_test(test_token_text),
      cmocka_unit_test(test_bpe_encode),
      cmocka_unit_test(test_bpe_spellings_same_digest),
      cmocka_unit_test(test_bpe_malformed),
      cmocka_unit_test(test_rank_file),
      cmocka_unit_test(test_pattern_matching_empty),
#ifdef SHARDTRAIN_HAVE_ICU
      cmocka_unit_test(test_rank_file_nfc),
#endif
      cmocka_unit_test(test_rank_file_malformed),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
