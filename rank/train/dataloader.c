/* dataloader.c - deterministic, rank-count independent batch layout
 * (see dataloader.h). */
#include "rank/train/dataloader.h"

#include <string.h>

#include "util/error.h"

int64_t st_data_step_start(int64_t pos, int64_t step_tokens, int64_t ntokens) {
  return pos + step_tokens + 1 > ntokens ? 0 : pos;
}

int st_data_micro_batch(st_token_source *src, int64_t step_pos, int micro, int rank, int world,
                        int B, int T, int vocab_size, int *inp, int *targets, int *scratch) {
  int64_t first_seq = ((int64_t)micro * world + rank) * B;
  int64_t start = step_pos + first_seq * T, n = (int64_t)B * T + 1;
  if (st_tokens_read(src, start, n, scratch)) return -1;
  for (int64_t i = 0; i < n; i++) {
    if (scratch[i] < 0 || scratch[i] >= vocab_size) {
      st_error_code(ST_EXIT_DATA);
      return st_error_set("token %d at position %lld of %s is outside the model vocabulary "
                          "(%d); pass --vocab-size to match the tokenizer that wrote the file",
                          scratch[i], (long long)(start + i), st_tokens_path(src), vocab_size);
    }
  }
  /* Contiguous window: targets are the inputs shifted by one token. */
  memcpy(inp, scratch, (size_t)B * T * sizeof(int));
  memcpy(targets, scratch + 1, (size_t)B * T * sizeof(int));
  return 0;
}
