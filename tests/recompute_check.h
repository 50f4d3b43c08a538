/* recompute_check.h - the check every recompute test makes (test_ops_grad,
 * test_model_family): run each --recompute policy, require the loss and
 * the n gradients of every policy to equal none's bit for bit, and the
 * activation bytes to fall policy by policy (none > act > selective >
 * full). `run` fills a policy's loss, gradients and activation bytes; ctx
 * is passed through. Include after cmocka.h. */
#ifndef ST_TESTS_RECOMPUTE_CHECK_H
#define ST_TESTS_RECOMPUTE_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "rank/memory/memory_plan.h"

typedef void (*st_recompute_run)(void *ctx, st_recompute rec, double *loss, float *grad,
                                 size_t *act_bytes);

static void recompute_check(const char *what, size_t n, st_recompute_run run, void *ctx) {
  enum { NP = ST_RECOMPUTE_POLICIES };
  float *g[NP];
  double loss[NP];
  size_t bytes[NP];
  for (int p = 0; p < NP; p++) {
    g[p] = calloc(n, sizeof(float));
    assert_non_null(g[p]);
    run(ctx, (st_recompute)p, &loss[p], g[p], &bytes[p]);
  }
  for (int p = 1; p < NP; p++) {
    assert_true(loss[p] == loss[0]);
    assert_memory_equal(g[p], g[0], n * sizeof(float));
  }
  printf("   %s activation bytes:", what);
  for (int p = 0; p < NP; p++) printf(" %s %zu", st_recompute_name((st_recompute)p), bytes[p]);
  printf("\n");
  for (int p = 1; p < NP; p++) assert_true(bytes[p] < bytes[p - 1]);
  for (int p = 0; p < NP; p++) free(g[p]);
}

#endif
