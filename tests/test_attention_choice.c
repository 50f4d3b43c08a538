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
 * 3. Sequences per cuDNN backward call: the whole micro-batch, or the
 *    largest divisor of it at or below a cap (given, or else from
 *    ST_ATTENTION_CUDNN_SEQS; a bad value is ignored); and the smallest
 *    group --attention auto considers (768 tiles of 128 rows a call).
 * 4. The head sizes nothing runs, refused by plan and train's setup in the
 *    same words.
 * 5. The Hopper kernels' block order: auto takes heads first up to 32
 *    heads of the micro-batch (B x NH) and tiles first past it; a forced
 *    order holds except past 65535 tiles, a grid's y limit, where tiles
 *    first is the only one that launches; ST_ATTENTION_GRID's words.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

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

static void test_cudnn_group(void **state) {
  (void)state;
  unsetenv("ST_ATTENTION_CUDNN_SEQS");
  /* no cap: the whole micro-batch in one call */
  assert_int_equal(st_attention_cudnn_group(32, 0), 32);
  assert_int_equal(st_attention_cudnn_group(1, 0), 1);
  /* a cap: the largest divisor at or below it */
  assert_int_equal(st_attention_cudnn_group(32, 10), 8);
  assert_int_equal(st_attention_cudnn_group(30, 10), 10);
  assert_int_equal(st_attention_cudnn_group(11, 10), 1); /* prime */
  assert_int_equal(st_attention_cudnn_group(12, 5), 4);
  assert_int_equal(st_attention_cudnn_group(8, 1), 1);
  assert_int_equal(st_attention_cudnn_group(8, 8), 8);
  assert_int_equal(st_attention_cudnn_group(8, 100), 8);
  assert_int_equal(st_attention_cudnn_group(0, 4), 1);
  assert_int_equal(st_attention_cudnn_group(8, -3), 8); /* below 1: no cap */
  /* the environment caps only where no cap is given */
  setenv("ST_ATTENTION_CUDNN_SEQS", "6", 1);
  assert_int_equal(st_attention_cudnn_group(32, 0), 4);
  assert_int_equal(st_attention_cudnn_group(12, 0), 6);
  assert_int_equal(st_attention_cudnn_group(12, 2), 2);
  setenv("ST_ATTENTION_CUDNN_SEQS", "many", 1); /* ignored, with a warning */
  assert_int_equal(st_attention_cudnn_group(32, 0), 32);
  setenv("ST_ATTENTION_CUDNN_SEQS", "0", 1);
  assert_int_equal(st_attention_cudnn_group(32, 0), 32);
  setenv("ST_ATTENTION_CUDNN_SEQS", "3x", 1);
  assert_int_equal(st_attention_cudnn_group(32, 0), 32);
  unsetenv("ST_ATTENTION_CUDNN_SEQS");
}

static void test_cudnn_min_group(void **state) {
  (void)state;
  /* GPT-2 124M, 12 heads: 96 tiles of 128 rows a sequence at T = 1024,
   * so 8 sequences reach 768 */
  assert_int_equal(st_attention_cudnn_min_group(32, 1024, 12), 8);
  assert_int_equal(st_attention_cudnn_min_group(12, 1024, 12), 12); /* no divisor of 12 in 8..11 */
  assert_int_equal(st_attention_cudnn_min_group(4, 1024, 12), 4);   /* never above B */
  assert_int_equal(st_attention_cudnn_min_group(8, 4096, 12), 2);   /* 384 a sequence */
  assert_int_equal(st_attention_cudnn_min_group(4, 8192, 12), 1);   /* 768 a sequence */
  assert_int_equal(st_attention_cudnn_min_group(4, 8100, 12), 1);   /* ceil(8100/128) = 64 */
  assert_int_equal(st_attention_cudnn_min_group(4, 8064, 12), 2);   /* 63 tiles: 756 */
  assert_int_equal(st_attention_cudnn_min_group(0, 1024, 12), 1);
  assert_int_equal(st_attention_cudnn_min_group(4, 0, 12), 1);
  assert_int_equal(st_attention_cudnn_min_group(4, 1024, 0), 1);
}

