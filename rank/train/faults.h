/* faults.h - fault injection for the tests (ST_FAULT_* environment
 * variables), read once at setup so the step loop only compares numbers.
 * Each variable and the test that sets it:
 *   ST_FAULT_STALL=RANK:STEP:SECONDS  that rank sleeps before that step, so
 *                                     the others wait in a collective and
 *                                     the NCCL watchdog must fire
 *                                     (tests/gpu/gpu_e2e.sh)
 *   ST_FAULT_OOM=STEP or RANK:STEP    an impossible allocation inside that
 *                                     step: the out-of-memory report, exit 7
 *                                     (tests/e2e/test_oom.py)
 *   ST_FAULT_OVERFLOW=STEP[,STEP...]  an inf in this rank's reduced gradients
 *                                     at those steps, as an fp16 overflow
 *                                     (tests/e2e/test_overflow_skip.py)
 *   ST_FAULT_ALLOC=STEP               4 KiB allocated and freed during that
 *                                     step (test_no_alloc_after_setup.py)
 *   ST_FAULT_LEAK_KIB=N               N KiB of host memory leaked every step
 *                                     (tests/e2e/test_memory_flat.py)
 *   ST_FAULT_NAN_STEP=STEP or RANK:STEP  after that step's update, the first
 *                                     fp32 weight of that rank's partition
 *                                     (every rank's without RANK) is NaN, as
 *                                     a diverged run's would be: the save
 *                                     refuses it (tests/e2e/test_nonfinite.py).
 *                                     Test-only, like every ST_FAULT_*.
 *   ST_FAULT_CKPT_SLOW=SECONDS[:STEP] the asynchronous checkpoint writer
 *                                     sleeps that long before writing the
 *                                     rank file of a save of STEP or later
 *                                     (read in rank/train/ckpt_save.c;
 *                                     tests/e2e/test_ckpt_async.py)
 */
#ifndef ST_FAULTS_H
#define ST_FAULTS_H

#include "kernels/ops.h"

typedef struct {
  int stall_rank;           /* -1: none */
  long long stall_step;
  double stall_s;
  int oom_rank;             /* -1: every rank */
  long long oom_step;       /* -1: none */
  const char *overflow;     /* the step list as given; NULL: none */
  long long alloc_step;     /* -1: none */
  long long leak_kib;       /* 0: none */
  int nan_rank;             /* -1: every rank */
  long long nan_step;       /* -1: none */
} st_faults;

/* Read every ST_FAULT_* variable; a malformed one is treated as unset. */
void st_faults_read(st_faults *f);

/* Step `step` (1-based) is about to run on `rank`: sleep (stall), fail an
 * allocation (oom, exits 7 through st_oom_fatal), allocate and free
 * (alloc), leak (leak_kib), as configured. */
void st_faults_step(const st_faults *f, const st_ops *ops, int rank, long long step);

/* Whether ST_FAULT_NAN_STEP poisons a weight of `rank` after `step`. */
int st_faults_nan_at(const st_faults *f, int rank, long long step);

/* Whether ST_FAULT_OVERFLOW lists `step`. */
int st_faults_overflow_at(const st_faults *f, long long step);

#endif
