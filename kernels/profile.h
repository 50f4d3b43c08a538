/* profile.h - where a step's time goes, op by op.
 *
 * st_ops_profiled wraps an op table: every compute op synchronizes the
 * device, runs, synchronizes again and adds its wall time to a row keyed by
 * the op and its shape (matmuls by N x C x OC, so the four GEMMs of a block
 * and the LM head are told apart). The synchronizations cost a few
 * microseconds per op and remove overlap, so a profiled step is a little
 * slower than a plain one; shares are what it is for. One table per
 * process (the wrapper keeps the inner table in a static).
 */
#ifndef ST_PROFILE_H
#define ST_PROFILE_H

#include <stdio.h>

#include "kernels/ops.h"

/* A table with inner's memory functions and timed compute ops. */
const st_ops *st_ops_profiled(const st_ops *inner);
/* Forget what was timed so far (after warmup steps). */
void st_ops_profile_reset(void);
/* Print rows sorted by time: op, calls and ms per step, share of the timed
 * total, over `steps` steps, and the step's wall time per step when
 * wall_s > 0 (the remainder is host work and collectives). */
void st_ops_profile_report(FILE *f, int steps, double wall_s);

#endif
