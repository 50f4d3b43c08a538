/* collectives_nccl.h - the collectives interface over NCCL, on device fp32
 * buffers, bootstrapped through MPI (NCCL's canonical pattern: rank 0 makes
 * the unique id, MPI_Bcast shares it, every rank calls
 * ncclCommInitRankConfig). Non-blocking communicators let a watchdog bound
 * every init and collective: one that does not finish in time is aborted
 * (ncclCommAbort) and reported naming the collective, the step and the rank,
 * never a silent hang. Host-side calls (broadcast, barrier, scalar
 * reductions) go through MPI. */
#ifndef ST_COLLECTIVES_NCCL_H
#define ST_COLLECTIVES_NCCL_H

#include "collectives/collectives.h"

typedef struct {
  double timeout_s;      /* watchdog for init and each collective; 0 = none */
  int cga_cluster_size;  /* ncclConfig_t fields; -1 = NCCL's default */
  int min_ctas, max_ctas;
  long long buffsize;    /* NCCL_BUFFSIZE in bytes unless the user set it; 0 = default */
  /* > 0: a second communicator, split from the first with at most this
   * many CTAs, carries the reductions started with background set
   * (the gradient reductions that overlap backward). */
  int overlap_max_ctas;
  /* With one rank: 0 installs the copies of collectives_local.h and makes
   * no NCCL communicator (train on one GPU); 1 makes the communicator
   * anyway (bench collectives, which measures NCCL; ST_NCCL_ONE_RANK=1). */
  int one_rank_nccl;
} st_nccl_options;

/* Create the NCCL communicator over MPI_COMM_WORLD on the current CUDA
 * device (or, with one rank and o->one_rank_nccl 0, the one-rank copies
 * and no communicator). Collective. 0, or -1 with st_error naming the
 * failing rank. */
int st_comm_nccl_init(st_comm *c, const st_nccl_options *o);
void st_comm_nccl_free(st_comm *c);

/* The NCCL settings in effect, one line, for the configuration block. */
const char *st_comm_nccl_describe(const st_comm *c);

#endif
