/* test_scaling_model.c - the alpha-beta model: costs by hand, the fit
 * recovers known parameters, the cluster link and the step projection. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "collectives/scaling_model.h"

static void test_costs(void **state) {
  (void)state;
  st_ab ab = {.overhead = 0, .alpha = 10e-6, .bw = 100e9};
  /* ring all-reduce, 4 ranks, 1 GB: 6 x 10 us + 1.5 x 10 ms */
  assert_float_equal(st_ab_time(ST_COLL_ALL_REDUCE, ST_ALGO_RING, 4, 1e9, ab), 60e-6 + 15e-3,
                     1e-12);
  /* tree all-reduce, 8 ranks: 2 x 3 steps, 2 S / B */
  assert_float_equal(st_ab_time(ST_COLL_ALL_REDUCE, ST_ALGO_TREE, 8, 1e9, ab), 60e-6 + 20e-3,
                     1e-12);
  /* reduce-scatter / all-gather, 2 ranks: 1 step, S / 2B */
  assert_float_equal(st_ab_time(ST_COLL_REDUCE_SCATTER, ST_ALGO_RING, 2, 1e9, ab),
                     10e-6 + 5e-3, 1e-12);
  assert_float_equal(st_ab_time(ST_COLL_ALL_GATHER, ST_ALGO_RING, 2, 1e9, ab), 10e-6 + 5e-3,
                     1e-12);
  assert_float_equal(st_ab_time(ST_COLL_BROADCAST, ST_ALGO_RING, 3, 1e9, ab), 20e-6 + 10e-3,
                     1e-12);
  /* one rank moves nothing */
  assert_float_equal(st_ab_time(ST_COLL_ALL_REDUCE, ST_ALGO_RING, 1, 1e9, ab), 0, 0);
  /* at large S the ring's bandwidth is nccl-tests' busbw: S/t x 2(n-1)/n -> B */
  double t = st_ab_time(ST_COLL_ALL_REDUCE, ST_ALGO_RING, 8, 1e12, ab);
  assert_float_equal(1e12 / t * 2 * 7 / 8, 100e9, 100e9 * 1e-5);
}

static void test_fit_recovers(void **state) {
  (void)state;
  const st_ab truth = {.overhead = 30e-6, .alpha = 7e-6, .bw = 250e9};
  for (int op = 0; op < 3; op++) {
    for (int n = 2; n <= 8; n *= 2) {
      double S[30], T[30];
      int m = 0;
      for (double s = 8; s <= 4.3e9; s *= 2, m++) {
        S[m] = s;
        /* +-1% alternating noise, as timing gives */
        T[m] = st_ab_time((st_coll_op)op, ST_ALGO_RING, n, s, truth) * (m % 2 ? 1.01 : 0.99);
      }
      st_ab fit;
      double r2;
      assert_int_equal(st_ab_fit((st_coll_op)op, n, S, T, m, &fit, &r2), 0);
      /* one rank count: the intercept (overhead + steps alpha) goes to overhead */
      const double steps = op == 0 ? 2.0 * (n - 1) : (double)(n - 1);
      assert_true(fabs(fit.bw / truth.bw - 1) < 0.02);
      assert_true(fabs(fit.overhead / (truth.overhead + steps * truth.alpha) - 1) < 0.05);
      assert_true(fit.alpha == 0);
      assert_true(r2 > 0.99);
    }
  }
  /* too few sizes, or times that do not grow: refused */
  double S[2] = {8, 8}, T[2] = {1e-5, 1e-5};
  st_ab fit;
  assert_int_equal(st_ab_fit(ST_COLL_ALL_REDUCE, 2, S, T, 2, &fit, NULL), -1);
  double S2[2] = {8, 1e9}, T2[2] = {1e-3, 1e-4};
  assert_int_equal(st_ab_fit(ST_COLL_ALL_REDUCE, 2, S2, T2, 2, &fit, NULL), -1);
}

static void test_projection(void **state) {
  (void)state;
  st_cluster cl = {.nodes = 1, .gpus_per_node = 2, .intra = {0, 5e-6, 270e9},
                   .inter = {0, 10e-6, 50e9}};
  st_ab l = st_cluster_link(&cl);
  assert_true(l.bw == 270e9 && l.alpha == 5e-6); /* one node: NVLink only */
  cl.nodes = 4;
  l = st_cluster_link(&cl);
  assert_true(l.bw == 50e9 && l.alpha == 10e-6); /* the network is the slowest hop */

  /* ZeRO 1, P = 100M, 2 GPUs on one node: RS of 400 MB, AG of 200 MB */
  st_step_model sm = {.zero_stage = 1, .params = 100e6, .compute_s = 0.1, .overlap = 1.0,
                      .grad_bytes = 4, .weight_bytes = 2};
  cl.nodes = 1;
  st_step_projection p;
  st_project_step(&sm, &cl, ST_ALGO_RING, &p);
  const double rs = 5e-6 + 0.5 * 400e6 / 270e9, ag = 5e-6 + 0.5 * 200e6 / 270e9;
  assert_float_equal(p.comm_s, rs + ag, 1e-12);
  assert_float_equal(p.exposed_s, ag, 1e-12); /* RS fully hidden */
  assert_float_equal(p.efficiency, 0.1 / (0.1 + ag), 1e-12);
  /* more nodes never help efficiency (weak scaling, slower link) */
  double prev = 2;
  for (int nodes = 1; nodes <= 64; nodes *= 2) {
    cl.nodes = nodes;
    cl.gpus_per_node = 8;
    st_project_step(&sm, &cl, ST_ALGO_RING, &p);
    assert_true(p.efficiency <= prev + 1e-15 && p.efficiency > 0);
    prev = p.efficiency;
  }
  /* ZeRO 0 all-reduces: tree beats ring in latency at scale */
  sm.zero_stage = 0;
  sm.params = 1e3; /* latency-bound */
  st_step_projection pr, pt;
  st_project_step(&sm, &cl, ST_ALGO_RING, &pr);
  st_project_step(&sm, &cl, ST_ALGO_TREE, &pt);
  assert_true(pt.comm_s < pr.comm_s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_costs),
      cmocka_unit_test(test_fit_recovers),
      cmocka_unit_test(test_projection),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
