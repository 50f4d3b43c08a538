/* swiglu.c - the SwiGLU gate (Shazeer 2020): inp[N,2F] holds gate | up per
 * row, out[N,F] = silu(gate) * up, silu(x) = x / (1 + exp(-x)) = x sig(x). */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

void cpu_swiglu_forward(void *out_, const void *inp_, int N, int F) {
  float *out = out_;
  const float *inp = inp_;
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float *g = inp + (int64_t)n * 2 * F, *u = g + F;
    float *o = out + (int64_t)n * F;
    for (int j = 0; j < F; j++) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
  }
}

/* silu'(x) = sig(x) (1 + x (1 - sig(x))). Both inputs of an element are
 * read before either gradient is written. */
void cpu_swiglu_backward(void *dinp_, const void *dout_, const void *inp_, int N, int F) {
  float *dinp = dinp_;
  const float *dout = dout_;
  const float *inp = inp_;
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float *g = inp + (int64_t)n * 2 * F, *u = g + F, *d = dout + (int64_t)n * F;
    float *dg = dinp + (int64_t)n * 2 * F, *du = dg + F;
    for (int j = 0; j < F; j++) {
      const float x = g[j], up = u[j], e1 = 1.0f + expf(-x), sig = 1.0f / e1;
      dg[j] = d[j] * up * sig * (1.0f + x * (1.0f - sig));
      du[j] = d[j] * (x / e1);
    }
  }
}
