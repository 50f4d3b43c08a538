/* layernorm.cu - LayerNorm over the channel dim (Ba et al. 2016), eps 1e-5
 * as in GPT-2 / torch.nn.LayerNorm. One warp per row for the forward and for
 * the input gradient, statistics in fp32 from the storage-type row; dw and
 * db (fp32 sums over rows) in two passes: per-chunk column partials, then
 * the partials added in chunk order.
 *
 * The row kernels take V channels per access (16-byte loads when C is a
 * multiple of V and every pointer is aligned; V = 1 otherwise): lane l
 * handles channels [V(l + 32k), V(l + 32k) + V) for k = 0, 1, ... */
#include "kernels/cuda/cuda_ops.h"

#define LN_THREADS 256
#define LN_WARPS (LN_THREADS / 32)

template <typename S, int V>
__global__ void layernorm_forward_kernel(S *out, float *mean, float *rstd, const S *inp,
                                         const S *w, const S *b, int N, int C) {
  int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const S *x = inp + (int64_t)row * C;
  float s = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V];
    st_load<S, V>(xv, x + c);
#pragma unroll
    for (int k = 0; k < V; k++) s += xv[k];
  }
  const float m = st_warp_sum(s) / C;
  float var = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V];
    st_load<S, V>(xv, x + c);
#pragma unroll
    for (int k = 0; k < V; k++) {
      float d = xv[k] - m;
      var += d * d;
    }
  }
  const float r = 1.0f / sqrtf(st_warp_sum(var) / C + 1e-5f);
  S *o = out + (int64_t)row * C;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], wv[V], bv[V], ov[V];
    st_load<S, V>(xv, x + c);
    st_load<S, V>(wv, w + c);
    st_load<S, V>(bv, b + c);
#pragma unroll
    for (int k = 0; k < V; k++) ov[k] = (xv[k] - m) * r * wv[k] + bv[k];
    st_store<S, V>(o + c, ov);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

/* dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w. */
template <typename S, int V>
__global__ void layernorm_backward_dinp_kernel(S *dinp, const S *dout, const S *inp, const S *w,
                                               const float *mean, const float *rstd, int N,
                                               int C) {
  int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const S *x = inp + (int64_t)row * C, *d = dout + (int64_t)row * C;
  S *di = dinp + (int64_t)row * C;
  const float m = mean[row], s = rstd[row];
  float gsum = 0.0f, gxsum = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V];
    st_load<S, V>(xv, x + c);
    st_load<S, V>(dv, d + c);
    st_load<S, V>(wv, w + c);
#pragma unroll
    for (int k = 0; k < V; k++) {
      float g = dv[k] * wv[k];
      gsum += g;
      gxsum += g * (xv[k] - m) * s;
    }
  }
  const float gmean = st_warp_sum(gsum) / C, gxmean = st_warp_sum(gxsum) / C;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V], iv[V];
    st_load<S, V>(xv, x + c);
    st_load<S, V>(dv, d + c);
    st_load<S, V>(wv, w + c);
    st_load<S, V>(iv, di + c);
#pragma unroll
    for (int k = 0; k < V; k++) {
      float xhat = (xv[k] - m) * s;
      iv[k] += s * (dv[k] * wv[k] - gmean - xhat * gxmean);
    }
    st_store<S, V>(di + c, iv);
  }
}

/* Pass 1: block (band of 32 V columns, chunk of rows). Thread (x, y) holds
 * columns [V (band + x), + V) and sums rows y, y+8, ... of the chunk; the 8
 * lane sums of a column are added in lane order. part[chunk][0:C] gets dw,
 * part[chunk][C:2C] gets db. Every column's sum is the same sequence of
 * operations for any V: V only widens the loads (16 bytes a row instead
 * of 2, which left this pass far below the memory's bandwidth). */
template <typename S, int V>
__global__ void layernorm_backward_part_kernel(float *part, const S *dout, const S *inp,
                                               const float *mean, const float *rstd, int N,
                                               int C, int rows_per_chunk) {
  __shared__ float sw[ST_COLSUM_LANES][ST_COLSUM_BAND * V], sb[ST_COLSUM_LANES][ST_COLSUM_BAND * V];
  const int tx = threadIdx.x, ty = threadIdx.y, chunk = blockIdx.y;
  const int c0 = blockIdx.x * ST_COLSUM_BAND * V, c = c0 + tx * V;
  const int r0 = chunk * rows_per_chunk;
  const int r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float aw[V], ab[V];
#pragma unroll
  for (int k = 0; k < V; k++) aw[k] = ab[k] = 0.0f;
  if (c < C) /* V > 1 only when V divides C: a pack is wholly inside or outside */
    for (int r = r0 + ty; r < r1; r += ST_COLSUM_LANES) {
      float d[V], x[V];
      st_load<S, V>(d, dout + (int64_t)r * C + c);
      st_load<S, V>(x, inp + (int64_t)r * C + c);
      const float m = mean[r], s = rstd[r];
#pragma unroll
      for (int k = 0; k < V; k++) {
        aw[k] += d[k] * (x[k] - m) * s;
        ab[k] += d[k];
      }
    }
#pragma unroll
  for (int k = 0; k < V; k++) sw[ty][tx * V + k] = aw[k], sb[ty][tx * V + k] = ab[k];
  __syncthreads();
  for (int j = ty * ST_COLSUM_BAND + tx; j < ST_COLSUM_BAND * V;
       j += ST_COLSUM_BAND * ST_COLSUM_LANES) {
    if (c0 + j >= C) break;
    float tw = 0.0f, tb = 0.0f;
    for (int y = 0; y < ST_COLSUM_LANES; y++) {
      tw += sw[y][j];
      tb += sb[y][j];
    }
    part[(int64_t)chunk * 2 * C + c0 + j] = tw;
    part[(int64_t)chunk * 2 * C + C + c0 + j] = tb;
  }
}

