/* rmsnorm.cu - RMSNorm over the channel dim (Zhang & Sennrich 2019, as in
 * Llama): out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). Laid out like
 * layernorm.cu: one warp per row for the forward and for the input
 * gradient (statistics in fp32 from the storage-type row, 16-byte accesses
 * when C and every pointer allow), and dw (fp32, summed over rows) as
 * per-chunk column partials then the partials added in chunk order, so no
 * floating-point atomics and the same bits on every run. The backward
 * computes the chunk partials in the same pass as the input gradient (each
 * warp sums its rows' dout * xhat into its own shared-memory row, the
 * block adds the warps' rows in warp order): a separate dw pass re-read
 * dout and x with 64-byte accesses and made the op 2.0% of a llama-3.2-1b
 * step at 1.8 TB/s (one H200, ST_PROFILE_OPS).
 *
 * Backward (from d rstd / d x_i = -rstd^3 x_i / C):
 *   dinp += rstd * (g - xhat * mean(g * xhat)), g = dout * w, xhat = x rstd
 *   dw   += sum over rows of dout * xhat. */
#include "kernels/cuda/cuda_ops.h"

#define RMS_THREADS 256
#define RMS_WARPS (RMS_THREADS / 32)

template <typename S, int V>
__global__ void rmsnorm_forward_kernel(S *out, float *rstd, const S *inp, const S *w, int N,
                                       int C, float eps) {
  const int row = blockIdx.x * RMS_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const S *x = inp + (int64_t)row * C;
  float ss = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V];
    st_load<S, V>(xv, x + c);
#pragma unroll
    for (int k = 0; k < V; k++) ss += xv[k] * xv[k];
  }
  const float r = 1.0f / sqrtf(st_warp_sum(ss) / C + eps);
  S *o = out + (int64_t)row * C;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], wv[V], ov[V];
    st_load<S, V>(xv, x + c);
    st_load<S, V>(wv, w + c);
#pragma unroll
    for (int k = 0; k < V; k++) ov[k] = xv[k] * r * wv[k];
    st_store<S, V>(o + c, ov);
  }
  if (lane == 0) rstd[row] = r;
}

/* One row's input gradient, by one warp: dinp[row] += ..., and, when dw_row
 * is not NULL, dw_row[c] += dout * xhat for the lane's own columns. */
template <typename S, int V>
__device__ __forceinline__ void rms_row_backward(S *dinp, float *dw_row, const S *dout,
                                                 const S *inp, const S *w, const float *rstd,
                                                 int row, int C, int lane) {
  const S *x = inp + (int64_t)row * C, *d = dout + (int64_t)row * C;
  S *di = dinp + (int64_t)row * C;
  const float s = rstd[row];
  float gx = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V];
    st_load<S, V>(xv, x + c);
    st_load<S, V>(dv, d + c);
    st_load<S, V>(wv, w + c);
#pragma unroll
    for (int k = 0; k < V; k++) gx += dv[k] * wv[k] * xv[k] * s;
  }
  const float gxmean = st_warp_sum(gx) / C;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V], iv[V];
    st_load<S, V>(xv, x + c);
    st_load<S, V>(dv, d + c);
    st_load<S, V>(wv, w + c);
    st_load<S, V>(iv, di + c);
#pragma unroll
    for (int k = 0; k < V; k++) iv[k] += s * (dv[k] * wv[k] - xv[k] * s * gxmean);
    st_store<S, V>(di + c, iv);
    if (dw_row) {
#pragma unroll
      for (int k = 0; k < V; k++) dw_row[c + k] += dv[k] * xv[k] * s;
    }
  }
}

template <typename S, int V>
__global__ void rmsnorm_backward_dinp_kernel(S *dinp, const S *dout, const S *inp, const S *w,
                                             const float *rstd, int N, int C) {
  const int row = blockIdx.x * RMS_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  rms_row_backward<S, V>(dinp, nullptr, dout, inp, w, rstd, row, C, lane);
}

/* One block per chunk of rows (the column-sum chunks of kernels/colsum.h),
 * W = blockDim.x / 32 warps; warp q takes rows r0 + q, r0 + q + W, ... and
 * adds dout * xhat of each into sdw[q][C]; part[chunk][c] = the W rows
 * added in warp order. */
template <typename S, int V>
__global__ void rmsnorm_backward_fused_kernel(S *dinp, float *part, const S *dout, const S *inp,
                                              const S *w, const float *rstd, int N, int C,
                                              int rows_per_chunk) {
  extern __shared__ float sdw[];
  const int W = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float *mine = sdw + (size_t)warp * C;
  for (int c = lane; c < C; c += 32) mine[c] = 0.0f;
  __syncwarp();
  const int r0 = blockIdx.x * rows_per_chunk;
  const int r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  for (int row = r0 + warp; row < r1; row += W)
    rms_row_backward<S, V>(dinp, mine, dout, inp, w, rstd, row, C, lane);
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float t = 0.0f;
    for (int q = 0; q < W; q++) t += sdw[(size_t)q * C + c];
    part[(int64_t)blockIdx.x * C + c] = t;
  }
}

/* Warps per block of the fused backward: as many as 64 KiB of shared rows
 * allow, at most 8; 0 for the two-kernel path: when one row of C floats
 * passes what a block may have, or when there are fewer than 256 chunks
 * (N < 32768 rows), too few blocks of one chunk each to keep the memory
 * system busy. */
static int rms_fused_warps(int C, int chunks) {
  if (chunks < 256) return 0;
  const size_t row = (size_t)C * sizeof(float);
  if (row > (size_t)200 << 10) return 0;
  int W = (int)(((size_t)64 << 10) / row);
  return W < 1 ? 1 : W > 8 ? 8 : W;
}

