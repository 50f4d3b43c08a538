/* adamw.c - AdamW (Loshchilov & Hutter 2019) in the form of torch.optim.AdamW:
 * decoupled decay p *= 1 - lr*wd, then p -= lr * m_hat / (sqrt(v_hat) + eps).
 * Also the sum of squares for the global gradient norm. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

void cpu_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                      float b1, float b2, float eps, float wd, float grad_scale, int64_t t,
                      void *work_) {
  float *work = work_ == p ? NULL : work_; /* fp32 storage: master and work may coincide */
  const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
  /* One loop without a branch, so that it vectorises (with -fno-math-errno
   * sqrtf is the sqrtps instruction): the same IEEE operations per element
   * in the same order as a scalar loop, so the same bits. The copy to work
   * is a second pass only where work is separate fp32 storage. */
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i] * grad_scale;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i] * (1.0f - lr * wd);
    p[i] = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
  }
  if (work) memcpy(work, p, (size_t)n * sizeof *p);
}

/* Fixed chunking (not per-thread partials) keeps the result independent of
 * the thread count, which bit-exact resume relies on. */
#define SSQ_CHUNKS 64
double cpu_sum_squares(const float *x, int64_t n) {
  double part[SSQ_CHUNKS];
  int64_t per = (n + SSQ_CHUNKS - 1) / SSQ_CHUNKS;
#pragma omp parallel for
  for (int k = 0; k < SSQ_CHUNKS; k++) {
    int64_t b = k * per, e = b + per < n ? b + per : n;
    double s = 0.0;
    for (int64_t i = b; i < e; i++) s += (double)x[i] * x[i];
    part[k] = s;
  }
  double s = 0.0;
  for (int k = 0; k < SSQ_CHUNKS; k++) s += part[k];
  return s;
}