/* Pass 2: dw[c] += partials in chunk order; db likewise. */
__global__ void layernorm_backward_reduce_kernel(float *dw, float *db, const float *part,
                                                 int C, int chunks) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float aw = dw[c], ab = db[c];
  for (int k = 0; k < chunks; k++) {
    aw += part[(int64_t)k * 2 * C + c];
    ab += part[(int64_t)k * 2 * C + C + c];
  }
  dw[c] = aw;
  db[c] = ab;
}

template <typename S>
void cuda_layernorm_forward(void *out_, float *mean, float *rstd, const void *inp_,
                            const void *w_, const void *b_, int N, int C) {
  S *out = (S *)out_;
  const S *inp = (const S *)inp_, *w = (const S *)w_, *b = (const S *)b_;
  if (N == 0) return;
  constexpr int P = st_pack<S>();
  const unsigned grid = st_blocks(N, LN_WARPS);
  if (C % P == 0 && st_aligned16(out) && st_aligned16(inp) && st_aligned16(w) &&
      st_aligned16(b))
    layernorm_forward_kernel<S, P><<<grid, LN_THREADS>>>(out, mean, rstd, inp, w, b, N, C);
  else
    layernorm_forward_kernel<S, 1><<<grid, LN_THREADS>>>(out, mean, rstd, inp, w, b, N, C);
  ST_CUDA_LAUNCHED();
}

template <typename S>
void cuda_layernorm_backward(void *dinp_, float *dw, float *db, const void *dout_,
                             const void *inp_, const void *w_, const float *mean,
                             const float *rstd, int N, int C) {
  S *dinp = (S *)dinp_;
  const S *dout = (const S *)dout_, *inp = (const S *)inp_, *w = (const S *)w_;
  if (N == 0 || C == 0) return;
  constexpr int P = st_pack<S>();
  const unsigned grid = st_blocks(N, LN_WARPS);
  if (C % P == 0 && st_aligned16(dinp) && st_aligned16(dout) && st_aligned16(inp) &&
      st_aligned16(w))
    layernorm_backward_dinp_kernel<S, P><<<grid, LN_THREADS>>>(dinp, dout, inp, w, mean, rstd,
                                                               N, C);
  else
    layernorm_backward_dinp_kernel<S, 1><<<grid, LN_THREADS>>>(dinp, dout, inp, w, mean, rstd,
                                                               N, C);
  ST_CUDA_LAUNCHED();
  if (!dw && !db) return; /* a frozen norm (LoRA's base): no weight gradients */
  const int rows = st_colsum_rows_per_chunk(N), chunks = st_colsum_chunks(N);
  float *part = (float *)cuda_scratch((size_t)chunks * 2 * C * sizeof(float));
  const dim3 block(ST_COLSUM_BAND, ST_COLSUM_LANES);
  if (C % P == 0 && st_aligned16(dout) && st_aligned16(inp)) {
    const dim3 pgrid(st_blocks(C, ST_COLSUM_BAND * P), chunks);
    layernorm_backward_part_kernel<S, P><<<pgrid, block>>>(part, dout, inp, mean, rstd, N, C,
                                                           rows);
  } else {
    const dim3 pgrid(st_blocks(C, ST_COLSUM_BAND), chunks);
    layernorm_backward_part_kernel<S, 1><<<pgrid, block>>>(part, dout, inp, mean, rstd, N, C,
                                                           rows);
  }
  ST_CUDA_LAUNCHED();
  layernorm_backward_reduce_kernel<<<st_blocks(C, 256), 256>>>(dw, db, part, C, chunks);
  ST_CUDA_LAUNCHED();
}

#define LN_INST(S)                                                                            \
  template void cuda_layernorm_forward<S>(void *, float *, float *, const void *, const void *, \
                                          const void *, int, int);                            \
  template void cuda_layernorm_backward<S>(void *, float *, float *, const void *,             \
                                           const void *, const void *, const float *,          \
                                           const float *, int, int);
ST_FOR_EACH_STORAGE(LN_INST)