/* Pass 1: block (band of 32 columns, chunk of rows); lane y sums rows y,
 * y+8, ... of the chunk, the 8 lane sums are added in lane order into
 * part[chunk][c]. */
template <typename S>
__global__ void rmsnorm_backward_part_kernel(float *part, const S *dout, const S *inp,
                                             const float *rstd, int N, int C,
                                             int rows_per_chunk) {
  __shared__ float sw[ST_COLSUM_LANES][ST_COLSUM_BAND];
  const int tx = threadIdx.x, ty = threadIdx.y, chunk = blockIdx.y;
  const int c = blockIdx.x * ST_COLSUM_BAND + tx;
  const int r0 = chunk * rows_per_chunk;
  const int r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float aw = 0.0f;
  if (c < C)
    for (int r = r0 + ty; r < r1; r += ST_COLSUM_LANES)
      aw += st_ld(dout[(int64_t)r * C + c]) * st_ld(inp[(int64_t)r * C + c]) * rstd[r];
  sw[ty][tx] = aw;
  __syncthreads();
  if (ty == 0 && c < C) {
    float tw = 0.0f;
    for (int y = 0; y < ST_COLSUM_LANES; y++) tw += sw[y][tx];
    part[(int64_t)chunk * C + c] = tw;
  }
}

/* Pass 2: dw[c] += the partials in chunk order. */
__global__ void rmsnorm_backward_reduce_kernel(float *dw, const float *part, int C, int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float aw = dw[c];
  for (int k = 0; k < chunks; k++) aw += part[(int64_t)k * C + c];
  dw[c] = aw;
}

template <typename S>
void cuda_rmsnorm_forward(void *out_, float *rstd, const void *inp_, const void *w_, int N, int C,
                          float eps) {
  S *out = (S *)out_;
  const S *inp = (const S *)inp_, *w = (const S *)w_;
  if (N == 0 || C == 0) return;
  constexpr int P = st_pack<S>();
  const unsigned grid = st_blocks(N, RMS_WARPS);
  if (C % P == 0 && st_aligned16(out) && st_aligned16(inp) && st_aligned16(w))
    rmsnorm_forward_kernel<S, P><<<grid, RMS_THREADS>>>(out, rstd, inp, w, N, C, eps);
  else
    rmsnorm_forward_kernel<S, 1><<<grid, RMS_THREADS>>>(out, rstd, inp, w, N, C, eps);
  ST_CUDA_LAUNCHED();
}

template <typename S>
void cuda_rmsnorm_backward(void *dinp_, float *dw, const void *dout_, const void *inp_,
                           const void *w_, const float *rstd, int N, int C) {
  S *dinp = (S *)dinp_;
  const S *dout = (const S *)dout_, *inp = (const S *)inp_, *w = (const S *)w_;
  if (N == 0 || C == 0) return;
  constexpr int P = st_pack<S>();
  const int rows = st_colsum_rows_per_chunk(N), chunks = st_colsum_chunks(N);
  const bool vec = C % P == 0 && st_aligned16(dinp) && st_aligned16(dout) && st_aligned16(inp) &&
                   st_aligned16(w);
  /* dw NULL (a frozen norm, LoRA's base): the input gradient only */
  const int W = dw ? rms_fused_warps(C, chunks) : 0;
  if (W > 0) {
    float *part = (float *)cuda_scratch((size_t)chunks * C * sizeof(float));
    const size_t smem = (size_t)W * C * sizeof(float);
    if (vec) {
      auto k = rmsnorm_backward_fused_kernel<S, P>;
      if (smem > (48 << 10))
        ST_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem));
      k<<<chunks, 32 * W, smem>>>(dinp, part, dout, inp, w, rstd, N, C, rows);
    } else {
      auto k = rmsnorm_backward_fused_kernel<S, 1>;
      if (smem > (48 << 10))
        ST_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem));
      k<<<chunks, 32 * W, smem>>>(dinp, part, dout, inp, w, rstd, N, C, rows);
    }
    ST_CUDA_LAUNCHED();
    rmsnorm_backward_reduce_kernel<<<st_blocks(C, 256), 256>>>(dw, part, C, chunks);
    ST_CUDA_LAUNCHED();
    return;
  }
  const unsigned grid = st_blocks(N, RMS_WARPS);
  if (vec)
    rmsnorm_backward_dinp_kernel<S, P><<<grid, RMS_THREADS>>>(dinp, dout, inp, w, rstd, N, C);
  else
    rmsnorm_backward_dinp_kernel<S, 1><<<grid, RMS_THREADS>>>(dinp, dout, inp, w, rstd, N, C);
  ST_CUDA_LAUNCHED();
  if (!dw) return;
  float *part = (float *)cuda_scratch((size_t)chunks * C * sizeof(float));
  dim3 pgrid(st_blocks(C, ST_COLSUM_BAND), chunks), block(ST_COLSUM_BAND, ST_COLSUM_LANES);
  rmsnorm_backward_part_kernel<S><<<pgrid, block>>>(part, dout, inp, rstd, N, C, rows);
  ST_CUDA_LAUNCHED();
  rmsnorm_backward_reduce_kernel<<<st_blocks(C, 256), 256>>>(dw, part, C, chunks);
  ST_CUDA_LAUNCHED();
}

#define RMS_INST(S)                                                                           \
  template void cuda_rmsnorm_forward<S>(void *, float *, const void *, const void *, int, int, \
                                        float);                                               \
  template void cuda_rmsnorm_backward<S>(void *, float *, const void *, const void *,         \
                                         const void *, const float *, int, int);
ST_FOR_EACH_STORAGE(RMS_INST)
