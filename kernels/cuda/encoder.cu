/* encoder.cu - token + position embedding, forward and backward. wpe NULL
 * (rotary positions): out = wte[inp]; dwpe NULL: no position gradient.
 *
 * The backward has to add rows of dout into rows of dwte picked by token id,
 * and a token can appear many times in a batch. Instead of atomics (whose
 * order varies from run to run), each distinct token's positions are added
 * into its dwte row in ascending order, the same order as the CPU reference,
 * so the result is bit-identical to it. With scratch: a stable radix sort
 * (cub, CUDA's own library) of the (token, position) pairs puts each token's
 * positions in one ascending run, and one warp per run and column band walks
 * it: linear in B*T. Without (scratch NULL or too small): the block of a
 * token's first position finds it by scanning every earlier position, and
 * its later ones by scanning every later one: quadratic in B*T (1.2 ms of a
 * 62 ms GPT-2 124M step at 32,768 positions, one H200, ST_PROFILE_OPS).
 * dwpe sums over the batch with one thread per element. dwte and dwpe are
 * fp32; dout is in the storage type and widened on load.
 */
#include <cub/device/device_radix_sort.cuh>

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

__global__ void encoder_iota_kernel(int *v, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = i;
}

#define ENC_RUN_WARPS 4     /* sorted positions per block, one warp each */
#define ENC_SHORT_UNROLL 4  /* rows in flight on a short run */
#define ENC_LONG_UNROLL 16  /* rows in flight on a long run */
#define ENC_LONG_RUN 16     /* a run of more positions than this is long */
#define ENC_SHORT_BLOCKS 9  /* short form: 9 blocks an SM, <= 56 registers (as one form had) */

/* The pairs (tok, pos) sorted by token, positions ascending within a
 * token: 1 when sorted index k starts a run (k == 0 or tok[k-1] != tok[k])
 * of the kind LONG asks for (more than ENC_LONG_RUN positions, or at most
 * that many). Uniform over a warp. */
template <bool LONG>
__device__ __forceinline__ bool enc_run_start(const int *tok, int k, int BT, int t) {
  if (k > 0 && tok[k - 1] == t) return false;
  const bool is_long = k + ENC_LONG_RUN < BT && tok[k + ENC_LONG_RUN] == t;
  return is_long == LONG;
}

/* Warp w of block x looks at sorted index k = x * 4 + w; only a warp at the
 * start of a run works (enc_run_start): its lanes own V consecutive
 * columns each of the band blockIdx.y, and add the run's dout rows into
 * dwte[tok] in ascending position order. One warp owns each (token,
 * band): nothing races. A run is a chain of dependent additions, so its
 * speed is how many rows are in flight, and two forms split the runs:
 * - short runs (LONG false): ENC_SHORT_UNROLL rows in flight, the
 *   pairs read one at a time, few registers; a batch of uniform random ids
 *   is nearly all runs of one, where occupancy is what counts;
 * - long runs (LONG true): a text's commonest token
 *   has thousands of positions in a micro-batch (the space byte about 6,000
 *   of 32,768), so ENC_LONG_UNROLL rows in flight, the next pairs in one
 *   coalesced load (lane u holds pair u, passed round by shuffles).
 * Both add in the same order, so the result does not depend on the split.
 * One form with 16 rows in flight for every run took uniform ids from
 * 0.088 to 0.128 ms at 8,192 positions (one H100, bench_cuda_ops). */
template <typename S, int V, bool LONG>
__global__ void __launch_bounds__(32 * ENC_RUN_WARPS, LONG ? 1 : ENC_SHORT_BLOCKS)
    encoder_backward_runs_kernel(float *dwte, const S *dout, const int *tok, const int *pos,
                                 int BT, int C) {
  constexpr int U = LONG ? ENC_LONG_UNROLL : ENC_SHORT_UNROLL;
  const int k = blockIdx.x * ENC_RUN_WARPS + threadIdx.y;
  if (k >= BT) return;
  const int t = tok[k];
  if (!enc_run_start<LONG>(tok, k, BT, t)) return;
  const int lane = threadIdx.x, c = (blockIdx.y * 32 + lane) * V;
  const bool mine = c < C;
  if (!LONG && !mine) return; /* the long form's lanes past C still pass pairs round */
  float *row = dwte + (int64_t)t * C + c;
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; j++) acc[j] = mine ? row[j] : 0.f;
  for (int e = k;; e += U) {
    int tl = -1, pl = 0;
    if (LONG && lane < U && e + lane < BT) tl = tok[e + lane], pl = pos[e + lane];
    float x[U][V];
    bool in[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int p = 0;
      if constexpr (LONG) {
        in[u] = __shfl_sync(0xffffffffu, tl, u) == t;
        p = __shfl_sync(0xffffffffu, pl, u);
      } else {
        in[u] = e + u < BT && tok[e + u] == t;
        if (in[u]) p = pos[e + u];
      }
      if (in[u] && mine) st_load<S, V>(x[u], dout + (int64_t)p * C + c);
    }
#pragma unroll
    for (int u = 0; u < U; u++)
      if (in[u] && mine) {
#pragma unroll
        for (int j = 0; j < V; j++) acc[j] += x[u][j];
      }
    if (!in[U - 1]) break; /* uniform: every lane saw the same pairs */
  }
  if (!mine) return;
