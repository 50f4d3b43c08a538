/* test_tokens.c - token data: prep round trip, .bin shards, and the error
 * messages users see for missing, foreign or damaged data files. */
#define _XOPEN_SOURCE 700
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/tokens.h"
#include "util/error.h"
#include "util/fsutil.h"

static char g_dir[64];

static int make_dir(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/st_tokens_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int remove_dir(void **state) {
  (void)state;
  return st_rm_rf(g_dir);
}

static void path_in_dir(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", g_dir, name);
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

/* Whole file into a malloc'd buffer; *n gets its size. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseeko(f, 0, SEEK_END);
  *n = (size_t)ftello(f);
  fseeko(f, 0, SEEK_SET);
  unsigned char *buf = malloc(*n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, *n, f), *n);
  fclose(f);
  return buf;
}

/* The message must name the file, or the user cannot act on it. */
static void assert_error_names(const char *path) {
  const char *msg = st_error_msg();
  if (!strstr(msg, path)) fail_msg("error \"%s\" does not name %s", msg, path);
}

static void assert_open_fails(const char *path, const char *split, const char *must_contain) {
  int vocab = -7;
  st_token_source *s = st_tokens_open(path, split, &vocab);
  if (s) {
    st_tokens_close(s);
    fail_msg("st_tokens_open(%s) succeeded; expected an error", path);
  }
  assert_error_names(path);
  if (must_contain && !strstr(st_error_msg(), must_contain))
    fail_msg("error \"%s\" lacks \"%s\"", st_error_msg(), must_contain);
  assert_int_equal(st_error_exit_code(), ST_EXIT_DATA);
}

static long long read_ll_attr(hid_t file, const char *name) {
  long long v = -1;
  hid_t a = H5Aopen(file, name, H5P_DEFAULT);
  assert_true(a >= 0);
  assert_true(H5Aread(a, H5T_NATIVE_LLONG, &v) >= 0);
  H5Aclose(a);
  return v;
}

static void assert_str_attr(hid_t file, const char *name, const char *want) {
  char got[256] = {0};
  hid_t a = H5Aopen(file, name, H5P_DEFAULT);
  assert_true(a >= 0);
  hid_t t = H5Aget_type(a);
  assert_int_equal(H5Tget_class(t), H5T_STRING);
  assert_true(H5Tget_size(t) < sizeof got);
  assert_true(H5Aread(a, t, got) >= 0);
  H5Tclose(t);
  H5Aclose(a);
  assert_string_equal(got, want);
}

/* 40 bytes, val_fraction 0.25: 10 val tokens, 30 train tokens. */
static const char k_text[] = "Hello, token world! \xc3\xa9t\xc3\xa9 bytes 01234567";

static void test_prep_round_trip(void **state) {
  (void)state;
  char in[256], out[256];
  size_t n = strlen(k_text);
  assert_int_equal(n, 40);
  path_in_dir(in, sizeof in, "input.txt");
  path_in_dir(out, sizeof out, "tokens.h5");
  write_bytes(in, k_text, n);

  int64_t train = -1, val = -1;
  assert_int_equal(st_prep_bytes(in, out, 0.25, &train, &val), 0);
  assert_int_equal(train, 30);
  assert_int_equal(val, 10);
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  assert_false(st_path_exists(tmp));

  const char *splits[2] = {"train", "val"};
  const int64_t counts[2] = {30, 10}, first[2] = {0, 30};
  for (int k = 0; k < 2; k++) {
    int vocab = 0, tok[64];
    st_token_source *s = st_tokens_open(out, splits[k], &vocab);
    if (!s) fail_msg("open %s: %s", splits[k], st_error_msg());
    assert_int_equal(vocab, 256);
    assert_int_equal(st_tokens_count(s), counts[k]);
    assert_string_equal(st_tokens_path(s), out);
    assert_int_equal(st_tokens_read(s, 0, counts[k], tok), 0);
    for (int64_t i = 0; i < counts[k]; i++)
      assert_int_equal(tok[i], (unsigned char)k_text[first[k] + i]);
    st_tokens_close(s);
  }

  hid_t f = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  assert_int_equal(read_ll_attr(f, "vocab_size"), 256);
  assert_int_equal(read_ll_attr(f, "train_tokens"), 30);
  assert_int_equal(read_ll_attr(f, "val_tokens"), 10);
  assert_str_attr(f, "tokenizer", "bytes");
  assert_str_attr(f, "source", in);
  assert_str_attr(f, "format", "shardtrain-tokens-v1");
  double vf = 0;
  hid_t a = H5Aopen(f, "val_fraction", H5P_DEFAULT);
  assert_true(H5Aread(a, H5T_NATIVE_DOUBLE, &vf) >= 0);
  H5Aclose(a);
  assert_true(vf == 0.25);
  /* The checksum filter is what makes corruption a read error. */
  hid_t d = H5Dopen2(f, "/train", H5P_DEFAULT);
  hid_t dcpl = H5Dget_create_plist(d);
  assert_int_equal(H5Pget_layout(dcpl), H5D_CHUNKED);
  assert_true(H5Pget_filter_by_id2(dcpl, H5Z_FILTER_FLETCHER32, NULL, NULL, NULL, 0, NULL,
                                   NULL) >= 0);
  H5Pclose(dcpl);
  H5Dclose(d);
  H5Fclose(f);
}

static void test_prep_sub_range(void **state) {
  (void)state;
  char in[256], out[256];
  enum { N = 5000 };
  static unsigned char text[N];
  for (int i = 0; i < N; i++) text[i] = (unsigned char)((i * 7 + 3) % 256);
  path_in_dir(in, sizeof in, "range.txt");
  path_in_dir(out, sizeof out, "range.hdf5");
  write_bytes(in, text, N);
  int64_t train = 0, val = 0;
  assert_int_equal(st_prep_bytes(in, out, 0.1, &train, &val), 0);
  assert_int_equal(val, 500);
  assert_int_equal(train, 4500);

  int vocab = 0, tok[100];
  st_token_source *s = st_tokens_open(out, "train", &vocab);
  assert_non_null(s);
  /* Sentinels after the range catch a read that writes too much. */
  for (int i = 0; i < 100; i++) tok[i] = -1;
  assert_int_equal(st_tokens_read(s, 1234, 57, tok), 0);
  for (int i = 0; i < 57; i++) assert_int_equal(tok[i], text[1234 + i]);
  for (int i = 57; i < 100; i++) assert_int_equal(tok[i], -1);
  assert_int_equal(st_tokens_read(s, 4500 - 3, 3, tok), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(tok[i], text[4497 + i]);
  /* Past the end is an error, not a short read. */
  assert_int_equal(st_tokens_read(s, 4499, 2, tok), -1);
  assert_error_names(out);
  assert_int_equal(st_tokens_read(s, -1, 1, tok), -1);
  st_tokens_close(s);

  s = st_tokens_open(out, "val", &vocab);
  assert_non_null(s);
  assert_int_equal(st_tokens_count(s), 500);
  assert_int_equal(st_tokens_read(s, 499, 1, tok), 0);
  assert_int_equal(tok[0], text[N - 1]);
  st_tokens_close(s);
}

/* Multi-chunk file: reads across chunk edges, then one flipped byte inside a
 * chunk must surface as a read error naming the file, not as other tokens. */
static void test_checksum_catches_corruption(void **state) {
  (void)state;
  char in[256], out[256];
  enum { N = 700000, EDGE = 1 << 18 };
  unsigned char *text = malloc(N);
  assert_non_null(text);
  uint32_t x = 12345;
  for (int i = 0; i < N; i++) {
    x = x * 1103515245u + 12345u;
    text[i] = (unsigned char)(x >> 24);
  }
  path_in_dir(in, sizeof in, "big.txt");
  path_in_dir(out, sizeof out, "big.h5");
  write_bytes(in, text, N);
  assert_int_equal(st_prep_bytes(in, out, 0.05, NULL, NULL), 0);

  int *tok = malloc(4000 * sizeof *tok);
  assert_non_null(tok);
  st_token_source *s = st_tokens_open(out, "train", NULL);
  assert_non_null(s);
  assert_int_equal(st_tokens_count(s), N - N / 20);
  assert_int_equal(st_tokens_read(s, EDGE - 2000, 4000, tok), 0);
  for (int i = 0; i < 4000; i++) assert_int_equal(tok[i], text[EDGE - 2000 + i]);
  st_tokens_close(s);

  /* Find chunk 1 of /train on disk and flip a byte in the middle of it. */
  hid_t f = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "/train", H5P_DEFAULT);
  hsize_t offset[1], size = 0;
  haddr_t addr = 0;
  unsigned mask = 0;
  hid_t sp = H5Dget_space(d);
  assert_true(H5Dget_chunk_info(d, sp, 1, offset, &mask, &addr, &size) >= 0);
  assert_int_equal(offset[0], EDGE);
  H5Sclose(sp);
  H5Dclose(d);
  H5Fclose(f);
  FILE *fp = fopen(out, "r+b");
  assert_non_null(fp);
  assert_int_equal(fseeko(fp, (off_t)(addr + size / 2), SEEK_SET), 0);
  int c = fgetc(fp);
  assert_int_equal(fseeko(fp, (off_t)(addr + size / 2), SEEK_SET), 0);
  fputc(c ^ 0x10, fp);
  fclose(fp);

  s = st_tokens_open(out, "train", NULL);
  assert_non_null(s);
  assert_int_equal(st_tokens_read(s, 0, 100, tok), 0); /* chunk 0 still fine */
  assert_int_equal(st_tokens_read(s, EDGE + 10, 100, tok), -1);
  assert_error_names(out);
  assert_int_equal(st_error_exit_code(), ST_EXIT_DATA);
  st_tokens_close(s);
  free(tok);
  free(text);
}

static void test_bin_round_trip(void **state) {
  (void)state;
  char path[256];
  enum { N = 70000 }; /* more than one pread staging buffer */
  static uint16_t toks[N];
  for (int i = 0; i < N; i++) toks[i] = (uint16_t)((i * 40503u) & 0xffff);
  toks[5] = 50256;
  toks[6] = 65535;
  path_in_dir(path, sizeof path, "shard.bin");
  assert_int_equal(st_write_llmc_bin(path, toks, N), 0);

  size_t size;
  unsigned char *raw = slurp(path, &size);
  assert_int_equal(size, 1024 + 2 * N);
  assert_int_equal(raw[0] | raw[1] << 8 | raw[2] << 16 | raw[3] << 24, 20240520);
  assert_int_equal(raw[4], 1);
  assert_int_equal(raw[1024 + 10], 50256 & 0xff); /* little-endian token 5 */
  assert_int_equal(raw[1024 + 11], 50256 >> 8);
  free(raw);

  int vocab = -1;
  st_token_source *s = st_tokens_open(path, "ignored", &vocab);
  if (!s) fail_msg("open: %s", st_error_msg());
  assert_int_equal(vocab, 0);
  assert_int_equal(st_tokens_count(s), N);
  static int out[N];
  const int64_t offsets[] = {0, 1, 5, 16383, 16384, 40000, N - 10};
  const int64_t lens[] = {N, 7, 2, 3, 20000, 30000, 10};
  for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
    memset(out, 0xff, sizeof out);
    assert_int_equal(st_tokens_read(s, offsets[k], lens[k], out), 0);
    for (int64_t i = 0; i < lens[k]; i++) assert_int_equal(out[i], toks[offsets[k] + i]);
    if (lens[k] < N) assert_int_equal(out[lens[k]], -1);
  }
  assert_int_equal(st_tokens_read(s, N - 1, 2, out), -1);
  assert_error_names(path);
  st_tokens_close(s);
}

/* llm.c version 2: uint32 tokens (Llama 3's), ids past 65535 read back. */
static void test_bin_v2_uint32(void **state) {
  (void)state;
  char path[256];
  enum { N = 10000 }; /* more than one pread staging buffer (8192 tokens) */
  static uint32_t toks[N];
  for (int i = 0; i < N; i++) toks[i] = (uint32_t)((i * 2654435761u) % 151851u);
  toks[3] = 65536;
  toks[4] = 128001;
  toks[5] = 151850;
  path_in_dir(path, sizeof path, "shard_v2.bin");
  assert_int_equal(st_write_llmc_bin32(path, toks, N), 0);
  size_t size;
  unsigned char *raw = slurp(path, &size);
  assert_int_equal(size, 1024 + 4 * N);
  assert_int_equal(raw[4], 2);
  assert_int_equal(raw[1024 + 16] | raw[1024 + 17] << 8 | raw[1024 + 18] << 16, 128001);
  free(raw);
  int vocab = -1;
  st_token_source *s = st_tokens_open(path, NULL, &vocab);
  if (!s) fail_msg("open: %s", st_error_msg());
  assert_int_equal(st_tokens_count(s), N);
  static int out[N];
  assert_int_equal(st_tokens_read(s, 0, N, out), 0);
  for (int i = 0; i < N; i++) assert_int_equal(out[i], (int)toks[i]);
  assert_int_equal(st_tokens_read(s, 8190, 5, out), 0);
  for (int i = 0; i < 5; i++) assert_int_equal(out[i], (int)toks[8190 + i]);
  st_tokens_close(s);
  /* an id no vocabulary reaches is damage, not a negative int */
  toks[7] = 0xfffffff0u;
  assert_int_equal(st_write_llmc_bin32(path, toks, N), 0);
  s = st_tokens_open(path, NULL, NULL);
  assert_non_null(s);
  assert_int_equal(st_tokens_read(s, 0, 16, out), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_DATA);
  assert_error_names(path);
  st_tokens_close(s);
  /* truncation counts 4-byte tokens */
  assert_int_equal(truncate(path, 1024 + 4 * 60 + 3), 0);
  assert_open_fails(path, NULL, "header says 10000 tokens, file holds 60");
}

static void test_missing_file(void **state) {
  (void)state;
  char path[256];
  path_in_dir(path, sizeof path, "nope.h5");
  assert_open_fails(path, "train", "does not exist");
  assert_non_null(strstr(st_error_msg(), "shardtrain prep"));
  path_in_dir(path, sizeof path, "nope.bin");
  assert_open_fails(path, "train", "does not exist");
}

static void test_wrong_extension(void **state) {
  (void)state;
  char path[256];
  path_in_dir(path, sizeof path, "tokens.txt");
  write_bytes(path, "abc", 3);
  assert_open_fails(path, "train", ".hdf5");
  assert_non_null(strstr(st_error_msg(), ".bin"));
}

static void test_bin_bad_magic(void **state) {
  (void)state;
  char path[256];
  uint16_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  path_in_dir(path, sizeof path, "magic.bin");
  assert_int_equal(st_write_llmc_bin(path, toks, 8), 0);
  size_t n;
  unsigned char *raw = slurp(path, &n);
  raw[0] ^= 0x5a;
  write_bytes(path, raw, n);
  free(raw);
  assert_open_fails(path, NULL, "magic");
}

static void test_bin_truncated(void **state) {
  (void)state;
  char path[256];
  uint16_t toks[100] = {0};
  path_in_dir(path, sizeof path, "short.bin");
  assert_int_equal(st_write_llmc_bin(path, toks, 100), 0);
  assert_int_equal(truncate(path, 1024 + 2 * 60 + 1), 0);
  assert_open_fails(path, NULL, "truncated: header says 100 tokens, file holds 60");
  assert_int_equal(truncate(path, 500), 0);
  assert_open_fails(path, NULL, "1024");
}

static void test_h5_without_val(void **state) {
  (void)state;
  char path[256];
  path_in_dir(path, sizeof path, "trainonly.h5");
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  assert_true(f >= 0);
  hsize_t dims = 4;
  uint16_t data[4] = {1, 2, 3, 4};
  hid_t sp = H5Screate_simple(1, &dims, NULL);
  hid_t d = H5Dcreate2(f, "/train", H5T_STD_U16LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  assert_true(H5Dwrite(d, H5T_NATIVE_USHORT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
  /* A float dataset stands in for files written by other tools. */
  hid_t d2 = H5Dcreate2(f, "/floats", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(d2);
  H5Dclose(d);
  H5Sclose(sp);
  H5Fclose(f);

  assert_open_fails(path, "val", "/val");
  assert_open_fails(path, "floats", "32-bit floats");
  int vocab = -1;
  st_token_source *s = st_tokens_open(path, "train", &vocab);
  if (!s) fail_msg("open train: %s", st_error_msg());
  assert_int_equal(vocab, 0); /* no vocab_size attribute: unknown */
  int tok[4];
  assert_int_equal(st_tokens_read(s, 1, 3, tok), 0);
  assert_int_equal(tok[0], 2);
  assert_int_equal(tok[2], 4);
  st_tokens_close(s);
}

static void test_not_hdf5(void **state) {
  (void)state;
  char path[256];
  path_in_dir(path, sizeof path, "fake.h5");
  write_bytes(path, "this is text, not HDF5", 22);
  assert_open_fails(path, "train", "not an HDF5 file");
}

static void test_prep_bad_inputs(void **state) {
  (void)state;
  char in[256], out[256], missing_dir_out[256];
  path_in_dir(in, sizeof in, "empty.txt");
  path_in_dir(out, sizeof out, "empty.h5");
  write_bytes(in, "", 0);
  assert_int_equal(st_prep_bytes(in, out, 0.1, NULL, NULL), -1);
  assert_error_names(in);
  assert_non_null(strstr(st_error_msg(), "empty"));
  assert_int_equal(st_error_exit_code(), ST_EXIT_DATA);
  assert_false(st_path_exists(out));

  /* 19 bytes at 0.1 gives 1 val token; 20 is the smallest that works. */
  write_bytes(in, "0123456789012345678", 19);
  assert_int_equal(st_prep_bytes(in, out, 0.1, NULL, NULL), -1);
  assert_error_names(in);
  assert_non_null(strstr(st_error_msg(), "at least 20 bytes"));
  write_bytes(in, "01234567890123456789", 20);
  int64_t train = 0, val = 0;
  assert_int_equal(st_prep_bytes(in, out, 0.1, &train, &val), 0);
  assert_int_equal(val, 2);
  assert_int_equal(train, 18);

  assert_int_equal(st_prep_bytes(in, out, 0.0, NULL, NULL), -1);
  assert_int_equal(st_prep_bytes(in, out, 0.6, NULL, NULL), -1);

  path_in_dir(missing_dir_out, sizeof missing_dir_out, "no/such/dir/t.h5");
  assert_int_equal(st_prep_bytes(in, missing_dir_out, 0.1, NULL, NULL), -1);
  assert_error_names(missing_dir_out);
  assert_non_null(strstr(st_error_msg(), "does not exist"));

  char missing_in[256];
  path_in_dir(missing_in, sizeof missing_in, "absent.txt");
  assert_int_equal(st_prep_bytes(missing_in, out, 0.1, NULL, NULL), -1);
  assert_error_names(missing_in);
}

static void test_failed_prep_keeps_old_file(void **state) {
  (void)state;
  char in[256], empty[256], out[256], tmp[300];
  path_in_dir(in, sizeof in, "good.txt");
  path_in_dir(empty, sizeof empty, "bad.txt");
  path_in_dir(out, sizeof out, "keep.h5");
  write_bytes(in, k_text, strlen(k_text));
  write_bytes(empty, "", 0);
  assert_int_equal(st_prep_bytes(in, out, 0.25, NULL, NULL), 0);
  size_t n_before, n_after;
  unsigned char *before = slurp(out, &n_before);

  assert_int_equal(st_prep_bytes(empty, out, 0.25, NULL, NULL), -1);
  assert_error_names(empty);
  write_bytes(empty, "abc", 3); /* too small, fails later in the pipeline */
  assert_int_equal(st_prep_bytes(empty, out, 0.25, NULL, NULL), -1);

  unsigned char *after = slurp(out, &n_after);
  assert_int_equal(n_after, n_before);
  assert_memory_equal(after, before, n_before);
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  assert_false(st_path_exists(tmp));
  free(before);
  free(after);

  /* The old file is still a valid token file. */
  st_token_source *s = st_tokens_open(out, "val", NULL);
  assert_non_null(s);
  assert_int_equal(st_tokens_count(s), 10);
  st_tokens_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prep_round_trip),
      cmocka_unit_test(test_prep_sub_range),
      cmocka_unit_test(test_checksum_catches_corruption),
      cmocka_unit_test(test_bin_round_trip),
      cmocka_unit_test(test_bin_v2_uint32),
      cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_wrong_extension),
      cmocka_unit_test(test_bin_bad_magic),
      cmocka_unit_test(test_bin_truncated),
      cmocka_unit_test(test_h5_without_val),
      cmocka_unit_test(test_not_hdf5),
      cmocka_unit_test(test_prep_bad_inputs),
      cmocka_unit_test(test_failed_prep_keeps_old_file),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
