/* partition.c - flat-vector ZeRO partition (see partition.h). */
#include "rank/optim/partition.h"

void st_partition_make(int64_t total, int rank, int world, st_partition *p) {
  p->rank = rank;
  p->world = world;
  p->total = total;
  p->padded = (total + world - 1) / world * world;
  p->shard = p->padded / world;
  st_partition_range(p, rank, &p->begin, &p->end);
}

void st_partition_range(const st_partition *p, int r, int64_t *begin, int64_t *end) {
  int64_t b = (int64_t)r * p->shard, e = b + p->shard;
  if (b > p->total) b = p->total;
  if (e > p->total) e = p->total;
  *begin = b;
  *end = e;
}
