/* encoder.cu - token + position embedding, forward and backward.
 *
 * The backward has to add rows of dout into rows of dwte picked by token id,
 * and a token can appear many times in a batch. Instead of atomics (whose
 * order varies from run to run), one block owns each distinct token: the
 * block of a token's first position collects that token's positions in
 * ascending order and adds their rows into dwte in that order, the same order
 * as the CPU reference. dwpe sums over the batch with one thread per element.
 */
#include "kernels/cuda/cuda_ops.h"

#define ENC_THREADS 256

__global__ void encoder_forward_kernel(float *out, const int *inp, const float *wte,
                                       const float *wpe, int T, int C, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t bt = i / C;
    int c = (int)(i % C), t = (int)(bt % T);
    out[i] = wte[(int64_t)inp[bt] * C + c] + wpe[(int64_t)t * C + c];
  }
}

/* One block per position i; only the block at a token's first position does
 * anything. It walks the positions i..BT-1 in chunks of ENC_THREADS, lists
 * the ones holding the same token in ascending order (an ordered compaction
 * with warp ballots), and adds their dout rows into dwte[token], each thread
 * owning a set of columns. The block owns the whole row, so nothing races. */
__global__ void encoder_backward_wte_kernel(float *dwte, const float *dout, const int *inp,
                                            int BT, int C) {
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
      for (int k = 0; k < total; k++) acc += dout[(int64_t)list[k] * C + c];
      row[c] = acc;
    }
    __syncthreads(); /* list and warp_count are rewritten by the next chunk */
  }
}

/* dwpe[t, c] += sum_b dout[b, t, c], b ascending. */
__global__ void encoder_backward_wpe_kernel(float *dwpe, const float *dout, int B, int T,
                                            int C) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, TC = (int64_t)T * C;
  if (i >= TC) return;
  float acc = dwpe[i];
  for (int b = 0; b < B; b++) acc += dout[b * TC + i];
  dwpe[i] = acc;
}

void cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe,
                          int B, int T, int C) {
  int64_t n = (int64_t)B * T * C;
  if (n == 0) return;
  encoder_forward_kernel<<<st_blocks_capped(n, ENC_THREADS), ENC_THREADS>>>(out, inp, wte, wpe,
                                                                           T, C, n);
  ST_CUDA_LAUNCHED();
}

void cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp,
                           int B, int T, int C) {
  int BT = B * T;
  if (BT == 0 || C == 0) return;
  encoder_backward_wte_kernel<<<BT, ENC_THREADS>>>(dwte, dout, inp, BT, C);
  ST_CUDA_LAUNCHED();
  int64_t TC = (int64_t)T * C;
  encoder_backward_wpe_kernel<<<st_blocks(TC, ENC_THREADS), ENC_THREADS>>>(dwpe, dout, B, T, C);
  ST_CUDA_LAUNCHED();
}
