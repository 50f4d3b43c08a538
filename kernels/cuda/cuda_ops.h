/* cuda_ops.h - the CUDA backend's kernels, gathered into the op tables by
 * ops_table.cu; signatures and semantics are those of kernels/ops.h. Also
 * the helpers every .cu file shares: error checks, launch geometry, warp
 * reductions, storage-dtype loads and stores, and the backend's scratch
 * buffer.
 *
 * Every op is a template on its storage type S (float, __nv_bfloat16 or
 * __half), instantiated for all three in its own .cu file; ops_table.cu
 * puts the instantiations of one S into one table. Kernels load S, compute
 * in fp32, and round once when they store S (round to nearest even).
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
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "kernels/colsum.h"
#include "kernels/ops.h"
}

/* ---- errors: the op table returns nothing, so a failed launch or CUDA call
 * (a bug or a dead device, never a planned condition) prints where and what,
 * and ends the process with exit code 1. An out-of-memory there
 * (cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED) goes to
 * st_cuda_oom instead: st_oom_fatal (kernels/arena.h), which the trainer
 * reports against the plan, exit code 7. alloc's own failures are not
 * fatal: it returns NULL as ops.h says. */
void st_cuda_fail(const char *what, const char *file, int line);
void st_cuda_oom(const char *call, const char *what, const char *file, int line);
#define ST_CUDA_CHECK(call)                                                      \
  do {                                                                           \
    cudaError_t st_err_ = (call);                                                \
    if (st_err_ == cudaErrorMemoryAllocation)                                    \
      st_cuda_oom(#call, cudaGetErrorString(st_err_), __FILE__, __LINE__);      \
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

/* ---- storage dtypes. st_ld widens one element to fp32; st_st<S> rounds an
 * fp32 value to S (nearest even, the rounding of st_dtype_from_f32 on the
 * host, so host and device conversions agree bit for bit). */
__device__ __forceinline__ float st_ld(float x) { return x; }
__device__ __forceinline__ float st_ld(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float st_ld(__half x) { return __half2float(x); }
template <typename S> __device__ __forceinline__ S st_st(float x);
template <> __device__ __forceinline__ float st_st<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 st_st<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half st_st<__half>(float x) {
  return __float2half_rn(x);
}

/* Elements of S in one 16-byte access (4 fp32, 8 bf16/fp16). */
template <typename S> constexpr int st_pack() { return (int)(16 / sizeof(S)); }

/* V consecutive elements as one access: V = st_pack<S>() for 16-byte loads
 * and stores (the address must be 16-byte aligned), V = 1 for plain ones.
 * Kernels take V as a template parameter and the host picks the 16-byte
 * instantiation only when every pointer is aligned (st_aligned16) and the
 * row length is a multiple of V: parameter views can start at any element. */
template <typename S, int V> struct alignas(sizeof(S) * V) st_vec { S v[V]; };

template <typename S, int V>
__device__ __forceinline__ void st_load(float (&f)[V], const S *p) {
  st_vec<S, V> k;
  if constexpr (sizeof(k) == 16) {
    const int4 raw = *reinterpret_cast<const int4 *>(p); /* one 128-bit load */
    memcpy(&k, &raw, 16);
  } else {
    k = *reinterpret_cast<const st_vec<S, V> *>(p);
  }
#pragma unroll
  for (int i = 0; i < V; i++) f[i] = st_ld(k.v[i]);
}

template <typename S, int V>
__device__ __forceinline__ void st_store(S *p, const float (&f)[V]) {
  st_vec<S, V> k;
#pragma unroll
  for (int i = 0; i < V; i++) k.v[i] = st_st<S>(f[i]);
  if constexpr (sizeof(k) == 16) {
    int4 raw;
    memcpy(&raw, &k, 16);
    *reinterpret_cast<int4 *>(p) = raw;
  } else {
    *reinterpret_cast<st_vec<S, V> *>(p) = k;
  }
}

static inline bool st_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The st_dtype of a storage type. */
template <typename S> constexpr st_dtype st_storage_dtype();
template <> constexpr st_dtype st_storage_dtype<float>() { return ST_FP32; }
template <> constexpr st_dtype st_storage_dtype<__nv_bfloat16>() { return ST_BF16; }
template <> constexpr st_dtype st_storage_dtype<__half>() { return ST_FP16; }

/* cuBLASLt's name for a storage type. */
template <typename S> constexpr cudaDataType_t st_cuda_type();
template <> constexpr cudaDataType_t st_cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t st_cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <> constexpr cudaDataType_t st_cuda_type<__half>() { return CUDA_R_16F; }

/* Explicit instantiation of an op family for the three storage types: each
 * .cu file defines X(S) as the list of its entry points for S. */
#define ST_FOR_EACH_STORAGE(X) X(float) X(__nv_bfloat16) X(__half)

/* ---- column sums over rows in a fixed order (layernorm dw/db, matmul
 * dbias): chunking in kernels/colsum.h, shared with the memory planner. */
#define ST_COLSUM_BAND 32 /* columns per block (one warp wide) */
#define ST_COLSUM_LANES 8 /* row lanes per block */

/* ---- memory (memory.cu) */
void *cuda_alloc(size_t bytes, const char *category);
/* bytes of device memory for the backend's own buffers (workspaces,
 * scratch): carved from the arena while one is open, else one counted
 * cudaMalloc, not zeroed. NULL when the memory is not there (never fatal). */
void *cuda_buffer(size_t bytes, const char *category);
void cuda_use_arena(st_arena *arena);
/* 1 when p lies in the arena in use (the owner frees it, not us). */
int cuda_arena_owns(const void *p);
void cuda_free(void *p);
void cuda_zero(void *p, size_t bytes);
void cuda_to_device(void *dst, const void *host_src, size_t bytes);
void cuda_to_host(void *host_dst, const void *src, size_t bytes);
void cuda_synchronize(void);
void *cuda_host_alloc(size_t bytes, const char *category);
void cuda_host_free(void *p);
void cuda_to_host_async(void *host_dst, const void *src, size_t bytes, int tag);
void cuda_to_device_async(void *dst, const void *host_src, size_t bytes, int tag);
void cuda_copy_wait(int tag);
/* Device scratch of at least `bytes`, owned by the backend and reused by every
 * op that needs partial sums; grows (never shrinks) on first use of a size, so
 * after the first step nothing is allocated. Valid until the next call. */
void *cuda_scratch(size_t bytes);
/* kernels/ops.h's reserve and allocations. cuda_note_alloc counts one
 * allocation of the backend's (what: "alloc", "cuda_scratch growth", ...). */
int cuda_reserve(size_t workspace_bytes, size_t scratch_bytes);
int64_t cuda_allocations(const char **last);
void cuda_note_alloc(const char *what, size_t bytes);
/* The cuBLASLt handle and a workspace of bytes (0: the default 32 MiB),
 * made now rather than on the first matmul (matmul.cu); 0 or -1, never
 * fatal. A workspace already made is kept when it is at least that size. */
int cuda_matmul_reserve(size_t bytes);
/* The cuDNN attention workspace st_cuda_attention_select asked for, made
 * now (attention.cu); 0 or -1, never fatal. */
int cuda_attention_reserve(void);
/* The arena is about to be freed: drop the handle and workspace when the
 * workspace was carved from it. */
void cuda_matmul_leave_arena(const st_arena *arena);
/* The same for the cuDNN attention workspace (attention.cu). */
void cuda_attention_leave_arena(const st_arena *arena);

/* ---- ops (one file per family, mirroring kernels/cpu/). S is the storage
 * type of every void * tensor; float * tensors are fp32 whatever S is. */
template <typename S>
void cuda_encoder_forward(void *out, const int *inp, const void *wte, const void *wpe, int B,
                          int T, int C);
template <typename S>
void cuda_encoder_backward(float *dwte, float *dwpe, const void *dout, const int *inp, int B,
                           int T, int C, void *scratch, size_t scratch_bytes);
template <typename S>
void cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *w,
                            const void *b, int N, int C);
template <typename S>
void cuda_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
                             const void *inp, const void *w, const float *mean,
                             const float *rstd, int N, int C);
template <typename S>
void cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                          float eps);
template <typename S>
void cuda_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp,
                           const void *w, const float *rstd, int N, int C);
