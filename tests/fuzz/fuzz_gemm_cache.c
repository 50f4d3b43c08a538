/* fuzz_gemm_cache.c - an ST_GEMM_CACHE file (kernels/gemm_cache.h): lines
 * that do not parse are skipped, never misread. The input is the file;
 * the harness looks up a key the seeds hold, then appends a line for a new
 * key and must find exactly it again. */
#include "tests/fuzz/fuzz.h"

#include "kernels/gemm_cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_path(0, "gemm.cache");
  fuzz_write(path, data, size);
  const long long key[4] = {768, 2304, 32768, 1};
  unsigned long long algo[ST_GEMM_ALGO_WORDS];
  (void)st_gemm_cache_find(path, "NVIDIA_H200_cublasLt_130000", key, 4, algo);
  /* a key no file holds before this input is appended and read back */
  const long long fresh[3] = {7, 11, (long long)size};
  const unsigned long long want[ST_GEMM_ALGO_WORDS] = {1, 2, 3, 0xdeadbeefULL, 5, 6, 7, 8};
  if (st_gemm_cache_add(path, "fuzz_device", fresh, 3, want) != 0) {
    perror("fuzz: st_gemm_cache_add");
    abort();
  }
  unsigned long long got[ST_GEMM_ALGO_WORDS];
  const int r = st_gemm_cache_find(path, "fuzz_device", fresh, 3, got);
  /* an earlier line of the input may hold the same key (the first wins) */
  if (r != 1) {
    fprintf(stderr, "fuzz: a line just appended is not found (%d)\n", r);
    abort();
  }
  return 0;
}
