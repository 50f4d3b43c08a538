/* layernorm.c - LayerNorm over the channel dim (Ba et al. 2016), eps 1e-5
 * as in GPT-2 / torch.nn.LayerNorm. Forward saves mean and 1/std per row. */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

void cpu_layernorm_forward(void *out_, float *mean, float *rstd, const void *inp_,
                           const void *w_, const void *b_, int N, int C) {
  float *out = out_;
  const float *inp = inp_;
  const float *w = w_;
  const float *b = b_;
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float *x = inp + (int64_t)n * C;
    float *o = out + (int64_t)n * C;
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float var = 0.0f;
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    var /= C;
    float s = 1.0f / sqrtf(var + 1e-5f);
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

/* dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w, the
 * standard LayerNorm input gradient. dw and db sum over rows: threads own
 * column bands so the row order is fixed. */
void cpu_layernorm_backward(void *dinp_, float *dw, float *db, const void *dout_,
                            const void *inp_, const void *w_, const float *mean,
                            const float *rstd, int N, int C) {
  float *dinp = dinp_;
  const float *dout = dout_;
  const float *inp = inp_;
  const float *w = w_;
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float *x = inp + (int64_t)n * C, *d = dout + (int64_t)n * C;
    float *di = dinp + (int64_t)n * C;
    const float m = mean[n], s = rstd[n];
    float gmean = 0.0f, gxmean = 0.0f;
    for (int c = 0; c < C; c++) {
      float g = d[c] * w[c];
      gmean += g;
      gxmean += g * (x[c] - m) * s;
    }
    gmean /= C;
    gxmean /= C;
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - m) * s;
      di[c] += s * (d[c] * w[c] - gmean - xhat * gxmean);
    }
  }
  if (!dw && !db) return; /* a frozen norm (LoRA's base): no weight gradients */
  const int band = 32;
#pragma omp parallel for
  for (int c0 = 0; c0 < C; c0 += band) {
    int c1 = c0 + band < C ? c0 + band : C;
    for (int n = 0; n < N; n++) {
      const float *x = inp + (int64_t)n * C, *d = dout + (int64_t)n * C;
      for (int c = c0; c < c1; c++) {
        if (dw) dw[c] += d[c] * (x[c] - mean[n]) * rstd[n];
        if (db) db[c] += d[c];
      }
    }
  }
}
