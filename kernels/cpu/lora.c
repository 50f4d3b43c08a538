/* lora.c - the column-slice add and gather of LoRA adapters and the
 * counter-based dropout (kernels/ops.h), fp32. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dropout_hash.h"

void cpu_lora_add_cols(void *y_, const void *v_, float scale, int N, int OC, int col0, int n) {
  float *y = y_;
  const float *v = v_;
#pragma omp parallel for
  for (int i = 0; i < N; i++)
    for (int j = 0; j < n; j++) y[(int64_t)i * OC + col0 + j] += scale * v[(int64_t)i * n + j];
}

void cpu_lora_take_cols(void *dst_, const void *y_, float scale, int N, int OC, int col0, int n) {
  float *dst = dst_;
  const float *y = y_;
#pragma omp parallel for
  for (int i = 0; i < N; i++)
    for (int j = 0; j < n; j++) dst[(int64_t)i * n + j] = scale * y[(int64_t)i * OC + col0 + j];
}

void cpu_dropout(void *out_, const void *in_, int64_t n, float p, uint64_t seed) {
  float *out = out_;
  const float *in = in_;
  const float keep = 1.0f / (1.0f - p);
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++)
    out[i] = st_dropout_uniform(seed, (uint64_t)i) >= p ? in[i] * keep : 0.0f;
}
