/* collectives_nccl.c - NCCL collectives with an init/collective watchdog
 * (see collectives_nccl.h). */
#define _XOPEN_SOURCE 700
#include "collectives/collectives_nccl.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/collectives_local.h"
#include "kernels/cuda/timeline.h"
#include "rank/memory/nccl_buffsize.h"
#include "util/error.h"

/* The MPI communicator comes first: the MPI implementation's host operations
 * (broadcast, barrier, scalar reductions) read c->impl as an MPI_Comm*, and
 * a pointer to a struct is a pointer to its first member. */
typedef struct {
  MPI_Comm mpi;
  ncclComm_t nccl;
  /* Split off nccl with fewer CTAs, for the reductions that run while
   * backward computes (reduce_scatterv_sum_start's background): each CTA it
   * holds is an SM the GEMMs lose. NULL when not asked for. */
  ncclComm_t bg;
  /* Non-blocking stream: collectives on it do not stall compute issued
   * later on the legacy default stream. Each collective is ordered after the
   * compute issued before it by `ready` (recorded on the default stream);
   * a started one records done[tag] for wait. */
  cudaStream_t stream;
  cudaEvent_t ready, done[ST_COMM_TAGS];
  int pending[ST_COMM_TAGS];
  const char *pending_what[ST_COMM_TAGS];
  size_t pending_count[ST_COMM_TAGS];
  double timeout_s;
  char describe[512];
} nccl_impl;

static nccl_impl *impl_of(st_comm *c) { return (nccl_impl *)c->impl; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
  ncclComm_t comm[2];
  atomic_int done;
} abort_job;

static void *abort_comms(void *arg) {
  abort_job *j = arg;
  for (int i = 0; i < 2; i++)
    if (j->comm[i]) ncclCommAbort(j->comm[i]);
  atomic_store(&j->done, 1);
  return NULL;
}

/* Abort both communicators, waiting at most ST_NCCL_ABORT_S for NCCL: the
 * process exits right after (MPI_Abort), and an abort that itself waits on
 * a stalled peer must not turn a detected hang back into a hang. */
#define ST_NCCL_ABORT_S 5.0
static void abort_all(st_comm *c) {
  nccl_impl *n = impl_of(c);
  static abort_job job; /* outlives a detached thread */
  job.comm[0] = n->bg;
  job.comm[1] = n->nccl;
  atomic_store(&job.done, 0);
  n->bg = n->nccl = NULL;
  pthread_t t;
  if (pthread_create(&t, NULL, abort_comms, &job) != 0) {
    abort_comms(&job);
    return;
  }
  const double t0 = now_s();
  while (!atomic_load(&job.done) && now_s() - t0 < ST_NCCL_ABORT_S) {
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
  if (atomic_load(&job.done)) {
    pthread_join(t, NULL);
  } else {
    pthread_detach(t);
    fprintf(stderr, "shardtrain: warning (rank %d): ncclCommAbort did not return within %.0f s; "
            "exiting without waiting for it\n", c->rank, ST_NCCL_ABORT_S);
  }
}

/* Wait until the communicator's pending work (init, or a collective on the
 * stream, or up to `event` when it is not NULL) completes; abort it past the
 * timeout. */
static int wait_done_on(st_comm *c, const char *what, size_t count, int check_stream,
                        cudaEvent_t event) {
  nccl_impl *n = impl_of(c);
  double t0 = now_s();
  for (;;) {
    ncclResult_t async = ncclSuccess, async_bg = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(n->nccl, &async);
    if (r == ncclSuccess && n->bg) r = ncclCommGetAsyncError(n->bg, &async_bg);
    if (r == ncclSuccess && async == ncclSuccess) async = async_bg;
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      ncclResult_t e = r != ncclSuccess ? r : async;
      abort_all(c);
      return st_error_set("NCCL %s of %zu elements failed on rank %d at step %lld: %s", what,
                          count, c->rank, c->step, ncclGetErrorString(e));
    }
    int done = async == ncclSuccess;
    if (done && check_stream) {
      cudaError_t q = event ? cudaEventQuery(event) : cudaStreamQuery(n->stream);
      if (q != cudaSuccess && q != cudaErrorNotReady)
        return st_error_set("CUDA error during NCCL %s on rank %d: %s", what, c->rank,
                            cudaGetErrorString(q));
      done = q == cudaSuccess;
    }
    if (done) return 0;
    if (n->timeout_s > 0 && now_s() - t0 > n->timeout_s) {
      abort_all(c);
      return st_error_set("NCCL %s of %zu elements did not finish within %.0f s on rank %d at "
                          "step %lld; the communicator was aborted. A rank may have died or "
                          "hung, or the network between nodes is blocked: check every rank's "
                          "log and NCCL_SOCKET_IFNAME / NCCL_IB_HCA (raise the limit with "
                          "--nccl-timeout)", what, count, n->timeout_s, c->rank, c->step);
    }
    /* Spin for the first 20 ms (a sleep adds its granularity, 50-100 us on
     * Linux, to every collective; a rank's host has nothing else to do
     * meanwhile), then poll every 50 us. */
    if (now_s() - t0 > 2e-2) {
      struct timespec pause = {0, 50000};
      nanosleep(&pause, NULL);
    }
  }
}

