/* adamw.cu - AdamW (Loshchilov & Hutter 2019) in the form of
 * torch.optim.AdamW, one thread per element, on the fp32 master weights;
 * the updated weight is also rounded into the working copy (storage type)
 * when there is one, so no separate conversion pass reads p again. And the
 * sum of squares for the global gradient norm, in double over a fixed grid
 * whose block partials are added on the host in block order (deterministic,
 * no atomics). */
#include <math.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/master_split.h"

/* Element i's update of master value p; m[i] and v[i] in place. The one
 * expression both master layouts use, so they round alike. */
template <typename G>
__device__ __forceinline__ float adamw_value(float p, const G *g, float *m, float *v, int64_t i,
                                             float lr, float b1, float b2, float eps, float wd,
                                             float grad_scale, float bc1, float bc2) {
  float gi = st_ld(g[i]) * grad_scale;
  float mi = b1 * m[i] + (1.0f - b1) * gi;
  float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  float pi = p * (1.0f - lr * wd);
  pi -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
  return pi;
}

template <typename S, typename G>
__device__ __forceinline__ void adamw_one(float *p, const G *g, float *m, float *v, int64_t i,
                                          float lr, float b1, float b2, float eps, float wd,
                                          float grad_scale, float bc1, float bc2, S *work) {
  const float pi = adamw_value(p[i], g, m, v, i, lr, b1, b2, eps, wd, grad_scale, bc1, bc2);
  p[i] = pi;
  if (work) work[i] = st_st<S>(pi);
}

template <typename S, typename G>
__global__ void adamw_kernel(float *p, const G *g, float *m, float *v, int64_t n, float lr,
                             float b1, float b2, float eps, float wd, float grad_scale,
                             float bc1, float bc2, S *work) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    adamw_one(p, g, m, v, i, lr, b1, b2, eps, wd, grad_scale, bc1, bc2, work);
}

/* Passed by value (about 1.5 KB of kernel parameters): no device copy of
 * the table, so nothing is allocated or copied per step. */
typedef struct {
  int64_t end[ST_ADAMW_SEGS];
  float wd[ST_ADAMW_SEGS];
  int n;
} adamw_segs;

/* A thread's elements rise with the grid stride, so its segment only moves
 * forward: one binary search for the first element, then a short walk. */
template <typename S, typename G>
__global__ void adamw_segments_kernel(float *p, const G *g, float *m, float *v, int64_t n,
                                      const adamw_segs segs, float lr, float b1, float b2,
                                      float eps, float grad_scale, float bc1, float bc2,
                                      S *work) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  int lo = 0, hi = segs.n - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (i < segs.end[mid]) hi = mid;
    else lo = mid + 1;
  }
  for (int k = lo; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    while (i >= segs.end[k]) k++;
    adamw_one(p, g, m, v, i, lr, b1, b2, eps, segs.wd[k], grad_scale, bc1, bc2, work);
  }
}

/* The split master (kernels/master_split.h): the bf16 working weight is its
 * high half, lo the rest; the same segment walk. */
template <typename G>
__global__ void adamw_segments_split_kernel(int16_t *lo, const G *g, float *m, float *v,
                                            int64_t n, const adamw_segs segs, float lr, float b1,
                                            float b2, float eps, float grad_scale, float bc1,
                                            float bc2, uint16_t *work) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  int a = 0, z = segs.n - 1;
  while (a < z) {
    int mid = (a + z) / 2;
    if (i < segs.end[mid]) z = mid;
    else a = mid + 1;
  }
  for (int k = a; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    while (i >= segs.end[k]) k++;
    const float p = st_master_join(work[i], lo[i]);
    const float pi =
        adamw_value(p, g, m, v, i, lr, b1, b2, eps, segs.wd[k], grad_scale, bc1, bc2);
    uint16_t h;
    int16_t r;
    st_master_split(pi, &h, &r);
    work[i] = h;
    lo[i] = r;
  }
}

/* Segments of one call, checked, into the by-value table. */
static adamw_segs make_segs(const int64_t *seg_end, const float *seg_wd, int nseg) {
  if (nseg > ST_ADAMW_SEGS) st_cuda_fail("adamw_update_segments: more than ST_ADAMW_SEGS segments",
                                         __FILE__, __LINE__);
  adamw_segs segs;
  segs.n = nseg;
  for (int k = 0; k < nseg; k++) segs.end[k] = seg_end[k], segs.wd[k] = seg_wd[k];
  return segs;
}

/* --grad-dtype: the gradients' element type; fp32 and bf16 only. */
static int grad_is_bf16(st_dtype gdt, const char *op) {
  if (gdt != ST_FP32 && gdt != ST_BF16) st_cuda_fail(op, __FILE__, __LINE__);
  return gdt == ST_BF16;
}

void cuda_adamw_update_segments_split(int16_t *lo, const void *g, st_dtype gdt, float *m,
                                      float *v, int64_t n, const int64_t *seg_end,
                                      const float *seg_wd, int nseg, float lr, float b1, float b2,
                                      float eps, float grad_scale, int64_t t, uint16_t *work) {
  if (n <= 0 || nseg <= 0) return;
  const adamw_segs segs = make_segs(seg_end, seg_wd, nseg);
  const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
  const int blocks = st_blocks_capped(n, 256);
  if (grad_is_bf16(gdt, "adamw_update_segments_split: gradients neither fp32 nor bf16"))
    adamw_segments_split_kernel<<<blocks, 256>>>(lo, (const __nv_bfloat16 *)g, m, v, n, segs,
                                                 lr, b1, b2, eps, grad_scale, bc1, bc2, work);
  else
    adamw_segments_split_kernel<<<blocks, 256>>>(lo, (const float *)g, m, v, n, segs, lr, b1,
                                                 b2, eps, grad_scale, bc1, bc2, work);
  ST_CUDA_LAUNCHED();
}

