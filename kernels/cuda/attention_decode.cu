/* attention_decode.cu - causal attention of new positions over a KV cache
 * (see attention_decode in kernels/ops.h), for sampling. Grouped-query
 * attention: the cache rows hold NKV heads (KV = NKV*hs columns), and the
 * block of query head h reads kv head h / (NH/NKV).
 *
 * Two launches: one copies the new rows' keys and values into the cache
 * (bit-exact, storage dtype), then one block per (new row, head, sequence)
 * computes that query's attention over keys 0 .. pos0+i:
 *   scores: each warp takes every nw-th key, its lanes split the head
 *     dimension, a butterfly sum gives the dot product; kept in shared
 *     memory (pos0+n_new floats, dynamic);
 *   softmax: block max and block sum of exp(s - max), in a fixed order;
 *   output: blockDim/hs groups of hs threads each sum every G-th key's
 *     p * v, then the groups' partial sums are added in group order.
 * fp32 arithmetic throughout, one rounding when the output is stored, and
 * no atomics: results repeat bit for bit. At decode (n_new = 1) the grid is
 * only NH * B blocks, but the work is one row of T keys per head, which is
 * small beside the matmuls of the same position. */
#include "kernels/cuda/cuda_ops.h"

#define DEC_THREADS 256
#define DEC_MAX_HS 256 /* one group of hs threads must fit in the block */

/* n = B * n_new * KV elements; qkv rows are C + 2 KV long. */
template <typename S>
__global__ void decode_append_kernel(S *kc, S *vc, const S *qkv, int n_new, int pos0, int maxT,
                                     int C, int KV, int64_t n) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = e / KV; /* b * n_new + i */
    const int c = (int)(e % KV);
    const int64_t b = row / n_new, i = row % n_new;
    const int64_t at = (b * maxT + pos0 + i) * KV + c;
    const S *src = qkv + row * (C + 2 * KV) + C + c;
    kc[at] = src[0];
    vc[at] = src[KV];
  }
}

template <typename S>
__global__ void __launch_bounds__(DEC_THREADS)
    decode_attention_kernel(S *out, const S *kc, const S *vc, const S *qkv, int n_new, int pos0,
                            int maxT, int C, int NH, int NKV, float scale) {
  extern __shared__ float sc[]; /* scores, then probabilities (unnormalised), [nk] */
  __shared__ float q[DEC_MAX_HS];
  __shared__ float red[DEC_THREADS / 32];
  __shared__ float part[DEC_THREADS];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hs = C / NH, nk = pos0 + i + 1, KV = NKV * hs, kh = h / (NH / NKV);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const S *qrow = qkv + ((int64_t)b * n_new + i) * (C + 2 * KV) + h * hs;
  for (int d = tid; d < hs; d += blockDim.x) q[d] = st_ld(qrow[d]);
  __syncthreads();
  const S *kb = kc + (int64_t)b * maxT * KV + kh * hs;
  const S *vb = vc + (int64_t)b * maxT * KV + kh * hs;
  float lmax = -INFINITY;
  for (int t2 = warp; t2 < nk; t2 += nw) { /* warp-uniform loop: the shuffles are safe */
    const S *k = kb + (int64_t)t2 * KV;
    float s = 0.0f;
    for (int d = lane; d < hs; d += 32) s += q[d] * st_ld(k[d]);
    s = st_warp_sum(s) * scale;
    if (lane == 0) sc[t2] = s;
    lmax = fmaxf(lmax, s);
  }
  if (lane == 0) red[warp] = lmax;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < nw; w++) m = fmaxf(m, red[w]);
  __syncthreads(); /* red is rewritten below */
  float lsum = 0.0f;
  for (int t2 = tid; t2 < nk; t2 += blockDim.x) {
    const float e = expf(sc[t2] - m);
    sc[t2] = e;
    lsum += e;
  }
  lsum = st_warp_sum(lsum);
  if (lane == 0) red[warp] = lsum;
  __syncthreads();
  float sum = 0.0f;
  for (int w = 0; w < nw; w++) sum += red[w];
  const int G = blockDim.x / hs, g = tid / hs, d = tid % hs;
  if (g < G) {
    float acc = 0.0f;
    for (int t2 = g; t2 < nk; t2 += G) acc += sc[t2] * st_ld(vb[(int64_t)t2 * KV + d]);
    part[g * hs + d] = acc;
  }
  __syncthreads();
  if (tid < hs) {
    float o = 0.0f;
    for (int k = 0; k < G; k++) o += part[k * hs + tid];
    out[((int64_t)b * n_new + i) * C + h * hs + tid] = st_st<S>(o / sum);
  }
}

template <typename S>
void cuda_attention_decode(void *out_, void *kcache_, void *vcache_, const void *qkv_, int B,
                           int n_new, int pos0, int maxT, int C, int NH, int NKV) {
  if (NH <= 0 || NKV <= 0 || NH % NKV != 0 || C % NH != 0)
    st_cuda_fail("attention_decode: NKV must divide NH and NH must divide C", __FILE__, __LINE__);
  S *out = (S *)out_, *kc = (S *)kcache_, *vc = (S *)vcache_;
  const S *qkv = (const S *)qkv_;
  const int hs = C / NH, KV = NKV * hs;
  const int64_t n = (int64_t)B * n_new * KV;
  if (n == 0) return;
  if (hs > DEC_MAX_HS || pos0 + n_new > maxT)
    st_cuda_fail("attention_decode: head size above 256 or past the cache", __FILE__, __LINE__);
  decode_append_kernel<S><<<st_blocks_capped(n, 256), 256>>>(kc, vc, qkv, n_new, pos0, maxT, C,
                                                              KV, n);
  ST_CUDA_LAUNCHED();
  const size_t smem = (size_t)(pos0 + n_new) * sizeof(float);
  if (smem > 48 * 1024)
    ST_CUDA_CHECK(cudaFuncSetAttribute(decode_attention_kernel<S>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  dim3 grid((unsigned)n_new, (unsigned)NH, (unsigned)B);
  decode_attention_kernel<S><<<grid, DEC_THREADS, smem>>>(out, kc, vc, qkv, n_new, pos0, maxT, C,
                                                          NH, NKV, 1.0f / sqrtf((float)hs));
  ST_CUDA_LAUNCHED();
}

#define DEC_INST(S)                                                                          \
  template void cuda_attention_decode<S>(void *, void *, void *, const void *, int, int, int, \
                                         int, int, int, int);
ST_FOR_EACH_STORAGE(DEC_INST)
