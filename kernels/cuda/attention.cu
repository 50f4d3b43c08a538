/* attention.cu - causal multi-head self-attention (Vaswani et al. 2017) as
 * flash attention (Dao et al. 2022) on CUDA cores: no T x T matrix exists;
 * memory is O(B*T*C). Grouped-query attention (Ainslie et al. 2023): qkv
 * rows are [(NH + 2 NKV) hs] (ops.h), query head h reads kv head
 * h / (NH/NKV); NKV = NH is plain multi-head attention. qkv, out, dout
 * and dqkv are in the storage type S;
 * tiles are widened to fp32 as they are loaded into shared memory and all
 * arithmetic is fp32, so S changes only the loads and the final stores.
 * What forward saves for backward (`att`, fp32) is the per-row log-sum-exp
 * L = m + log(l) of the scaled scores, laid out [B,NH,T]; backward's
 * scratch (`datt`, same size) holds D = rowsum(dO * O).
 *
 * Tiles of FA_BR = FA_BC = 64 rows, 256 threads as a 16 x 16 grid (tx, ty);
 * a thread owns a 4 x 4 micro-tile of each score tile (rows ty + 16i,
 * columns tx + 16j) and a 4 x HD/16 slice of each head-sized accumulator
 * (rows ty + 16i, columns tx + 16j). Head sizes up to 128 run through three
 * instantiations (HD = 32, 64, 128) whose shared-memory rows are padded with
 * zeros past hs, so the extra terms add exact zeros.
 *
 * Forward: one block per (b, h, query tile); online softmax over the key
 * tiles 0..query tile (causal), row statistics reduced over the 16 lanes of
 * a half-warp by butterfly.
 * Backward: dq_kernel, one block per query tile, first takes
 * D = rowsum(dO * O) from its dO tile and forward's output O (equal to
 * sum_j P_ij dP_ij, which would need a second walk over the key tiles) and
 * writes it to datt; then it walks the key tiles once: P = exp(S - L)
 * recomputed, dP = dO V^T, dS = P * (dP - D) * scale, dQ += dS K.
 * dkv_kernel, one block per (kv head, key tile) and launched after
 * dq_kernel (it reads D), walks the query heads of its group and, for each,
 * the query tiles from the diagonal on: dV += P^T dO, dK += dS^T Q. Each gradient element is owned by one thread that sums in a
 * fixed order and adds once into dqkv (one rounding to S): no atomics,
 * bit-identical from run to run.
 */
#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_choice.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops_cuda.h"

extern "C" {
#include "util/envparse.h"
#include "util/error.h"
}

#define FA_T 64       /* rows per query tile and per key tile */
#define FA_THREADS 256 /* 16 x 16 */
#define FA_PLD (FA_T + 1) /* padded row length of the score tiles in shared memory */

/* Loads rows row0..row0+63 of a [*, stride] matrix of S (row r at
 * src + r*stride, hs valid columns) into dst[64][HD+1] as fp32; rows >= T
 * and columns >= hs are 0. */
template <int HD, typename S>
__device__ __forceinline__ void fa_load(float *dst, const S *src, int64_t stride, int row0,
                                        int T, int hs) {
  constexpr int LD = HD + 1;
  for (int idx = threadIdx.x; idx < FA_T * HD; idx += FA_THREADS) {
    const int r = idx / HD, d = idx % HD, t = row0 + r;
    dst[r * LD + d] = (t < T && d < hs) ? st_ld(src[(int64_t)t * stride + d]) : 0.0f;
  }
}

