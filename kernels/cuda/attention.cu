/* attention.cu - causal multi-head self-attention (Vaswani et al. 2017) in
 * fp32, materialising att[B,NH,T,T] = softmax(q k^T / sqrt(hs)) exactly as
 * the CPU reference does (entries above the diagonal are 0). Flash attention
 * replaces this later; this version is the straightforward one.
 *
 * Forward: one warp per (b, h, t) row computes the scores, the row max, the
 * softmax; then one thread per output element (b, t, c) sums att * v over
 * t2 <= t in ascending order.
 * Backward: one warp per row turns datt into the pre-softmax gradient
 * dpre = att * (datt - sum(att * datt)) * scale (kept in the datt scratch);
 * then dq, dk and dv are each owned by one thread per element, which sums
 * over the other time index in ascending order: no two threads write the
 * same element and there are no atomics.
 */
#include <math.h>

#include "kernels/cuda/cuda_ops.h"

#define ATT_THREADS 256
#define ATT_WARPS (ATT_THREADS / 32)

__global__ void attention_softmax_kernel(float *att, const float *qkv, int B, int T, int C,
                                         int NH, float scale) {
  const int64_t row = blockIdx.x * (int64_t)ATT_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= (int64_t)B * NH * T) return;
  const int t = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((int64_t)T * NH));
  const int hs = C / NH, C3 = 3 * C;
  const float *q = qkv + ((int64_t)b * T + t) * C3 + h * hs;
  const float *kbase = qkv + (int64_t)b * T * C3 + C + h * hs;
  float *a = att + row * T;
  float maxv = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float *k = kbase + (int64_t)t2 * C3;
    float s = 0.0f;
    for (int i = 0; i < hs; i++) s += q[i] * k[i];
    s *= scale;
    a[t2] = s;
    maxv = fmaxf(maxv, s);
  }
  maxv = st_warp_max(maxv);
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    float e = expf(a[t2] - maxv);
    a[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / st_warp_sum(sum);
  for (int t2 = lane; t2 < T; t2 += 32) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
}

/* out[b,t,c] = sum_{t2<=t} att[b,h,t,t2] * v[b,t2,c], h = c / hs. */
__global__ void attention_value_kernel(float *out, const float *att, const float *qkv, int B,
                                       int T, int C, int NH) {
  const int64_t n = (int64_t)B * T * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int c = (int)(i % C);
    const int64_t bt = i / C;
    const int t = (int)(bt % T), b = (int)(bt / T), h = c / (C / NH), C3 = 3 * C;
    const float *a = att + (((int64_t)b * NH + h) * T + t) * T;
    const float *v = qkv + (int64_t)b * T * C3 + 2 * C + c;
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += a[t2] * v[(int64_t)t2 * C3];
    out[i] = acc;
  }
}

/* Per row (b,h,t): datt[t2] = v[t2] . dout[t], then in place
 * dpre[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j]) * scale. */
__global__ void attention_dpre_kernel(float *datt, const float *dout, const float *qkv,
                                      const float *att, int B, int T, int C, int NH,
                                      float scale) {
  const int64_t row = blockIdx.x * (int64_t)ATT_WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= (int64_t)B * NH * T) return;
  const int t = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((int64_t)T * NH));
  const int hs = C / NH, C3 = 3 * C;
  const float *d = dout + ((int64_t)b * T + t) * C + h * hs;
  const float *vbase = qkv + (int64_t)b * T * C3 + 2 * C + h * hs;
  const float *a = att + row * T;
  float *da = datt + row * T;
  float dot = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float *v = vbase + (int64_t)t2 * C3;
    float s = 0.0f;
    for (int i = 0; i < hs; i++) s += v[i] * d[i];
    da[t2] = s;
    dot += a[t2] * s;
  }
  dot = st_warp_sum(dot);
  for (int t2 = lane; t2 <= t; t2 += 32) da[t2] = a[t2] * (da[t2] - dot) * scale;
}