static int wait_done(st_comm *c, const char *what, size_t count, int check_stream) {
  return wait_done_on(c, what, count, check_stream, NULL);
}

/* Order the next collective after all compute issued so far. */
static int after_compute(st_comm *c) {
  nccl_impl *n = impl_of(c);
  if (cudaEventRecord(n->ready, 0) != cudaSuccess ||
      cudaStreamWaitEvent(n->stream, n->ready, 0) != cudaSuccess)
    return st_error_set("CUDA event error before an NCCL collective on rank %d", c->rank);
  return 0;
}

static int issued(st_comm *c, ncclResult_t r, const char *what, size_t count) {
  if (r != ncclSuccess && r != ncclInProgress)
    return st_error_set("NCCL %s of %zu elements failed on rank %d at step %lld: %s", what,
                        count, c->rank, c->step, ncclGetErrorString(r));
  /* deferred: wait only for the enqueue (a non-blocking communicator may
   * still be issuing it), not for the stream */
  return wait_done(c, what, count, !c->defer_wait);
}

static int nccl_flush(st_comm *c) { return wait_done(c, "queued collectives", 0, 1); }

static int nccl_all_reduce_sum(st_comm *c, float *buf, size_t count) {
  nccl_impl *n = impl_of(c);
  if (after_compute(c)) return -1;
  return issued(c, ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, n->nccl, n->stream),
                "all-reduce", count);
}

static int nccl_reduce_scatter_sum(st_comm *c, const float *send, float *recv, size_t count) {
  nccl_impl *n = impl_of(c);
  if (after_compute(c)) return -1;
  return issued(c, ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, n->nccl, n->stream),
                "reduce-scatter", count);
}

/* NCCL has no uneven reduce-scatter: one reduce per owner, grouped so they
 * launch as one operation. Issues without waiting. */
static ncclResult_t issue_scatterv(st_comm *c, const float *send, const size_t *counts,
                                   float *recv, int background) {
  nccl_impl *n = impl_of(c);
  ncclComm_t comm = background && n->bg ? n->bg : n->nccl;
  size_t off = 0;
  ncclResult_t r = ncclGroupStart();
  for (int k = 0; k < c->world && (r == ncclSuccess || r == ncclInProgress); k++) {
    if (counts[k]) r = ncclReduce(send + off, recv, counts[k], ncclFloat, ncclSum, k, comm,
                                  n->stream);
    off += counts[k];
  }
  ncclResult_t e = ncclGroupEnd();
  return r == ncclSuccess || r == ncclInProgress ? e : r;
}

static size_t total_of(const st_comm *c, const size_t *counts) {
  size_t t = 0;
  for (int k = 0; k < c->world; k++) t += counts[k];
  return t;
}

static int nccl_reduce_scatterv_sum(st_comm *c, const float *send, const size_t *counts,
                                    float *recv) {
  if (after_compute(c)) return -1;
  return issued(c, issue_scatterv(c, send, counts, recv, 0), "reduce-scatter (bucket)",
                total_of(c, counts));
}

static int nccl_reduce_scatterv_sum_start(st_comm *c, const float *send, const size_t *counts,
                                          float *recv, int tag, int background) {
  nccl_impl *n = impl_of(c);
  if (tag < 0 || tag >= ST_COMM_TAGS || n->pending[tag])
    return st_error_set("internal: asynchronous collective tag %d is out of range or busy", tag);
  const size_t total = total_of(c, counts);
  if (after_compute(c)) return -1;
  st_timeline_mark("rs>", tag, n->stream);
  ncclResult_t r = issue_scatterv(c, send, counts, recv, background);
  if (r != ncclSuccess && r != ncclInProgress)
    return st_error_set("NCCL reduce-scatter (bucket) of %zu elements failed on rank %d at "
                        "step %lld: %s", total, c->rank, c->step, ncclGetErrorString(r));
  /* A non-blocking communicator may still be enqueuing the group: the event
   * must follow the collective on the stream, so let the enqueue finish. */
  if (r == ncclInProgress && wait_done_on(c, "reduce-scatter (bucket)", total, 0, NULL))
    return -1;
  st_timeline_mark("rs<", tag, n->stream);
  if (cudaEventRecord(n->done[tag], n->stream) != cudaSuccess)
    return st_error_set("CUDA event error after an NCCL collective on rank %d", c->rank);
  n->pending[tag] = 1;
  n->pending_what[tag] = "reduce-scatter (bucket)";
  n->pending_count[tag] = total;
  return 0;
}

