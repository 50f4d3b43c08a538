/* data_order.c - seeded epoch orders (see data_order.h). */
#include "rank/train/data_order.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* splitmix64's finaliser: a bijective 64-bit mix. */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A balanced Feistel network over 2*half bits: a bijection for any round
 * function, so cycle-walking it until the value falls below n permutes
 * [0, n). */
static uint64_t feistel(uint64_t x, int half, uint64_t key) {
  const uint64_t mask = (1ull << half) - 1;
  uint64_t l = x >> half, r = x & mask;
  for (uint64_t round = 0; round < 4; round++) {
    uint64_t f = mix64(r ^ mix64(key + round)) & mask;
    uint64_t t = l ^ f;
    l = r;
    r = t;
  }
  return l << half | r;
}

uint64_t st_perm_index(uint64_t i, uint64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = 0;
  while (bits < 62 && (1ull << bits) < n) bits++;
  const int half = (bits + 1) / 2 > 0 ? (bits + 1) / 2 : 1;
  uint64_t x = i;
  do x = feistel(x, half, key); while (x >= n); /* domain < 4n: a few walks on average */
  return x;
}

void st_shard_order(int n, uint64_t seed, int64_t epoch, int *order) {
  uint64_t s = mix64(seed ^ mix64((uint64_t)epoch ^ 0x5eedf00dull));
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = n - 1; i > 0; i--) {
    s = mix64(s);
    int j = (int)(s % (uint64_t)(i + 1)); /* bias below 2^-40 for any shard count */
    int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

int st_data_order_init(st_data_order *o, int n, const int64_t *nseq, uint64_t seed, int shuffle) {
  memset(o, 0, sizeof *o);
  o->nseq = malloc((size_t)(n > 0 ? n : 1) * sizeof *o->nseq);
  o->order = malloc((size_t)(n > 0 ? n : 1) * sizeof *o->order);
  o->cum = malloc((size_t)(n + 1) * sizeof *o->cum);
  if (!o->nseq || !o->order || !o->cum) {
    st_data_order_free(o);
    return st_error_set("out of memory for the data order of %d shards", n);
  }
  o->n = n;
  o->seed = seed;
  o->shuffle = shuffle;
  o->epoch = -1;
  for (int i = 0; i < n; i++) {
    o->nseq[i] = nseq[i];
    o->total += nseq[i];
  }
  return 0;
}

void st_data_order_free(st_data_order *o) {
  free(o->nseq);
  free(o->order);
  free(o->cum);
  memset(o, 0, sizeof *o);
}

static void make_epoch(st_data_order *o, int64_t epoch) {
  if (o->shuffle) st_shard_order(o->n, o->seed, epoch, o->order);
  else
    for (int i = 0; i < o->n; i++) o->order[i] = i;
  o->cum[0] = 0;
  for (int j = 0; j < o->n; j++) o->cum[j + 1] = o->cum[j] + o->nseq[o->order[j]];
  o->epoch = epoch;
}

void st_data_order_at(st_data_order *o, int64_t epoch, int64_t p, int *shard, int64_t *seq) {
  if (o->epoch != epoch && (o->shuffle || o->epoch < 0)) make_epoch(o, epoch);
  int lo = 0, hi = o->n - 1; /* the last j with cum[j] <= p */
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (o->cum[mid] <= p) lo = mid;
    else hi = mid - 1;
  }
  const int s = o->order[lo];
  const int64_t i = p - o->cum[lo];
  *shard = s;
  *seq = o->shuffle ? (int64_t)st_perm_index((uint64_t)i, (uint64_t)o->nseq[s],
                                             mix64(o->seed ^ mix64((uint64_t)epoch * 0x100000001b3ull +
                                                                   (uint64_t)s)))
                    : i;
}