/* acc[i][j] = sum_d A[ty+16i][d] * Bm[tx+16j][d] */
template <int HD>
__device__ __forceinline__ void fa_dot(float acc[4][4], const float *A, const float *Bm, int ty,
                                       int tx) {
  constexpr int LD = HD + 1;
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
#pragma unroll 8
  for (int d = 0; d < HD; d++) {
    float a[4], b[4];
#pragma unroll
    for (int i = 0; i < 4; i++) a[i] = A[(ty + 16 * i) * LD + d];
#pragma unroll
    for (int j = 0; j < 4; j++) b[j] = Bm[(tx + 16 * j) * LD + d];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

/* Two products sharing the row/column indices: s = A1 B1^T, t = A2 B2^T. */
template <int HD>
__device__ __forceinline__ void fa_dot2(float s[4][4], float u[4][4], const float *A1,
                                        const float *B1, const float *A2, const float *B2,
                                        int ty, int tx) {
  constexpr int LD = HD + 1;
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) s[i][j] = 0.0f, u[i][j] = 0.0f;
#pragma unroll 4
  for (int d = 0; d < HD; d++) {
    float a[4], b[4], c[4], e[4];
#pragma unroll
    for (int i = 0; i < 4; i++) a[i] = A1[(ty + 16 * i) * LD + d], c[i] = A2[(ty + 16 * i) * LD + d];
#pragma unroll
    for (int j = 0; j < 4; j++) b[j] = B1[(tx + 16 * j) * LD + d], e[j] = B2[(tx + 16 * j) * LD + d];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) {
        s[i][j] = fmaf(a[i], b[j], s[i][j]);
        u[i][j] = fmaf(c[i], e[j], u[i][j]);
      }
  }
}

/* acc[i][j] += sum_c P[ty+16i][c] * M[c][tx+16j], c < 64, P stride FA_PLD. */
template <int HD>
__device__ __forceinline__ void fa_pm(float acc[4][HD / 16], const float *P, const float *M,
                                      int ty, int tx) {
  constexpr int LD = HD + 1, NJ = HD / 16;
#pragma unroll 4
  for (int c = 0; c < FA_T; c++) {
    float p[4], m[NJ];
#pragma unroll
    for (int i = 0; i < 4; i++) p[i] = P[(ty + 16 * i) * FA_PLD + c];
#pragma unroll
    for (int j = 0; j < NJ; j++) m[j] = M[c * LD + tx + 16 * j];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < NJ; j++) acc[i][j] = fmaf(p[i], m[j], acc[i][j]);
  }
}

/* Reductions over the 16 lanes of a half-warp (the threads of one row). */
__device__ __forceinline__ float fa_row_max(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float fa_row_sum(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int HD, typename S>
__global__ void __launch_bounds__(FA_THREADS)
    flash_forward_kernel(S *out, float *lse, const S *qkv, int T, int C, int NH, int NKV,
                         float scale) {
  constexpr int LD = HD + 1, NJ = HD / 16;
  extern __shared__ float smem[];
  float *Qs = smem, *Ks = Qs + FA_T * LD, *Vs = Ks + FA_T * LD, *Ps = Vs + FA_T * LD;
  const int nq = (T + FA_T - 1) / FA_T;
  const int qt = nq - 1 - (int)blockIdx.y; /* longest rows first */
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH, hs = C / NH, R = C + 2 * NKV * hs;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4, q0 = qt * FA_T;
  const S *base = qkv + (int64_t)b * T * R + h * hs;
  const S *kbase = qkv + (int64_t)b * T * R + C + (h / (NH / NKV)) * hs, *vbase = kbase + NKV * hs;
  fa_load<HD>(Qs, base, R, q0, T, hs);
  float m[4], l[4], o[4][NJ];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) o[i][j] = 0.0f;
  }
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * FA_T;
    __syncthreads();
    fa_load<HD>(Ks, kbase, R, k0, T, hs);
    fa_load<HD>(Vs, vbase, R, k0, T, hs);
    __syncthreads();
    float s[4][4];
    fa_dot<HD>(s, Qs, Ks, ty, tx);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = q0 + ty + 16 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int c = k0 + tx + 16 * j;
        s[i][j] = (c <= r && c < T) ? s[i][j] * scale : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      /* key k0 <= r and k0 < T: every row has a finite score in every tile */
      const float mnew = fmaxf(m[i], fa_row_max(mx));
      const float alpha = expf(m[i] - mnew);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float p = expf(s[i][j] - mnew);
        Ps[(ty + 16 * i) * FA_PLD + tx + 16 * j] = p;
        sum += p;
      }
      l[i] = l[i] * alpha + fa_row_sum(sum);
      m[i] = mnew;
