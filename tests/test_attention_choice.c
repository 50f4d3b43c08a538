/* test_attention_choice.c - which CUDA attention kernel takes a shape
 * (kernels/attention_choice.c, called by attention.cu and attention_tc.cu
 * and at setup by st_cuda_attention_select).
 *
 * 1. Tensor-core kernels: bf16 and fp16 only, head sizes 32, 64 and 128
 *    exactly (GPT-2's 768/12 = 64 included); fp32, other head sizes, a width
 *    not divisible by the heads, and zero or negative sizes are refused.
 * 2. fp32-arithmetic kernels: the smallest of the 32/64/128 tiles that holds
 *    the head size, 0 (none) past 128 or for a width not divisible by the
 *    heads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/attention_choice.h"

static void test_tc(void **state) {
  (void)state;
  assert_int_equal(st_attention_tc_takes(768, 12, ST_BF16), 1); /* GPT-2 124M: hs 64 */
  assert_int_equal(st_attention_tc_takes(768, 12, ST_FP16), 1);
  assert_int_equal(st_attention_tc_takes(768, 12, ST_FP32), 0);
  assert_int_equal(st_attention_tc_takes(128, 4, ST_BF16), 1);   /* hs 32 */
  assert_int_equal(st_attention_tc_takes(1024, 8, ST_BF16), 1);  /* hs 128 */
  assert_int_equal(st_attention_tc_takes(64, 4, ST_BF16), 0);    /* hs 16 */
  assert_int_equal(st_attention_tc_takes(96, 2, ST_BF16), 0);    /* hs 48 */
  assert_int_equal(st_attention_tc_takes(2048, 8, ST_BF16), 0);  /* hs 256 */
  assert_int_equal(st_attention_tc_takes(100, 3, ST_BF16), 0);   /* not divisible */
  assert_int_equal(st_attention_tc_takes(0, 4, ST_BF16), 0);
  assert_int_equal(st_attention_tc_takes(64, 0, ST_BF16), 0);
  assert_int_equal(st_attention_tc_takes(-64, -1, ST_BF16), 0);
}

static void test_simt(void **state) {
  (void)state;
  assert_int_equal(st_attention_simt_tile(64, 64), 32);  /* hs 1 */
  assert_int_equal(st_attention_simt_tile(72, 3), 32);   /* hs 24 (the ops test's shape) */
  assert_int_equal(st_attention_simt_tile(128, 4), 32);  /* hs 32 */
  assert_int_equal(st_attention_simt_tile(132, 4), 64);  /* hs 33 */
  assert_int_equal(st_attention_simt_tile(768, 12), 64); /* hs 64 */
  assert_int_equal(st_attention_simt_tile(390, 5), 128); /* hs 78 */
  assert_int_equal(st_attention_simt_tile(512, 4), 128); /* hs 128 */
  assert_int_equal(st_attention_simt_tile(516, 4), 0);   /* hs 129 */
  assert_int_equal(st_attention_simt_tile(256, 1), 0);   /* hs 256 */
  assert_int_equal(st_attention_simt_tile(64, 5), 0);    /* not divisible */
  assert_int_equal(st_attention_simt_tile(0, 4), 0);
  assert_int_equal(st_attention_simt_tile(64, 0), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_tc), cmocka_unit_test(test_simt)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
