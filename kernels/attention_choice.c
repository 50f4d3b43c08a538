/* attention_choice.c - see attention_choice.h. */
#include "kernels/attention_choice.h"

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
