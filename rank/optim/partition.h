/* partition.h - ZeRO partition of the flat parameter vector across ranks.
 *
 * The flat vector of `total` elements is padded to `padded` = a multiple of
 * world, and rank r owns [r*shard, (r+1)*shard) with shard = padded/world.
 * The padding lets any tensor size divide by any rank count: sizes are padded,
 * never refused. Only [begin, end) (clipped to total) holds real elements.
 */
#ifndef ST_PARTITION_H
#define ST_PARTITION_H

#include <stdint.h>

typedef struct {
  int rank, world;
  int64_t total;   /* real elements */
  int64_t padded;  /* total rounded up to a multiple of world */
  int64_t shard;   /* padded / world */
  int64_t begin;   /* first real element owned by this rank */
  int64_t end;     /* one past the last real element owned (<= total) */
} st_partition;

void st_partition_make(int64_t total, int rank, int world, st_partition *p);
/* The range owned by another rank r, clipped to total. */
void st_partition_range(const st_partition *p, int r, int64_t *begin, int64_t *end);

#endif
