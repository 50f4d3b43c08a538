/* crossentropy.cu - softmax over the real vocabulary + cross-entropy, fused
 * with its gradient, one block per row. Columns V..Vp-1 (padding of the tied
 * embedding) are excluded from the softmax and get zero gradient. Three
 * passes over the row (max, sum of exponentials, gradient); block reductions
 * combine a fixed set of per-thread partials in a fixed tree, so the result
 * does not vary from run to run. logits may alias dlogits: every thread
 * reads what it needs before the barrier that precedes the first write, and
 * after it each thread overwrites only the columns it alone reads. Logits
 * and dlogits are in the storage type, the loss is fp32. */
#include <math.h>

#include "kernels/cuda/cuda_ops.h"

#define CE_THREADS 256
#define CE_WARPS (CE_THREADS / 32)

/* P elements per access: 16-byte loads when rows allow (Vp a multiple of
 * the pack, rows aligned), else 1. Columns v >= V are skipped. */
template <typename S, int P>
__global__ void softmax_crossentropy_kernel(float *loss, S *dlogits, const S *logits,
                                            const int *targets, float dloss, int V, int Vp) {
  __shared__ float smax[CE_WARPS];
  __shared__ double ssum[CE_WARPS];
  const int n = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const S *l = logits + (int64_t)n * Vp;
  const int packs = Vp / P;

  float m = -INFINITY;
  for (int p = tid; p < packs; p += CE_THREADS) {
    float x[P];
    st_load<S, P>(x, l + (int64_t)p * P);
#pragma unroll
    for (int k = 0; k < P; k++)
      if (p * P + k < V) m = fmaxf(m, x[k]);
  }
  m = st_warp_max(m);
  if (lane == 0) smax[warp] = m;
  __syncthreads();
  float maxv = smax[0];
  for (int w = 1; w < CE_WARPS; w++) maxv = fmaxf(maxv, smax[w]);

  /* fp32 keeps the CPU reference's double exponentials (debugging
   * precision); bf16/fp16 logits carry 8-11 bits, so each thread sums its
   * ~200 fp32 exponentials in fp32 and only the partials are combined in
   * double. The row is L2-resident for this second read. */
  double s = 0.0;
  float sf = 0.0f;
  for (int p = tid; p < packs; p += CE_THREADS) {
    float x[P];
    st_load<S, P>(x, l + (int64_t)p * P);
#pragma unroll
    for (int k = 0; k < P; k++)
      if (p * P + k < V) {
        if constexpr (sizeof(S) == 4) s += exp((double)(x[k] - maxv));
        else sf += expf(x[k] - maxv);
      }
  }
  if constexpr (sizeof(S) != 4) s = sf;
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
  for (int p = tid; p < packs; p += CE_THREADS) {
    float x[P];
    st_load<S, P>(x, l + (int64_t)p * P);
#pragma unroll
    for (int k = 0; k < P; k++) {
      const int v = p * P + k;
      x[k] = v < V ? (expf(x[k] - lse) - (v == tgt ? 1.0f : 0.0f)) * dloss : 0.0f;
    }
    st_store<S, P>(d + (int64_t)p * P, x);
  }
}

template <typename S>
void cuda_softmax_crossentropy(float *loss, void *dlogits, const void *logits,
                               const int *targets, float dloss, int N, int V, int Vp) {
  if (N == 0) return;
  constexpr int P = st_pack<S>();
  const bool vec = Vp % P == 0 && st_aligned16(logits) && (!dlogits || st_aligned16(dlogits));
  if (vec)
    softmax_crossentropy_kernel<S, P><<<N, CE_THREADS>>>(loss, (S *)dlogits, (const S *)logits,
                                                         targets, dloss, V, Vp);
  else
    softmax_crossentropy_kernel<S, 1><<<N, CE_THREADS>>>(loss, (S *)dlogits, (const S *)logits,
                                                         targets, dloss, V, Vp);
  ST_CUDA_LAUNCHED();
}

#define CE_INST(S)                                                                       \
  template void cuda_softmax_crossentropy<S>(float *, void *, const void *, const int *, \
                                             float, int, int, int);
ST_FOR_EACH_STORAGE(CE_INST)