/* The refusal plan and train's setup share: what runs nothing, by asked
 * mode and dtype, and one line naming the flag and the fix. */
static void test_head_refusal(void **state) {
  (void)state;
  char m[256];
  static const st_attention_impl modes[] = {ST_ATTENTION_AUTO, ST_ATTENTION_CUDNN,
                                            ST_ATTENTION_FLASH, ST_ATTENTION_MIXED};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(st_attention_head_refusal(modes[i], 768, 12, ST_BF16, m, sizeof m), 0);
    assert_int_equal(st_attention_head_refusal(modes[i], 2048, 16, ST_FP16, m, sizeof m), 0);
    m[0] = 0;
    assert_int_equal(st_attention_head_refusal(modes[i], 2048, 8, ST_BF16, m, sizeof m), 1);
    assert_non_null(strstr(m, "head size 256 (width 2048 / 8 heads)"));
    assert_non_null(strstr(m, "use more heads"));
    assert_null(strchr(m, '\n'));
  }
  /* ours take any whole head size to 128; cuDNN only multiples of 8 */
  assert_int_equal(st_attention_head_refusal(ST_ATTENTION_AUTO, 72, 2, ST_BF16, m, sizeof m), 0);
  assert_int_equal(st_attention_head_refusal(ST_ATTENTION_FLASH, 72, 2, ST_BF16, m, sizeof m), 0);
  assert_int_equal(st_attention_head_refusal(ST_ATTENTION_CUDNN, 72, 2, ST_BF16, m, sizeof m), 1);
  assert_non_null(strstr(m, "--attention cudnn"));
  assert_non_null(strstr(m, "got 36"));
  /* mixed runs cuDNN's forward: the same head sizes, its own flag named */
  assert_int_equal(st_attention_head_refusal(ST_ATTENTION_MIXED, 72, 2, ST_BF16, m, sizeof m), 1);
  assert_non_null(strstr(m, "--attention mixed"));
  assert_int_equal(st_attention_head_refusal(ST_ATTENTION_MIXED, 768, 12, ST_FP16, m, sizeof m), 0);
  /* fp32 runs ours whatever was asked: 36 is fine, 256 names ours only */
  assert_int_equal(st_attention_head_refusal(ST_ATTENTION_CUDNN, 72, 2, ST_FP32, m, sizeof m), 0);
  assert_int_equal(st_attention_head_refusal(ST_ATTENTION_AUTO, 2048, 8, ST_FP32, m, sizeof m), 1);
  assert_non_null(strstr(m, "no attention kernel of ours"));
  assert_int_equal(st_attention_head_refusal(ST_ATTENTION_FLASH, 2048, 8, ST_BF16, m, sizeof m), 1);
  assert_null(strstr(m, "--attention")); /* no other mode runs it either */
  /* the cuDNN head-size rule itself */
  assert_int_equal(st_attention_cudnn_takes_head(64), 1);
  assert_int_equal(st_attention_cudnn_takes_head(128), 1);
  assert_int_equal(st_attention_cudnn_takes_head(136), 0);
  assert_int_equal(st_attention_cudnn_takes_head(36), 0);
  assert_int_equal(st_attention_cudnn_takes_head(0), 0);
  assert_int_equal(st_attention_ours_takes(2048, 16, ST_FP32), 1);
  assert_int_equal(st_attention_ours_takes(2048, 8, ST_BF16), 0);
}

/* --attention's words both ways, and auto's rule for running mixed from the
 * start: our pipelined Hopper backward at head size 64 only. */
static void test_names_and_auto(void **state) {
  (void)state;
  static const char *const words[] = {"auto", "cudnn", "flash", "mixed"};
  for (int i = 0; i < 4; i++) {
    st_attention_impl a = ST_ATTENTION_FLASH;
    assert_int_equal(st_attention_parse(words[i], &a), 0);
    assert_int_equal((int)a, i);
    assert_string_equal(st_attention_name(a), words[i]);
  }
  st_attention_impl a = ST_ATTENTION_MIXED;
  assert_int_equal(st_attention_parse("flash2", &a), -1);
  assert_int_equal(st_attention_parse("", &a), -1);
  assert_int_equal(st_attention_parse(NULL, &a), -1);
  assert_int_equal((int)a, ST_ATTENTION_MIXED); /* untouched */
  assert_string_equal(st_attention_name((st_attention_impl)7), "auto");
  assert_int_equal(st_attention_auto_mixed(64, 1), 1);
  assert_int_equal(st_attention_auto_mixed(64, 0), 0);  /* not Hopper: cuDNN where it fits */
  assert_int_equal(st_attention_auto_mixed(128, 1), 0); /* cuDNN's backward the faster there */
  assert_int_equal(st_attention_auto_mixed(32, 1), 0);
}