/* NCCL has no uneven all-gather: each rank with a nonzero count broadcasts
 * its piece into its place in recv, grouped so they launch as one
 * operation, then done[tag] is recorded as for the reductions. */
static int nccl_all_gatherv_start(st_comm *c, const void *send, const size_t *counts, void *recv,
                                  size_t elem_size, int tag) {
  nccl_impl *n = impl_of(c);
  if (tag < 0 || tag >= ST_COMM_TAGS || n->pending[tag])
    return st_error_set("internal: asynchronous collective tag %d is out of range or busy", tag);
  const size_t total = total_of(c, counts);
  ncclDataType_t t = elem_size == 4 ? ncclFloat : ncclBfloat16; /* bits only */
  if (after_compute(c)) return -1;
  st_timeline_mark("ag>", tag, n->stream);
  size_t off = 0;
  ncclResult_t r = ncclGroupStart();
  for (int k = 0; k < c->world && (r == ncclSuccess || r == ncclInProgress); k++) {
    if (counts[k])
      r = ncclBroadcast(send, (char *)recv + off * elem_size, counts[k], t,
                        k, n->nccl, n->stream);
    off += counts[k];
  }
  ncclResult_t e = ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) r = e;
  if (r != ncclSuccess && r != ncclInProgress)
    return st_error_set("NCCL all-gather (uneven) of %zu elements failed on rank %d at step "
                        "%lld: %s", total, c->rank, c->step, ncclGetErrorString(r));
  if (r == ncclInProgress && wait_done_on(c, "all-gather (uneven)", total, 0, NULL)) return -1;
  st_timeline_mark("ag<", tag, n->stream);
  if (cudaEventRecord(n->done[tag], n->stream) != cudaSuccess)
    return st_error_set("CUDA event error after an NCCL collective on rank %d", c->rank);
  n->pending[tag] = 1;
  n->pending_what[tag] = "all-gather (uneven)";
  n->pending_count[tag] = total;
  return 0;
}

static int nccl_wait(st_comm *c, int tag) {
  nccl_impl *n = impl_of(c);
  if (tag < 0 || tag >= ST_COMM_TAGS || !n->pending[tag]) return 0;
  n->pending[tag] = 0;
  return wait_done_on(c, n->pending_what[tag], n->pending_count[tag], 1, n->done[tag]);
}

static int nccl_broadcast_buf(st_comm *c, void *buf, size_t bytes, int root) {
  nccl_impl *n = impl_of(c);
  if (after_compute(c)) return -1;
  return issued(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->nccl, n->stream),
                "broadcast", bytes);
}

static int nccl_all_gather(st_comm *c, const void *send, void *recv, size_t count,
                           size_t elem_size) {
  nccl_impl *n = impl_of(c);
  /* A gather moves bits: any 2-byte type serves bf16 and fp16 alike. */
  ncclDataType_t t = elem_size == 4 ? ncclFloat : ncclBfloat16;
  if (after_compute(c)) return -1;
  st_timeline_mark("ag>", 0, n->stream);
  ncclResult_t r = ncclAllGather(send, recv, count, t, n->nccl, n->stream);
  if (st_timeline_enabled() && r == ncclInProgress && wait_done(c, "all-gather", count, 0))
    return -1; /* the mark must follow the enqueued gather */
  st_timeline_mark("ag<", 0, n->stream);
  return issued(c, r, "all-gather", count);
}

/* NCCL reads its buffer settings from the environment at init: set ours
 * only where the user has not, so an explicit NCCL_BUFFSIZE always wins. */
static void set_env_default(const char *name, long long v) {
  if (v <= 0 || getenv(name)) return;
  char buf[32];
  snprintf(buf, sizeof buf, "%lld", v);
  setenv(name, buf, 0);
}

