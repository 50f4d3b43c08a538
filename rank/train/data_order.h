/* data_order.h - the order an epoch visits the sequences of a shard set.
 *
 * Shuffled: epoch e visits the shards in a Fisher-Yates order drawn from
 * (seed, e), and the sequences inside each shard in a stateless Feistel
 * permutation keyed by (seed, e, shard): every sequence exactly once per
 * epoch, another order each epoch and seed, and no O(N) table (the
 * permutation is computed per index, cycle-walking a power-of-4 domain of
 * at most 4N). Sequential (--shuffle off): shards in the given order,
 * sequences in file order, the same every epoch. docs/data.md.
 */
#ifndef ST_DATA_ORDER_H
#define ST_DATA_ORDER_H

#include <stdint.h>

/* Index i (0 <= i < n) under the permutation of [0, n) keyed by key. */
uint64_t st_perm_index(uint64_t i, uint64_t n, uint64_t key);

/* order[0..n) = a permutation of 0..n-1 drawn from (seed, epoch). */
void st_shard_order(int n, uint64_t seed, int64_t epoch, int *order);

typedef struct {
  int n;             /* shards */
  int64_t *nseq;     /* sequences of each shard (copied) */
  int64_t total;     /* sum of nseq: sequences per epoch */
  int shuffle;
  uint64_t seed;
  int64_t epoch;     /* the epoch order and cum below are for (-1: none yet) */
  int *order;        /* shard visited j-th */
  int64_t *cum;      /* cum[j]: sequences before the j-th visited shard (n + 1) */
} st_data_order;

/* 0, or -1 with st_error (out of memory). */
int st_data_order_init(st_data_order *o, int n, const int64_t *nseq, uint64_t seed, int shuffle);
void st_data_order_free(st_data_order *o);
/* The sequence at position p (0 <= p < total) of epoch `epoch`: *shard and
 * *seq (its index inside that shard). O(log n) once the epoch's shard
 * order is made (O(n), on the first position of another epoch). */
void st_data_order_at(st_data_order *o, int64_t epoch, int64_t p, int *shard, int64_t *seq);

#endif
