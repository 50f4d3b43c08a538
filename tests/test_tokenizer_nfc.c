/* test_tokenizer_nfc.c - tokenizer.json's NFC normalizer (io/text_nfc.c) on a
 * Qwen2-format tokenizer.json cut from Qwen's real vocabulary
 * (tests/data/tokenizer/qwen2_nfc, made by tests/fixtures/make_qwen2_nfc.py):
 * the ids Hugging Face `tokenizers` gives on its golden texts, with the NFC
 * normalizer and with it removed; decomposed text encoding as its precomposed
 * form (and not without NFC), across ICU chunks and invalid bytes; the
 * identity (digest) with and without NFC; normalizers that are refused. A
 * build without ICU checks that the file is refused, naming the package. */
#define _XOPEN_SOURCE 700
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer.h"
#include "util/error.h"
#include "util/fsutil.h"

#define FIXTURE NFC_DATA_DIR "/tokenizer.json"
/* The fixture with "normalizer": null, as every build before NFC gave it
 * (hf-bpe, "shardtrain tokenizer v2"): adding NFC must not move it. */
#define PLAIN_DIGEST "ac0e0f8b9a5c7b0149c74ab80099346dec37909574f3a342dae3a65144af80c5"

static char g_dir[64];
static char *g_json; /* the fixture's text */

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  assert_non_null(s);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  s[n] = 0;
  if (len) *len = (size_t)n;
  return s;
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/st_tokenizer_nfc_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  g_json = read_all(FIXTURE, NULL);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  free(g_json);
  return st_rm_rf(g_dir);
}

/* The fixture with its normalizer replaced by norm (JSON), as DIR/NAME/tokenizer.json. */
static st_tokenizer *variant(const char *name, const char *norm, char *dir, size_t cap) {
  static const char key[] = "\"normalizer\":{\"type\":\"NFC\"}";
  const char *at = strstr(g_json, key);
  assert_non_null(at);
  snprintf(dir, cap, "%s/%s", g_dir, name);
  assert_int_equal(st_mkdir_p(dir), 0);
  char path[256];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fprintf(f, "%.*s\"normalizer\":%s%s", (int)(at - g_json), g_json, norm, at + strlen(key));
  fclose(f);
  return st_tokenizer_load(dir);
}

static void expect_refused(const char *name, const char *norm, const char *needle) {
  char dir[128];
  assert_null(variant(name, norm, dir, sizeof dir));
  assert_int_equal(st_error_exit_code(), ST_EXIT_DATA);
  if (!strstr(st_error_msg(), needle)) fail_msg("'%s' lacks '%s'", st_error_msg(), needle);
  assert_null(strchr(st_error_msg(), '\n'));
}

#ifdef SHARDTRAIN_HAVE_ICU

static uint32_t *ids_of(const st_tokenizer *t, const char *s, size_t len, int special, size_t *n) {
  uint32_t *ids = NULL;
  if (st_tokenizer_encode(t, s, len, special, &ids, n) != 0) fail_msg("%s", st_error_msg());
  return ids;
}

static int same_ids(const st_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen) {
  size_t na, nb;
  uint32_t *x = ids_of(t, a, alen, 0, &na), *y = ids_of(t, b, blen, 0, &nb);
  int same = na == nb && memcmp(x, y, na * sizeof *x) == 0;
  free(x);
  free(y);
  return same;
}

static void expect_golden(const st_tokenizer *t, const cJSON *e, const char *field) {
  const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
  const char *text = cJSON_GetObjectItem(e, "text")->valuestring;
  const cJSON *want = cJSON_GetObjectItem(e, field);
  const int special = cJSON_IsTrue(cJSON_GetObjectItem(e, "special"));
  size_t n;
  uint32_t *ids = ids_of(t, text, strlen(text), special, &n);
  if (n != (size_t)cJSON_GetArraySize(want))
    fail_msg("%s (%s): %zu ids, tokenizers gives %d", name, field, n, cJSON_GetArraySize(want));
  size_t i = 0;
  for (const cJSON *w = want->child; w && i < n; w = w->next, i++)
    if (ids[i] != (uint32_t)w->valuedouble)
      fail_msg("%s (%s): id %zu is %u, tokenizers gives %d", name, field, i, ids[i],
               (int)w->valuedouble);
  free(ids);
}

