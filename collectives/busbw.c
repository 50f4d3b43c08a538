/* busbw.c - one collective, one size: check, then time (see busbw.h). */
#include "collectives/busbw.h"

#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static const char *const k_names[ST_COLL_COUNT] = {"all-reduce", "reduce-scatter", "all-gather",
                                                   "broadcast"};

const char *st_coll_name(st_coll_op op) { return op < ST_COLL_COUNT ? k_names[op] : "?"; }

int st_coll_parse(const char *name) {
  for (int i = 0; i < ST_COLL_COUNT; i++)
    if (strcmp(name, k_names[i]) == 0) return i;
  return -1;
}

double st_busbw_factor(st_coll_op op, int n) {
  if (n < 1) n = 1;
  switch (op) {
  case ST_COLL_ALL_REDUCE: return 2.0 * (n - 1) / n;
  case ST_COLL_REDUCE_SCATTER:
  case ST_COLL_ALL_GATHER: return (double)(n - 1) / n;
  default: return 1.0;
  }
}

size_t st_coll_buffer_bytes(size_t max_bytes) { return 2 * (max_bytes + 64); }

/* Pattern values: small integers, so sums over up to thousands of ranks are
 * exact in fp32 and the check can demand equality. */
static float pattern(int rank, size_t i) { return (float)((rank + 1) * (int)(i % 13 + 1)); }

#define CHUNK ((size_t)1 << 22) /* floats staged through the host at a time */

/* dst[0, n) in backend memory = pattern(rank, first + i). */
static int fill(const st_ops *ops, float *dst, size_t n, int rank, size_t first) {
  float *h = malloc(CHUNK * sizeof(float));
  if (!h) return st_error_set("out of host memory for the benchmark pattern");
  for (size_t off = 0; off < n; off += CHUNK) {
    size_t k = n - off < CHUNK ? n - off : CHUNK;
    for (size_t i = 0; i < k; i++) h[i] = pattern(rank, first + off + i);
    ops->to_device(dst + off, h, k * sizeof(float));
  }
  free(h);
  return 0;
}

/* ST_FAULT_BENCH_CORRUPT=RANK: that rank's first result element is changed
 * before the check, so the tests can see a wrong collective caught. */
static void fault_corrupt(const st_ops *ops, float *result, int rank) {
  const char *f = getenv("ST_FAULT_BENCH_CORRUPT");
  if (!f || atoi(f) != rank) return;
  const float bad = -12345.0f;
  ops->to_device(result, &bad, sizeof bad);
}

/* Compare src[0, n) with expected(i) chunk by chunk; 1 when all equal. */
typedef float (*expect_fn)(size_t i, const void *ctx);
static int matches(const st_ops *ops, const float *src, size_t n, expect_fn want,
                   const void *ctx) {
  float *h = malloc(CHUNK * sizeof(float));
  if (!h) return 0;
  int ok = 1;
  for (size_t off = 0; off < n && ok; off += CHUNK) {
    size_t k = n - off < CHUNK ? n - off : CHUNK;
    ops->to_host(h, src + off, k * sizeof(float));
    for (size_t i = 0; i < k && ok; i++) ok = h[i] == want(off + i, ctx);
  }
  free(h);
  return ok;
}

typedef struct {
  int n, rank;
  size_t count; /* per-rank block (reduce-scatter output / all-gather input) */
} ectx;

static float want_sum(size_t i, const void *p) { /* all-reduce: sum over ranks */
  const ectx *e = p;
  return (float)(e->n * (e->n + 1) / 2) * (float)(i % 13 + 1);
}
static float want_block(size_t i, const void *p) { /* reduce-scatter: block `rank` of the sum */
  const ectx *e = p;
  return (float)(e->n * (e->n + 1) / 2) * (float)((e->rank * e->count + i) % 13 + 1);
}
static float want_gather(size_t i, const void *p) { /* all-gather: block q from rank q */
  const ectx *e = p;
  return pattern((int)(i / e->count), i % e->count);
}

