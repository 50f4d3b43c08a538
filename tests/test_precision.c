/* test_precision.c - the host side of mixed precision: fp32 <-> bf16/fp16
 * conversions (kernels/dtype.c) and the fp16 dynamic loss scaler
 * (rank/optim/loss_scaler.c). Reference bit patterns are IEEE-754 round to
 * nearest even, the rounding of CUDA's __float2bfloat16_rn/__float2half_rn. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/dtype.h"
#include "rank/optim/loss_scaler.h"

static uint16_t to16(st_dtype d, float f) {
  uint16_t h;
  st_dtype_from_f32(d, &h, &f, 1);
  return h;
}
static float from16(st_dtype d, uint16_t h) {
  float f;
  st_dtype_to_f32(d, &f, &h, 1);
  return f;
}

static void test_bf16_rounding(void **state) {
  (void)state;
  assert_int_equal(to16(ST_BF16, 1.0f), 0x3f80);
  assert_int_equal(to16(ST_BF16, -2.0f), 0xc000);
  /* ulp of bf16 at 1 is 2^-7: 1 + 2^-8 ties to even (down), 1 + 3*2^-8 up */
  assert_int_equal(to16(ST_BF16, 1.0f + 0x1p-8f), 0x3f80);
  assert_int_equal(to16(ST_BF16, 1.0f + 3 * 0x1p-8f), 0x3f82);
  assert_int_equal(to16(ST_BF16, 1.0f + 0x1p-8f + 0x1p-20f), 0x3f81); /* above the tie */
  assert_int_equal(to16(ST_BF16, INFINITY), 0x7f80);
  assert_int_equal(to16(ST_BF16, 3.4028235e38f), 0x7f80); /* FLT_MAX rounds past bf16's max */
  assert_true(isnan(from16(ST_BF16, to16(ST_BF16, NAN))));
  assert_true(from16(ST_BF16, 0x3f80) == 1.0f);
  /* Every finite bf16 value survives bf16 -> fp32 -> bf16. */
  for (uint32_t h = 0; h < 65536; h++) {
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue; /* nan */
    assert_int_equal(to16(ST_BF16, from16(ST_BF16, (uint16_t)h)), h);
  }
}

static void test_fp16_rounding(void **state) {
  (void)state;
  assert_int_equal(to16(ST_FP16, 1.0f), 0x3c00);
  assert_int_equal(to16(ST_FP16, -2.0f), 0xc000);
  assert_int_equal(to16(ST_FP16, 0.1f), 0x2e66);
  assert_int_equal(to16(ST_FP16, 1.0f / 3.0f), 0x3555);
  assert_int_equal(to16(ST_FP16, 65504.0f), 0x7bff);  /* largest finite */
  assert_int_equal(to16(ST_FP16, 65519.0f), 0x7bff);  /* below the midpoint */
  assert_int_equal(to16(ST_FP16, 65520.0f), 0x7c00);  /* the midpoint ties to even: inf */
  assert_int_equal(to16(ST_FP16, 1e9f), 0x7c00);
  assert_int_equal(to16(ST_FP16, 0x1p-24f), 0x0001);  /* smallest subnormal */
  assert_int_equal(to16(ST_FP16, 0x1p-25f), 0x0000);  /* tie with 0: even */
  assert_int_equal(to16(ST_FP16, 3 * 0x1p-25f), 0x0002); /* tie between 1 and 2 units: even */
  assert_int_equal(to16(ST_FP16, 0x1p-14f), 0x0400);  /* smallest normal */
  assert_int_equal(to16(ST_FP16, 0x1p-14f - 0x1p-26f), 0x0400); /* rounds up into normals */
  assert_true(from16(ST_FP16, 0x0001) == 0x1p-24f);
  assert_true(isnan(from16(ST_FP16, to16(ST_FP16, NAN))));
  for (uint32_t h = 0; h < 65536; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* nan */
    assert_int_equal(to16(ST_FP16, from16(ST_FP16, (uint16_t)h)), h);
  }
}

