/* crossentropy.cu - softmax over the real vocabulary + cross-entropy, fused
 * with its gradient, one block per row. Columns V..Vp-1 (padding of the tied
 * embedding) are excluded from the softmax and get zero gradient. The sum of
 * exponentials is taken in double like the CPU reference; block reductions
 * combine a fixed set of per-thread partials in a fixed tree, so the result
 * does not vary from run to run. logits may alias dlogits: every thread
 * reads what it needs before the barrier that precedes the first write, and
 * after it each thread overwrites only the columns it alone reads. Logits
 * and dlogits are in the storage type, the loss is fp32. */
#include <math.h>

#include "kernels/cuda/cuda_ops.h"

#define CE_THREADS 256
#define CE_WARPS (CE_THREADS / 32)

template <typename S>
__global__ void softmax_crossentropy_kernel(float *loss, S *dlogits, const S *logits,
                                            const int *targets, float dloss, int V, int Vp) {
  __shared__ float smax[CE_WARPS];
  __shared__ double ssum[CE_WARPS];
  const int n = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const S *l = logits + (int64_t)n * Vp;

  float m = -INFINITY;
  for (int v = tid; v < V; v += CE_THREADS) m = fmaxf(m, st_ld(l[v]));
  m = st_warp_max(m);
  if (lane == 0) smax[warp] = m;
  __syncthreads();
  float maxv = smax[0];
  for (int w = 1; w < CE_WARPS; w++) maxv = fmaxf(maxv, smax[w]);

  double s = 0.0;
  for (int v = tid; v < V; v += CE_THREADS) s += exp((double)(st_ld(l[v]) - maxv));
  s = st_warp_sum_d(s);
  if (lane == 0) ssum[warp] = s;
  __syncthreads();
  double sum = 0.0;
  for (int w = 0; w < CE_WARPS; w++) sum += ssum[w];
  const float lse = maxv + (float)log(sum);
  const int tgt = targets[n];
  const float ltgt = st_ld(l[tgt]);
  if (tid == 0) loss[n] = lse - ltgt;
  if (!dlogits) return;
  __syncthreads(); /* l[tgt] read by all before anyone overwrites it */
  S *d = dlogits + (int64_t)n * Vp;
  for (int v = tid; v < Vp; v += CE_THREADS) {
    float g = 0.0f;
    if (v < V) g = (expf(st_ld(l[v]) - lse) - (v == tgt ? 1.0f : 0.0f)) * dloss;
    d[v] = st_st<S>(g);
  }
}

template <typename S>
void cuda_softmax_crossentropy(float *loss, void *dlogits, const void *logits,
                               const int *targets, float dloss, int N, int V, int Vp) {
  if (N == 0) return;
  softmax_crossentropy_kernel<S><<<N, CE_THREADS>>>(loss, (S *)dlogits, (const S *)logits,
                                                    targets, dloss, V, Vp);
  ST_CUDA_LAUNCHED();
}

#define CE_INST(S)                                                                       \
  template void cuda_softmax_crossentropy<S>(float *, void *, const void *, const int *, \
                                             float, int, int, int);
ST_FOR_EACH_STORAGE(CE_INST)