/* Every golden text gives the ids `tokenizers` gives, with NFC and without. */
static void test_golden_parity(void **state) {
  (void)state;
  char *g = read_all(NFC_DATA_DIR "/golden.json", NULL);
  cJSON *j = cJSON_Parse(g);
  free(g);
  assert_non_null(j);
  st_tokenizer *t = st_tokenizer_load(FIXTURE);
  if (!t) fail_msg("%s", st_error_msg());
  char dir[128];
  st_tokenizer *plain = variant("plain", "null", dir, sizeof dir);
  assert_non_null(plain);
  assert_string_equal(st_tokenizer_name(t), "hf-bpe");
  assert_int_equal(st_tokenizer_vocab_size(t), 1894);
  int n = 0;
  for (const cJSON *e = cJSON_GetObjectItem(j, "texts")->child; e; e = e->next, n++) {
    expect_golden(t, e, "ids");
    expect_golden(plain, e, "ids_plain");
  }
  assert_true(n >= 10);
  cJSON_Delete(j);
  st_tokenizer_free(t);
  st_tokenizer_free(plain);
}

static char *repeat(const char *s, int times, size_t *len) {
  size_t n = strlen(s);
  char *r = malloc(n * (size_t)times + 1);
  assert_non_null(r);
  for (int i = 0; i < times; i++) memcpy(r + n * (size_t)i, s, n);
  r[n * (size_t)times] = 0;
  *len = n * (size_t)times;
  return r;
}

/* Decomposed text encodes as its precomposed form under NFC, and not
 * without it; decode gives the NFC bytes. */
static void test_decomposed_as_precomposed(void **state) {
  (void)state;
  st_tokenizer *t = st_tokenizer_load(FIXTURE);
  if (!t) fail_msg("%s", st_error_msg());
  char dir[128];
  st_tokenizer *plain = variant("plain2", "null", dir, sizeof dir);
  assert_non_null(plain);
  static const char *const pairs[][2] = {
      {"e\xcc\x81", "\xc3\xa9"},                                  /* e + U+0301: U+00E9 */
      {"\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab", "\xed\x95\x9c"}, /* jamo: U+D55C */
      {"Hi e\xcc\x81t\xc3\xa9 \xf0\x9f\x98\x80 \xe1\x84\x80\xe1\x85\xa1 ok 42\n",
       "Hi \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80 \xea\xb0\x80 ok 42\n"},   /* ASCII, emoji, U+AC00 */
      {"a\xcc\x87\xcc\xa3", "\xe1\xba\xa1\xcc\x87"},              /* reordered: U+1EA1 U+0307 */
      {"\xe2\x84\xab", "\xc3\x85"},                                /* ANGSTROM SIGN: U+00C5 */
      {"\xff" "e\xcc\x81\xfe", "\xff\xc3\xa9\xfe"},                /* between invalid bytes */
  };
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
    const char *d = pairs[i][0], *c = pairs[i][1];
    if (!same_ids(t, d, strlen(d), c, strlen(c))) fail_msg("pair %zu: NFC ids differ", i);
    if (same_ids(plain, d, strlen(d), c, strlen(c))) fail_msg("pair %zu: same without NFC", i);
    size_t n, len;
    uint32_t *ids = ids_of(t, d, strlen(d), 0, &n);
    char *back;
    assert_int_equal(st_tokenizer_decode(t, ids, n, &back, &len), 0);
    assert_int_equal(len, strlen(c));
    assert_memory_equal(back, c, len);
    free(back);
    free(ids);
  }
  /* nothing composes across an invalid byte: "e", 0xFF, U+0301 come back as they are */
  const char *cut = "e\xff\xcc\x81";
  size_t n, len;
  uint32_t *ids = ids_of(t, cut, 4, 0, &n);
  char *back;
  assert_int_equal(st_tokenizer_decode(t, ids, n, &back, &len), 0);
  assert_int_equal(len, 4);
  assert_memory_equal(back, cut, 4);
  free(back);
  free(ids);
  /* past ICU's 64 KiB chunks: the NFD of the sample 60 times (about 95 KB)
   * as its NFC; e + U+0301 40000 times as U+00E9 40000 times (a chunk cut
   * 64 KiB on, between an "e" and its U+0301, would leave one apart); one
   * "e" with 40000 U+0301 (no boundary to cut at) */
  char *g = read_all(NFC_DATA_DIR "/golden.json", NULL);
  cJSON *j = cJSON_Parse(g);
  free(g);
  const char *nfd = NULL, *nfc = NULL;
  for (const cJSON *e = cJSON_GetObjectItem(j, "texts")->child; e; e = e->next) {
    const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
    if (!strcmp(name, "sample_nfd")) nfd = cJSON_GetObjectItem(e, "text")->valuestring;
    if (!strcmp(name, "sample_nfc")) nfc = cJSON_GetObjectItem(e, "text")->valuestring;
  }
  assert_true(nfd && nfc);
  size_t dl, cl;
  char *d = repeat(nfd, 60, &dl), *c = repeat(nfc, 60, &cl);
  assert_true(dl > (64u << 10) && dl != cl);
  assert_true(same_ids(t, d, dl, c, cl));
  assert_false(same_ids(plain, d, dl, c, cl));
  free(d);
  free(c);
  cJSON_Delete(j);
  d = repeat("e\xcc\x81", 40000, &dl);
  c = repeat("\xc3\xa9", 40000, &cl);
  assert_true(same_ids(t, d, dl, c, cl));
  free(d);
  free(c);
  char *marks = repeat("\xcc\x81", 40000, &dl), *run = malloc(dl + 2);
  assert_non_null(run);
  run[0] = 'e';
  memcpy(run + 1, marks, dl + 1);
  memcpy(marks, "\xc3\xa9", 2); /* é, then the other 39999 */
  assert_true(same_ids(t, run, dl + 1, marks, dl));
  free(run);
  free(marks);
  st_tokenizer_free(t);
  st_tokenizer_free(plain);
}

