/* fd_check.h - the finite-difference check the op tests share
 * (test_ops_grad.c, test_ops_family.c); include after <cmocka.h>.
 *
 * A check builds L = sum(out * R) for a fixed random R, so dL/dout = R,
 * runs the op's backward with dout = R, and compares each input gradient
 * element with (L(x+h) - L(x-h)) / 2h, h = 1e-3, L summed in double.
 * Tolerance: |analytic - numeric| <= 2e-2 * max(|analytic|, |numeric|) + 2e-3.
 * fp32 rounding of the perturbed forward is the main error source (about
 * 1e-7 * |L| / h); the bound is 10x what was observed when written.
 */
#ifndef ST_TESTS_FD_CHECK_H
#define ST_TESTS_FD_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "util/rng.h"

#define H 1e-3f

static st_rng g_rng;
/* The largest |analytic - numeric| any check has seen (reported by tests). */
static double g_fd_max_err;

static inline float *randn(int64_t n, float scale) {
  float *x = malloc((size_t)n * sizeof *x);
  for (int64_t i = 0; i < n; i++) x[i] = scale * st_rng_normal(&g_rng);
  return x;
}
static inline float *zeros(int64_t n) { return calloc((size_t)n, sizeof(float)); }

static inline double dot(const float *a, const float *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* A forward evaluation: recompute the op's output and return sum(out * R). */
typedef double (*loss_fn)(void *ctx);

/* Compare grad[i] against finite differences of f over x[i] for up to
 * `samples` indices spread across the array. Returns the number of failures. */
static inline int check(const char *what, float *x, const float *grad, int64_t n, loss_fn f,
                        void *ctx, int samples) {
  int bad = 0;
  int64_t stride = n > samples ? n / samples : 1;
  for (int64_t i = 0; i < n; i += stride) {
    float old = x[i];
    x[i] = old + H;
    double lp = f(ctx);
    x[i] = old - H;
    double lm = f(ctx);
    x[i] = old;
    double num = (lp - lm) / (2.0 * H), ana = grad[i];
    double tol = 2e-2 * fmax(fabs(num), fabs(ana)) + 2e-3;
    if (fabs(num - ana) > g_fd_max_err) g_fd_max_err = fabs(num - ana);
    if (fabs(num - ana) > tol) {
      if (bad < 5) print_error("%s[%lld]: analytic %.6g numeric %.6g\n", what, (long long)i, ana, num);
      bad++;
    }
  }
  return bad;
}

#endif
