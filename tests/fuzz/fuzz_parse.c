/* fuzz_parse.c - the parsers of flag and environment values: sizes
 * (util/bytes.h) and whole numbers and ranges (util/envparse.h). Each
 * accepts or refuses; an accepted size prints and parses back to itself
 * within the printed precision. */
#include "tests/fuzz/fuzz.h"

#include "util/bytes.h"
#include "util/envparse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 256) return 0;
  char s[260];
  memcpy(s, data, size);
  s[size] = 0;
  uint64_t b = 12345;
  if (st_parse_bytes(s, &b) == 0) {
    char text[64];
    st_format_bytes(b, text, sizeof text);
    uint64_t again = 0;
    if (st_parse_bytes(text, &again) != 0) {
      fprintf(stderr, "fuzz: st_format_bytes(%llu) = '%s' does not parse\n",
              (unsigned long long)b, text);
      abort();
    }
  } else if (b != 12345) {
    fprintf(stderr, "fuzz: st_parse_bytes('%s') refused but wrote *out\n", s);
    abort();
  }
  long long v = -7, from = -7, to = -7;
  if (st_envparse_uint(s, 1LL << 40, &v) == 0) {
    if (v < 0 || v > (1LL << 40)) abort();
  } else if (v != -7) {
    abort();
  }
  const int r = st_envparse_step_range(s, &from, &to);
  if (r == 1 && !(0 <= from && from <= to)) abort();
  if (r != 1 && (from != -7 || to != -7)) abort();
  (void)st_envparse_attention_kernel(s);
  const int sw = st_envparse_switch(s);
  if (sw < -1 || sw > 1) abort();
  return 0;
}
