/* fuzz_shards.c - a list of token shards (@LIST, io/token_shards.h): the
 * input is the list file; beside it are three llm.c shards the harness
 * writes once (a.bin: 300 uint16 tokens, b.bin: 200 uint32, c.bin: 10
 * uint16). Opening the set must give consistent counts, and reading every
 * shard's first and last sequence must work, or the open is refused in
 * one line. Lines naming /dev or /proc are left out (a list naming
 * /dev/stdin would wait for input, which is not a bug). */
#define _GNU_SOURCE /* memmem */
#include "tests/fuzz/fuzz.h"

#include "io/token_shards.h"

enum { T = 16 };

static void shard(const char *name, int version, int n) {
  uint8_t *b = calloc(1, 1024 + (size_t)n * 4);
  if (!b) abort();
  const int32_t h[3] = {20240520, version, n};
  memcpy(b, h, sizeof h);
  for (int i = 0; i < n; i++) {
    const uint32_t v = (uint32_t)(i * 7 % 50000);
    if (version == 1) memcpy(b + 1024 + 2 * i, &v, 2); /* little-endian low half */
    else memcpy(b + 1024 + 4 * i, &v, 4);
  }
  fuzz_write(fuzz_path(1, name), b, 1024 + (size_t)n * (version == 1 ? 2 : 4));
  free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int made;
  if (!made) {
    shard("a.bin", 1, 300);
    shard("b.bin", 2, 200);
    shard("c.bin", 1, 10);
    made = 1;
  }
  if (memmem(data, size, "/dev", 4) || memmem(data, size, "/proc", 5) ||
      memmem(data, size, "/sys", 4))
    return 0;
  const char *list = fuzz_path(0, "list.txt");
  fuzz_write(list, data, size);
  char spec[700];
  snprintf(spec, sizeof spec, "@%s", list);
  st_shard_set set;
  memset(&set, 0, sizeof set);
  fuzz_clear_error();
  if (st_shards_open(&set, spec, "train", T)) {
    fuzz_check_failure("st_shards_open");
    st_shards_close(&set);
    return 0;
  }
  fuzz_accepted("st_shards_open");
  int64_t seqs = 0;
  int out[T + 1];
  for (int i = 0; i < set.n; i++) {
    if (set.s[i].nseq != (set.s[i].tokens > 0 ? (set.s[i].tokens - 1) / T : 0)) abort();
    seqs += set.s[i].nseq;
    fuzz_clear_error();
    if (set.s[i].nseq > 0 && (st_shards_read_seq(&set, i, 0, T, out) ||
                              st_shards_read_seq(&set, i, set.s[i].nseq - 1, T, out))) {
      fprintf(stderr, "fuzz: reading shard %d of an open set failed: %s\n", i, st_error_msg());
      abort();
    }
  }
  if (seqs != set.total_seq || (set.width != 2 && set.width != 4)) abort();
  st_shards_close(&set);
  return 0;
}
