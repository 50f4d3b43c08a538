/* attention.c - causal multi-head self-attention (Vaswani et al. 2017) with
 * grouped-query attention (Ainslie et al. 2023), the fp32 reference.
 * att[B,NH,T,T] keeps softmax(q k^T / sqrt(hs)) for backward; entries above
 * the diagonal are 0. qkv rows hold NH query heads, then NKV key heads, then
 * NKV value heads; query head h reads kv head h / (NH/NKV).
 *
 * The forward splits work over (batch, query head) pairs, each owning its
 * slices of out and att. The backward splits over (batch, kv head) pairs:
 * the query heads of one group all add into the same dk and dv, so one
 * thread walks them in order (head, then row), which fixes the order of
 * every sum whatever the thread count. With NKV == NH each group is one
 * head and the operations are those of plain multi-head attention. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

int64_t cpu_attention_state_floats(int B, int T, int NH) { return (int64_t)B * NH * T * T; }

void cpu_attention_forward(void *out_, float *att, const void *qkv_, int B, int T, int C,
                           int NH, int NKV) {
  float *out = out_;
  const float *qkv = qkv_;
  const int hs = C / NH, G = NH / NKV, RS = (NH + 2 * NKV) * hs;
  const int koff = NH * hs, voff = (NH + NKV) * hs;
  const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const int kvh = h / G;
        const float *q = qkv + ((int64_t)b * T + t) * RS + h * hs;
        float *a = att + (((int64_t)b * NH + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *k = qkv + ((int64_t)b * T + t2) * RS + koff + kvh * hs;
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
          const float *v = qkv + ((int64_t)b * T + t2) * RS + voff + kvh * hs;
          for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
        }
      }
}

/* datt is scratch of the same shape as att. Softmax backward:
 * dpre[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j]). */
void cpu_attention_backward(void *dqkv_, float *datt, const void *dout_, const void *qkv_,
                            const void *out, const float *att, int B, int T, int C, int NH,
                            int NKV) {
  float *dqkv = dqkv_;
  const float *dout = dout_;
  const float *qkv = qkv_;
  (void)out; /* the reference keeps the softmax; no D pass to save */
  const int hs = C / NH, G = NH / NKV, RS = (NH + 2 * NKV) * hs;
  const int koff = NH * hs, voff = (NH + NKV) * hs;
  const float scale = 1.0f / sqrtf((float)hs);
  memset(dqkv, 0, (size_t)B * T * RS * sizeof(float)); /* dqkv is overwritten */
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++)
    for (int kvh = 0; kvh < NKV; kvh++)
      for (int h = kvh * G; h < (kvh + 1) * G; h++)
        for (int t = 0; t < T; t++) {
          const float *a = att + (((int64_t)b * NH + h) * T + t) * T;
          float *da = datt + (((int64_t)b * NH + h) * T + t) * T;
          const float *d = dout + ((int64_t)b * T + t) * C + h * hs;
          const float *q = qkv + ((int64_t)b * T + t) * RS + h * hs;
          float *dq = dqkv + ((int64_t)b * T + t) * RS + h * hs;
          float dot = 0.0f;
          for (int t2 = 0; t2 <= t; t2++) {
            const float *v = qkv + ((int64_t)b * T + t2) * RS + voff + kvh * hs;
            float *dv = dqkv + ((int64_t)b * T + t2) * RS + voff + kvh * hs;
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
            const float *k = qkv + ((int64_t)b * T + t2) * RS + koff + kvh * hs;
            float *dk = dqkv + ((int64_t)b * T + t2) * RS + koff + kvh * hs;
            for (int i = 0; i < hs; i++) {
              dq[i] += dpre * k[i];
              dk[i] += dpre * q[i];
            }
          }
        }
}
