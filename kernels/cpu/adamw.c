/* adamw.c - AdamW (Loshchilov & Hutter 2019) in the form of torch.optim.AdamW:
 * decoupled decay p *= 1 - lr*wd, then p -= lr * m_hat / (sqrt(v_hat) + eps).
 * Also the sum of squares for the global gradient norm. */
#include <math.h>
#include <stddef.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/master_split.h"

/* One element's update; *p, *m, *v in place, the new weight returned. */
static inline float adamw_one(float *p, float g, float *m, float *v, float lr, float b1, float b2,
                              float eps, float wd, float bc1, float bc2) {
  const float mi = b1 * *m + (1.0f - b1) * g;
  const float vi = b2 * *v + (1.0f - b2) * g * g;
  *m = mi;
  *v = vi;
  const float pi = *p * (1.0f - lr * wd);
  return *p = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}

void cpu_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                      float b1, float b2, float eps, float wd, float grad_scale, int64_t t,
                      void *work_) {
  float *work = work_ == p ? NULL : work_; /* fp32 storage: master and work may coincide */
  const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
  /* Two loops rather than a branch inside one, so that each vectorises
   * (with -fno-math-errno sqrtf is one instruction): the same IEEE
   * operations per element in the same order as a scalar loop, so the same
   * bits, and the working copy written while the weight is in a register. */
  if (work) {
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++)
      work[i] = adamw_one(&p[i], g[i] * grad_scale, &m[i], &v[i], lr, b1, b2, eps, wd, bc1, bc2);
  } else {
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++)
      adamw_one(&p[i], g[i] * grad_scale, &m[i], &v[i], lr, b1, b2, eps, wd, bc1, bc2);
  }
}

void cpu_adamw_update_segments_split(int16_t *lo, const float *g, float *m, float *v, int64_t n,
                                     const int64_t *seg_end, const float *seg_wd, int nseg,
                                     float lr, float b1, float b2, float eps, float grad_scale,
                                     int64_t t, uint16_t *work) {
  const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
  int64_t b = 0;
  for (int k = 0; k < nseg; b = seg_end[k++]) {
    const int64_t e = seg_end[k] < n ? seg_end[k] : n;
    const float wd = seg_wd[k];
#pragma omp parallel for
    for (int64_t i = b; i < e; i++) {
      float p = st_master_join(work[i], lo[i]);
      adamw_one(&p, g[i] * grad_scale, &m[i], &v[i], lr, b1, b2, eps, wd, bc1, bc2);
      st_master_split(p, &work[i], &lo[i]);
    }
  }
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
