/* rmsnorm.c - RMSNorm over the channel dim (Zhang & Sennrich 2019), in the
 * order of Hugging Face's LlamaRMSNorm: rstd = 1/sqrt(mean(x^2) + eps),
 * out = w * (x * rstd). Forward saves rstd per row. */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

void cpu_rmsnorm_forward(void *out_, float *rstd, const void *inp_, const void *w_, int N, int C,
                         float eps) {
  float *out = out_;
  const float *inp = inp_;
  const float *w = w_;
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float *x = inp + (int64_t)n * C;
    float *o = out + (int64_t)n * C;
    float ss = 0.0f;
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    const float s = 1.0f / sqrtf(ss / C + eps);
    for (int c = 0; c < C; c++) o[c] = w[c] * (x[c] * s);
    rstd[n] = s;
  }
}

/* d x_j = rstd * (g_j - xhat_j * mean(g * xhat)), g = dout * w, xhat = x *
 * rstd: the LayerNorm gradient without the mean terms. dinp accumulates
 * (the residual stream); dw sums over rows in column bands so the row order
 * is fixed. */
void cpu_rmsnorm_backward(void *dinp_, float *dw, const void *dout_, const void *inp_,
                          const void *w_, const float *rstd, int N, int C) {
  float *dinp = dinp_;
  const float *dout = dout_;
  const float *inp = inp_;
  const float *w = w_;
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float *x = inp + (int64_t)n * C, *d = dout + (int64_t)n * C;
    float *di = dinp + (int64_t)n * C;
    const float s = rstd[n];
    float gxmean = 0.0f;
    for (int c = 0; c < C; c++) gxmean += d[c] * w[c] * (x[c] * s);
    gxmean /= C;
    for (int c = 0; c < C; c++) di[c] += s * (d[c] * w[c] - (x[c] * s) * gxmean);
  }
  if (!dw) return; /* a frozen norm (LoRA's base): no weight gradient */
  const int band = 32;
#pragma omp parallel for
  for (int c0 = 0; c0 < C; c0 += band) {
    int c1 = c0 + band < C ? c0 + band : C;
    for (int n = 0; n < N; n++) {
      const float *x = inp + (int64_t)n * C, *d = dout + (int64_t)n * C;
      for (int c = c0; c < c1; c++) dw[c] += d[c] * (x[c] * rstd[n]);
    }
  }
}
