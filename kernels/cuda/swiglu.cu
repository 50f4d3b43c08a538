/* swiglu.cu - SwiGLU (Shazeer 2020), the Llama MLP's gate: inp[N,2F] holds
 * gate | up per row, out[N,F] = silu(gate) * up, silu(x) = x sigmoid(x).
 * cuBLASLt has no epilogue that multiplies two halves of a GEMM's output,
 * so this is its own elementwise pass: one thread per V outputs (16-byte
 * accesses when F and every pointer allow, else V = 1), grid-stride.
 * Backward, with s = sigmoid(gate):
 *   d gate = dout * up * s (1 + gate (1 - s)),  d up = dout * silu(gate),
 * written (not accumulated) into dinp[N,2F]. */
#include "kernels/cuda/cuda_ops.h"

#define SWIGLU_THREADS 256


/* Pack e covers outputs [e*V, e*V + V) of one row (F % V == 0). */
template <typename S, int V>
__global__ void swiglu_forward_kernel(S *out, const S *inp, int F, int64_t npacks) {
  const int fp = F / V;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < npacks;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = e / fp;
    const int f = (int)(e % fp) * V;
    const S *g = inp + row * 2 * F + f;
    float gv[V], uv[V], ov[V];
    st_load<S, V>(gv, g);
    st_load<S, V>(uv, g + F);
#pragma unroll
    for (int k = 0; k < V; k++) ov[k] = gv[k] / (1.0f + expf(-gv[k])) * uv[k]; /* the CPU's order */
    st_store<S, V>(out + row * F + f, ov);
  }
}

template <typename S, int V>
__global__ void swiglu_backward_kernel(S *dinp, const S *dout, const S *inp, int F,
                                       int64_t npacks) {
  const int fp = F / V;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < npacks;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = e / fp;
    const int f = (int)(e % fp) * V;
    const S *g = inp + row * 2 * F + f;
    float gv[V], uv[V], dv[V], dg[V], du[V];
    st_load<S, V>(gv, g);
    st_load<S, V>(uv, g + F);
    st_load<S, V>(dv, dout + row * F + f);
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float e1 = 1.0f + expf(-gv[k]), s = 1.0f / e1;
      dg[k] = dv[k] * uv[k] * s * (1.0f + gv[k] * (1.0f - s));
      du[k] = dv[k] * (gv[k] / e1);
    }
    S *di = dinp + row * 2 * F + f;
    st_store<S, V>(di, dg);
    st_store<S, V>(di + F, du);
  }
}

template <typename S>
void cuda_swiglu_forward(void *out_, const void *inp_, int N, int F) {
  S *out = (S *)out_;
  const S *inp = (const S *)inp_;
  const int64_t n = (int64_t)N * F;
  if (n == 0) return;
  constexpr int P = st_pack<S>();
  if (F % P == 0 && st_aligned16(out) && st_aligned16(inp))
    swiglu_forward_kernel<S, P><<<st_blocks_capped(n / P, SWIGLU_THREADS), SWIGLU_THREADS>>>(
        out, inp, F, n / P);
  else
    swiglu_forward_kernel<S, 1><<<st_blocks_capped(n, SWIGLU_THREADS), SWIGLU_THREADS>>>(
        out, inp, F, n);
  ST_CUDA_LAUNCHED();
}

template <typename S>
void cuda_swiglu_backward(void *dinp_, const void *dout_, const void *inp_, int N, int F) {
  S *dinp = (S *)dinp_;
  const S *dout = (const S *)dout_, *inp = (const S *)inp_;
  const int64_t n = (int64_t)N * F;
  if (n == 0) return;
  constexpr int P = st_pack<S>();
  if (F % P == 0 && st_aligned16(dinp) && st_aligned16(dout) && st_aligned16(inp))
    swiglu_backward_kernel<S, P><<<st_blocks_capped(n / P, SWIGLU_THREADS), SWIGLU_THREADS>>>(
        dinp, dout, inp, F, n / P);
  else
    swiglu_backward_kernel<S, 1><<<st_blocks_capped(n, SWIGLU_THREADS), SWIGLU_THREADS>>>(
        dinp, dout, inp, F, n);
  ST_CUDA_LAUNCHED();
}

#define SWIGLU_INST(S)                                                          \
  template void cuda_swiglu_forward<S>(void *, const void *, int, int);         \
  template void cuda_swiglu_backward<S>(void *, const void *, const void *, int, int);
ST_FOR_EACH_STORAGE(SWIGLU_INST)
