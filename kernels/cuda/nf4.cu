/* nf4.cu - NF4 weights on the GPU (format: kernels/nf4.h): dequantisation
 * into the storage dtype, the kernel every NF4 matmul runs before its GEMM
 * (kernels/nf4_matmul.c), and quantisation, which an import runs once per
 * base weight at setup.
 *
 * Both match the host reference (kernels/cpu/nf4.c) bit for bit: the same
 * code tables and searches (kernels/nf4_tables.h), every fp32 operation
 * rounded once (__fmul_rn/__fadd_rn/__fdiv_rn: nvcc would otherwise fuse
 * the absmax's multiply and add), and the offset's double sum taken in the
 * order st_nf4_mean documents. Nothing here uses floating-point atomics.
 */
#include "kernels/cuda/cuda_ops.h"

extern "C" {
#include "kernels/nf4.h"
}
#include "kernels/nf4_tables.h"

__constant__ float c_code[16] = {ST_NF4_CODE_VALUES};
__constant__ float c_mid[15] = {ST_NF4_MID_VALUES};
__constant__ float c_dyn[256] = {ST_NF4_DYNAMIC_CODE_VALUES};

#define NF4_THREADS 256
#define NF4_PER_THREAD 16 /* elements per thread of the fast path: 8 code bytes */

/* The tables the threads index with different values (constant memory
 * serialises those) copied to shared memory. */
__device__ __forceinline__ void load_tables(float *s_code, float *s_dyn) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) s_dyn[i] = c_dyn[i];
  if (threadIdx.x < 16) s_code[threadIdx.x] = c_code[threadIdx.x];
  __syncthreads();
}

__device__ __forceinline__ float block_absmax(const float *s_dyn, const uint8_t *acodes,
                                              const float *absmax2, float offset, int64_t b) {
  return __fadd_rn(__fmul_rn(s_dyn[acodes[b]], absmax2[b / ST_NF4_BLOCK2]), offset);
}

/* Fast path (n a multiple of 16, dst 16-byte aligned): thread t turns code
 * bytes [8t, 8t+8) (one 8-byte load) into elements [16t, 16t+16), all in
 * first-level block t/4, stored with 16-byte stores. */
template <typename S>
__global__ void nf4_dequant16_kernel(S *dst, const uint2 *codes, const uint8_t *acodes,
                                     const float *absmax2, float offset, int64_t nt) {
  __shared__ float s_code[16], s_dyn[256];
  load_tables(s_code, s_dyn);
  constexpr int V = (int)(16 / sizeof(S)); /* st_pack<S>(), which is host-only */
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < nt;
       t += (int64_t)gridDim.x * blockDim.x) {
    const uint2 c = codes[t];
    const float a = block_absmax(s_dyn, acodes, absmax2, offset, t >> 2);
    float f[NF4_PER_THREAD];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const unsigned byte = ((j < 4 ? c.x : c.y) >> (8 * (j & 3))) & 0xffu;
      f[2 * j] = __fmul_rn(s_code[byte >> 4], a);
      f[2 * j + 1] = __fmul_rn(s_code[byte & 15u], a);
    }
#pragma unroll
    for (int k = 0; k < NF4_PER_THREAD; k += V) {
      float part[V];
#pragma unroll
      for (int i = 0; i < V; i++) part[i] = f[k + i];
      st_store<S, V>(dst + t * NF4_PER_THREAD + k, part);
    }
  }
}

/* Any n and alignment: one element per thread. */
template <typename S>
__global__ void nf4_dequant1_kernel(S *dst, const uint8_t *codes, const uint8_t *acodes,
                                    const float *absmax2, float offset, int64_t n) {
  __shared__ float s_code[16], s_dyn[256];
  load_tables(s_code, s_dyn);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const unsigned byte = codes[i >> 1];
    const float a = block_absmax(s_dyn, acodes, absmax2, offset, i / ST_NF4_BLOCK);
    dst[i] = st_st<S>(__fmul_rn(s_code[(i & 1) ? (byte & 15u) : (byte >> 4)], a));
  }
}

template <typename S> void cuda_nf4_dequantize(void *dst, const st_nf4 *q) {
  const int64_t n = q->rows * q->cols;
  if (n <= 0) return;
  if (n % NF4_PER_THREAD == 0 && st_aligned16(dst) && ((uintptr_t)q->codes & 7u) == 0) {
    const int64_t nt = n / NF4_PER_THREAD;
    nf4_dequant16_kernel<S><<<st_blocks_capped(nt, NF4_THREADS), NF4_THREADS>>>(
        (S *)dst, (const uint2 *)q->codes, q->absmax_codes, q->absmax2, q->offset, nt);
  } else {
    nf4_dequant1_kernel<S><<<st_blocks_capped(n, NF4_THREADS), NF4_THREADS>>>(
        (S *)dst, q->codes, q->absmax_codes, q->absmax2, q->offset, n);
  }
  ST_CUDA_LAUNCHED();
}

/* Quantisation, first level: one warp per block of 64, lane l holding
 * elements 2l and 2l+1 (one code byte). absmax[b] in fp32; *bad set when
 * an element is not finite (an integer flag, order-free). */
