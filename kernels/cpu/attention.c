/* attention.c - causal multi-head self-attention (Vaswani et al. 2017), the
 * fp32 reference. att[B,NH,T,T] keeps softmax(q k^T / sqrt(hs)) for backward;
 * entries above the diagonal are 0. Work is split over (batch, head) pairs,
 * each of which owns its slices of every output, so no two threads write the
 * same element and the order of every sum is fixed. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

int64_t cpu_attention_state_floats(int B, int T, int NH) { return (int64_t)B * NH * T * T; }

void cpu_attention_forward(void *out_, float *att, const void *qkv_, int B, int T, int C,
                           int NH, int NKV) {
  (void)NKV; /* GQA: not yet */
  float *out = out_;
  const float *qkv = qkv_;
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float *q = qkv + ((int64_t)b * T + t) * C3 + h * hs;
        float *a = att + (((int64_t)b * NH + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *k = qkv + ((int64_t)b * T + t2) * C3 + C + h * hs;
          float s = 0.0f;
          for (int i = 0; i < hs; i++) s += q[i] * k[i];
          s *= scale;
          a[t2] = s;
          if (s > maxv) maxv = s;
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          a[t2] = expf(a[t2] - maxv);
          sum += a[t2];
        }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
        float *o = out + ((int64_t)b * T + t) * C + h * hs;
        for (int i = 0; i < hs; i++) o[i] = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *v = qkv + ((int64_t)b * T + t2) * C3 + 2 * C + h * hs;
          for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
        }
      }
}

/* datt is scratch of the same shape as att. Softmax backward:
 * dpre[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j]). */
void cpu_attention_backward(void *dqkv_, float *datt, const void *dout_, const void *qkv_,
                            const void *out, const float *att, int B, int T, int C, int NH,
                            int NKV) {
  (void)NKV; /* GQA: not yet */
  float *dqkv = dqkv_;
  const float *dout = dout_;
  const float *qkv = qkv_;
  (void)out; /* the reference keeps the softmax; no D pass to save */
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  memset(dqkv, 0, (size_t)B * T * C3 * sizeof(float)); /* dqkv is overwritten */
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float *a = att + (((int64_t)b * NH + h) * T + t) * T;
        float *da = datt + (((int64_t)b * NH + h) * T + t) * T;
        const float *d = dout + ((int64_t)b * T + t) * C + h * hs;
        const float *q = qkv + ((int64_t)b * T + t) * C3 + h * hs;
        float *dq = dqkv + ((int64_t)b * T + t) * C3 + h * hs;
        float dot = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *v = qkv + ((int64_t)b * T + t2) * C3 + 2 * C + h * hs;
          float *dv = dqkv + ((int64_t)b * T + t2) * C3 + 2 * C + h * hs;
          float s = 0.0f;
          for (int i = 0; i < hs; i++) {
            s += v[i] * d[i];
            dv[i] += a[t2] * d[i];
          }
          da[t2] = s;
          dot += a[t2] * s;
        }
        for (int t2 = 0; t2 <= t; t2++) {
          float dpre = a[t2] * (da[t2] - dot) * scale;
          const float *k = qkv + ((int64_t)b * T + t2) * C3 + C + h * hs;
          float *dk = dqkv + ((int64_t)b * T + t2) * C3 + C + h * hs;
          for (int i = 0; i < hs; i++) {
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
}
