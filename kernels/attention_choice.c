/* attention_choice.c - see attention_choice.h. */
#include "kernels/attention_choice.h"
#include "util/envparse.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int st_attention_ours_takes(int C, int NH, st_dtype dt) {
  return st_attention_simt_tile(C, NH) > 0 || st_attention_tc_takes(C, NH, dt);
}

const char *const st_attention_words[] = {"auto", "cudnn", "flash", "mixed", NULL};
#define N_WORDS ((int)(sizeof st_attention_words / sizeof *st_attention_words) - 1)

int st_attention_parse(const char *word, st_attention_impl *out) {
  for (int i = 0; i < N_WORDS; i++)
    if (word && strcmp(word, st_attention_words[i]) == 0) {
      *out = (st_attention_impl)i;
      return 0;
    }
  return -1;
}

const char *st_attention_name(st_attention_impl impl) {
  return (unsigned)impl < (unsigned)N_WORDS ? st_attention_words[impl] : "auto";
}

int st_attention_auto_mixed(int hs, int hopper) { return hopper && hs == 64; }

int st_attention_cudnn_takes_head(int hs) { return hs > 0 && hs % 8 == 0 && hs <= 128; }

int st_attention_head_refusal(st_attention_impl asked, int C, int NH, st_dtype dt, char *msg,
                              unsigned long cap) {
  const int hs = NH > 0 ? C / NH : 0;
  const char *heads = NH == 1 ? "head" : "heads";
  const int flash = asked == ST_ATTENTION_FLASH;
  /* mixed runs cuDNN's forward: its head sizes */
  const int cudnn = asked == ST_ATTENTION_CUDNN || asked == ST_ATTENTION_MIXED;
  if (!st_attention_ours_takes(C, NH, dt)) {
    /* cuDNN's sizes lie inside ours, so another --attention never helps */
    if (flash || dt == ST_FP32)
      snprintf(msg, cap, "--heads/--dim: head size %d (width %d / %d %s) has no attention "
               "kernel of ours (head sizes 1 to 128); use more heads", hs, C, NH, heads);
    else
      snprintf(msg, cap, "--heads/--dim: head size %d (width %d / %d %s): cuDNN's fused "
               "attention takes multiples of 8 up to 128 and our kernels 1 to 128; use more "
               "heads", hs, C, NH, heads);
    return 1;
  }
  if (cudnn && dt != ST_FP32 && !st_attention_cudnn_takes_head(hs)) {
    snprintf(msg, cap, "--attention %s: cuDNN's fused attention needs a head size that is a "
             "multiple of 8 and at most 128, got %d (width %d / %d %s); use --attention "
             "flash or auto (ours run it)", st_attention_name(asked), hs, C, NH, heads);
    return 1;
  }
  return 0;
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

int st_attention_heads_group(int setting, int64_t bnh, int64_t tiles, int sms) {
  if (bnh < 1) return 1;
  int64_t g;
  if (setting == ST_ATTENTION_GRID_HEADS) g = bnh;
  else if (setting >= 1) g = setting;
  else if (bnh <= ST_ATTENTION_HEADS_FIRST_MAX) g = bnh;
  else {
    const int64_t slots = 3 * (int64_t)(sms > 0 ? sms : 132);
    g = (2 * slots + tiles) / (tiles + 1); /* ceil(2 slots / (tiles + 1)) */
    if (g > ST_ATTENTION_HEADS_GROUP_MAX) g = ST_ATTENTION_HEADS_GROUP_MAX;
  }
  return (int)(g < 1 ? 1 : g > bnh ? bnh : g);
}

int st_attention_grid_parse(const char *e) {
  if (!e || !*e || strcmp(e, "auto") == 0) return ST_ATTENTION_GRID_AUTO;
  if (strcmp(e, "heads") == 0) return ST_ATTENTION_GRID_HEADS;
  if (strcmp(e, "tiles") == 0) return 1;
  long long v = 0;
  if (st_envparse_uint(e, 65535, &v) != 0 || v < 1) return ST_ATTENTION_GRID_BAD;
  return (int)v;
}
