/* test_decimal.c - util/decimal.c's st_float_decimal, the float-to-decimal
 * that the config writers (run_config.c, resume_config.c, config_fields.c)
 * put into JSON.
 *
 * 1. The values people type come back as typed: 0.002, 3e-4, 0.1, 0.95,
 *    1e-5, 500000 and 2^24 (which %.7g wrote as 16777220, a different
 *    float: the bug this replaced).
 * 2. Every float of a sweep across the exponent range (and FLT_MIN,
 *    FLT_MAX, denormals, negatives, zero) reads back as the same float, and
 *    with no fewer digits than needed: one digit less (down to 6) would not
 *    read back.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "util/decimal.h"

static void test_typed_values(void **state) {
  (void)state;
  static const char *typed[] = {"0.002", "0.0003", "0.1", "0.95", "1e-05", "500000",
                                "16777216", "0.999", "6e-05", "1", "0"};
  for (size_t i = 0; i < sizeof typed / sizeof typed[0]; i++) {
    float f = strtof(typed[i], NULL);
    double d = st_float_decimal(f);
    /* The double itself is the decimal typed, not the float widened. */
    assert_true(d == strtod(typed[i], NULL));
  }
  /* The old writer's failure, kept as a check that the digits grow. */
  char old[32];
  snprintf(old, sizeof old, "%.7g", (double)16777216.0f);
  assert_string_equal(old, "1.677722e+07");
  assert_true(st_float_decimal(16777216.0f) == 16777216.0);
}

/* Significant digits %.*g needed for x to read back: the reference the
 * result is held to, counted independently of decimal.c's loop. */
static int digits_needed(float x) {
  char buf[40];
  for (int d = 1; d <= 9; d++) {
    snprintf(buf, sizeof buf, "%.*g", d, (double)x);
    if (strtof(buf, NULL) == x) return d;
  }
  return 10;
}

static void check_one(float x) {
  double d = st_float_decimal(x);
  assert_true((float)d == x);
  int need = digits_needed(x);
  assert_true(need <= 9);
  char buf[40];
  int want = need < 6 ? 6 : need;
  snprintf(buf, sizeof buf, "%.*g", want, (double)x);
  if (d != strtod(buf, NULL)) {
    fail_msg("%.9g: got %.17g, want %s (%d digits)", (double)x, d, buf, want);
  }
}

static void test_sweep(void **state) {
  (void)state;
  const float edge[] = {0.0f, -0.0f, FLT_MIN, FLT_MAX, -FLT_MAX, FLT_TRUE_MIN,
                        1e-45f, 3.4028233e38f, 1.0f / 3.0f, -2.5e-7f};
  for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) check_one(edge[i]);
  /* Every 4099th bit pattern of the finite positive floats, both signs:
   * about a million values over all exponents. */
  for (uint32_t bits = 1; bits < 0x7f800000u; bits += 4099u) {
    float x;
    memcpy(&x, &bits, sizeof x);
    check_one(x);
    check_one(-x);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_typed_values),
      cmocka_unit_test(test_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