#pragma unroll
  for (int j = 0; j < V; j++) row[j] = acc[j];
}

/* The run kernel's two forms over the sorted pairs: short runs, then long ones
 * (disjoint rows of dwte, so the order between them does not matter). */
template <typename S, int V>
static void encoder_backward_runs(float *dwte, const S *dout, const int *tok, const int *pos,
                                  int BT, int C) {
  const dim3 block(32, ENC_RUN_WARPS);
  const dim3 grid((unsigned)((BT + ENC_RUN_WARPS - 1) / ENC_RUN_WARPS),
                  (unsigned)((C / V + 31) / 32));
  encoder_backward_runs_kernel<S, V, false><<<grid, block>>>(dwte, dout, tok, pos, BT, C);
  ST_CUDA_LAUNCHED();
  encoder_backward_runs_kernel<S, V, true><<<grid, block>>>(dwte, dout, tok, pos, BT, C);
}

/* Carves scratch into the sorted tokens, the positions before and after the
 * sort and cub's temporary storage (each 256-byte aligned); false when it
 * does not hold them. */
static bool encoder_sort_carve(void *scratch, size_t bytes, int BT, int **tok_sorted,
                               int **pos_in, int **pos_sorted, void **temp, size_t *temp_bytes) {
  if (!scratch) return false;
  size_t tb = 0;
  if (cub::DeviceRadixSort::SortPairs(nullptr, tb, (const int *)nullptr, (int *)nullptr,
                                      (const int *)nullptr, (int *)nullptr, BT) != cudaSuccess)
    return false;
  const size_t arr = ((size_t)BT * sizeof(int) + 255) / 256 * 256;
  if (((uintptr_t)scratch & 255u) != 0 || bytes < 3 * arr + tb) return false;
  char *s = (char *)scratch;
  *tok_sorted = (int *)s;
  *pos_in = (int *)(s + arr);
  *pos_sorted = (int *)(s + 2 * arr);
  *temp = s + 3 * arr;
  *temp_bytes = tb;
  return true;
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
                           int T, int C, void *scratch, size_t scratch_bytes) {
  const S *dout = (const S *)dout_;
  int BT = B * T;
  if (BT == 0 || C == 0) return;
  int *tok_sorted, *pos_in, *pos_sorted;
  void *temp;
  size_t temp_bytes;
  if (encoder_sort_carve(scratch, scratch_bytes, BT, &tok_sorted, &pos_in, &pos_sorted, &temp,
                         &temp_bytes)) {
    encoder_iota_kernel<<<st_blocks(BT, ENC_THREADS), ENC_THREADS>>>(pos_in, BT);
    ST_CUDA_LAUNCHED();
    /* token ids are non-negative ints: 31 key bits; the sort is stable */
    ST_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, inp, tok_sorted, pos_in,
                                                  pos_sorted, BT, 0, 31));
    constexpr int P = st_pack<S>();
    if (C % P == 0 && st_aligned16(dout))
      encoder_backward_runs<S, P>(dwte, dout, tok_sorted, pos_sorted, BT, C);
    else
      encoder_backward_runs<S, 1>(dwte, dout, tok_sorted, pos_sorted, BT, C);
  } else {
    encoder_backward_wte_kernel<S><<<BT, ENC_THREADS>>>(dwte, dout, inp, BT, C);
  }
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
                                         int, int, void *, size_t);
ST_FOR_EACH_STORAGE(ENC_INST)
