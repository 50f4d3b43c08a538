/* cuda_ops.h - the CUDA backend's kernels, gathered into the op table by
 * ops_table.cu; signatures and semantics are those of kernels/ops.h. Also
 * the helpers every .cu file shares: error checks, launch geometry, warp
 * reductions and the backend's scratch buffer.
 *
 * Everything runs on the legacy default stream of the current device, so
 * ops are ordered with each other and with the synchronous copies of the
 * memory functions. Reductions never use floating-point atomics: each sum
 * is owned by one thread, warp or block and taken in a fixed order, so a
 * result is bit-for-bit the same from run to run on the same GPU model.
 */
#ifndef ST_CUDA_OPS_H
#define ST_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

extern "C" {
#include "kernels/ops.h"
}

/* ---- errors: the op table returns nothing, so a failed launch or CUDA call
 * (a bug or a dead device, never a planned condition) prints where and what,
 * and ends the process with exit code 1. Allocation failures are not fatal:
 * alloc returns NULL as ops.h says. */
void st_cuda_fail(const char *what, const char *file, int line);
#define ST_CUDA_CHECK(call)                                                      \
  do {                                                                           \
    cudaError_t st_err_ = (call);                                                \
    if (st_err_ != cudaSuccess) st_cuda_fail(cudaGetErrorString(st_err_), __FILE__, __LINE__); \
  } while (0)
/* After every kernel launch: catches bad launch configurations at once. */
#define ST_CUDA_LAUNCHED() ST_CUDA_CHECK(cudaGetLastError())

/* ---- launch geometry */
static inline unsigned st_blocks(int64_t n, int threads) {
  return (unsigned)((n + threads - 1) / threads);
}
/* Grid for elementwise kernels with a grid-stride loop: enough blocks to fill
 * the GPU, capped so that gridDim.x stays in range for any n. */
static inline unsigned st_blocks_capped(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b > 65536) b = 65536;
  if (b < 1) b = 1;
  return (unsigned)b;
}

/* ---- warp reductions (butterfly: every lane gets the same result, and the
 * order of additions is fixed by the lane pattern) */
__device__ __forceinline__ float st_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double st_warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float st_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* ---- column sums over rows in a fixed order (layernorm dw/db, matmul
 * dbias): rows are cut into chunks that depend only on N, each chunk's
 * per-column partial is written to scratch, and a second pass adds the
 * partials to the gradient in chunk order. */
#define ST_COLSUM_BAND 32 /* columns per block (one warp wide) */
#define ST_COLSUM_LANES 8 /* row lanes per block */
static inline int st_colsum_rows_per_chunk(int N) {
  int r = (N + 1023) / 1024; /* at most 1024 chunks */
  if (r < 128) r = 128;
  return r;
}
static inline int st_colsum_chunks(int N) {
  int r = st_colsum_rows_per_chunk(N);
  return (N + r - 1) / r;
}

/* ---- memory (memory.cu) */
void *cuda_alloc(size_t bytes);
void cuda_free(void *p);
void cuda_zero(void *p, size_t bytes);
void cuda_to_device(void *dst, const void *host_src, size_t bytes);
void cuda_to_host(void *host_dst, const void *src, size_t bytes);
/* Device scratch of at least `bytes`, owned by the backend and reused by every
 * op that needs partial sums; grows (never shrinks) on first use of a size, so
 * after the first step nothing is allocated. Valid until the next call. */
void *cuda_scratch(size_t bytes);

/* ---- ops (one file per family, mirroring kernels/cpu/) */
void cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe,
                          int B, int T, int C);
void cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp,
                           int B, int T, int C);
void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, int N, int C);
void cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, const float *mean,
                             const float *rstd, int N, int C);
void cuda_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                         int N, int C, int OC);
void cuda_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                          const float *inp, const float *w, int N, int C, int OC);
int64_t cuda_attention_state_floats(int B, int T, int NH);
void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH);
void cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH);
void cuda_gelu_forward(float *out, const float *inp, int64_t n);
void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
void cuda_residual_forward(float *out, const float *a, const float *b, int64_t n);
void cuda_softmax_crossentropy(float *loss, float *dlogits, const float *logits,
                               const int *targets, float dloss, int N, int V, int Vp);
void cuda_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                       float b1, float b2, float eps, float wd, float grad_scale, int64_t t);
double cuda_sum_squares(const float *x, int64_t n);

#endif
