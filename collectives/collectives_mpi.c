/* collectives_mpi.c - the collectives interface over MPI, host fp32 buffers.
 * Used by the CPU backend and by tests; the NCCL implementation keeps the
 * same semantics on device buffers. */
#include <mpi.h>
#include <stdlib.h>

#include "collectives/collectives.h"
#include "util/error.h"

static MPI_Comm comm_of(st_comm *c) { return *(MPI_Comm *)c->impl; }

static int check(int rc, const char *what, size_t count) {
  if (rc == MPI_SUCCESS) return 0;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return st_error_set("MPI %s of %zu elements failed: %s", what, count, msg);
}

/* MPI counts are int: split large buffers into pieces below INT_MAX. */
#define MAX_PIECE ((size_t)1 << 30)

static int mpi_all_reduce_sum(st_comm *c, float *buf, size_t count) {
  for (size_t off = 0; off < count; off += MAX_PIECE) {
    size_t n = count - off < MAX_PIECE ? count - off : MAX_PIECE;
    if (check(MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)n, MPI_FLOAT, MPI_SUM, comm_of(c)),
              "all-reduce", count))
      return -1;
  }
  return 0;
}

static int mpi_reduce_scatter_sum(st_comm *c, const float *send, float *recv, size_t count) {
  if (count > MAX_PIECE) return st_error_set("reduce-scatter block of %zu elements too large", count);
  return check(MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, comm_of(c)),
               "reduce-scatter", count);
}

static int mpi_reduce_scatterv_sum(st_comm *c, const float *send, const size_t *counts,
                                   float *recv) {
  int *rc = malloc((size_t)c->world * sizeof *rc);
  if (!rc) return st_error_set("out of host memory");
  size_t total = 0;
  for (int r = 0; r < c->world; r++) {
    rc[r] = (int)counts[r];
    total += counts[r];
  }
  float dummy;
  int err = MPI_Reduce_scatter(send, counts[c->rank] ? recv : &dummy, rc, MPI_FLOAT, MPI_SUM,
                               comm_of(c));
  free(rc);
  return check(err, "reduce-scatter", total);
}

static int mpi_all_gather(st_comm *c, const void *send, void *recv, size_t count,
                          size_t elem_size) {
  if (count > MAX_PIECE) return st_error_set("all-gather block of %zu elements too large", count);
  MPI_Datatype t = elem_size == 4 ? MPI_FLOAT : MPI_UINT16_T;
  /* send may alias recv's own block: MPI requires MPI_IN_PLACE for that. */
  const void *s = send == (const char *)recv + (size_t)c->rank * count * elem_size ? MPI_IN_PLACE
                                                                                   : send;
  return check(MPI_Allgather(s, (int)count, t, recv, (int)count, t, comm_of(c)), "all-gather",
               count);
}

static int mpi_all_gatherv_start(st_comm *c, const void *send, const size_t *counts,
                                 void *recv, size_t elem_size, int tag) {
  (void)tag; /* host buffers: completes here */
  int *rc = malloc(2 * (size_t)c->world * sizeof *rc);
  if (!rc) return st_error_set("out of host memory");
  int *displ = rc + c->world;
  size_t total = 0;
  for (int r = 0; r < c->world; r++) {
    if (counts[r] > MAX_PIECE || total > MAX_PIECE) {
      free(rc);
      return st_error_set("all-gather (uneven) of more than %zu elements is too large for one "
                          "MPI call", MAX_PIECE);
    }
    rc[r] = (int)counts[r];
    displ[r] = (int)total;
    total += counts[r];
  }
  MPI_Datatype t = elem_size == 4 ? MPI_FLOAT : MPI_UINT16_T;
  const char dummy = 0;
  int err = MPI_Allgatherv(counts[c->rank] ? send : &dummy, rc[c->rank], t, recv, rc, displ, t,
                           comm_of(c));
  free(rc);
  return check(err, "all-gather (uneven)", total);
}

static int mpi_reduce_scatterv_sum_start(st_comm *c, const float *send, const size_t *counts,
                                         float *recv, int tag, int background) {
  (void)tag, (void)background; /* host buffers: nothing to overlap with, so it completes here */
  return c->reduce_scatterv_sum(c, send, counts, recv);
}

static int mpi_wait(st_comm *c, int tag) {
  (void)c, (void)tag;
  return 0;
}

static int mpi_broadcast(st_comm *c, void *buf, size_t bytes, int root) {
  for (size_t off = 0; off < bytes; off += MAX_PIECE) {
    size_t n = bytes - off < MAX_PIECE ? bytes - off : MAX_PIECE;
    if (check(MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, root, comm_of(c)), "broadcast",
              bytes))
      return -1;
  }
  return 0;
}

static int mpi_flush(st_comm *c) {
  (void)c;
  return 0; /* MPI calls have completed on return */
}

static int mpi_barrier(st_comm *c) { return check(MPI_Barrier(comm_of(c)), "barrier", 0); }

static int mpi_all_reduce_double_sum(st_comm *c, double *buf, size_t count) {
  return check(MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_DOUBLE, MPI_SUM, comm_of(c)),
               "all-reduce", count);
}

static int mpi_all_reduce_int_max(st_comm *c, int *buf, size_t count) {
  return check(MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_INT, MPI_MAX, comm_of(c)),
               "all-reduce", count);
}

int st_comm_mpi_init(st_comm *c) {
  MPI_Comm *mc = malloc(sizeof *mc);
  if (!mc) return st_error_set("out of host memory");
  /* A private duplicate keeps our traffic apart from any other MPI user. */
  MPI_Comm_dup(MPI_COMM_WORLD, mc);
  MPI_Comm_set_errhandler(*mc, MPI_ERRORS_RETURN);
  c->impl = mc;
  MPI_Comm_rank(*mc, &c->rank);
  MPI_Comm_size(*mc, &c->world);
  c->backend = "mpi";
  c->defer_wait = 0;
  c->all_reduce_sum = mpi_all_reduce_sum;
  c->reduce_scatter_sum = mpi_reduce_scatter_sum;
  c->reduce_scatterv_sum = mpi_reduce_scatterv_sum;
  c->all_gather = mpi_all_gather;
  c->reduce_scatterv_sum_start = mpi_reduce_scatterv_sum_start;
  c->all_gatherv_start = mpi_all_gatherv_start;
  c->wait = mpi_wait;
  c->flush = mpi_flush;
  c->broadcast = mpi_broadcast;
  c->broadcast_buf = mpi_broadcast; /* the CPU backend's memory is host memory */
  c->barrier = mpi_barrier;
  c->all_reduce_double_sum = mpi_all_reduce_double_sum;
  c->all_reduce_int_max = mpi_all_reduce_int_max;
  return 0;
}

void st_comm_mpi_free(st_comm *c) {
  if (c->impl) {
    MPI_Comm_free((MPI_Comm *)c->impl);
    free(c->impl);
    c->impl = NULL;
  }
}
