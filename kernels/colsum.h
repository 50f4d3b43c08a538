/* colsum.h - the sizing rules the CUDA kernels and the memory planner share,
 * in plain C so rank/memory/memory_plan.c can include them: how rows are cut into
 * chunks for the fixed-order column sums (layernorm dw/db, matmul dbias),
 * and how the backend's scratch buffer grows. */
#ifndef ST_COLSUM_H
#define ST_COLSUM_H

#include <stdint.h>

/* Rows are cut into chunks that depend only on N, each chunk's per-column
 * partial is written to scratch, and a second pass adds the partials in
 * chunk order: at most 1024 chunks of at least 128 rows. */
static inline int st_colsum_rows_per_chunk(int N) {
  int r = (N + 1023) / 1024;
  if (r < 128) r = 128;
  return r;
}
static inline int st_colsum_chunks(int N) {
  int r = st_colsum_rows_per_chunk(N);
  return (N + r - 1) / r;
}

/* The scratch buffer's size after a request of req bytes when it holds cur:
 * unchanged when it fits, else doubled (at least req, at least 1 MiB). */
static inline uint64_t st_scratch_grow(uint64_t cur, uint64_t req) {
  if (req <= cur) return cur;
  uint64_t want = cur * 2 > req ? cur * 2 : req;
  return want < ((uint64_t)1 << 20) ? (uint64_t)1 << 20 : want;
}

#endif
