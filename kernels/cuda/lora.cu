/* lora.cu - LoRA's column-slice add and gather and the counter-based
 * dropout (kernels/ops.h) in the storage type, arithmetic in fp32. The mask
 * is kernels/dropout_hash.h's, the CPU's, element for element. */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/dropout_hash.h"

template <typename S>
__global__ void lora_add_cols_kernel(S *y, const S *v, float scale, int OC, int col0, int n,
                                     int64_t total) {
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
       k += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = k / n, j = k % n;
    S *o = y + i * OC + col0 + j;
    *o = st_st<S>(st_ld(*o) + scale * st_ld(v[k]));
  }
}

template <typename S>
__global__ void lora_take_cols_kernel(S *dst, const S *y, float scale, int OC, int col0, int n,
                                      int64_t total) {
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
       k += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = k / n, j = k % n;
    dst[k] = st_st<S>(scale * st_ld(y[i * OC + col0 + j]));
  }
}

template <typename S>
__global__ void dropout_kernel(S *out, const S *in, int64_t n, float p, float keep,
                               uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = st_dropout_uniform(seed, (uint64_t)i) >= p ? st_st<S>(st_ld(in[i]) * keep)
                                                        : st_st<S>(0.0f);
}

template <typename S>
void cuda_lora_add_cols(void *y, const void *v, float scale, int N, int OC, int col0, int n) {
  const int64_t total = (int64_t)N * n;
  if (total == 0) return;
  lora_add_cols_kernel<S><<<st_blocks_capped(total, 256), 256>>>((S *)y, (const S *)v, scale, OC,
                                                                 col0, n, total);
  ST_CUDA_LAUNCHED();
}

template <typename S>
void cuda_lora_take_cols(void *dst, const void *y, float scale, int N, int OC, int col0, int n) {
  const int64_t total = (int64_t)N * n;
  if (total == 0) return;
  lora_take_cols_kernel<S><<<st_blocks_capped(total, 256), 256>>>((S *)dst, (const S *)y, scale,
                                                                  OC, col0, n, total);
  ST_CUDA_LAUNCHED();
}

template <typename S>
void cuda_dropout(void *out, const void *in, int64_t n, float p, uint64_t seed) {
  if (n == 0) return;
  dropout_kernel<S><<<st_blocks_capped(n, 256), 256>>>((S *)out, (const S *)in, n, p,
                                                       1.0f / (1.0f - p), seed);
  ST_CUDA_LAUNCHED();
}

#define LORA_INST(S)                                                                       \
  template void cuda_lora_add_cols<S>(void *, const void *, float, int, int, int, int);    \
  template void cuda_lora_take_cols<S>(void *, const void *, float, int, int, int, int);   \
  template void cuda_dropout<S>(void *, const void *, int64_t, float, uint64_t);
ST_FOR_EACH_STORAGE(LORA_INST)
