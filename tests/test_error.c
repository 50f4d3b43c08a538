/* test_error.c - util/error.c: a message is one line whatever it quotes
 * (control characters escaped), except a report made with
 * st_error_set_lines; exit-code classes; prefixes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "util/error.h"

static void test_escapes_controls(void **state) {
  (void)state;
  /* a tensor name as a file might hold it: newline, tab, CR, ESC, DEL */
  assert_int_equal(st_error_set("tensor \"%s\" is bad", "a\nb\tc\rd\x1b[2Je\x7f"), -1);
  assert_string_equal(st_error_msg(), "tensor \"a\\nb\\tc\\rd\\x1b[2Je\\x7f\" is bad");
  /* printable ASCII, backslashes and UTF-8 pass as they are */
  st_error_set("%s", "caf\xc3\xa9 \\n \xe4\xb8\x96 ~");
  assert_string_equal(st_error_msg(), "caf\xc3\xa9 \\n \xe4\xb8\x96 ~");
  /* escaping twice changes nothing: a message may be set again from itself */
  char copy[2048];
  st_error_set("x\ny");
  strcpy(copy, st_error_msg());
  st_error_set("%s", copy);
  assert_string_equal(st_error_msg(), "x\\ny");
}

static void test_codes_and_prefix(void **state) {
  (void)state;
  st_error_code(ST_EXIT_ERROR);
  assert_int_equal(st_error_setc(ST_EXIT_DATA, "bad \x01 %d", 4), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_DATA);
  assert_string_equal(st_error_msg(), "bad \\x01 4");
  assert_int_equal(st_error_prefix("file %s", "a\nb"), -1);
  assert_string_equal(st_error_msg(), "file a\\nb: bad \\x01 4");
  st_error_code(ST_EXIT_ERROR);
}

static void test_lines_and_truncation(void **state) {
  (void)state;
  st_error_set_lines("run failed\n  which ends:\n    %s", "last line");
  assert_string_equal(st_error_msg(), "run failed\n  which ends:\n    last line");
  /* 2000 newlines escape to 4000 bytes: cut at the buffer, never inside an
   * escape, and NUL-terminated */
  char big[2001];
  memset(big, '\n', 2000);
  big[2000] = 0;
  st_error_set("%s", big);
  const size_t n = strlen(st_error_msg());
  assert_true(n <= 2047 && n >= 2040);
  assert_int_equal(n % 2, 0);
  for (size_t i = 0; i < n; i += 2) {
    assert_int_equal(st_error_msg()[i], '\\');
    assert_int_equal(st_error_msg()[i + 1], 'n');
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_escapes_controls),
      cmocka_unit_test(test_codes_and_prefix),
      cmocka_unit_test(test_lines_and_truncation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