static int call(st_comm *c, st_coll_op op, void *send, void *recv, size_t count) {
  switch (op) {
  case ST_COLL_ALL_REDUCE: return c->all_reduce_sum(c, send, count);
  case ST_COLL_REDUCE_SCATTER: return c->reduce_scatter_sum(c, send, recv, count);
  case ST_COLL_ALL_GATHER: return c->all_gather(c, send, recv, count, sizeof(float));
  default: return c->broadcast_buf(c, send, count, 0);
  }
}

int st_coll_measure(st_comm *c, const st_ops *ops, void *send, void *recv, st_coll_op op,
                    size_t bytes, int warmup, int iters, int pipelined, st_coll_result *out) {
  const int n = c->world;
  memset(out, 0, sizeof *out);
  out->op = op;
  size_t count;
  if (op == ST_COLL_BROADCAST) count = bytes;
  else if (op == ST_COLL_ALL_REDUCE) count = bytes / sizeof(float);
  else count = bytes / sizeof(float) / (size_t)n; /* per-rank block */
  if (count == 0) return 0;
  out->count = count;
  out->bytes = op == ST_COLL_BROADCAST ? count
               : op == ST_COLL_ALL_REDUCE ? count * sizeof(float)
                                          : count * (size_t)n * sizeof(float);

  /* the checked call */
  ectx e = {n, c->rank, count};
  int ok = 1, rc = 0;
  if (op == ST_COLL_BROADCAST) {
    size_t nf = (count + 3) / 4;
    if (fill(ops, send, nf, c->rank == 0 ? 0 : 7, 0)) return -1;
    rc = call(c, op, send, recv, count);
    if (!rc) { /* every rank must now hold root 0's bytes */
      /* r holds root 0's pattern as floats; h the first count bytes that
       * arrived, compared byte for byte. */
      unsigned char *h = malloc(count);
      float *r = malloc(nf * sizeof *r);
      if (!h || !r) ok = 0;
      else {
        for (size_t i = 0; i < nf; i++) r[i] = pattern(0, i);
        ops->to_host(h, send, count);
        ok = memcmp(h, r, count) == 0;
      }
      free(h);
      free(r);
    }
  } else if (op == ST_COLL_ALL_REDUCE) {
    if (fill(ops, send, count, c->rank, 0)) return -1;
    rc = call(c, op, send, recv, count);
    if (!rc) fault_corrupt(ops, send, c->rank);
    if (!rc) ok = matches(ops, send, count, want_sum, &e);
  } else if (op == ST_COLL_REDUCE_SCATTER) {
    if (fill(ops, send, count * (size_t)n, c->rank, 0)) return -1;
    rc = call(c, op, send, recv, count);
    if (!rc) ok = matches(ops, recv, count, want_block, &e);
  } else {
    if (fill(ops, send, count, c->rank, 0)) return -1;
    rc = call(c, op, send, recv, count);
    if (!rc) ok = matches(ops, recv, count * (size_t)n, want_gather, &e);
  }
  if (rc) return -1;
  int bad = !ok; /* any rank's mismatch fails the size for all */
  if (c->all_reduce_int_max(c, &bad, 1)) return -1;

  /* pipelined: calls enqueued back to back and one wait at the end, as
   * nccl-tests and torch_busbw.py time them; blocking: each call waited for
   * by the host, as the trainer's synchronous calls are */
  c->defer_wait = pipelined;
  int rc2 = 0;
  for (int i = 0; i < warmup && !rc2; i++) rc2 = call(c, op, send, recv, count);
  if (!rc2) rc2 = c->flush(c);
  c->barrier(c);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters && !rc2; i++) rc2 = call(c, op, send, recv, count);
  if (!rc2) rc2 = c->flush(c);
  c->defer_wait = 0;
  if (rc2) return -1;
  ops->synchronize();
  double t = (MPI_Wtime() - t0) / (iters > 0 ? iters : 1);
  /* the slowest rank's time is the collective's (host reduction over MPI:
   * every st_comm spans MPI_COMM_WORLD) */
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  out->iters = iters;
  out->time_s = t;
  out->algbw = out->time_s > 0 ? (double)out->bytes / out->time_s : 0;
  out->busbw = out->algbw * st_busbw_factor(op, n);
  out->correct = !bad;
  return 0;
}
