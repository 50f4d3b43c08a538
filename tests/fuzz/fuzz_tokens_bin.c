/* fuzz_tokens_bin.c - an llm.c token shard (.bin, io/tokens.h): open it,
 * and read its first and last tokens when it opens. */
#include "tests/fuzz/fuzz.h"

#include "io/tokens.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_path(0, "shard.bin");
  fuzz_write(path, data, size);
  int vocab = -1;
  fuzz_clear_error();
  st_token_source *s = st_tokens_open(path, "train", &vocab);
  if (!s) {
    fuzz_check_failure("st_tokens_open");
    return 0;
  }
  fuzz_accepted("st_tokens_open");
  const int64_t n = st_tokens_count(s);
  const int w = st_tokens_width(s);
  if (n < 0 || (w != 2 && w != 4) || (uint64_t)n * (uint64_t)w > size) {
    fprintf(stderr, "fuzz: %lld tokens of %d bytes accepted from %zu bytes\n", (long long)n, w,
            size);
    abort();
  }
  int out[64];
  const int64_t k = n < 64 ? n : 64;
  fuzz_clear_error();
  if (k && st_tokens_read(s, 0, k, out)) fuzz_check_failure("st_tokens_read");
  fuzz_clear_error();
  if (k && st_tokens_read(s, n - k, k, out)) fuzz_check_failure("st_tokens_read");
  st_tokens_close(s);
  return 0;
}
