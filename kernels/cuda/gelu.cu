/* gelu.cu - GELU with the tanh approximation (Hendrycks & Gimpel 2016), the
 * form GPT-2 uses: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). One
 * thread per V elements (16-byte accesses when the pointers allow, the
 * remainder then in a second launch with V = 1); the backward accumulates
 * into dinp. */
#include "kernels/cuda/cuda_ops.h"

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

template <typename S, int V>
__global__ void gelu_forward_kernel(S *out, const S *inp, int64_t npacks) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < npacks;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x[V], y[V];
    st_load<S, V>(x, inp + i * V);
#pragma unroll
    for (int k = 0; k < V; k++)
      y[k] = 0.5f * x[k] * (1.0f + tanhf(GELU_S * (x[k] + 0.044715f * x[k] * x[k] * x[k])));
    st_store<S, V>(out + i * V, y);
  }
}

template <typename S, int V>
__global__ void gelu_backward_kernel(S *dinp, const S *inp, const S *dout, int64_t npacks) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < npacks;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x[V], d[V], di[V];
    st_load<S, V>(x, inp + i * V);
    st_load<S, V>(d, dout + i * V);
#pragma unroll
    for (int k = 0; k < V; k++) {
      float u = GELU_S * (x[k] + 0.044715f * x[k] * x[k] * x[k]);
      float th = tanhf(u);
      float sech2 = 1.0f - th * th;
      float grad = 0.5f * (1.0f + th) +
                   0.5f * x[k] * sech2 * GELU_S * (1.0f + 3.0f * 0.044715f * x[k] * x[k]);
      di[k] = grad * d[k];
    }
    st_store<S, V>(dinp + i * V, di);
  }
}

template <typename S>
void cuda_gelu_forward(void *out_, const void *inp_, int64_t n) {
  S *out = (S *)out_;
  const S *inp = (const S *)inp_;
  constexpr int P = st_pack<S>();
  int64_t done = 0;
  if (st_aligned16(out) && st_aligned16(inp) && n >= P) {
    const int64_t np = n / P;
    gelu_forward_kernel<S, P><<<st_blocks_capped(np, 256), 256>>>(out, inp, np);
    ST_CUDA_LAUNCHED();
    done = np * P;
  }
  if (done < n) {
    gelu_forward_kernel<S, 1><<<st_blocks_capped(n - done, 256), 256>>>(out + done, inp + done,
                                                                       n - done);
    ST_CUDA_LAUNCHED();
  }
}

template <typename S>
void cuda_gelu_backward(void *dinp_, const void *inp_, const void *dout_, int64_t n) {
  S *dinp = (S *)dinp_;
  const S *inp = (const S *)inp_, *dout = (const S *)dout_;
  constexpr int P = st_pack<S>();
  int64_t done = 0;
  if (st_aligned16(dinp) && st_aligned16(inp) && st_aligned16(dout) && n >= P) {
    const int64_t np = n / P;
    gelu_backward_kernel<S, P><<<st_blocks_capped(np, 256), 256>>>(dinp, inp, dout, np);
    ST_CUDA_LAUNCHED();
    done = np * P;
  }
  if (done < n) {
    gelu_backward_kernel<S, 1><<<st_blocks_capped(n - done, 256), 256>>>(
        dinp + done, inp + done, dout + done, n - done);
    ST_CUDA_LAUNCHED();
  }
}

#define GELU_INST(S)                                                   \
  template void cuda_gelu_forward<S>(void *, const void *, int64_t); \
  template void cuda_gelu_backward<S>(void *, const void *, const void *, int64_t);
ST_FOR_EACH_STORAGE(GELU_INST)
