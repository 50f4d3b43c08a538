/* nccl_buffsize.c - see nccl_buffsize.h. */
#include "rank/memory/nccl_buffsize.h"

#include <stdlib.h>

#include "util/envparse.h"
#include "util/error.h"

int st_nccl_buffsize_env(long long *bytes) {
  *bytes = 0;
  const char *s = getenv("NCCL_BUFFSIZE");
  if (!s) return 0;
  long long v;
  if (st_envparse_uint(s, ST_NCCL_BUFFSIZE_MAX, &v) || v == 0)
    return st_error_setc(ST_EXIT_USAGE, "NCCL_BUFFSIZE='%.40s' is not a whole number of bytes "
                         "from 1 to %lld written in digits (e.g. 4194304 for 4 MiB; no units, "
                         "no fraction); fix or unset it", s, ST_NCCL_BUFFSIZE_MAX);
  *bytes = v;
  return 0;
}

int st_nccl_one_rank_env(int *on) {
  const char *s = getenv("ST_NCCL_ONE_RANK");
  *on = st_envparse_switch(s);
  if (*on >= 0) return 0;
  *on = 0;
  return st_error_setc(ST_EXIT_USAGE, "ST_NCCL_ONE_RANK='%.40s': use 1 (one rank makes an NCCL "
                       "communicator too) or 0 (it does not: the default)", s);
}