#pragma unroll
      for (int j = 0; j < NJ; j++) o[i][j] *= alpha;
    }
    __syncthreads();
    fa_pm<HD>(o, Ps, Vs, ty, tx);
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int r = q0 + ty + 16 * i;
    if (r >= T) continue;
    const float inv = 1.0f / l[i];
    S *orow = out + ((int64_t)b * T + r) * C + h * hs;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int d = tx + 16 * j;
      if (d < hs) orow[d] = st_st<S>(o[i][j] * inv);
    }
    if (tx == 0) lse[(int64_t)bh * T + r] = m[i] + logf(l[i]);
  }
}

/* One block per (b, h, query tile): D (written to Dg) and dQ (added to dqkv). */
template <int HD, typename S>
__global__ void __launch_bounds__(FA_THREADS)
    flash_dq_kernel(S *dqkv, float *Dg, const S *dout, const S *qkv, const S *out,
                    const float *lse, int T, int C, int NH, int NKV, float scale) {
  constexpr int LD = HD + 1, NJ = HD / 16;
  extern __shared__ float smem[];
  float *Qs = smem, *dOs = Qs + FA_T * LD, *Ks = dOs + FA_T * LD, *Vs = Ks + FA_T * LD;
  float *dSs = Vs + FA_T * LD;
  const int nq = (T + FA_T - 1) / FA_T;
  const int qt = nq - 1 - (int)blockIdx.y;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH, hs = C / NH, R = C + 2 * NKV * hs;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4, q0 = qt * FA_T;
  const S *base = qkv + (int64_t)b * T * R + h * hs;
  const S *kbase = qkv + (int64_t)b * T * R + C + (h / (NH / NKV)) * hs, *vbase = kbase + NKV * hs;
  fa_load<HD>(Qs, base, R, q0, T, hs);
  fa_load<HD>(dOs, dout + (int64_t)b * T * C + h * hs, C, q0, T, hs);
  /* D = rowsum(dO * O): O borrows the K tile's buffer until the walk starts */
  fa_load<HD>(Ks, out + (int64_t)b * T * C + h * hs, C, q0, T, hs);
  __syncthreads();
  float L[4], D[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int rl = ty + 16 * i, r = q0 + rl;
    float d = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) d = fmaf(dOs[rl * LD + tx + 16 * j], Ks[rl * LD + tx + 16 * j], d);
    D[i] = fa_row_sum(d);
    L[i] = r < T ? lse[(int64_t)bh * T + r] : 0.0f;
    if (tx == 0 && r < T) Dg[(int64_t)bh * T + r] = D[i];
  }
  /* dS = P (dP - D) scale, dQ += dS K */
  float dq[4][NJ];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++) dq[i][j] = 0.0f;
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * FA_T;
    __syncthreads(); /* the previous tile (or O) is no longer read */
    fa_load<HD>(Ks, kbase, R, k0, T, hs);
    fa_load<HD>(Vs, vbase, R, k0, T, hs);
    __syncthreads();
    float s[4][4], dp[4][4];
    fa_dot2<HD>(s, dp, Qs, Ks, dOs, Vs, ty, tx);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = q0 + ty + 16 * i;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int c = k0 + tx + 16 * j;
        const float p = (c <= r && r < T) ? expf(s[i][j] * scale - L[i]) : 0.0f;
        dSs[(ty + 16 * i) * FA_PLD + tx + 16 * j] = p * (dp[i][j] - D[i]) * scale;
      }
    }
    __syncthreads();
    fa_pm<HD>(dq, dSs, Ks, ty, tx);
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int r = q0 + ty + 16 * i;
    if (r >= T) continue;
    S *g = dqkv + ((int64_t)b * T + r) * R + h * hs;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int d = tx + 16 * j;
      if (d < hs) g[d] = st_st<S>(dq[i][j]);
    }
  }
}

/* One block per (b, kv head, key tile): dK and dV, written into dqkv. Here
 * a thread's micro-tile rows are keys (ty + 16i) and its columns queries
 * (tx + 16j). With GQA the block walks the query heads of its group one
 * after the other (each from the diagonal query tile on), so the group's
 * sum is taken by the owner of each element in a fixed order. */
