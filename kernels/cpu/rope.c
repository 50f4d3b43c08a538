/* rope.c - rotary position embedding (Su et al. 2021) in Hugging Face
 * Llama's rotate-half form, in place on the q and k heads of qkv rows
 * [(NH+2*NKV)*HD]; v heads are untouched. cs[maxT, HD] holds cos in the
 * first HD/2 and sin in the second (see rope_forward in kernels/ops.h).
 * Each element is written by one (row, head, pair), so threads never share. */
#include "kernels/cpu/cpu_ops.h"

/* dir = +1 rotates by the position's angle, -1 by its negative (the
 * transpose, which is the inverse of a rotation). */
static void rotate(float *qkv, const float *cs, int B, int T, int pos0, int NH, int NKV, int HD,
                   float dir) {
  const int half = HD / 2, RS = (NH + 2 * NKV) * HD, nrot = NH + NKV;
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *c = cs + (int64_t)(pos0 + t) * HD, *s = c + half;
      float *row = qkv + ((int64_t)b * T + t) * RS;
      for (int h = 0; h < nrot; h++) {
        float *x = row + h * HD;
        for (int i = 0; i < half; i++) {
          const float x0 = x[i], x1 = x[i + half], sn = dir * s[i];
          x[i] = x0 * c[i] - x1 * sn;
          x[i + half] = x1 * c[i] + x0 * sn;
        }
      }
    }
}

void cpu_rope_forward(void *qkv, const float *cs, int B, int T, int pos0, int NH, int NKV,
                      int HD) {
  rotate(qkv, cs, B, T, pos0, NH, NKV, HD, 1.0f);
}

void cpu_rope_backward(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int HD) {
  rotate(dqkv, cs, B, T, 0, NH, NKV, HD, -1.0f);
}
