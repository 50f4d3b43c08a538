/* adamw.c - AdamW (Loshchilov & Hutter 2019) in the form of torch.optim.AdamW:
 * decoupled decay p *= 1 - lr*wd, then p -= lr * m_hat / (sqrt(v_hat) + eps).
 * Also the sum of squares for the global gradient norm. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* Gradient element i of g in gdt (ST_FP32 or ST_BF16), widened exactly. */
static inline float grad_at(const void *g, st_dtype gdt, int64_t i) {
  if (gdt == ST_FP32) return ((const float *)g)[i];
  const uint32_t b = (uint32_t)((const uint16_t *)g)[i] << 16;
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

void cpu_adamw_update(float *p, const void *g, st_dtype gdt, float *m, float *v, int64_t n,
                      float lr, float b1, float b2, float eps, float wd, float grad_scale,
                      int64_t t, void *work_) {
  float *work = work_ == p ? NULL : work_; /* fp32 storage: master and work may coincide */
  const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
  /* Separate loops rather than branches inside one, so that each vectorises
   * (with -fno-math-errno sqrtf is one instruction): the same IEEE
   * operations per element in the same order as a scalar loop, so the same
   * bits, and the working copy written while the weight is in a register. */
  if (gdt == ST_FP32) {
    const float *gf = g;
    if (work) {
#pragma omp parallel for
      for (int64_t i = 0; i < n; i++)
        work[i] =
            adamw_one(&p[i], gf[i] * grad_scale, &m[i], &v[i], lr, b1, b2, eps, wd, bc1, bc2);
    } else {
#pragma omp parallel for
      for (int64_t i = 0; i < n; i++)
        adamw_one(&p[i], gf[i] * grad_scale, &m[i], &v[i], lr, b1, b2, eps, wd, bc1, bc2);
    }
    return;
  }
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++) {
    const float pi = adamw_one(&p[i], grad_at(g, gdt, i) * grad_scale, &m[i], &v[i], lr, b1, b2,
                               eps, wd, bc1, bc2);
    if (work) work[i] = pi;
  }
}

void cpu_adamw_update_segments_split(int16_t *lo, const void *g, st_dtype gdt, float *m,
                                     float *v, int64_t n, const int64_t *seg_end,
                                     const float *seg_wd, int nseg, float lr, float b1, float b2,
                                     float eps, float grad_scale, int64_t t, uint16_t *work) {
  const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
  int64_t b = 0;
  for (int k = 0; k < nseg; b = seg_end[k++]) {
    const int64_t e = seg_end[k] < n ? seg_end[k] : n;
    const float wd = seg_wd[k];
#pragma omp parallel for
    for (int64_t i = b; i < e; i++) {
      float p = st_master_join(work[i], lo[i]);
      adamw_one(&p, grad_at(g, gdt, i) * grad_scale, &m[i], &v[i], lr, b1, b2, eps, wd, bc1,
                bc2);
      st_master_split(p, &work[i], &lo[i]);
    }
  }
}

/* Round to nearest even, as st_dtype_from_f32 and CUDA's __float2bfloat16_rn. */
void cpu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
  st_dtype_from_f32(ST_BF16, dst, src, (size_t)n);
}

/* Fixed chunking (not per-thread partials) keeps the result independent of
 * the thread count, which bit-exact resume relies on. */
#define SSQ_CHUNKS 64
double cpu_sum_squares(const void *x, st_dtype dt, int64_t n) {
  double part[SSQ_CHUNKS];
  int64_t per = (n + SSQ_CHUNKS - 1) / SSQ_CHUNKS;
#pragma omp parallel for
  for (int k = 0; k < SSQ_CHUNKS; k++) {
    int64_t b = k * per, e = b + per < n ? b + per : n;
    double s = 0.0;
    for (int64_t i = b; i < e; i++) {
      const double xi = grad_at(x, dt, i);
      s += xi * xi;
    }
    part[k] = s;
  }
  double s = 0.0;
  for (int k = 0; k < SSQ_CHUNKS; k++) s += part[k];
  return s;
}