template <int HD, typename S>
__global__ void __launch_bounds__(FA_THREADS)
    flash_dkv_kernel(S *dqkv, const float *Dg, const S *dout, const S *qkv, const float *lse,
                     int T, int C, int NH, int NKV, float scale) {
  constexpr int LD = HD + 1, NJ = HD / 16;
  extern __shared__ float smem[];
  float *Ks = smem, *Vs = Ks + FA_T * LD, *Qs = Vs + FA_T * LD, *dOs = Qs + FA_T * LD;
  float *Ps = dOs + FA_T * LD, *dSs = Ps + FA_T * FA_PLD, *Ls = dSs + FA_T * FA_PLD;
  float *Ds = Ls + FA_T;
  const int nq = (T + FA_T - 1) / FA_T;
  const int kt = blockIdx.y; /* key tile 0 has the most query tiles: first */
  const int bk = blockIdx.x, b = bk / NKV, kh = bk % NKV, G = NH / NKV;
  const int hs = C / NH, R = C + 2 * NKV * hs;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4, k0 = kt * FA_T;
  const S *kbase = qkv + (int64_t)b * T * R + C + kh * hs, *vbase = kbase + NKV * hs;
  fa_load<HD>(Ks, kbase, R, k0, T, hs);
  fa_load<HD>(Vs, vbase, R, k0, T, hs);
  float dk[4][NJ], dv[4][NJ];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++) dk[i][j] = 0.0f, dv[i][j] = 0.0f;
  for (int g = 0; g < G; g++) {
    const int h = kh * G + g, bh = b * NH + h;
    const S *base = qkv + (int64_t)b * T * R + h * hs;
    const S *dobase = dout + (int64_t)b * T * C + h * hs;
    for (int qt = kt; qt < nq; qt++) {
      const int q0 = qt * FA_T;
      __syncthreads();
      fa_load<HD>(Qs, base, R, q0, T, hs);
      fa_load<HD>(dOs, dobase, C, q0, T, hs);
      if (threadIdx.x < FA_T) {
        const int r = q0 + threadIdx.x;
        Ls[threadIdx.x] = r < T ? lse[(int64_t)bh * T + r] : 0.0f;
        Ds[threadIdx.x] = r < T ? Dg[(int64_t)bh * T + r] : 0.0f;
      }
      __syncthreads();
      float s[4][4], dp[4][4];
      fa_dot2<HD>(s, dp, Ks, Qs, Vs, dOs, ty, tx);
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int rl = tx + 16 * j, r = q0 + rl;
        const float Lr = Ls[rl], Dr = Ds[rl];
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int c = k0 + ty + 16 * i;
          const float p = (c <= r && r < T) ? expf(s[i][j] * scale - Lr) : 0.0f;
          Ps[(ty + 16 * i) * FA_PLD + rl] = p;
          dSs[(ty + 16 * i) * FA_PLD + rl] = p * (dp[i][j] - Dr) * scale;
        }
      }
      __syncthreads();
      fa_pm<HD>(dv, Ps, dOs, ty, tx);
      fa_pm<HD>(dk, dSs, Qs, ty, tx);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int c = k0 + ty + 16 * i;
    if (c >= T) continue;
    S *gk = dqkv + ((int64_t)b * T + c) * R + C + kh * hs, *gv = gk + NKV * hs;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int d = tx + 16 * j;
      if (d < hs) {
        gk[d] = st_st<S>(dk[i][j]);
        gv[d] = st_st<S>(dv[i][j]);
      }
    }
  }
}

template <int HD>
static size_t fa_forward_smem() { return (size_t)(3 * FA_T * (HD + 1) + FA_T * FA_PLD) * sizeof(float); }
template <int HD>
static size_t fa_dq_smem() { return (size_t)(4 * FA_T * (HD + 1) + FA_T * FA_PLD) * sizeof(float); }
template <int HD>
static size_t fa_dkv_smem() {
  return (size_t)(4 * FA_T * (HD + 1) + 2 * FA_T * FA_PLD + 2 * FA_T) * sizeof(float);
}

