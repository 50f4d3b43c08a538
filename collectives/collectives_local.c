/* collectives_local.c - one rank's device collectives as copies on the
 * compute stream (see collectives_local.h). */
#include "collectives/collectives_local.h"

#include <cuda_runtime.h>

#include "kernels/cuda/timeline.h"
#include "util/error.h"

static int copy(const st_comm *c, void *dst, const void *src, size_t bytes, const char *what) {
  if (!bytes || dst == src) return 0;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0);
  if (e != cudaSuccess)
    return st_error_set("the one-rank %s of %zu bytes (a device copy) failed at step %lld: %s",
                        what, bytes, c->step, cudaGetErrorString(e));
  return 0;
}

static int tag_ok(int tag) {
  if (tag < 0 || tag >= ST_COMM_TAGS)
    return st_error_set("internal: asynchronous collective tag %d is out of range", tag);
  return 0;
}

/* Benchmarks' deferred calls end here: everything is on the compute stream. */
static int local_flush(st_comm *c) {
  cudaError_t e = cudaStreamSynchronize(0);
  if (e != cudaSuccess)
    return st_error_set("CUDA error in the one-rank collectives on rank %d: %s", c->rank,
                        cudaGetErrorString(e));
  return 0;
}

static int local_all_reduce_sum(st_comm *c, float *buf, size_t count) {
  (void)c, (void)buf, (void)count;
  return 0;
}

static int local_reduce_scatter_sum(st_comm *c, const float *send, float *recv, size_t count) {
  return copy(c, recv, send, count * sizeof(float), "reduce-scatter");
}

static int local_reduce_scatterv_sum(st_comm *c, const float *send, const size_t *counts,
                                     float *recv) {
  return copy(c, recv, send, counts[0] * sizeof(float), "reduce-scatter (bucket)");
}

static int local_reduce_scatterv_sum_start(st_comm *c, const float *send, const size_t *counts,
                                           float *recv, int tag, int background) {
  (void)background;
  if (tag_ok(tag)) return -1;
  st_timeline_mark("rs>", tag, 0);
  if (copy(c, recv, send, counts[0] * sizeof(float), "reduce-scatter (bucket)")) return -1;
  st_timeline_mark("rs<", tag, 0);
  return 0;
}

static int local_all_gatherv_start(st_comm *c, const void *send, const size_t *counts,
                                   void *recv, size_t elem_size, int tag) {
  if (tag_ok(tag)) return -1;
  st_timeline_mark("ag>", tag, 0);
  if (copy(c, recv, send, counts[0] * elem_size, "all-gather (uneven)")) return -1;
  st_timeline_mark("ag<", tag, 0);
  return 0;
}

static int local_wait(st_comm *c, int tag) {
  (void)c, (void)tag;
  return 0;
}

static int local_all_gather(st_comm *c, const void *send, void *recv, size_t count,
                            size_t elem_size) {
  st_timeline_mark("ag>", 0, 0);
  if (copy(c, recv, send, count * elem_size, "all-gather")) return -1;
  st_timeline_mark("ag<", 0, 0);
  return 0;
}

static int local_broadcast_buf(st_comm *c, void *buf, size_t bytes, int root) {
  (void)c, (void)buf, (void)bytes, (void)root;
  return 0;
}

void st_comm_local_install(st_comm *c) {
  c->flush = local_flush;
  c->all_reduce_sum = local_all_reduce_sum;
  c->reduce_scatter_sum = local_reduce_scatter_sum;
  c->reduce_scatterv_sum = local_reduce_scatterv_sum;
  c->reduce_scatterv_sum_start = local_reduce_scatterv_sum_start;
  c->all_gatherv_start = local_all_gatherv_start;
  c->wait = local_wait;
  c->all_gather = local_all_gather;
  c->broadcast_buf = local_broadcast_buf;
}
