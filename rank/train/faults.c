/* faults.c - fault injection for the tests (see faults.h). */
#define _POSIX_C_SOURCE 200809L
#include "rank/train/faults.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/arena.h"

void st_faults_read(st_faults *f) {
  memset(f, 0, sizeof *f);
  f->stall_rank = -1;
  f->oom_rank = -1;
  f->oom_step = -1;
  f->alloc_step = -1;
  f->nan_rank = -1;
  f->nan_step = -1;
  const char *s = getenv("ST_FAULT_STALL");
  if (s && sscanf(s, "%d:%lld:%lf", &f->stall_rank, &f->stall_step, &f->stall_s) != 3)
    f->stall_rank = -1;
  if ((s = getenv("ST_FAULT_OOM"))) {
    long long a = -1, b = -1;
    const int n = sscanf(s, "%lld:%lld", &a, &b);
    if (n == 2) f->oom_rank = (int)a, f->oom_step = b;
    else if (n == 1) f->oom_step = a;
  }
  if ((s = getenv("ST_FAULT_NAN_STEP"))) {
    long long a = -1, b = -1;
    const int n = sscanf(s, "%lld:%lld", &a, &b);
    if (n == 2) f->nan_rank = (int)a, f->nan_step = b;
    else if (n == 1) f->nan_step = a;
  }
  f->overflow = getenv("ST_FAULT_OVERFLOW");
  if ((s = getenv("ST_FAULT_ALLOC"))) f->alloc_step = atoll(s);
  if ((s = getenv("ST_FAULT_LEAK_KIB"))) f->leak_kib = atoll(s);
}

void st_faults_step(const st_faults *f, const st_ops *ops, int rank, long long step) {
  if (f->stall_rank == rank && f->stall_step == step) {
    fprintf(stderr, "shardtrain: ST_FAULT_STALL: rank %d sleeps %.0f s before step %lld\n", rank,
            f->stall_s, step);
    struct timespec ts = {(time_t)f->stall_s, 0};
    nanosleep(&ts, NULL);
  }
  if (f->oom_step == step && (f->oom_rank < 0 || f->oom_rank == rank)) {
    /* More than any machine has (4 EiB): the request fails as a real one
     * would and goes where a CUDA out-of-memory inside an op goes. */
    const size_t huge = (size_t)1 << 62;
    void *p = ops->alloc(huge, "unplanned");
    if (!p)
      st_oom_fatal("unplanned", huge, "ST_FAULT_OOM: an allocation inside the step (fault "
                   "injection)");
    ops->free(p); /* it did not fail: the allocation check reports it instead */
  }
  if (f->alloc_step == step) {
    fprintf(stderr, "shardtrain: ST_FAULT_ALLOC: rank %d allocates during step %lld\n", rank,
            step);
    ops->free(ops->alloc(4096, "unplanned"));
  }
  if (f->leak_kib > 0) {
    static void *chain; /* a reachable list, so the compiler cannot drop the blocks */
    char *p = malloc((size_t)f->leak_kib << 10);
    if (!p) return;
    memset(p, 1, (size_t)f->leak_kib << 10); /* never freed: that is the point */
    memcpy(p, &chain, sizeof chain);
    chain = p;
  }
}

int st_faults_nan_at(const st_faults *f, int rank, long long step) {
  return f->nan_step >= 0 && f->nan_step == step && (f->nan_rank < 0 || f->nan_rank == rank);
}

int st_faults_overflow_at(const st_faults *f, long long step) {
  for (const char *p = f->overflow; p && *p;) {
    char *end;
    const long long s = strtoll(p, &end, 10);
    if (end == p) return 0;
    if (s == step) return 1;
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}