template <int HD, typename S>
static void fa_forward(S *out, float *lse, const S *qkv, int B, int T, int C, int NH, int NKV,
                       float scale) {
  const size_t sm = fa_forward_smem<HD>();
  ST_CUDA_CHECK(cudaFuncSetAttribute(flash_forward_kernel<HD, S>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
  const dim3 grid((unsigned)(B * NH), (unsigned)((T + FA_T - 1) / FA_T));
  flash_forward_kernel<HD, S><<<grid, FA_THREADS, sm>>>(out, lse, qkv, T, C, NH, NKV, scale);
  ST_CUDA_LAUNCHED();
}

template <int HD, typename S>
static void fa_backward(S *dqkv, float *D, const S *dout, const S *qkv, const S *out,
                        const float *lse, int B, int T, int C, int NH, int NKV, float scale) {
  const unsigned ntiles = (unsigned)((T + FA_T - 1) / FA_T);
  const dim3 grid((unsigned)(B * NH), ntiles), kvgrid((unsigned)(B * NKV), ntiles);
  const size_t sq = fa_dq_smem<HD>(), skv = fa_dkv_smem<HD>();
  ST_CUDA_CHECK(cudaFuncSetAttribute(flash_dq_kernel<HD, S>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sq));
  ST_CUDA_CHECK(cudaFuncSetAttribute(flash_dkv_kernel<HD, S>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)skv));
  flash_dq_kernel<HD, S><<<grid, FA_THREADS, sq>>>(dqkv, D, dout, qkv, out, lse, T, C, NH, NKV,
                                                   scale);
  ST_CUDA_LAUNCHED();
  flash_dkv_kernel<HD, S><<<kvgrid, FA_THREADS, skv>>>(dqkv, D, dout, qkv, lse, T, C, NH, NKV,
                                                      scale);
  ST_CUDA_LAUNCHED();
}

int64_t cuda_attention_state_floats(int B, int T, int NH) { return (int64_t)B * NH * T; }

/* bf16/fp16 go to cuDNN's fused attention when st_cuda_attention_select
 * chose it and a plan exists for the shape (shapes without one, such as a
 * shorter last validation batch, take our kernels: plans are never built
 * inside a step), else to the tensor-core kernels (attention_tc.cu) when
 * they take the head size; these fp32-arithmetic kernels remain the fp32
 * path and the fallback. ST_ATTENTION_KERNEL=simt forces the fallback (for
 * comparisons). */
static int g_force_simt = -1;
template <typename S>
static int use_tc(int C, int NH) {
  if (sizeof(S) != 2) return 0;
  if (g_force_simt < 0) {
    const char *e = getenv("ST_ATTENTION_KERNEL");
    const int k = st_envparse_attention_kernel(e);
    if (k < 0)
      fprintf(stderr, "shardtrain: warning: ST_ATTENTION_KERNEL=%s is not simt or auto; the "
              "normal choice of kernel is kept\n", e);
    g_force_simt = k > 0;
  }
  return !g_force_simt && cuda_attention_tc_supported(C, NH, st_storage_dtype<S>());
}

/* The selection and cuDNN's workspace: the size select asked for, made by
 * cuda_attention_reserve (the op table's reserve), at setup. */
static int g_cudnn_fwd, g_cudnn_bwd; /* cuDNN runs the forward / the backward */
static void *g_cudnn_ws;
static size_t g_cudnn_ws_bytes, g_cudnn_ws_want;

template <typename S>
static int use_cudnn_fwd(int B, int T, int C, int NH, int NKV) {
  return sizeof(S) == 2 && g_cudnn_fwd &&
         cuda_attention_cudnn_ready(B, T, C, NH, NKV, st_storage_dtype<S>());
}

template <typename S>
static int use_cudnn_bwd(int B, int T, int C, int NH, int NKV) {
  return sizeof(S) == 2 && g_cudnn_bwd &&
         cuda_attention_cudnn_ready_backward(B, T, C, NH, NKV, st_storage_dtype<S>());
}

/* A head layout no kernel can index is a caller's bug (the model config is
 * validated long before): fatal. */
static void check_heads(int C, int NH, int NKV) {
  if (NH <= 0 || NKV <= 0 || NH % NKV != 0 || C % NH != 0)
    st_cuda_fail("attention: NKV must divide NH and NH must divide C", __FILE__, __LINE__);
}

static void cudnn_check(int rc) {
  if (rc) st_cuda_fail(cuda_attention_cudnn_error(), __FILE__, __LINE__);
  ST_CUDA_LAUNCHED();
}

extern "C" void st_cuda_attention_workspace_at_least(size_t bytes) {
  if (bytes > g_cudnn_ws_want) g_cudnn_ws_want = bytes;
}

void cuda_attention_leave_arena(const st_arena *arena) {
  if (!g_cudnn_ws || !st_arena_owns(arena, g_cudnn_ws)) return;
  g_cudnn_ws = NULL; /* the next reserve makes it again */
  g_cudnn_ws_bytes = 0;
}

int cuda_attention_reserve(void) {
  if (g_cudnn_ws_want <= g_cudnn_ws_bytes) return 0;
  if (g_cudnn_ws && !cuda_arena_owns(g_cudnn_ws)) ST_CUDA_CHECK(cudaFree(g_cudnn_ws));
  g_cudnn_ws = NULL;
  g_cudnn_ws_bytes = 0;
  g_cudnn_ws = cuda_buffer(g_cudnn_ws_want, "cudnn_attention_workspace");
  if (!g_cudnn_ws) return -1;
  g_cudnn_ws_bytes = g_cudnn_ws_want;
  return 0;
}

extern "C" void st_cuda_attention_group_cap(int cap) { cuda_attention_cudnn_group_cap(cap); }

/* "cuDNN X.Y.Z" of the cuDNN that runs, into buf[cap]. */
static const char *cudnn_version_str(char *buf, size_t cap) {
  const int v = cuda_attention_cudnn_version();
  snprintf(buf, cap, "cuDNN %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
  return buf;
}

/* --attention mixed, and auto where cuDNN's backward is not taken: cuDNN's
 * forward (faster than ours at every shape timed: docs/benchmarks.md) and
 * our deterministic O(T) backward, which reads cuDNN's stats as its lse
 * (the same quantity and layout, attention_cudnn.h). No O(T^2) workspace:
 * the forward's plan alone is built. The note names the flag the user gave
 * (asked) and why auto came here (why, "" for mixed as asked). -1 with
 * st_error when cuDNN cannot run the forward. */
static int select_mixed(st_dtype dt, int B, int T, int C, int NH, int NKV, const char *ours,
                        st_attention_impl asked, const char *why, st_attention_choice *out) {
  size_t ws = 0;
  if (cuda_attention_cudnn_prepare_forward(B, T, C, NH, NKV, dt, &ws)) {
    cuda_attention_cudnn_release();
    return st_error_set("--attention %s: %s; use --attention flash (ours, both ways)",
                        st_attention_name(asked), cuda_attention_cudnn_error());
  }
  cuda_attention_cudnn_keep_only(B, T, C, NH, NKV, dt, 0);
  char ver[32];
  out->impl = ST_ATTENTION_MIXED;
  out->workspace_bytes = ws;
  out->deterministic = 1;
  snprintf(out->note, sizeof out->note, "%s fused flash attention forward (workspace %.1f MiB), "
           "backward by %.90s, deterministic, O(T) (--attention %s%s)",
           cudnn_version_str(ver, sizeof ver), ws / 1048576.0, ours, st_attention_name(asked),
           why);
  g_cudnn_fwd = 1;
  g_cudnn_ws_want = ws;
  return 0;
}

extern "C" int st_cuda_attention_select_as(st_attention_impl want, st_attention_impl asked,
                                           st_dtype dt, int B, int T, int C, int NH, int NKV,
                                           st_attention_choice *out) {
  memset(out, 0, sizeof *out);
  out->impl = ST_ATTENTION_FLASH;
  g_cudnn_fwd = g_cudnn_bwd = 0;
  g_cudnn_ws_want = 0; /* a selection of ours after cuDNN's reserves no workspace */
  if (NH <= 0 || NKV <= 0 || NH % NKV != 0)
    return st_error_setc(ST_EXIT_USAGE, "--kv-heads: %d key/value heads do not divide %d heads; "
                         "use a divisor of --heads", NKV, NH);
  const int wgmma = dt != ST_FP32 &&
                    (dt == ST_BF16 ? use_tc<__nv_bfloat16>(C, NH) : use_tc<__half>(C, NH)) &&
                    cuda_attention_tc_runs_wgmma(B, C, NH, dt);
  const char *ours = dt == ST_FP32 || !cuda_attention_tc_supported(C, NH, dt)
                         ? "our flash attention (fp32 arithmetic, attention.cu)"
                     : wgmma ? "our flash attention on Hopper's warpgroup MMA (attention_wgmma.cu)"
                             : "our tensor-core FlashAttention-2 (attention_tc.cu)";
  /* A head size nothing runs is refused here, at setup, not by
   * st_cuda_fail inside the first step; plan says the same words. */
  char why[256];
  if (st_attention_head_refusal(want, C, NH, dt, why, sizeof why))
    return st_error_setc(ST_EXIT_USAGE, "%s", why);
  if (want == ST_ATTENTION_FLASH) {
    /* --attention auto settling on ours comes here too: cuDNN's plans for
     * the shape it gave up are of no further use */
    cuda_attention_cudnn_release();
    snprintf(out->note, sizeof out->note, "%s, deterministic (--attention %s)", ours,
             st_attention_name(asked));
    return 0;
  }
  if (dt == ST_FP32) {
    if (want == ST_ATTENTION_CUDNN || want == ST_ATTENTION_MIXED)
      return st_error_setc(ST_EXIT_USAGE, "--attention %s: cuDNN's fused attention runs bf16 "
                           "and fp16 only; use --precision bf16|fp16, or --attention auto|flash "
                           "with fp32", st_attention_name(want));
    snprintf(out->note, sizeof out->note, "%s, deterministic (--attention auto: fp32 runs ours)",
             ours);
    return 0;
  }
  size_t ws = 0;
  int det = 0, bseq = B;
  if (want == ST_ATTENTION_MIXED) return select_mixed(dt, B, T, C, NH, NKV, ours, asked, "", out);
  /* auto at head size 64 on Hopper: our backward is the faster, and O(T)
   * (st_attention_auto_mixed); ours both ways where cuDNN's forward cannot
   * run either */
  if (want == ST_ATTENTION_AUTO && st_attention_auto_mixed(C / NH, wgmma)) {
    if (select_mixed(dt, B, T, C, NH, NKV, ours, asked, "; at head size 64 on Hopper our "
                     "backward is faster than cuDNN's deterministic one and needs no O(T^2) "
                     "workspace", out) == 0)
      return 0;
    snprintf(out->note, sizeof out->note, "%s, deterministic (--attention auto: cuDNN's forward "
             "has no plan here: %.120s)", ours, cuda_attention_cudnn_error());
    return 0;
  }
  if (cuda_attention_cudnn_prepare(B, T, C, NH, NKV, dt, &ws, &det, &bseq)) {
    if (want == ST_ATTENTION_CUDNN)
      return st_error_set("--attention cudnn: %s; use --attention flash (or auto, which falls "
                          "back to it)", cuda_attention_cudnn_error());
    /* cuDNN's forward may still build where its backward did not */
    char why_not[200];
    snprintf(why_not, sizeof why_not, "; cuDNN's backward has no plan here: %.120s",
             cuda_attention_cudnn_error());
    if (cuda_attention_cudnn_ready(B, T, C, NH, NKV, dt))
      return select_mixed(dt, B, T, C, NH, NKV, ours, asked, why_not, out);
    snprintf(out->note, sizeof out->note, "%s, deterministic (--attention auto: cuDNN has no "
             "plan here: %.120s)", ours, cuda_attention_cudnn_error());
    cuda_attention_cudnn_release(); /* the handle (and any plan) the failed prepare left */
    return 0;
  }
  /* only this shape's plans run from here on */
  cuda_attention_cudnn_keep_only(B, T, C, NH, NKV, dt, 1);
  char ver[32];
  out->impl = ST_ATTENTION_CUDNN;
  out->workspace_bytes = ws;
  out->deterministic = det;
  char groups[64] = "";
  if (bseq < B)
    snprintf(groups, sizeof groups, " in groups of %d sequence%s", bseq, bseq == 1 ? "" : "s");
  snprintf(out->note, sizeof out->note, "%s fused flash attention, %s backward%s, workspace "
           "%.1f MiB (--attention %s)", cudnn_version_str(ver, sizeof ver),
           det ? "deterministic" : "NONDETERMINISTIC", groups, ws / 1048576.0,
           st_attention_name(asked));
  g_cudnn_fwd = g_cudnn_bwd = 1;
  g_cudnn_ws_want = ws; /* the latest selection's shape is the one that runs */
  return 0;
}

extern "C" int st_cuda_attention_select_gqa(st_attention_impl want, st_dtype dt, int B, int T,
                                            int C, int NH, int NKV, st_attention_choice *out) {
  return st_cuda_attention_select_as(want, want, dt, B, T, C, NH, NKV, out);
}

extern "C" int st_cuda_attention_select(st_attention_impl want, st_dtype dt, int B, int T, int C,
                                        int NH, st_attention_choice *out) {
  return st_cuda_attention_select_gqa(want, dt, B, T, C, NH, NH, out);
}

template <typename S>
void cuda_attention_forward(void *out_, float *att, const void *qkv_, int B, int T, int C,
                            int NH, int NKV) {
  check_heads(C, NH, NKV);
  if (use_cudnn_fwd<S>(B, T, C, NH, NKV)) {
    cudnn_check(cuda_attention_cudnn_forward(out_, att, qkv_, B, T, C, NH, NKV,
                                             st_storage_dtype<S>(), g_cudnn_ws));
    return;
  }
  if (use_tc<S>(C, NH)) {
    cuda_attention_tc_forward(out_, att, qkv_, B, T, C, NH, NKV, st_storage_dtype<S>());
    return;
  }
  S *out = (S *)out_;
  const S *qkv = (const S *)qkv_;
  if ((int64_t)B * T * C == 0) return;
  const int hs = C / NH, tile = st_attention_simt_tile(C, NH);
  const float scale = 1.0f / sqrtf((float)hs);
  if (tile == 32) fa_forward<32>(out, att, qkv, B, T, C, NH, NKV, scale);
  else if (tile == 64) fa_forward<64>(out, att, qkv, B, T, C, NH, NKV, scale);
  else if (tile == 128) fa_forward<128>(out, att, qkv, B, T, C, NH, NKV, scale);
  else st_cuda_fail("attention: head size above 128 is not supported", __FILE__, __LINE__);
}

template <typename S>
void cuda_attention_backward(void *dqkv_, float *datt, const void *dout_, const void *qkv_,
                             const void *out_, const float *att, int B, int T, int C, int NH,
                             int NKV) {
  check_heads(C, NH, NKV);
  if (use_cudnn_bwd<S>(B, T, C, NH, NKV)) {
    cudnn_check(cuda_attention_cudnn_backward(dqkv_, dout_, qkv_, out_, att, B, T, C, NH, NKV,
                                              st_storage_dtype<S>(), g_cudnn_ws));
    return;
  }
  if (use_tc<S>(C, NH)) {
    cuda_attention_tc_backward(dqkv_, datt, dout_, qkv_, out_, att, B, T, C, NH, NKV,
                               st_storage_dtype<S>());
    return;
  }
  S *dqkv = (S *)dqkv_;
  const S *dout = (const S *)dout_, *qkv = (const S *)qkv_, *out = (const S *)out_;
  if ((int64_t)B * T * C == 0) return;
  const int hs = C / NH, tile = st_attention_simt_tile(C, NH);
  const float scale = 1.0f / sqrtf((float)hs);
  if (tile == 32) fa_backward<32>(dqkv, datt, dout, qkv, out, att, B, T, C, NH, NKV, scale);
  else if (tile == 64) fa_backward<64>(dqkv, datt, dout, qkv, out, att, B, T, C, NH, NKV, scale);
  else if (tile == 128) fa_backward<128>(dqkv, datt, dout, qkv, out, att, B, T, C, NH, NKV, scale);
  else st_cuda_fail("attention: head size above 128 is not supported", __FILE__, __LINE__);
}

#define ATT_INST(S)                                                                           \
  template void cuda_attention_forward<S>(void *, float *, const void *, int, int, int, int,  \
                                          int);                                              \
  template void cuda_attention_backward<S>(void *, float *, const void *, const void *,       \
                                           const void *, const float *, int, int, int, int,  \
                                           int);
ST_FOR_EACH_STORAGE(ATT_INST)
