/* crossentropy.c - softmax over the real vocabulary + cross-entropy, fused
 * with its gradient so a [N, Vp] probability buffer is never kept. Columns
 * V..Vp-1 are padding of the tied embedding: excluded from the softmax (so
 * they never win) and given zero gradient. */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

void cpu_softmax_crossentropy(float *loss, void *dlogits_, const void *logits_,
                              const int *targets, float dloss, int N, int V, int Vp) {
  float *dlogits = dlogits_;
  const float *logits = logits_;
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float *l = logits + (int64_t)n * Vp;
    float maxv = -INFINITY;
    for (int v = 0; v < V; v++)
      if (l[v] > maxv) maxv = l[v];
    double sum = 0.0;
    for (int v = 0; v < V; v++) sum += exp((double)(l[v] - maxv));
    float lse = maxv + (float)log(sum);
    loss[n] = lse - l[targets[n]];
    if (dlogits) {
      float *d = dlogits + (int64_t)n * Vp;
      int tgt = targets[n];
      for (int v = 0; v < V; v++) {
        float p = expf(l[v] - lse);
        d[v] = (p - (v == tgt ? 1.0f : 0.0f)) * dloss;
      }
      for (int v = V; v < Vp; v++) d[v] = 0.0f;
    }
  }
}
