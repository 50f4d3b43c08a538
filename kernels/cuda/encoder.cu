/* encoder.cu - token + position embedding, forward and backward. wpe NULL
 * (rotary positions): out = wte[inp]; dwpe NULL: no position gradient.
 *
 * The backward has to add rows of dout into rows of dwte picked by token id,
 * and a token can appear many times in a batch. Instead of atomics (whose
 * order varies from run to run), one block owns each distinct token: the
 * block of a token's first position collects that token's positions in
 * ascending order and adds their rows into dwte in that order, the same order
 * as the CPU reference. dwpe sums over the batch with one thread per element.
 * dwte and dwpe are fp32; dout is in the storage type and widened on load.
 */
#include "kernels/cuda/cuda_ops.h"

#define ENC_THREADS 256

/* One thread per V consecutive channels of one position; C % V == 0. */
template <typename S, int V>
__global__ void encoder_forward_kernel(S *out, const int *inp, const S *wte, const S *wpe,
                                       int T, int C, int64_t npacks) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < npacks;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e = i * V, bt = e / C;
    const int c = (int)(e % C), t = (int)(bt % T);
    float a[V], b[V];
    st_load<S, V>(a, wte + (int64_t)inp[bt] * C + c);
    if (wpe) { /* uniform over the launch */
      st_load<S, V>(b, wpe + (int64_t)t * C + c);
#pragma unroll
      for (int k = 0; k < V; k++) a[k] += b[k];
    }
    st_store<S, V>(out + e, a);
  }
}

/* One block per position i; only the block at a token's first position does
 * anything. It walks the positions i..BT-1 in chunks of ENC_THREADS, lists
 * the ones holding the same token in ascending order (an ordered compaction
 * with warp ballots), and adds their dout rows into dwte[token], each thread
 * owning a set of columns. The block owns the whole row, so nothing races. */
template <typename S>
__global__ void encoder_backward_wte_kernel(float *dwte, const S *dout, const int *inp, int BT,
                                            int C) {
  __shared__ int list[ENC_THREADS];
  __shared__ int warp_count[ENC_THREADS / 32];
  const int i = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tok = inp[i];
  for (int base = 0; base < i; base += ENC_THREADS) {
    int j = base + tid;
    if (__syncthreads_or(j < i && inp[j] == tok)) return; /* not the first: uniform exit */
  }
  float *row = dwte + (int64_t)tok * C;
  for (int base = i; base < BT; base += ENC_THREADS) {
    int j = base + tid;
    int match = j < BT && inp[j] == tok;
    unsigned ballot = __ballot_sync(0xffffffffu, match);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0, total = 0;
    for (int w = 0; w < ENC_THREADS / 32; w++) {
      if (w < warp) offset += warp_count[w];
      total += warp_count[w];
    }
    if (match) list[offset + __popc(ballot & ((1u << lane) - 1u))] = j;
    __syncthreads();
    for (int c = tid; c < C && total > 0; c += ENC_THREADS) {
      float acc = row[c];
      for (int k = 0; k < total; k++) acc += st_ld(dout[(int64_t)list[k] * C + c]);
      row[c] = acc;
    }
    __syncthreads(); /* list and warp_count are rewritten by the next chunk */
  }
}

/* dwpe[t, c] += sum_b dout[b, t, c], b ascending. */
template <typename S>
__global__ void encoder_backward_wpe_kernel(float *dwpe, const S *dout, int B, int T, int C) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, TC = (int64_t)T * C;
  if (i >= TC) return;
  float acc = dwpe[i];
  for (int b = 0; b < B; b++) acc += st_ld(dout[b * TC + i]);
  dwpe[i] = acc;
}

template <typename S>
void cuda_encoder_forward(void *out_, const int *inp, const void *wte_, const void *wpe_, int B,
                          int T, int C) {
  S *out = (S *)out_;
  const S *wte = (const S *)wte_, *wpe = (const S *)wpe_;
  const int64_t n = (int64_t)B * T * C;
  if (n == 0) return;
  constexpr int P = st_pack<S>();
  if (C % P == 0 && st_aligned16(out) && st_aligned16(wte) && st_aligned16(wpe)) {
    encoder_forward_kernel<S, P><<<st_blocks_capped(n / P, ENC_THREADS), ENC_THREADS>>>(
        out, inp, wte, wpe, T, C, n / P);
  } else {
    encoder_forward_kernel<S, 1><<<st_blocks_capped(n, ENC_THREADS), ENC_THREADS>>>(
        out, inp, wte, wpe, T, C, n);
  }
  ST_CUDA_LAUNCHED();
}

template <typename S>
void cuda_encoder_backward(float *dwte, float *dwpe, const void *dout_, const int *inp, int B,
                           int T, int C) {
  const S *dout = (const S *)dout_;
  int BT = B * T;
  if (BT == 0 || C == 0) return;
  encoder_backward_wte_kernel<S><<<BT, ENC_THREADS>>>(dwte, dout, inp, BT, C);
  ST_CUDA_LAUNCHED();
  if (!dwpe) return;
  int64_t TC = (int64_t)T * C;
  encoder_backward_wpe_kernel<S><<<st_blocks(TC, ENC_THREADS), ENC_THREADS>>>(dwpe, dout, B, T,
                                                                             C);
  ST_CUDA_LAUNCHED();
}

#define ENC_INST(S)                                                                         \
  template void cuda_encoder_forward<S>(void *, const int *, const void *, const void *, int, \
                                        int, int);                                          \
  template void cuda_encoder_backward<S>(float *, float *, const void *, const int *, int,  \
                                         int, int);
ST_FOR_EACH_STORAGE(ENC_INST)