template <typename S>
void cuda_rope_forward(void *qkv, const float *cs, int B, int T, int pos0, int NH, int NKV,
                       int HD);
template <typename S>
void cuda_rope_backward(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int HD);
template <typename S>
void cuda_matmul_forward(void *out, const void *inp, const void *w, const void *bias, int N,
                         int C, int OC);
template <typename S>
void cuda_matmul_residual_forward(void *out, const void *inp, const void *w, const void *bias,
                                  const void *res, int N, int C, int OC);
template <typename S>
void cuda_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout,
                          const void *inp, const void *w, int N, int C, int OC);
template <typename S>
void cuda_matmul_backward_input(void *dinp, const void *dout, const void *w, int N, int C,
                                int OC);
template <typename S> void cuda_nf4_dequantize(void *dst, const struct st_nf4 *q);
template <typename S> int cuda_nf4_quantize(struct st_nf4 *q, const void *src, void *workspace);
template <typename S>
void cuda_matmul_gelu_forward(void *out, void *pre, const void *inp, const void *w,
                              const void *bias, int N, int C, int OC);
template <typename S>
void cuda_matmul_backward_gelu(void *dinp, float *dw, float *dbias, const void *dout,
                               const void *inp, const void *w, const void *pre, int N, int C,
                               int OC);