/* NFC is part of the identity; a Sequence of NFC is NFC; the stored files
 * load back as the same tokenizer. */
static void test_identity(void **state) {
  (void)state;
  st_tokenizer *t = st_tokenizer_load(FIXTURE);
  if (!t) fail_msg("%s", st_error_msg());
  char dir[128], out[128];
  st_tokenizer *plain = variant("plain3", "null", dir, sizeof dir);
  st_tokenizer *seq = variant("seq", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]}",
                              dir, sizeof dir);
  st_tokenizer *empty = variant("empty_seq", "{\"type\":\"Sequence\",\"normalizers\":[]}", dir,
                                sizeof dir);
  if (!plain || !seq || !empty) fail_msg("%s", st_error_msg());
  assert_string_equal(st_tokenizer_normalizer(t), "NFC");
  assert_string_equal(st_tokenizer_normalizer(seq), "NFC");
  assert_string_equal(st_tokenizer_normalizer(plain), "none");
  assert_string_equal(st_tokenizer_normalizer(empty), "none");
  assert_string_equal(st_tokenizer_digest(plain), PLAIN_DIGEST);
  assert_string_equal(st_tokenizer_digest(empty), PLAIN_DIGEST);
  assert_string_not_equal(st_tokenizer_digest(t), PLAIN_DIGEST);
  assert_string_equal(st_tokenizer_digest(seq), st_tokenizer_digest(t));
  snprintf(out, sizeof out, "%s/written", g_dir);
  assert_int_equal(st_tokenizer_write_dir(t, out), 0);
  st_tokenizer *u = st_tokenizer_load(out);
  if (!u) fail_msg("%s", st_error_msg());
  assert_string_equal(st_tokenizer_digest(u), st_tokenizer_digest(t));
  assert_true(same_ids(u, "e\xcc\x81", 3, "\xc3\xa9", 2));
  st_tokenizer_free(t);
  st_tokenizer_free(plain);
  st_tokenizer_free(seq);
  st_tokenizer_free(empty);
  st_tokenizer_free(u);
}

/* Other normalizers, and NFC with added tokens matched after it, are refused
 * by name. */
static void test_refused(void **state) {
  (void)state;
  expect_refused("nfkc", "{\"type\":\"NFKC\"}", "tokenizer.json: has a normalizer (NFKC)");
  expect_refused("seq_lower", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},"
                 "{\"type\":\"Lowercase\"}]}", "has a normalizer (Lowercase)");
  char dir[128], path[256];
  snprintf(dir, sizeof dir, "%s/added_normalized", g_dir);
  assert_int_equal(st_mkdir_p(dir), 0);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  const char *at = strstr(g_json, "\"normalized\":false");
  assert_non_null(at);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fprintf(f, "%.*s\"normalized\":true%s", (int)(at - g_json), g_json, at + 18);
  fclose(f);
  assert_null(st_tokenizer_load(dir));
  if (!strstr(st_error_msg(), "added token \"<|endoftext|>\" has \"normalized\": true"))
    fail_msg("%s", st_error_msg());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden_parity),
      cmocka_unit_test(test_decomposed_as_precomposed),
      cmocka_unit_test(test_identity),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

#else /* built without ICU */

/* The NFC tokenizer is refused, saying the build lacks ICU and how to get
 * it; one without a normalizer still loads. */
static void test_refused_without_icu(void **state) {
  (void)state;
  expect_refused("nfc", "{\"type\":\"NFC\"}", "this build of shardtrain lacks ICU");
  assert_non_null(strstr(st_error_msg(), "libicu-dev"));
  char dir[128];
  st_tokenizer *plain = variant("plain", "null", dir, sizeof dir);
  if (!plain) fail_msg("%s", st_error_msg());
  assert_string_equal(st_tokenizer_digest(plain), PLAIN_DIGEST);
  st_tokenizer_free(plain);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_refused_without_icu)};
  return cmocka_run_group_tests(tests, setup, teardown);
}

#endif