static void test_grid_order(void **state) {
  (void)state;
  const int A = ST_ATTENTION_GRID_AUTO;
  /* one group (every head's longest tile first) up to 32 heads, measured */
  assert_int_equal(st_attention_heads_group(A, 12, 128, 132), 12);  /* 124M, 1 x 8192 */
  assert_int_equal(st_attention_heads_group(A, 32, 64, 132), 32);   /* 2 x 16 heads */
  /* above: ceil(2 x 3 x 132 / (tiles + 1)) heads a group, at most 7 */
  assert_int_equal(st_attention_heads_group(A, 48, 128, 132), 7);   /* 124M, 4 x 8192: 792 / 129 */
  assert_int_equal(st_attention_heads_group(A, 384, 16, 132), 7);   /* 124M, 32 x 1024: 47, capped */
  assert_int_equal(st_attention_heads_group(A, 33, 64, 132), 7);    /* 13, capped */
  assert_int_equal(st_attention_heads_group(A, 48, 256, 132), 4);   /* T 16384: 792 / 257 */
  assert_int_equal(st_attention_heads_group(A, 48, 128, 0), 7);     /* SMs unknown: an H100's */
  assert_int_equal(st_attention_heads_group(A, 48, 128, 78), 4);    /* fewer SMs, smaller groups */
  assert_int_equal(st_attention_heads_group(A, 48, 4096, 132), 1);  /* long heads: head after head */
  /* forced */
  assert_int_equal(st_attention_heads_group(ST_ATTENTION_GRID_HEADS, 384, 16, 132), 384);
  assert_int_equal(st_attention_heads_group(1, 12, 128, 132), 1);
  assert_int_equal(st_attention_heads_group(6, 48, 128, 132), 6);
  assert_int_equal(st_attention_heads_group(100, 48, 128, 132), 48); /* capped at bnh */
  assert_int_equal(st_attention_heads_group(A, 0, 128, 132), 1);
  assert_int_equal(st_attention_grid_parse(NULL), ST_ATTENTION_GRID_AUTO);
  assert_int_equal(st_attention_grid_parse(""), ST_ATTENTION_GRID_AUTO);
  assert_int_equal(st_attention_grid_parse("auto"), ST_ATTENTION_GRID_AUTO);
  assert_int_equal(st_attention_grid_parse("heads"), ST_ATTENTION_GRID_HEADS);
  assert_int_equal(st_attention_grid_parse("tiles"), 1);
  assert_int_equal(st_attention_grid_parse("1"), 1);
  assert_int_equal(st_attention_grid_parse("12"), 12);
  assert_int_equal(st_attention_grid_parse("65535"), 65535);
  assert_int_equal(st_attention_grid_parse("65536"), ST_ATTENTION_GRID_BAD);
  assert_int_equal(st_attention_grid_parse("0"), ST_ATTENTION_GRID_BAD);
  assert_int_equal(st_attention_grid_parse("-3"), ST_ATTENTION_GRID_BAD);
  assert_int_equal(st_attention_grid_parse("8 "), ST_ATTENTION_GRID_BAD);
  assert_int_equal(st_attention_grid_parse("Heads"), ST_ATTENTION_GRID_BAD);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_tc), cmocka_unit_test(test_simt),
                                     cmocka_unit_test(test_names_and_auto),
                                     cmocka_unit_test(test_cudnn_group),
                                     cmocka_unit_test(test_cudnn_min_group),
                                     cmocka_unit_test(test_head_refusal),
                                     cmocka_unit_test(test_grid_order)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
