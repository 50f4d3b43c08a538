/* crossentropy.cu - softmax over the real vocabulary + cross-entropy, fused
 * with its gradient, one block per row. Columns V..Vp-1 (padding of the tied
 * embedding) are excluded from the softmax and get zero gradient. Two
 * passes over the row: the max and the sum of exponentials together, in the
 * online form (Milakov & Gimelshein 2018: a running max m and a sum s
 * rescaled by exp(m_old - m_new) whenever the max grows), then the
 * gradient. A row of Llama 3's 128256 bf16 logits is 256 KB and a chunk of
 * them (rank/model/model.h) is far beyond L2, so each pass is a read from
 * memory: three passes made the op 2.4% of a llama-3.2-1b step at 1.4 TB/s
 * (one H200, ST_PROFILE_OPS). Block reductions combine a fixed set of
 * per-thread (max, sum) partials in a fixed tree, so the result does not
 * vary from run to run. logits may alias dlogits: every thread reads what
 * it needs before the barrier that precedes the first write, and after it
 * each thread overwrites only the columns it alone reads. Logits and
 * dlogits are in the storage type, the loss is fp32. */
#include <math.h>

#include <type_traits>

#include "kernels/cuda/cuda_ops.h"

#define CE_THREADS 256
#define CE_WARPS (CE_THREADS / 32)

/* (m, s) <- the pair for the union of two sets of exponentials, each sum
 * taken relative to its own max. An empty set is (-inf, 0). T: float for
 * bf16/fp16 sums, double for fp32 (the CPU reference's precision). */
template <typename T>
__device__ __forceinline__ void ce_merge(float &m, T &s, float m2, T s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) { m = m2; s = s2; return; }
  if (m2 > m) {
    if constexpr (sizeof(T) == 8) s = s * exp((double)(m - m2)) + s2;
    else s = s * expf(m - m2) + s2;
    m = m2;
  } else {
    if constexpr (sizeof(T) == 8) s += s2 * exp((double)(m2 - m));
    else s += s2 * expf(m2 - m);
  }
}

/* P elements per access: 16-byte loads when rows allow (Vp a multiple of
 * the pack, rows aligned), else 1. Columns v >= V are skipped. */
template <typename S, int P>
__global__ void softmax_crossentropy_kernel(float *loss, S *dlogits, const S *logits,
                                            const int *targets, float dloss, int V, int Vp) {
  /* fp32 keeps the CPU reference's double exponentials (debugging
   * precision); bf16/fp16 logits carry 8-11 bits, so each thread sums its
   * ~60 packs of exponentials in fp32. */
  using acc = typename std::conditional<sizeof(S) == 4, double, float>::type;
  __shared__ float smax[CE_WARPS];
  __shared__ acc ssum[CE_WARPS];
  const int n = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const S *l = logits + (int64_t)n * Vp;
  const int packs = Vp / P;

  float m = -INFINITY;
  acc s = 0;
  for (int p = tid; p < packs; p += CE_THREADS) {
    float x[P];
    st_load<S, P>(x, l + (int64_t)p * P);
    float pm = -INFINITY;
#pragma unroll
    for (int k = 0; k < P; k++)
      if (p * P + k < V) pm = fmaxf(pm, x[k]);
    if (pm == -INFINITY) continue;
    acc ps = 0;
#pragma unroll
    for (int k = 0; k < P; k++)
      if (p * P + k < V) {
        if constexpr (sizeof(S) == 4) ps += exp((double)(x[k] - pm));
        else ps += expf(x[k] - pm);
      }
    ce_merge<acc>(m, s, pm, ps);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const acc s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ce_merge<acc>(m, s, m2, s2);
  }
  if (lane == 0) {
    smax[warp] = m;
    ssum[warp] = s;
  }
  __syncthreads();
  float maxv = smax[0];
  acc sum = ssum[0];
  for (int w = 1; w < CE_WARPS; w++) ce_merge<acc>(maxv, sum, smax[w], ssum[w]);
  const float lse = maxv + (float)log((double)sum);
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