template <typename S>
void cuda_adamw_update(float *p, const void *g, st_dtype gdt, float *m, float *v, int64_t n,
                       float lr, float b1, float b2, float eps, float wd, float grad_scale,
                       int64_t t, void *work_) {
  if (n <= 0) return;
  /* fp32 storage may use the master copy as its working copy */
  S *work = (void *)p == work_ ? NULL : (S *)work_;
  /* bias corrections in float on the host, as the CPU reference computes them */
  const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
  const int blocks = st_blocks_capped(n, 256);
  if (grad_is_bf16(gdt, "adamw_update: gradients neither fp32 nor bf16"))
    adamw_kernel<S><<<blocks, 256>>>(p, (const __nv_bfloat16 *)g, m, v, n, lr, b1, b2, eps, wd,
                                     grad_scale, bc1, bc2, work);
  else
    adamw_kernel<S><<<blocks, 256>>>(p, (const float *)g, m, v, n, lr, b1, b2, eps, wd,
                                     grad_scale, bc1, bc2, work);
  ST_CUDA_LAUNCHED();
}

template <typename S>
void cuda_adamw_update_segments(float *p, const void *g, st_dtype gdt, float *m, float *v,
                                int64_t n, const int64_t *seg_end, const float *seg_wd, int nseg,
                                float lr, float b1, float b2, float eps, float grad_scale,
                                int64_t t, void *work_) {
  if (n <= 0 || nseg <= 0) return;
  const adamw_segs segs = make_segs(seg_end, seg_wd, nseg);
  S *work = (void *)p == work_ ? NULL : (S *)work_;
  const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
  const int blocks = st_blocks_capped(n, 256);
  if (grad_is_bf16(gdt, "adamw_update_segments: gradients neither fp32 nor bf16"))
    adamw_segments_kernel<S><<<blocks, 256>>>(p, (const __nv_bfloat16 *)g, m, v, n, segs, lr,
                                              b1, b2, eps, grad_scale, bc1, bc2, work);
  else
    adamw_segments_kernel<S><<<blocks, 256>>>(p, (const float *)g, m, v, n, segs, lr, b1, b2,
                                              eps, grad_scale, bc1, bc2, work);
  ST_CUDA_LAUNCHED();
}

#define ADAMW_INST(S)                                                                         \
  template void cuda_adamw_update<S>(float *, const void *, st_dtype, float *, float *,       \
                                     int64_t, float, float, float, float, float, float,       \
                                     int64_t, void *);                                        \
  template void cuda_adamw_update_segments<S>(float *, const void *, st_dtype, float *,        \
                                              float *, int64_t, const int64_t *,              \
                                              const float *, int, float, float, float, float, \
                                              float, int64_t, void *);
ST_FOR_EACH_STORAGE(ADAMW_INST)

/* Reduced fp32 gradients into the bf16 shard: round to nearest even. */
__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}

void cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<st_blocks_capped(n, 256), 256>>>((__nv_bfloat16 *)dst, src, n);
  ST_CUDA_LAUNCHED();
}

#define SSQ_BLOCKS 512 /* fixed: the summation order must not depend on the GPU */
#define SSQ_THREADS 256

/* Thread k of the grid sums elements k, k + grid, ... in double; the block
 * adds its threads' sums in a fixed tree and writes one partial. A
 * non-finite element makes its square inf or nan, and both survive every
 * later addition (squares are never -inf, so inf + -inf cannot arise): the
 * loss scaler relies on the result being non-finite exactly then. Finite
 * floats cannot overflow it (each square is below 2^256 in double). */
template <typename X>
__global__ void sum_squares_kernel(double *part, const X *x, int64_t n) {
  __shared__ double s[SSQ_THREADS / 32];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * (int64_t)SSQ_THREADS + threadIdx.x; i < n;
       i += (int64_t)SSQ_BLOCKS * SSQ_THREADS) {
    double xi = st_ld(x[i]);
    acc += xi * xi;
  }
  acc = st_warp_sum_d(acc);
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < SSQ_THREADS / 32; w++) t += s[w];
    part[blockIdx.x] = t;
  }
}

double cuda_sum_squares(const void *x, st_dtype dt, int64_t n) {
  if (n <= 0) return 0.0;
  double *part = (double *)cuda_scratch(SSQ_BLOCKS * sizeof(double));
  if (grad_is_bf16(dt, "sum_squares: neither fp32 nor bf16"))
    sum_squares_kernel<<<SSQ_BLOCKS, SSQ_THREADS>>>(part, (const __nv_bfloat16 *)x, n);
  else
    sum_squares_kernel<<<SSQ_BLOCKS, SSQ_THREADS>>>(part, (const float *)x, n);
  ST_CUDA_LAUNCHED();
  double host[SSQ_BLOCKS];
  cuda_to_host(host, part, sizeof host);
  double s = 0.0;
  for (int k = 0; k < SSQ_BLOCKS; k++) s += host[k];
  return s;
}
