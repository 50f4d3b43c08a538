/* rope.cu - rotary position embedding (Su et al. 2021) in Hugging Face
 * Llama's rotate-half form, in place on the q and k heads of qkv (see
 * rope_forward in kernels/ops.h for the layout and the cos/sin table).
 * One thread per rotated pair (x[i], x[i + HD/2]) of one head of one row,
 * grid-stride; the pair is read, rotated in fp32 and written back once, so
 * the op is elementwise and bit-for-bit repeatable. The backward applies
 * the transpose (rotation by -angle) to the gradient, which is exact
 * inversion up to the one rounding of the stored values. */
#include "kernels/cuda/cuda_ops.h"

#define ROPE_THREADS 256

/* sign = +1: forward rotation at positions pos0 + t; -1: its transpose. */
template <typename S>
__global__ void rope_kernel(S *qkv, const float *cs, int T, int pos0, int nrot, int R, int HD,
                            float sign, int64_t n) {
  const int half = HD / 2;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int i = (int)(e % half);
    const int64_t rh = e / half; /* row * nrot + head */
    const int head = (int)(rh % nrot);
    const int64_t row = rh / nrot;
    const int p = pos0 + (int)(row % T);
    const float c = cs[(int64_t)p * HD + i], s = sign * cs[(int64_t)p * HD + half + i];
    S *x = qkv + row * R + (int64_t)head * HD;
    const float a = st_ld(x[i]), b = st_ld(x[i + half]);
    x[i] = st_st<S>(a * c - b * s);
    x[i + half] = st_st<S>(b * c + a * s);
  }
}

template <typename S>
static void rope_launch(void *qkv, const float *cs, int B, int T, int pos0, int NH, int NKV, int HD,
                        float sign) {
  if (HD % 2 != 0 || NH <= 0 || NKV <= 0)
    st_cuda_fail("rope: head size must be even and head counts positive", __FILE__, __LINE__);
  const int nrot = NH + NKV, R = (NH + 2 * NKV) * HD;
  const int64_t n = (int64_t)B * T * nrot * (HD / 2);
  if (n == 0) return;
  rope_kernel<S><<<st_blocks_capped(n, ROPE_THREADS), ROPE_THREADS>>>((S *)qkv, cs, T, pos0, nrot,
                                                                     R, HD, sign, n);
  ST_CUDA_LAUNCHED();
}

template <typename S>
void cuda_rope_forward(void *qkv, const float *cs, int B, int T, int pos0, int NH, int NKV,
                       int HD) {
  rope_launch<S>(qkv, cs, B, T, pos0, NH, NKV, HD, 1.0f);
}

template <typename S>
void cuda_rope_backward(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int HD) {
  rope_launch<S>(dqkv, cs, B, T, 0, NH, NKV, HD, -1.0f);
}

#define ROPE_INST(S)                                                                           \
  template void cuda_rope_forward<S>(void *, const float *, int, int, int, int, int, int);     \
  template void cuda_rope_backward<S>(void *, const float *, int, int, int, int, int);
ST_FOR_EACH_STORAGE(ROPE_INST)
