/* residual.c - the residual add (alone and after a projection), and the fp32 add that accumulates
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

/* The projection's output goes into out first and the residual is added in
 * place: the same two roundings, in the same order, as matmul_forward into a
 * buffer of its own followed by residual_forward. */
void cpu_matmul_residual_forward(void *out, const void *inp, const void *w, const void *bias,
                                 const void *res, int N, int C, int OC) {
  cpu_matmul_forward(out, inp, w, bias, N, C, OC);
  cpu_residual_forward(out, res, out, (int64_t)N * OC);
}

void cpu_accumulate_f32(float *dst, const float *src, int64_t n) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}
