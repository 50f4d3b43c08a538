/* collectives.h - the five collectives shardtrain needs, behind one interface.
 *
 * The MPI implementation (collectives_mpi.c) works on host fp32 buffers; an
 * NCCL implementation on device buffers arrives with the CUDA backend. All
 * calls are blocking (except the _start ones) and must be made by every rank
 * of the communicator, in the same order.
 * Each returns 0, or -1 with st_error naming the collective.
 */
#ifndef ST_COLLECTIVES_H
#define ST_COLLECTIVES_H

#include <stddef.h>
#include <stdint.h>

typedef struct st_comm st_comm;

/* Asynchronous operations in flight at once: tags 0-3 are the gradient
 * reductions' hook slots (rank/model/model.h), 4-5 ZeRO 3's two block
 * buffers of gathered weights (ST_COMM_TAG_GATHER + slot). */
#define ST_COMM_TAGS 6
#define ST_COMM_TAG_GATHER 4

struct st_comm {
  int rank, world;
  void *impl; /* MPI_Comm* for the MPI backend */
  const char *backend;
  long long step; /* the training step, for error messages (set by the trainer) */
  /* When set, device collectives return once enqueued on the communication
   * stream instead of waiting for completion, and flush waits for all of
   * them (the watchdog applies). Benchmarks set it to time back-to-back
   * calls as nccl-tests does; the trainer never does. MPI calls complete on
   * return either way. */
  int defer_wait;
  int (*flush)(st_comm *c);
  /* sum across ranks, in place; count fp32 elements */
  int (*all_reduce_sum)(st_comm *c, float *buf, size_t count);
  /* sum across ranks of send[world*count]; rank r receives block r (count) */
  int (*reduce_scatter_sum)(st_comm *c, const float *send, float *recv, size_t count);
  /* uneven reduce-scatter: send holds sum(counts) elements, rank r's block
   * first-to-last in rank order; rank r receives the sum of block r
   * (counts[r] elements, possibly 0). Used by ZeRO 2 for one bucket. */
  int (*reduce_scatterv_sum)(st_comm *c, const float *send, const size_t *counts, float *recv);
  /* The same, started and not waited for: on GPUs it runs on the
   * communication stream after the compute issued so far, while later
   * compute goes on; send and recv must stay untouched until
   * wait(c, tag). tag in [0, ST_COMM_TAGS) names it; a tag must be waited
   * for before it is reused. background: compute runs alongside it
   * (gradient buckets during backward), so NCCL uses its low-SM
   * communicator when it has one. The MPI implementation completes at once. */
  int (*reduce_scatterv_sum_start)(st_comm *c, const float *send, const size_t *counts,
                                   float *recv, int tag, int background);
  /* Uneven all-gather, started and not waited for (as
   * reduce_scatterv_sum_start): rank r contributes counts[r] elements
   * (possibly 0) of elem_size bytes (4: fp32, 2: bf16/fp16, copied as bits)
   * from send; every rank's recv receives sum(counts) elements, rank r's
   * block first-to-last in rank order. send must not overlap recv. ZeRO 3
   * fills a block buffer with the weights from every rank's shard. MPI:
   * MPI_Allgatherv, complete on return; NCCL: one ncclBroadcast per rank
   * with a nonzero count, grouped, on the communication stream. */
  int (*all_gatherv_start)(st_comm *c, const void *send, const size_t *counts, void *recv,
                           size_t elem_size, int tag);
  /* Block until the operation started with tag has finished (the watchdog
   * applies). 0 at once when none is pending. */
  int (*wait)(st_comm *c, int tag);
  /* every rank contributes count elements of elem_size bytes (4: fp32, 2:
   * bf16/fp16 working weights); recv holds world*count, rank order. send may
   * be recv's own block (in place). */
  int (*all_gather)(st_comm *c, const void *send, void *recv, size_t count, size_t elem_size);
  /* bytes from root to all, host memory */
  int (*broadcast)(st_comm *c, void *buf, size_t bytes, int root);
  /* bytes from root to all, in the backend's memory (device on GPUs) */
  int (*broadcast_buf)(st_comm *c, void *buf, size_t bytes, int root);
  int (*barrier)(st_comm *c);
  /* all-reduce helpers on host scalars (flags, loss sums) */
  int (*all_reduce_double_sum)(st_comm *c, double *buf, size_t count);
  int (*all_reduce_int_max)(st_comm *c, int *buf, size_t count);
};

/* Wrap MPI_COMM_WORLD (or a duplicate of it). MPI must be initialised. */
int st_comm_mpi_init(st_comm *c);
void st_comm_mpi_free(st_comm *c);

#endif
