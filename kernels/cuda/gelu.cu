/* gelu.cu - GELU with the tanh approximation (Hendrycks & Gimpel 2016), the
 * form GPT-2 uses: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). One
 * thread per element; the backward accumulates into dinp. */
#include "kernels/cuda/cuda_ops.h"

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

__global__ void gelu_forward_kernel(float *out, const float *inp, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x)));
  }
}

__global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout,
                                     int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = inp[i];
    float u = GELU_S * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float grad =
        0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += grad * dout[i];
  }
}

void cuda_gelu_forward(float *out, const float *inp, int64_t n) {
  if (n <= 0) return;
  gelu_forward_kernel<<<st_blocks_capped(n, 256), 256>>>(out, inp, n);
  ST_CUDA_LAUNCHED();
}

void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
  if (n <= 0) return;
  gelu_backward_kernel<<<st_blocks_capped(n, 256), 256>>>(dinp, inp, dout, n);
  ST_CUDA_LAUNCHED();
}
