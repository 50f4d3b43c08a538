/* data_feed.h - a rank's training micro-batches, read one ahead.
 *
 * A prefetch thread reads the next micro-batch's tokens (the next micro-step
 * of this step, or the first of the next step) while this one computes, into
 * its own buffer; st_data_feed_get copies it out, or reads in the caller's
 * thread when the batch asked for is not the one prefetched (the first, or
 * after a resume). Only one thread reads the shard set at a time. The
 * thread is off under ST_DATA_PREFETCH=0, and with HDF5 shards when the
 * HDF5 library is not thread-safe. ST_DATA_TRACE=DIR appends the (epoch,
 * shard, sequence) of every training sequence this rank consumes to
 * DIR/rank_R.txt, a line per sequence (tests). docs/data.md.
 */
#ifndef ST_DATA_FEED_H
#define ST_DATA_FEED_H

#include <stdint.h>

#include "rank/train/dataloader.h"

typedef struct st_data_feed st_data_feed;

/* Borrow set (kept open by the caller, read only through the feed from now
 * on); order settings copied. NULL with st_error (out of memory, thread). */
st_data_feed *st_data_feed_open(st_shard_set *set, uint64_t seed, int shuffle, int B, int T,
                                int rank, int world, int vocab_size);
/* inp and targets ([B,T]) of micro-step `micro` of the step starting at
 * `start`; *wait_s gets the seconds spent waiting for or reading them. 0, or
 * -1 with st_error naming the file. */
int st_data_feed_get(st_data_feed *f, st_data_pos start, int micro, int step, int *inp,
                     int *targets, double *wait_s);
/* Start reading that micro-batch in the background (no-op without the thread). */
void st_data_feed_post(st_data_feed *f, st_data_pos start, int micro);
/* 1 when the prefetch thread runs. */
int st_data_feed_threaded(const st_data_feed *f);
/* Stop the thread (waits for its read), free everything; NULL is fine. */
void st_data_feed_close(st_data_feed *f);

#endif
