/* dataloader.h - which sequences each rank reads for each micro-batch.
 *
 * The data is one stream of sequences (io/token_shards.h): position p of
 * epoch e is the sequence st_data_order_at(e, p) names. A step consumes G
 * = micro_batch * grad_accum * world consecutive positions starting at its
 * data position; rank r's micro-step k takes positions g = (k*world + r)*B
 * .. +B-1 of them, so ranks read disjoint parts and the stream (and the
 * step's loss) does not depend on the rank count.
 *
 * Sequential order (--shuffle off): a step that would run past the last
 * whole step of the epoch starts the next epoch at 0 instead (the rest is
 * skipped, as the single-file loader always did: one file reads exactly
 * the windows it read before). Shuffled: the stream runs on into the next
 * epoch, so every sequence is read exactly once per epoch and a step may
 * hold the end of one epoch and the start of the next. docs/data.md.
 */
#ifndef ST_DATALOADER_H
#define ST_DATALOADER_H

#include <stdint.h>

#include "io/token_shards.h"
#include "rank/train/data_order.h"

typedef struct {
  int64_t epoch;
  int64_t pos; /* sequences of the epoch before this one, 0 <= pos < N */
} st_data_pos;

/* Where a step that is due at `at` starts: at itself, or sequential order's
 * wrap to the next epoch when fewer than G sequences are left in this one
 * (N: sequences per epoch). */
st_data_pos st_data_step_start(st_data_pos at, int64_t G, int64_t N, int shuffle);
/* The position n sequences after at, carried into later epochs. */
st_data_pos st_data_advance(st_data_pos at, int64_t n, int64_t N);

/* Fill inp and targets ([B,T] int) for rank `rank`'s micro-step `micro` of
 * the step starting at `start`. Tokens >= vocab_size are an error naming the
 * file. scratch holds T+1 ints. ids (may be NULL) gets B (shard, sequence)
 * pairs as 2*B int64. 0, or -1 with st_error. */
int st_data_micro_batch(st_shard_set *set, st_data_order *ord, st_data_pos start, int micro,
                        int rank, int world, int B, int T, int vocab_size, int *inp, int *targets,
                        int *scratch, int64_t *ids);

#endif