template <typename S>
__global__ void nf4_quant_first_kernel(const S *src, uint8_t *codes, float *absmax, int *bad,
                                       int64_t n, int64_t nb) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  for (int64_t b = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; b < nb; b += warps) {
    const int64_t i = b * ST_NF4_BLOCK + 2 * lane;
    const float x0 = i < n ? st_ld(src[i]) : 0.0f;
    const float x1 = i + 1 < n ? st_ld(src[i + 1]) : 0.0f;
    if (!isfinite(x0) || !isfinite(x1)) atomicOr(bad, 1);
    const float m = st_warp_max(fmaxf(fabsf(x0), fabsf(x1)));
    const float r = __fdiv_rn(1.0f, fmaxf(m, 1e-38f)); /* bitsandbytes: 0-blocks quantise to 0.0 */
    if (i < n) {
      const unsigned hi = st_nf4_index(__fmul_rn(x0, r), c_mid);
      const unsigned lo = i + 1 < n ? st_nf4_index(__fmul_rn(x1, r), c_mid) : ST_NF4_ZERO_INDEX;
      codes[i >> 1] = (uint8_t)(hi << 4 | lo);
    }
    if (lane == 0) absmax[b] = m;
  }
}

/* The offset: st_nf4_mean's sums in its order (256 interleaved double
 * partial sums, then halved pairwise), one block of 256 threads. */
__global__ void nf4_mean_kernel(const float *absmax, int64_t nb, float *offset) {
  __shared__ double s[ST_NF4_BLOCK2];
  const int t = threadIdx.x;
  double acc = 0.0;
  for (int64_t i = t; i < nb; i += ST_NF4_BLOCK2) acc = __dadd_rn(acc, (double)absmax[i]);
  s[t] = acc;
  __syncthreads();
  for (int h = ST_NF4_BLOCK2 / 2; h > 0; h >>= 1) {
    if (t < h) s[t] = __dadd_rn(s[t], s[t + h]);
    __syncthreads();
  }
  if (t == 0) *offset = nb > 0 ? (float)__ddiv_rn(s[0], (double)nb) : 0.0f;
}

/* Second level: one block of 256 threads per group of 256 absmax values. */
__global__ void nf4_quant_second_kernel(const float *absmax, const float *offset,
                                        uint8_t *acodes, float *absmax2, int64_t nb) {
  __shared__ float s_code[16], s_dyn[256];
  __shared__ float s_max[ST_NF4_BLOCK2 / 32];
  load_tables(s_code, s_dyn);
  const int64_t b = blockIdx.x * (int64_t)ST_NF4_BLOCK2 + threadIdx.x;
  const float a = b < nb ? __fsub_rn(absmax[b], *offset) : 0.0f;
  float m = st_warp_max(fabsf(a));
  if ((threadIdx.x & 31) == 0) s_max[threadIdx.x / 32] = m;
  __syncthreads();
  m = s_max[0];
  for (int w = 1; w < ST_NF4_BLOCK2 / 32; w++) m = fmaxf(m, s_max[w]);
  if (b < nb) acodes[b] = st_nf4_dynamic_index(m > 0.0f ? __fdiv_rn(a, m) : 0.0f, s_dyn);
  if (threadIdx.x == 0) absmax2[blockIdx.x] = m;
}

template <typename S> int cuda_nf4_quantize(st_nf4 *q, const void *src, void *workspace) {
  const st_nf4_sizes sz = st_nf4_size(q->rows, q->cols);
  q->offset = 0.0f;
  if (sz.n <= 0) return 0;
  float *absmax = (float *)workspace;
  char *tail = (char *)workspace + ((sz.blocks * sizeof(float) + 255) & ~(size_t)255);
  float *d_offset = (float *)tail;
  int *d_bad = (int *)(tail + 16);
  cuda_zero(tail, 32);
  const int64_t threads = sz.blocks * 32;
  nf4_quant_first_kernel<S><<<st_blocks_capped(threads, NF4_THREADS), NF4_THREADS>>>(
      (const S *)src, q->codes, absmax, d_bad, sz.n, sz.blocks);
  ST_CUDA_LAUNCHED();
  nf4_mean_kernel<<<1, ST_NF4_BLOCK2>>>(absmax, sz.blocks, d_offset);
  ST_CUDA_LAUNCHED();
  nf4_quant_second_kernel<<<(unsigned)sz.blocks2, ST_NF4_BLOCK2>>>(absmax, d_offset,
                                                                   q->absmax_codes, q->absmax2,
                                                                   sz.blocks);
  ST_CUDA_LAUNCHED();
  int bad = 0;
  cuda_to_host(&q->offset, d_offset, sizeof(float));
  cuda_to_host(&bad, d_bad, sizeof(int));
  return bad ? -1 : 0;
}

#define NF4_INST(S)                                                     \
  template void cuda_nf4_dequantize<S>(void *, const st_nf4 *);        \
  template int cuda_nf4_quantize<S>(st_nf4 *, const void *, void *);
ST_FOR_EACH_STORAGE(NF4_INST)