int64_t cuda_attention_state_floats(int B, int T, int NH);
template <typename S>
void cuda_attention_forward(void *out, float *att, const void *qkv, int B, int T, int C,
                            int NH, int NKV);
template <typename S>
void cuda_attention_backward(void *dqkv, float *datt, const void *dout, const void *qkv,
                             const void *out, const float *att, int B, int T, int C, int NH,
                             int NKV);
template <typename S>
void cuda_attention_decode(void *out, void *kcache, void *vcache, const void *qkv, int B,
                           int n_new, int pos0, int maxT, int C, int NH, int NKV);
template <typename S> void cuda_gelu_forward(void *out, const void *inp, int64_t n);
template <typename S>
void cuda_gelu_backward(void *dinp, const void *inp, const void *dout, int64_t n);
template <typename S> void cuda_swiglu_forward(void *out, const void *inp, int N, int F);
template <typename S>
void cuda_swiglu_backward(void *dinp, const void *dout, const void *inp, int N, int F);
template <typename S>
void cuda_residual_forward(void *out, const void *a, const void *b, int64_t n);
void cuda_accumulate_f32(float *dst, const float *src, int64_t n);
template <typename S>
void cuda_lora_add_cols(void *y, const void *v, float scale, int N, int OC, int col0, int n);
template <typename S>
void cuda_lora_take_cols(void *dst, const void *y, float scale, int N, int OC, int col0, int n);
template <typename S>
void cuda_dropout(void *out, const void *in, int64_t n, float p, uint64_t seed);
template <typename S>
void cuda_softmax_crossentropy(float *loss, void *dlogits, const void *logits,
                               const int *targets, float dloss, int N, int V, int Vp);
template <typename S>
void cuda_adamw_update(float *p, const void *g, st_dtype gdt, float *m, float *v, int64_t n,
                       float lr, float b1, float b2, float eps, float wd, float grad_scale,
                       int64_t t, void *work);
template <typename S>
void cuda_adamw_update_segments(float *p, const void *g, st_dtype gdt, float *m, float *v,
                                int64_t n, const int64_t *seg_end, const float *seg_wd, int nseg,
                                float lr, float b1, float b2, float eps, float grad_scale,
                                int64_t t, void *work);
/* bf16 storage only (kernels/master_split.h) */
void cuda_adamw_update_segments_split(int16_t *lo, const void *g, st_dtype gdt, float *m,
                                      float *v, int64_t n, const int64_t *seg_end,
                                      const float *seg_wd, int nseg, float lr, float b1, float b2,
                                      float eps, float grad_scale, int64_t t, uint16_t *work);
void cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);
double cuda_sum_squares(const void *x, st_dtype dt, int64_t n);

#endif
