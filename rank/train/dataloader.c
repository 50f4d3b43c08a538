/* dataloader.c - deterministic, rank-count independent batch layout
 * (see dataloader.h). */
#include "rank/train/dataloader.h"

#include <string.h>

#include "util/error.h"

st_data_pos st_data_step_start(st_data_pos at, int64_t G, int64_t N, int shuffle) {
  if (!shuffle && at.pos + G > N) {
    at.epoch++;
    at.pos = 0;
  }
  return at;
}

st_data_pos st_data_advance(st_data_pos at, int64_t n, int64_t N) {
  at.pos += n;
  if (N > 0 && at.pos >= N) {
    at.epoch += at.pos / N;
    at.pos %= N;
  }
  return at;
}

int st_data_micro_batch(st_shard_set *set, st_data_order *ord, st_data_pos start, int micro,
                        int rank, int world, int B, int T, int vocab_size, int *inp, int *targets,
                        int *scratch, int64_t *ids) {
  const int64_t first = ((int64_t)micro * world + rank) * B;
  for (int b = 0; b < B; b++) {
    st_data_pos at = st_data_advance(start, first + b, ord->total);
    int shard;
    int64_t seq;
    st_data_order_at(ord, at.epoch, at.pos, &shard, &seq);
    if (ids) {
      ids[2 * b] = shard;
      ids[2 * b + 1] = seq;
    }
    if (st_shards_read_seq(set, shard, seq, T, scratch)) return -1;
    for (int i = 0; i <= T; i++) {
      if (scratch[i] < 0 || scratch[i] >= vocab_size) {
        st_error_code(ST_EXIT_DATA);
        return st_error_set("token %d at position %lld of %s is outside the model vocabulary "
                            "(%d); pass --vocab-size to match the tokenizer that wrote the file",
                            scratch[i], (long long)(seq * T + i), set->s[shard].path, vocab_size);
      }
    }
    /* One window of T+1 tokens: targets are the inputs shifted by one. */
    memcpy(inp + (size_t)b * T, scratch, (size_t)T * sizeof(int));
    memcpy(targets + (size_t)b * T, scratch + 1, (size_t)T * sizeof(int));
  }
  return 0;
}