/* dq[b,t,c] += sum_{t2<=t} dpre[b,h,t,t2] * k[b,t2,c]. */
__global__ void attention_dq_kernel(float *dqkv, const float *dpre, const float *qkv, int B,
                                    int T, int C, int NH) {
  const int64_t n = (int64_t)B * T * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int c = (int)(i % C);
    const int64_t bt = i / C;
    const int t = (int)(bt % T), b = (int)(bt / T), h = c / (C / NH), C3 = 3 * C;
    const float *p = dpre + (((int64_t)b * NH + h) * T + t) * T;
    const float *k = qkv + (int64_t)b * T * C3 + C + c;
    float *dq = dqkv + bt * C3 + c;
    float acc = *dq;
    for (int t2 = 0; t2 <= t; t2++) acc += p[t2] * k[(int64_t)t2 * C3];
    *dq = acc;
  }
}

/* For key/value position t2: dk[b,t2,c] += sum_{t>=t2} dpre[b,h,t,t2] * q[b,t,c] and
 * dv[b,t2,c] += sum_{t>=t2} att[b,h,t,t2] * dout[b,t,c], t ascending. */
__global__ void attention_dkv_kernel(float *dqkv, const float *dpre, const float *att,
                                     const float *dout, const float *qkv, int B, int T, int C,
                                     int NH) {
  const int64_t n = (int64_t)B * T * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int c = (int)(i % C);
    const int64_t bt2 = i / C;
    const int t2 = (int)(bt2 % T), b = (int)(bt2 / T), h = c / (C / NH), C3 = 3 * C;
    const int64_t col = ((int64_t)b * NH + h) * T * T + t2; /* [b,h,t=0,t2] */
    const float *q = qkv + (int64_t)b * T * C3 + c;
    const float *d = dout + (int64_t)b * T * C + c;
    float *dk = dqkv + bt2 * C3 + C + c, *dv = dqkv + bt2 * C3 + 2 * C + c;
    float acck = *dk, accv = *dv;
    for (int t = t2; t < T; t++) {
      const int64_t at = col + (int64_t)t * T;
      acck += dpre[at] * q[(int64_t)t * C3];
      accv += att[at] * d[(int64_t)t * C];
    }
    *dk = acck;
    *dv = accv;
  }
}

int64_t cuda_attention_state_floats(int B, int T, int NH) { return (int64_t)B * NH * T * T; }

void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH) {
  const int64_t rows = (int64_t)B * NH * T, n = (int64_t)B * T * C;
  if (rows == 0 || n == 0) return;
  const float scale = 1.0f / sqrtf((float)(C / NH));
  attention_softmax_kernel<<<st_blocks(rows, ATT_WARPS), ATT_THREADS>>>(att, qkv, B, T, C, NH,
                                                                       scale);
  ST_CUDA_LAUNCHED();
  attention_value_kernel<<<st_blocks_capped(n, ATT_THREADS), ATT_THREADS>>>(out, att, qkv, B, T,
                                                                           C, NH);
  ST_CUDA_LAUNCHED();
}

void cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH) {
  const int64_t rows = (int64_t)B * NH * T, n = (int64_t)B * T * C;
  if (rows == 0 || n == 0) return;
  const float scale = 1.0f / sqrtf((float)(C / NH));
  attention_dpre_kernel<<<st_blocks(rows, ATT_WARPS), ATT_THREADS>>>(datt, dout, qkv, att, B, T,
                                                                    C, NH, scale);
  ST_CUDA_LAUNCHED();
  attention_dq_kernel<<<st_blocks_capped(n, ATT_THREADS), ATT_THREADS>>>(dqkv, datt, qkv, B, T,
                                                                        C, NH);
  ST_CUDA_LAUNCHED();
  attention_dkv_kernel<<<st_blocks_capped(n, ATT_THREADS), ATT_THREADS>>>(dqkv, datt, att, dout,
                                                                         qkv, B, T, C, NH);
  ST_CUDA_LAUNCHED();
}