static void test_fp32_copy(void **state) {
  (void)state;
  float a[3] = {1.5f, -0.0f, 1e-40f}, b[3];
  st_dtype_from_f32(ST_FP32, b, a, 3);
  assert_memory_equal(a, b, sizeof a);
  assert_int_equal(st_dtype_size(ST_BF16), 2);
  assert_int_equal(st_dtype_size(ST_FP32), 4);
}

static void test_scaler_hysteresis_and_growth(void **state) {
  (void)state;
  st_loss_scaler s;
  st_loss_scaler_init(&s, 1, 16777216.0f);
  assert_true(s.scale == 65536.0f);
  /* The first overflow is tolerated (hysteresis 2): skipped, scale kept. */
  assert_int_equal(st_loss_scaler_update(&s, 1), 1);
  assert_true(s.scale == 65536.0f);
  /* The second halves it, and so does every further one until growth. */
  assert_int_equal(st_loss_scaler_update(&s, 1), 1);
  assert_true(s.scale == 32768.0f);
  assert_int_equal(st_loss_scaler_update(&s, 0), 0);
  assert_int_equal(st_loss_scaler_update(&s, 1), 1);
  assert_true(s.scale == 16384.0f);
  assert_int_equal(s.skipped_steps, 3);
  /* 999 clean steps keep the scale; the 1000th doubles it and refills the
   * hysteresis, so the next single overflow is tolerated again. */
  for (int i = 0; i < 999; i++) assert_int_equal(st_loss_scaler_update(&s, 0), 0);
  assert_true(s.scale == 16384.0f);
  assert_int_equal(st_loss_scaler_update(&s, 0), 0);
  assert_true(s.scale == 32768.0f);
  assert_int_equal(st_loss_scaler_update(&s, 1), 1);
  assert_true(s.scale == 32768.0f);
  /* An overflow restarts the count of clean steps. */
  for (int i = 0; i < 999; i++) st_loss_scaler_update(&s, 0);
  st_loss_scaler_update(&s, 1);
  assert_true(s.scale == 16384.0f);
  for (int i = 0; i < 999; i++) st_loss_scaler_update(&s, 0);
  assert_true(s.scale == 16384.0f);
}

static void test_scaler_clamps(void **state) {
  (void)state;
  st_loss_scaler s;
  st_loss_scaler_init(&s, 1, 131072.0f);
  for (int i = 0; i < 5000; i++) st_loss_scaler_update(&s, 0);
  assert_true(s.scale == 131072.0f); /* max_scale */
  for (int i = 0; i < 100; i++) st_loss_scaler_update(&s, 1);
  assert_true(s.scale == 1.0f); /* never below 1 */
  st_loss_scaler_init(&s, 1, 1024.0f);
  assert_true(s.scale == 1024.0f); /* the start is clamped too */
}

static void test_scaler_disabled(void **state) {
  (void)state;
  st_loss_scaler s;
  st_loss_scaler_init(&s, 0, 16777216.0f);
  assert_true(s.scale == 1.0f);
  assert_int_equal(st_loss_scaler_update(&s, 0), 0);
  /* bf16/fp32: a non-finite gradient still skips the step, scale stays 1. */
  assert_int_equal(st_loss_scaler_update(&s, 1), 1);
  assert_true(s.scale == 1.0f);
  assert_int_equal(s.skipped_steps, 1);
  for (int i = 0; i < 3000; i++) st_loss_scaler_update(&s, 0);
  assert_true(s.scale == 1.0f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_rounding),
      cmocka_unit_test(test_fp16_rounding),
      cmocka_unit_test(test_fp32_copy),
      cmocka_unit_test(test_scaler_hysteresis_and_growth),
      cmocka_unit_test(test_scaler_clamps),
      cmocka_unit_test(test_scaler_disabled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
