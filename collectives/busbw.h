/* busbw.h - timing and checking one collective at one size, with the
 * bandwidth definitions of nccl-tests (doc/PERFORMANCE.md):
 *   algbw = S / t, S the total array size in bytes (all-reduce and broadcast:
 *           the buffer; reduce-scatter: the input of all ranks together, n x
 *           the output; all-gather: the output);
 *   busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for reduce-scatter and
 *           all-gather, x 1 for broadcast,
 * so busbw is comparable with the link bandwidth whatever n is.
 */
#ifndef ST_BUSBW_H
#define ST_BUSBW_H

#include <stddef.h>

#include "collectives/collectives.h"
#include "kernels/ops.h"

typedef enum {
  ST_COLL_ALL_REDUCE = 0,
  ST_COLL_REDUCE_SCATTER = 1,
  ST_COLL_ALL_GATHER = 2,
  ST_COLL_BROADCAST = 3,
  ST_COLL_COUNT = 4
} st_coll_op;

/* "all-reduce", "reduce-scatter", "all-gather", "broadcast". */
const char *st_coll_name(st_coll_op op);
/* The op named so, or -1. */
int st_coll_parse(const char *name);
/* busbw / algbw for op on n ranks (see above). */
double st_busbw_factor(st_coll_op op, int n);

typedef struct {
  st_coll_op op;
  size_t bytes;   /* S: total array size measured (rounded down to what n ranks can split) */
  size_t count;   /* fp32 elements per rank's call (broadcast: bytes) */
  int iters;
  double time_s;  /* mean seconds per call, slowest rank */
  double algbw, busbw; /* bytes per second */
  int correct;    /* 1 when every rank's result matched the expected values */
} st_coll_result;

/* Bytes of device/host buffer st_coll_measure needs for sizes up to
 * max_bytes: a send and a receive buffer. */
size_t st_coll_buffer_bytes(size_t max_bytes);

/* Time `op` over about `bytes` (rounded down so n ranks split it evenly in
 * fp32 elements; a size too small for that gives out->bytes = 0 and no
 * call) on c, buffers send/recv (each st_coll_buffer_bytes/2) in ops'
 * memory: one checked call on a known pattern (results compared on the
 * host), then `warmup` untimed and `iters` timed calls between barriers:
 * pipelined (enqueued back to back, one wait at the end: nccl-tests' way)
 * or not (the host waits for each call, as the trainer does).
 * Collective over c. 0, or -1 with st_error when a collective failed. */
int st_coll_measure(st_comm *c, const st_ops *ops, void *send, void *recv, st_coll_op op,
                    size_t bytes, int warmup, int iters, int pipelined, st_coll_result *out);

#endif
