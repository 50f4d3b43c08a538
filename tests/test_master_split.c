/* test_master_split.c - the fp32 master as a bf16 high half and a 16-bit
 * rest (kernels/master_split.h): every float splits and joins back to its
 * bits (NaN to a NaN of its sign), the high half is the float rounded half
 * away from zero, which is round-to-nearest-even except at exact ties, and
 * the rest fits. Checked on a dense sample of all 2^32 bit patterns (every
 * 251st, plus every high half with the rests around a tie) rather than all
 * of them, to keep the sanitizer build fast. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/dtype.h"
#include "kernels/master_split.h"

static float from_bits(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

/* One pattern's checks; 1 when it was an exact tie. */
static int check_one(uint32_t x) {
  uint16_t hi;
  int16_t lo;
  st_master_split_bits(x, &hi, &lo);
  const float f = from_bits(x);
  if (isnan(f)) {
    const float h = from_bits((uint32_t)hi << 16);
    if (!isnan(h) || (hi >> 15) != (x >> 31) || lo != 0)
      fail_msg("NaN %08x split to %04x %d", x, hi, lo);
    return 0;
  }
  if (st_master_join_bits(hi, lo) != x) fail_msg("%08x joined back as %08x", x, st_master_join_bits(hi, lo));
  /* half away from zero on the magnitude bits: truncate, up when the
   * dropped half is >= 0x8000 */
  const uint32_t low = x & 0xffffu;
  const uint16_t want = (uint16_t)((x >> 16) + (low >= 0x8000u));
  if (hi != want) fail_msg("%08x: high half %04x, want %04x", x, hi, want);
  uint16_t rne;
  st_dtype_from_f32(ST_BF16, &rne, &f, 1);
  if (low != 0x8000u && hi != rne)
    fail_msg("%08x: high half %04x differs from round-to-nearest-even %04x off a tie", x, hi, rne);
  /* the float form agrees with the bit form */
  uint16_t h2;
  int16_t l2;
  st_master_split(f, &h2, &l2);
  const float back = st_master_join(h2, l2);
  if (h2 != hi || l2 != lo || memcmp(&back, &f, sizeof f) != 0)
    fail_msg("%08x: float split/join disagree with the bit forms", x);
  return low == 0x8000u;
}

static void test_sampled_patterns(void **state) {
  (void)state;
  uint64_t n = 0;
  for (uint64_t x = 0; x <= 0xffffffffull; x += 251, n++) check_one((uint32_t)x);
  assert_true(n > 17000000);
  /* every high half with the rests at and around a tie, and the ends */
  const uint32_t lows[] = {0x0000, 0x0001, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff};
  int ties = 0;
  for (uint32_t h = 0; h <= 0xffff; h++)
    for (size_t k = 0; k < sizeof lows / sizeof *lows; k++) ties += check_one(h << 16 | lows[k]);
  assert_true(ties > 60000); /* the ties of every non-NaN high half */
}

static void test_special_values(void **state) {
  (void)state;
  const float vals[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1.0f, -1.0f, 3.4028235e38f,
                        -3.4028235e38f, 1e-45f, -1e-45f, 1.1754942e-38f, NAN, -NAN};
  for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
    uint32_t b;
    memcpy(&b, &vals[i], sizeof b);
    check_one(b);
  }
  /* the largest finite float rounds to inf, as round-to-nearest does, and
   * still joins back exactly */
  uint16_t hi;
  int16_t lo;
  st_master_split(3.4028235e38f, &hi, &lo);
  assert_int_equal(hi, 0x7f80);
  assert_int_equal(lo, -1);
  /* a tie goes away from zero in both signs: 1 + 2^-8 is halfway between
   * bf16's 1 and 1 + 2^-7 */
  st_master_split(1.00390625f, &hi, &lo);
  assert_int_equal(hi, 0x3f81);
  assert_int_equal(lo, -32768);
  st_master_split(-1.00390625f, &hi, &lo);
  assert_int_equal(hi, 0xbf81);
  assert_int_equal(lo, -32768);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sampled_patterns),
                                     cmocka_unit_test(test_special_values)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
