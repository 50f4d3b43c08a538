/* residual.cu - the residual add in the storage type, and dst += src on fp32
 * vectors (gradient shards). One thread per V elements (16-byte accesses when
 * the pointers allow, the remainder then in a second launch with V = 1). The
 * residual's backward is a pass-through that rank/model/model.c does by
 * accumulating into one buffer. */
#include "kernels/cuda/cuda_ops.h"

template <typename S, int V>
__global__ void residual_forward_kernel(S *out, const S *a, const S *b, int64_t npacks) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < npacks;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x[V], y[V];
    st_load<S, V>(x, a + i * V);
    st_load<S, V>(y, b + i * V);
#pragma unroll
    for (int k = 0; k < V; k++) x[k] += y[k];
    st_store<S, V>(out + i * V, x);
  }
}

template <typename S>
void cuda_residual_forward(void *out_, const void *a_, const void *b_, int64_t n) {
  S *out = (S *)out_;
  const S *a = (const S *)a_, *b = (const S *)b_;
  constexpr int P = st_pack<S>();
  int64_t done = 0;
  if (st_aligned16(out) && st_aligned16(a) && st_aligned16(b) && n >= P) {
    const int64_t np = n / P;
    residual_forward_kernel<S, P><<<st_blocks_capped(np, 256), 256>>>(out, a, b, np);
    ST_CUDA_LAUNCHED();
    done = np * P;
  }
  if (done < n) {
    residual_forward_kernel<S, 1><<<st_blocks_capped(n - done, 256), 256>>>(
        out + done, a + done, b + done, n - done);
    ST_CUDA_LAUNCHED();
  }
}

/* dst += src is the residual add with out = a = dst: each element is read
 * and written by the same thread, so the aliasing is harmless. */
void cuda_accumulate_f32(float *dst, const float *src, int64_t n) {
  cuda_residual_forward<float>(dst, dst, src, n);
}

#define RES_INST(S) \
  template void cuda_residual_forward<S>(void *, const void *, const void *, int64_t);
ST_FOR_EACH_STORAGE(RES_INST)
