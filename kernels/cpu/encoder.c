/* encoder.c - token + position embedding, forward and backward. wpe and
 * dwpe are NULL for rotary positions (the token embedding alone). */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

void cpu_encoder_forward(void *out_, const int *inp, const void *wte_, const void *wpe_,
                         int B, int T, int C) {
  float *out = out_;
  const float *wte = wte_;
  const float *wpe = wpe_;
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *o = out + ((int64_t)b * T + t) * C;
      const float *te = wte + (int64_t)inp[b * T + t] * C;
      if (!wpe) {
        memcpy(o, te, (size_t)C * sizeof(float));
        continue;
      }
      const float *pe = wpe + (int64_t)t * C;
      for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
    }
}

/* The same token can appear many times in a batch, so rows of dwte collide.
 * Each thread owns a band of columns and walks every position in order:
 * no atomics, and the summation order does not depend on the thread count.
 * The scratch is the CUDA backend's (its sort); nothing here needs one. */
void cpu_encoder_backward(float *dwte, float *dwpe, const void *dout_, const int *inp,
                          int B, int T, int C, void *scratch, size_t scratch_bytes) {
  (void)scratch, (void)scratch_bytes;
  const float *dout = dout_;
  const int band = 16;
#pragma omp parallel for
  for (int c0 = 0; c0 < C; c0 += band) {
    int c1 = c0 + band < C ? c0 + band : C;
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        const float *d = dout + ((int64_t)b * T + t) * C;
        float *te = dwte + (int64_t)inp[b * T + t] * C;
        for (int c = c0; c < c1; c++) te[c] += d[c];
        if (!dwpe) continue;
        float *pe = dwpe + (int64_t)t * C;
        for (int c = c0; c < c1; c++) pe[c] += d[c];
      }
  }
}
