/* attention_decode.c - causal attention of new positions over a KV cache,
 * the fp32 reference (see attention_decode in kernels/ops.h), with
 * grouped-query attention: the cache holds NKV heads per position and query
 * head h reads kv head h / (NH/NKV), as in attention.c.
 *
 * Each score is computed three times (for the maximum, for the sum of
 * exponentials, for the output) with the same float operations in the same
 * order as attention.c, so the rows equal attention_forward's bit for bit
 * and no T-sized scratch is needed. Work is split over (sequence, head,
 * new row): each owns its slice of out; the cache rows are written first. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

static float score(const float *q, const float *k, int hs, float scale) {
  float s = 0.0f;
  for (int i = 0; i < hs; i++) s += q[i] * k[i];
  return s * scale;
}

void cpu_attention_decode(void *out_, void *kcache_, void *vcache_, const void *qkv_, int B,
                          int n_new, int pos0, int maxT, int C, int NH, int NKV) {
  float *out = out_, *kc = kcache_, *vc = vcache_;
  const float *qkv = qkv_;
  const int hs = C / NH, G = NH / NKV, RS = (NH + 2 * NKV) * hs, KV = NKV * hs;
  const float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++)
    for (int i = 0; i < n_new; i++) {
      const float *row = qkv + ((int64_t)b * n_new + i) * RS;
      const int64_t at = ((int64_t)b * maxT + pos0 + i) * KV;
      memcpy(kc + at, row + NH * hs, (size_t)KV * sizeof(float));
      memcpy(vc + at, row + NH * hs + KV, (size_t)KV * sizeof(float));
    }
#pragma omp parallel for collapse(3)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < n_new; i++) {
        const int t = pos0 + i;
        const float *q = qkv + ((int64_t)b * n_new + i) * RS + h * hs;
        const float *kb = kc + (int64_t)b * maxT * KV + (h / G) * hs;
        const float *vb = vc + (int64_t)b * maxT * KV + (h / G) * hs;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          float s = score(q, kb + (int64_t)t2 * KV, hs, scale);
          if (s > maxv) maxv = s;
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) sum += expf(score(q, kb + (int64_t)t2 * KV, hs, scale) - maxv);
        const float inv = 1.0f / sum;
        float *o = out + ((int64_t)b * n_new + i) * C + h * hs;
        for (int k = 0; k < hs; k++) o[k] = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          const float a = expf(score(q, kb + (int64_t)t2 * KV, hs, scale) - maxv) * inv;
          const float *v = vb + (int64_t)t2 * KV;
          for (int k = 0; k < hs; k++) o[k] += a * v[k];
        }
      }
}
