/* layernorm.cu - LayerNorm over the channel dim (Ba et al. 2016), eps 1e-5
 * as in GPT-2 / torch.nn.LayerNorm. One warp per row for the forward and for
 * the input gradient; dw and db (sums over rows) in two passes: per-chunk
 * column partials, then the partials added in chunk order. */
#include "kernels/cuda/cuda_ops.h"

#define LN_THREADS 256
#define LN_WARPS (LN_THREADS / 32)

__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                         const float *w, const float *b, int N, int C) {
  int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *x = inp + (int64_t)row * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = st_warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float d = x[c] - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(st_warp_sum(v) / C + 1e-5f);
  float *o = out + (int64_t)row * C;
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * w[c] + b[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

/* dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w. */
__global__ void layernorm_backward_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                               const float *w, const float *mean,
                                               const float *rstd, int N, int C) {
  int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *x = inp + (int64_t)row * C, *d = dout + (int64_t)row * C;
  float *di = dinp + (int64_t)row * C;
  const float m = mean[row], s = rstd[row];
  float gsum = 0.0f, gxsum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float g = d[c] * w[c];
    gsum += g;
    gxsum += g * (x[c] - m) * s;
  }
  const float gmean = st_warp_sum(gsum) / C, gxmean = st_warp_sum(gxsum) / C;
  for (int c = lane; c < C; c += 32) {
    float xhat = (x[c] - m) * s;
    di[c] += s * (d[c] * w[c] - gmean - xhat * gxmean);
  }
}

/* Pass 1: block (band of 32 columns, chunk of rows). Lane y of the block sums
 * rows y, y+8, ... of the chunk; the 8 lane sums are added in lane order.
 * part[chunk][0:C] gets dw, part[chunk][C:2C] gets db. */
__global__ void layernorm_backward_part_kernel(float *part, const float *dout, const float *inp,
                                               const float *mean, const float *rstd, int N,
                                               int C, int rows_per_chunk) {
  __shared__ float sw[ST_COLSUM_LANES][ST_COLSUM_BAND], sb[ST_COLSUM_LANES][ST_COLSUM_BAND];
  const int tx = threadIdx.x, ty = threadIdx.y, chunk = blockIdx.y;
  const int c = blockIdx.x * ST_COLSUM_BAND + tx;
  const int r0 = chunk * rows_per_chunk;
  const int r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float aw = 0.0f, ab = 0.0f;
  if (c < C)
    for (int r = r0 + ty; r < r1; r += ST_COLSUM_LANES) {
      float d = dout[(int64_t)r * C + c];
      aw += d * (inp[(int64_t)r * C + c] - mean[r]) * rstd[r];
      ab += d;
    }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int y = 0; y < ST_COLSUM_LANES; y++) {
      tw += sw[y][tx];
      tb += sb[y][tx];
    }
    part[(int64_t)chunk * 2 * C + c] = tw;
    part[(int64_t)chunk * 2 * C + C + c] = tb;
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

void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, int N, int C) {
  if (N == 0) return;
  layernorm_forward_kernel<<<st_blocks(N, LN_WARPS), LN_THREADS>>>(out, mean, rstd, inp, w, b,
                                                                  N, C);
  ST_CUDA_LAUNCHED();
}

void cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, const float *mean,
                             const float *rstd, int N, int C) {
  if (N == 0 || C == 0) return;
  layernorm_backward_dinp_kernel<<<st_blocks(N, LN_WARPS), LN_THREADS>>>(dinp, dout, inp, w,
                                                                        mean, rstd, N, C);
  ST_CUDA_LAUNCHED();
  const int rows = st_colsum_rows_per_chunk(N), chunks = st_colsum_chunks(N);
  float *part = (float *)cuda_scratch((size_t)chunks * 2 * C * sizeof(float));
  dim3 grid(st_blocks(C, ST_COLSUM_BAND), chunks), block(ST_COLSUM_BAND, ST_COLSUM_LANES);
  layernorm_backward_part_kernel<<<grid, block>>>(part, dout, inp, mean, rstd, N, C, rows);
  ST_CUDA_LAUNCHED();
  layernorm_backward_reduce_kernel<<<st_blocks(C, 256), 256>>>(dw, db, part, C, chunks);
  ST_CUDA_LAUNCHED();
}
