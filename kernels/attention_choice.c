/* attention_choice.c - see attention_choice.h. */
#include "kernels/attention_choice.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int st_attention_tc_takes(int C, int NH, st_dtype dt) {
  if (dt != ST_BF16 && dt != ST_FP16) return 0;
  if (C <= 0 || NH <= 0 || C % NH != 0) return 0;
  const int hs = C / NH;
  return hs == 32 || hs == 64 || hs == 128;
}

int st_attention_simt_tile(int C, int NH) {
  if (C <= 0 || NH <= 0 || C % NH != 0) return 0;
  const int hs = C / NH;
  return hs <= 32 ? 32 : hs <= 64 ? 64 : hs <= 128 ? 128 : 0;
}

/* ST_ATTENTION_CUDNN_SEQS as a positive int, or 0 when unset; a value that
 * is not one is reported once and ignored. */
static int seqs_env(void) {
  static int warned;
  const char *e = getenv("ST_ATTENTION_CUDNN_SEQS");
  if (!e || !*e) return 0;
  char *end = NULL;
  errno = 0;
  const long v = strtol(e, &end, 10);
  if (errno || *end || v < 1 || v > 1 << 30) {
    if (!warned)
      fprintf(stderr, "shardtrain: warning: ST_ATTENTION_CUDNN_SEQS=%s is not a whole number "
              "of sequences >= 1; the default grouping is kept\n", e);
    warned = 1;
    return 0;
  }
  return (int)v;
}

int st_attention_cudnn_group(int B, int cap) {
  if (B < 1) return 1;
  if (cap < 1) cap = seqs_env();
  if (cap < 1 || cap >= B) return B;
  for (int g = cap; g > 1; g--)
    if (B % g == 0) return g;
  return 1;
}

int st_attention_cudnn_min_group(int B, int T, int NH) {
  if (B < 1 || T < 1 || NH < 1) return 1;
  const uint64_t tiles = (uint64_t)NH * (((uint64_t)T + 127) / 128);
  for (int g = 1; g < B; g++)
    if (B % g == 0 && (uint64_t)g * tiles >= ST_CUDNN_MIN_TILES) return g;
  return B;
}
