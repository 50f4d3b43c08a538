/* test_envparse.c - the environment parsers of util/envparse.c, which the
 * CUDA backend calls (kernels/cuda/timeline.c, attention.cu, ops_table.cu),
 * and NCCL_BUFFSIZE as train and plan read it (rank/memory/nccl_buffsize.c).
 *
 * 1. Whole numbers: digits only, up to the cap; sign, blanks, units,
 *    fractions, exponents, hex and values past 2^63 are refused, and the
 *    output is untouched then.
 * 2. ST_TIMELINE: unset (NULL, the crash of issue 12) and "" disable without
 *    parsing; "FROM:TO" and "STEP" enable; anything else is -1 and leaves
 *    the range as it was.
 * 3. ST_ATTENTION_KERNEL: simt forces the fallback; unset, "" and auto do
 *    not; other words are -1 (warned about by the caller).
 * 3b. Switches (ST_NCCL_ONE_RANK): unset, "" and 0 are off, 1 is on,
 *    anything else is refused.
 * 4. CUDA_VISIBLE_DEVICES described for the "no CUDA device" message: unset,
 *    empty and "-1" (both hide every GPU) say so.
 * 5. NCCL_BUFFSIZE from the environment: unset is 0; a whole number in
 *    1..16 GiB is taken; abc, 4MiB, 1.5, "", -1, 0, 2^63 and 2^64 are
 *    refused with one line naming the variable and exit class 2.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "rank/memory/nccl_buffsize.h"
#include "util/envparse.h"
#include "util/error.h"

static void test_uint(void **state) {
  (void)state;
  long long v = -7;
  assert_int_equal(st_envparse_uint("0", 10, &v), 0);
  assert_int_equal(v, 0);
  assert_int_equal(st_envparse_uint("4194304", 1LL << 34, &v), 0);
  assert_int_equal(v, 4194304);
  assert_int_equal(st_envparse_uint("0042", 100, &v), 0);
  assert_int_equal(v, 42);
  assert_int_equal(st_envparse_uint("9223372036854775807", INT64_MAX, &v), 0);
  assert_true(v == INT64_MAX);
  v = 123;
  static const char *const bad[] = {"", "abc", "4MiB", "4M", "1.5", "1e6", "-1", "+1", " 1",
                                    "1 ", "0x10", "9223372036854775808", "18446744073709551616",
                                    "99999999999999999999999", "1:2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (st_envparse_uint(bad[i], INT64_MAX, &v) != -1) fail_msg("accepted '%s'", bad[i]);
    assert_int_equal(v, 123);
  }
  assert_int_equal(st_envparse_uint(NULL, 10, &v), -1);
  assert_int_equal(st_envparse_uint("11", 10, &v), -1); /* past max */
  /* one digit past a one-digit max: (max - d) / 10 truncates to 0 in C, and
   * "9" once passed max 8 (ST_GEMM_SEARCH=9 then overran an 8-slot array) */
  for (int d = 1; d <= 9; d++) {
    char b[2] = {(char)('0' + d), 0};
    assert_int_equal(st_envparse_uint(b, d - 1, &v), -1);
    assert_int_equal(st_envparse_uint(b, d, &v), 0);
    assert_int_equal(v, d);
  }
  assert_int_equal(st_envparse_uint("10", 10, &v), 0);  /* max itself */
  assert_int_equal(v, 10);
}

static void test_step_range(void **state) {
  (void)state;
  long long from = 5, to = 7;
  assert_int_equal(st_envparse_step_range(NULL, &from, &to), 0);
  assert_int_equal(st_envparse_step_range("", &from, &to), 0);
  assert_int_equal(from, 5);
  assert_int_equal(to, 7);
  assert_int_equal(st_envparse_step_range("3:9", &from, &to), 1);
  assert_int_equal(from, 3);
  assert_int_equal(to, 9);
  assert_int_equal(st_envparse_step_range("12", &from, &to), 1);
  assert_int_equal(from, 12);
  assert_int_equal(to, 12);
  assert_int_equal(st_envparse_step_range("4:4", &from, &to), 1);
  assert_int_equal(from, 4);
  static const char *const bad[] = {"x", "3:", ":3", "9:3", "-1", "1:-2", "1:2:3", "1.5",
                                    "3 : 4", "5:abc", "1:99999999999999999999",
                                    "123456789012345678901234567890123456:1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    from = 5, to = 7;
    if (st_envparse_step_range(bad[i], &from, &to) != -1) fail_msg("accepted '%s'", bad[i]);
    assert_int_equal(from, 5);
    assert_int_equal(to, 7);
  }
}

