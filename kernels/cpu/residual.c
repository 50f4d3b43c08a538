/* residual.c - the residual add, and the fp32 add that accumulates
 * gradient shards. Its backward is a copy of the upstream
 * gradient into both branches, which the schedule in rank/model/model.c does by
 * accumulating into the same buffer. */
#include "kernels/cpu/cpu_ops.h"

void cpu_residual_forward(void *out_, const void *a_, const void *b_, int64_t n) {
  float *out = out_;
  const float *a = a_;
  const float *b = b_;
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_accumulate_f32(float *dst, const float *src, int64_t n) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}
