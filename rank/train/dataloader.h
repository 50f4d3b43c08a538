/* dataloader.h - which tokens each rank reads for each micro-batch.
 *
 * A step consumes a contiguous window of G*T+1 tokens of the train split,
 * G = micro_batch * grad_accum * world sequences, starting at the data
 * position. Sequence g of the window is tokens [pos + g*T, pos + g*T + T]
 * (inputs and next-token targets). Rank r's micro-step k takes sequences
 * g = (k*world + r)*B .. +B-1, so ranks read disjoint parts and the step's
 * loss does not depend on the rank count. When the window would run past
 * the end of the split, the position wraps to 0 (a new epoch).
 */
#ifndef ST_DATALOADER_H
#define ST_DATALOADER_H

#include <stdint.h>

#include "io/tokens.h"

/* The position a step starting at `pos` actually reads from (wrapping). */
int64_t st_data_step_start(int64_t pos, int64_t step_tokens, int64_t ntokens);

/* Fill inp and targets ([B,T] int) for rank `rank`'s micro-step `micro` of
 * the step whose window starts at step_pos. Tokens >= vocab_size are an
 * error naming the file. scratch holds B*T+1 ints. 0, or -1 with st_error. */
int st_data_micro_batch(st_token_source *src, int64_t step_pos, int micro, int rank, int world,
                        int B, int T, int vocab_size, int *inp, int *targets, int *scratch);

#endif