int st_comm_nccl_init(st_comm *c, const st_nccl_options *o) {
  /* Before NCCL reads it: a value it and the memory plan would read
   * differently (or not at all) is refused, on every rank (exit 2). */
  long long user_bs;
  if (st_nccl_buffsize_env(&user_bs)) return -1;
  /* Start from the MPI implementation (host operations, rank, world), then
   * move its communicator into our state and replace the device collectives. */
  if (st_comm_mpi_init(c)) return -1;
  nccl_impl *n = calloc(1, sizeof *n);
  if (!n) return st_error_set("out of host memory");
  n->mpi = *(MPI_Comm *)c->impl;
  free(c->impl);
  c->impl = n;
  c->backend = "nccl";
  c->step = 0;
  n->timeout_s = o->timeout_s;
  if (c->world == 1 && !o->one_rank_nccl) {
    /* nothing to talk to: no communicator, its buffers or its kernels */
    c->backend = "local";
    snprintf(n->describe, sizeof n->describe, "none: one rank, so no NCCL communicator; the "
             "device collectives are copies on the compute stream (ST_NCCL_ONE_RANK=1 makes "
             "one)");
    st_comm_local_install(c);
    return 0;
  }
  set_env_default("NCCL_BUFFSIZE", o->buffsize);

  ncclUniqueId id;
  int ok = 1;
  if (c->rank == 0) ok = ncclGetUniqueId(&id) == ncclSuccess;
  MPI_Bcast(&ok, 1, MPI_INT, 0, n->mpi);
  if (!ok) return st_error_set("ncclGetUniqueId failed on rank 0 (is a network interface up? "
                               "see NCCL_SOCKET_IFNAME)");
  MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, n->mpi);
  int ev_ok = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming) == cudaSuccess;
  for (int t = 0; t < ST_COMM_TAGS; t++)
    ev_ok &= cudaEventCreateWithFlags(&n->done[t], cudaEventDisableTiming) == cudaSuccess;
  if (cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) != cudaSuccess || !ev_ok)
    return st_error_set("cannot create a CUDA stream and events on rank %d", c->rank);

  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0; /* non-blocking: init can be bounded and aborted */
  if (o->cga_cluster_size >= 0) cfg.cgaClusterSize = o->cga_cluster_size;
  if (o->min_ctas > 0) cfg.minCTAs = o->min_ctas;
  if (o->max_ctas > 0) cfg.maxCTAs = o->max_ctas;
  ncclResult_t r = ncclCommInitRankConfig(&n->nccl, c->world, id, c->rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress)
    return st_error_set("ncclCommInitRankConfig failed on rank %d: %s", c->rank,
                        ncclGetErrorString(r));
  if (wait_done(c, "init", 0, 0)) return -1;
  if (o->overlap_max_ctas > 0 && c->world > 1) {
    ncclConfig_t bc = NCCL_CONFIG_INITIALIZER;
    bc.blocking = 0;
    bc.maxCTAs = o->overlap_max_ctas;
    r = ncclCommSplit(n->nccl, 0, c->rank, &n->bg, &bc);
    if (r != ncclSuccess && r != ncclInProgress)
      return st_error_set("ncclCommSplit (the overlap communicator) failed on rank %d: %s",
                          c->rank, ncclGetErrorString(r));
    if (wait_done(c, "init of the overlap communicator", 0, 0)) return -1;
  }

  long long bs_now = 0; /* ours (set above) when the user set none */
  st_nccl_buffsize_env(&bs_now);
  char bs[32] = "default";
  if (bs_now > 0) snprintf(bs, sizeof bs, "%lld", bs_now);
  char overlap[96] = "";
  if (n->bg)
    snprintf(overlap, sizeof overlap, "; gradient buckets on a split communicator of %d CTAs",
             o->overlap_max_ctas);
  snprintf(n->describe, sizeof n->describe,
           "NCCL %d.%d.%d, non-blocking init, watchdog %.0f s, NCCL_BUFFSIZE=%s, cgaClusterSize=%s, "
           "CTAs %d..%d%s", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, o->timeout_s, bs,
           o->cga_cluster_size >= 0 ? "set" : "default", o->min_ctas, o->max_ctas, overlap);
  c->all_reduce_sum = nccl_all_reduce_sum;
  c->reduce_scatter_sum = nccl_reduce_scatter_sum;
  c->reduce_scatterv_sum = nccl_reduce_scatterv_sum;
  c->reduce_scatterv_sum_start = nccl_reduce_scatterv_sum_start;
  c->all_gatherv_start = nccl_all_gatherv_start;
  c->wait = nccl_wait;
  c->flush = nccl_flush;
  c->all_gather = nccl_all_gather;
  c->broadcast_buf = nccl_broadcast_buf;
  return 0;
}

void st_comm_nccl_free(st_comm *c) {
  nccl_impl *n = impl_of(c);
  if (!n) return;
  if (n->bg) ncclCommDestroy(n->bg);
  if (n->nccl) ncclCommDestroy(n->nccl);
  if (n->stream) cudaStreamDestroy(n->stream);
  if (n->ready) cudaEventDestroy(n->ready);
  for (int t = 0; t < ST_COMM_TAGS; t++)
    if (n->done[t]) cudaEventDestroy(n->done[t]);
  MPI_Comm_free(&n->mpi);
  free(n);
  c->impl = NULL;
}

const char *st_comm_nccl_describe(const st_comm *c) {
  return ((nccl_impl *)c->impl)->describe;
}