static void test_attention_kernel(void **state) {
  (void)state;
  assert_int_equal(st_envparse_attention_kernel(NULL), 0);
  assert_int_equal(st_envparse_attention_kernel(""), 0);
  assert_int_equal(st_envparse_attention_kernel("auto"), 0);
  assert_int_equal(st_envparse_attention_kernel("simt"), 1);
  assert_int_equal(st_envparse_attention_kernel("SIMT"), -1);
  assert_int_equal(st_envparse_attention_kernel("flash"), -1);
  assert_int_equal(st_envparse_attention_kernel("simt "), -1);
}

static void test_gemm_search(void **state) {
  (void)state;
  int n = -5, any = -5;
  const char *exact[] = {NULL, "", "exact"};
  for (int i = 0; i < 3; i++) {
    n = any = -5;
    assert_int_equal(st_envparse_gemm_search(exact[i], &n, &any), 0);
    assert_int_equal(n, 8);
    assert_int_equal(any, 0);
  }
  assert_int_equal(st_envparse_gemm_search("off", &n, &any), 0);
  assert_int_equal(n, 1);
  assert_int_equal(any, 0);
  n = any = -5;
  assert_int_equal(st_envparse_gemm_search("1", &n, &any), 0);
  assert_int_equal(n, 1);
  assert_int_equal(any, 0);
  for (int v = 2; v <= 8; v++) {
    char b[4];
    snprintf(b, sizeof b, "%d", v);
    assert_int_equal(st_envparse_gemm_search(b, &n, &any), 0);
    assert_int_equal(n, v);
    assert_int_equal(any, 1);
  }
  const char *bad[] = {"0", "9", "08", "-2", " 8", "8 ", "exact8", "EXACT", "any", "2.0"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    n = any = -5;
    assert_int_equal(st_envparse_gemm_search(bad[i], &n, &any), -1);
    assert_int_equal(n, -5); /* untouched */
    assert_int_equal(any, -5);
  }
}

static void test_switch(void **state) {
  (void)state;
  assert_int_equal(st_envparse_switch(NULL), 0);
  assert_int_equal(st_envparse_switch(""), 0);
  assert_int_equal(st_envparse_switch("0"), 0);
  assert_int_equal(st_envparse_switch("1"), 1);
  assert_int_equal(st_envparse_switch("yes"), -1);
  assert_int_equal(st_envparse_switch("true"), -1);
  assert_int_equal(st_envparse_switch(" 1"), -1);
  assert_int_equal(st_envparse_switch("10"), -1);
  assert_int_equal(st_envparse_switch("01"), -1);
}

static void test_cuda_visible(void **state) {
  (void)state;
  char b[96];
  assert_string_equal(st_envparse_cuda_visible(NULL, b, sizeof b), "unset");
  assert_non_null(strstr(st_envparse_cuda_visible("", b, sizeof b), "empty"));
  assert_non_null(strstr(b, "hides every GPU"));
  assert_non_null(strstr(st_envparse_cuda_visible("-1", b, sizeof b), "'-1'"));
  assert_non_null(strstr(b, "hides every GPU"));
  assert_string_equal(st_envparse_cuda_visible("0,1", b, sizeof b), "'0,1'");
  char small[4];
  st_envparse_cuda_visible("0,1,2,3", small, sizeof small); /* truncates, stays a string */
  assert_int_equal(strlen(small), 3);
}

static void test_nccl_buffsize(void **state) {
  (void)state;
  long long v = -1;
  unsetenv("NCCL_BUFFSIZE");
  assert_int_equal(st_nccl_buffsize_env(&v), 0);
  assert_int_equal(v, 0);
  setenv("NCCL_BUFFSIZE", "8388608", 1);
  assert_int_equal(st_nccl_buffsize_env(&v), 0);
  assert_int_equal(v, 8388608);
  setenv("NCCL_BUFFSIZE", "17179869184", 1); /* 16 GiB, the cap */
  assert_int_equal(st_nccl_buffsize_env(&v), 0);
  assert_true(v == ST_NCCL_BUFFSIZE_MAX);
  static const char *const bad[] = {"abc", "4MiB", "1.5", "", "-1", "0", "17179869185",
                                    "9223372036854775808", "18446744073709551617", " 4096"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("NCCL_BUFFSIZE", bad[i], 1);
    st_error_code(ST_EXIT_ERROR);
    v = 99;
    if (st_nccl_buffsize_env(&v) != -1) fail_msg("accepted NCCL_BUFFSIZE='%s'", bad[i]);
    assert_int_equal(v, 0);
    assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
    const char *m = st_error_msg();
    assert_non_null(strstr(m, "NCCL_BUFFSIZE"));
    assert_null(strchr(m, '\n')); /* one line */
  }
  unsetenv("NCCL_BUFFSIZE");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uint),          cmocka_unit_test(test_step_range),
      cmocka_unit_test(test_attention_kernel), cmocka_unit_test(test_cuda_visible),
      cmocka_unit_test(test_switch),
      cmocka_unit_test(test_gemm_search),        cmocka_unit_test(test_nccl_buffsize),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
