/* gelu.c - GELU with the tanh approximation (Hendrycks & Gimpel 2016), the
 * form GPT-2 uses: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

void cpu_gelu_forward(void *out_, const void *inp_, int64_t n) {
  float *out = out_;
  const float *inp = inp_;
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x)));
  }
}

void cpu_gelu_backward(void *dinp_, const void *inp_, const void *dout_, int64_t n) {
  float *dinp = dinp_;
  const float *inp = inp_;
  const float *dout = dout_;
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++) {
    float x = inp[i];
    float u = GELU_S * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = grad * dout[i];
  }
}

/* The fused forms of the op table, composed: the CPU reference has nothing
 * to gain from fusing and stays the plain definition. */
void cpu_matmul_gelu_forward(void *out, void *pre, const void *inp, const void *w,
                             const void *bias, int N, int C, int OC) {
  cpu_matmul_forward(pre, inp, w, bias, N, C, OC);
  cpu_gelu_forward(out, pre, (int64_t)N * OC);
}

void cpu_matmul_backward_gelu(void *dinp, float *dw, float *dbias, const void *dout,
                              const void *inp, const void *w, const void *pre, int N, int C,
                              int OC) {
  cpu_matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
  cpu_gelu_backward(dinp, pre, dinp, (int64_t)N * C);
}
