/* rope.cu - rotary position embedding (Su et al. 2021) in Hugging Face
 * Llama's rotate-half form, in place on the q and k heads of qkv (see
 * rope_forward in kernels/ops.h for the layout and the cos/sin table).
 * Each pair (x[i], x[i + HD/2]) of one head of one row is read, rotated in
 * fp32 and written back once, so the op is elementwise and bit-for-bit
 * repeatable. The fast kernel takes one row per block and 16-byte packs of
 * pairs (P consecutive i of each half): with one 2-byte pair per thread
 * and 64-bit index arithmetic the op ran at 1.2 TB/s, 1.8% of a
 * llama-3.2-1b step (one H200, ST_PROFILE_OPS). The backward applies the
 * transpose (rotation by -angle) to the gradient, which is exact
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

/* One block per row of qkv; P pairs per access, (HD/2) % P == 0. */
template <typename S, int P>
__global__ void rope_row_kernel(S *qkv, const float *cs, int T, int pos0, int nrot, int R, int HD,
                                float sign) {
  const int half = HD / 2, hp = half / P;
  const int64_t row = blockIdx.x;
  const float *c = cs + (int64_t)(pos0 + (int)(row % T)) * HD;
  S *base = qkv + row * R;
  for (int e = threadIdx.x; e < nrot * hp; e += blockDim.x) {
    const int head = e / hp, i = (e - head * hp) * P;
    S *x = base + head * HD;
    float a[P], b[P], co[P], si[P];
    st_load<S, P>(a, x + i);
    st_load<S, P>(b, x + half + i);
#pragma unroll
    for (int k = 0; k < P; k++) {
      co[k] = c[i + k];
      si[k] = sign * c[half + i + k];
    }
    float ya[P], yb[P];
#pragma unroll
    for (int k = 0; k < P; k++) {
      ya[k] = a[k] * co[k] - b[k] * si[k];
      yb[k] = b[k] * co[k] + a[k] * si[k];
    }
    st_store<S, P>(x + i, ya);
    st_store<S, P>(x + half + i, yb);
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
  constexpr int P = st_pack<S>();
  if ((HD / 2) % P == 0 && R % P == 0 && st_aligned16(qkv) && (int64_t)B * T <= INT32_MAX) {
    const int work = nrot * (HD / 2 / P);
    const int threads = work >= 256 ? 256 : (work + 31) / 32 * 32;
    rope_row_kernel<S, P><<<(unsigned)((int64_t)B * T), threads>>>((S *)qkv, cs, T, pos0, nrot, R,
                                                                   HD, sign);
    ST_CUDA_LAUNCHED();
    return;
  }
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
