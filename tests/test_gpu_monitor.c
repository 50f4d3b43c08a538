/* test_gpu_monitor.c - the reading --mem-warn-fraction is checked on
 * (rank/memory/gpu_monitor.c, st_mem_sample_usage).
 *
 * 1. Sources in order of preference: NVML, then cudaMemGetInfo, then the
 *    process's RSS against the machine's memory; nothing read is 0.
 * 2. --enforce-gpu-mem's hold leaves a GPU reading's used and total: a run
 *    using 20 of a 24 GiB cap on an 80 GiB card held down to 24 reads
 *    20/24, not 76/80 (which passed 0.9 at every step of every capped run).
 *    RSS is not touched; a hold larger than a source's total skips that
 *    source; a reading below the hold is 0 used.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "rank/memory/gpu_monitor.h"

#define GIB (1ull << 30)

static void test_sources(void **state) {
  (void)state;
  st_mem_sample s;
  memset(&s, 0, sizeof s);
  uint64_t used = 7, total = 7;
  const char *what = NULL;
  assert_int_equal(st_mem_sample_usage(&s, 0, &used, &total, &what), 0);
  s.rss_bytes = 3 * GIB, s.host_total_bytes = 128 * GIB;
  assert_int_equal(st_mem_sample_usage(&s, 0, &used, &total, &what), 1);
  assert_true(used == 3 * GIB && total == 128 * GIB);
  assert_non_null(strstr(what, "resident memory"));
  s.have_cuda = 1, s.cuda_used_bytes = 10 * GIB, s.cuda_total_bytes = 80 * GIB;
  assert_int_equal(st_mem_sample_usage(&s, 0, &used, &total, &what), 1);
  assert_true(used == 10 * GIB && total == 80 * GIB);
  assert_string_equal(what, "GPU memory (cudaMemGetInfo)");
  s.have_nvml = 1, s.gpu_used_bytes = 11 * GIB, s.gpu_total_bytes = 81 * GIB;
  assert_int_equal(st_mem_sample_usage(&s, 0, &used, &total, &what), 1);
  assert_true(used == 11 * GIB && total == 81 * GIB);
  assert_string_equal(what, "GPU memory (NVML)");
}

static void test_hold(void **state) {
  (void)state;
  st_mem_sample s;
  memset(&s, 0, sizeof s);
  s.rss_bytes = 3 * GIB, s.host_total_bytes = 128 * GIB;
  s.have_cuda = 1, s.cuda_used_bytes = 76 * GIB, s.cuda_total_bytes = 80 * GIB;
  s.have_nvml = 1, s.gpu_used_bytes = 76 * GIB, s.gpu_total_bytes = 80 * GIB;
  uint64_t used, total;
  const char *what;
  const uint64_t held = 56 * GIB;
  assert_int_equal(st_mem_sample_usage(&s, held, &used, &total, &what), 1);
  assert_true(used == 20 * GIB && total == 24 * GIB);
  assert_string_equal(what, "GPU memory (NVML) less --enforce-gpu-mem's hold");
  assert_true((double)used <= 0.9 * (double)total); /* below the default threshold */
  s.have_nvml = 0;
  assert_int_equal(st_mem_sample_usage(&s, held, &used, &total, &what), 1);
  assert_true(used == 20 * GIB && total == 24 * GIB);
  assert_non_null(strstr(what, "cudaMemGetInfo) less --enforce-gpu-mem's hold"));
  /* counters read before the hold took its bytes: used below the hold */
  s.cuda_used_bytes = 1 * GIB;
  assert_int_equal(st_mem_sample_usage(&s, held, &used, &total, &what), 1);
  assert_true(used == 0 && total == 24 * GIB);
  /* a hold past a source's total skips it: down to RSS, untouched */
  assert_int_equal(st_mem_sample_usage(&s, 90 * GIB, &used, &total, &what), 1);
  assert_true(used == 3 * GIB && total == 128 * GIB);
  assert_non_null(strstr(what, "resident memory"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sources),
      cmocka_unit_test(test_hold),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
