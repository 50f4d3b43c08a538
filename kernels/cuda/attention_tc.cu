/* attention_tc.cu - causal multi-head flash attention (FlashAttention-2, Dao
 * 2023) on tensor cores, bf16 or fp16 storage, fp32 accumulation and fp32
 * softmax statistics. Interface and layouts in attention_tc.h.
 *
 * Tensor-core primitive: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16},
 * D[16x8] += A[16x16] B[16x8], one warp. With g = lane/4 and t = lane%4 a
 * thread holds
 *   A: 4 registers of 2 halves: (row g, cols 2t,2t+1), (row g+8, same),
 *      (row g, cols 2t+8,2t+9), (row g+8, same)
 *   B: 2 registers: (rows 2t,2t+1 of column g), (rows 2t+8,2t+9 of column g)
 *   C/D: 4 floats: (row g, cols 2t,2t+1), (row g+8, cols 2t,2t+1).
 * Operands come from shared memory through ldmatrix.x4 (four 8x8 b16
 * matrices; lane l gives the address of row l%8 of matrix l/8, and register
 * i of every lane receives matrix i as (row g, cols 2t,2t+1)). A tile stored
 * row-major [row][d] gives the A operand of row x d products directly, and
 * the B operand of X Y^T products (columns of B are rows of Y) directly too;
 * for X Y products (B[k][n] = Y[k][n], Y stored [k][n]) the .trans form
 * hands each lane (rows 2t,2t+1 of column g), which is the B layout. The
 * C layout of one 16 x 16 block of S (two n-tiles) is exactly the A layout
 * of a 16 x 16 operand after packing pairs to 16 bits, so P and dS go from
 * accumulators to the next product without touching shared memory.
 *
 * Shared-memory rows are hs + 8 elements long: a row is then 16 bytes (4
 * banks) further along the 32 banks than the previous one, so the 8 row
 * addresses of each ldmatrix phase and the 16-byte cp.async stores of a row
 * fall in distinct banks (no swizzle needed), and every row start stays
 * 16-byte aligned for cp.async and ldmatrix. Rows past T are zero-filled by
 * cp.async (src-size 0): masked scores become -inf/0, but the 0 * garbage
 * products of the mma must not see NaN patterns from stale shared memory.
 *
 * 128 threads (4 warps) per block everywhere; each warp owns whole 16-row
 * slices of the block's "row" tile, so softmax statistics reduce only over
 * the 4 lanes of a quad (shuffles) and never across warps. The next K/V (or
 * Q/dO) tile streams in with cp.async while the current one is used (two
 * buffers, one commit group per tile).
 *
 * Forward (one block per (b,h) and query tile, longest rows first):
 *   query tile BR = 128 rows for hs <= 64 (32 rows = 2 m16 slices per warp),
 *   64 rows for hs = 128 (16 per warp, to stay within 255 registers); key
 *   tiles of 64. Q fragments stay in registers; S = Q K^T for the warp's rows
 *   x 64 keys, online softmax in the log2 domain (exp2f of one fmaf:
 *   score * log2(e)/sqrt(hs) - running max), O += P V with P rounded to the
 *   storage type.
 *   A warp skips key tiles that lie wholly above its rows (causal). The
 *   output goes through the warp's own Q rows in shared memory so that the
 *   global stores are 16-byte and coalesced. lse = (m + log2 l) ln 2.
 *   Shared memory: (BR + 4*64) * (hs+8) * 2 bytes (55 KB at hs = 64).
 * Backward, three kernels:
 *   delta: D = rowsum(dO * O) in fp32, one warp per (b,t,h), into scratch.
 *   dq: one block per query tile of 64 rows (16 per warp), walking key tiles
 *     0..diagonal (64 keys; 32 for hs = 128): S = Q K^T, dP = dO V^T,
 *     P = exp2(S*scale*log2e - lse*log2e), dS = P (dP - D), dQ += dS K.
 *   dkv: one block per (kv head, key tile of 64 keys; 16 per warp), walking
 *     the query heads of its group (grouped-query attention: query head h
 *     reads kv head h / (NH/NKV)) and for each the query tiles from the
 *     diagonal to the end (64 queries; 32 for hs = 128),
 *     computing the transposed products directly: S^T = K Q^T, dP^T = V dO^T,
 *     dV += P^T dO, dK += dS^T Q (so P^T and dS^T are again accumulators that
 *     become A operands in registers).
 *   Both reload their A fragments (Q, dO or K, V) from shared memory at each
 *   use instead of holding them, leaving the registers to four accumulators.
 *   Shared memory: (2*64 + 4*BC) * (hs+8) * 2 bytes, plus the lse/D rows of
 *   two query tiles for dkv (55-56 KB at hs = 64).
 *
 * Determinism: every output element is produced by one thread: the
 * accumulation order inside an mma is fixed by the hardware, the tiles are
 * walked in a fixed order, quad reductions are fixed butterflies, and each
 * gradient element is read, added to and written once by its owner (dQ by
 * the dq kernel, dK and dV by the dkv kernel). No atomics; results are
 * bit-identical from run to run on the same GPU model.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/attention_choice.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/attention_wgmma.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "util/envparse.h"

#define TC_WARPS 4
#define TC_THREADS (32 * TC_WARPS)
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.69314718055994531f

/* ---- PTX wrappers */

__device__ __forceinline__ void tc_ldsm4(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(st_saddr(p)));
}
__device__ __forceinline__ void tc_ldsm4t(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(st_saddr(p)));
}

/* Lane address offsets (row, column) inside a 16 x 16 block of a row-major
 * tile for ldmatrix.x4.
 * "A order": matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7),
 *   (rows 0-7, cols 8-15), (rows 8-15, cols 8-15): registers 0..3 are the A
 *   operand of the block; with .trans on a [k][n] tile they are b0,b1 of
 *   n-tile 0 (cols 0-7) then b0,b1 of n-tile 1 (cols 8-15).
 * "B order": matrices (rows 0-7, cols 0-7), (rows 0-7, cols 8-15),
 *   (rows 8-15, cols 0-7), (rows 8-15, cols 8-15): on a tile Y of an X Y^T
 *   product, registers 0,1 are b0,b1 of n-tile 0 (Y rows 0-7) and 2,3 of
 *   n-tile 1 (Y rows 8-15), k = the 16 columns. */
__device__ __forceinline__ int tc_arow(int lane) { return lane & 15; }
__device__ __forceinline__ int tc_acol(int lane) { return (lane >> 4) << 3; }
__device__ __forceinline__ int tc_brow(int lane) { return (lane & 7) | ((lane >> 1) & 8); }
__device__ __forceinline__ int tc_bcol(int lane) { return lane & 8; }

/* Storage-type specifics: packing two floats into the 32-bit pair layout of
 * the mma operands (first element in the low half) and the mma itself. */
template <typename E>
struct tc_type;

template <>
struct tc_type<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
  }
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    __nv_bfloat162 v;
    memcpy(&v, &u, sizeof u);
    return __bfloat1622float2(v);
  }
  static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct tc_type<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
  }
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    __half2 v;
    memcpy(&v, &u, sizeof u);
    return __half22float2(v);
  }
  static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

/* Block-wide: rows row0..row0+ROWS-1 of a [*, stride] matrix (row r at
 * src + r*stride, HD columns) into dst[ROWS][HD+8] with cp.async; rows >= T
 * become zeros. The caller commits the group. */
template <typename E, int HD, int ROWS>
__device__ __forceinline__ void tc_load_rows(E *dst, const E *src, int64_t stride, int row0,
                                             int T) {
  constexpr int CH = HD / 8, LDS = HD + 8; /* 16-byte chunks per row */
#pragma unroll
  for (int i = threadIdx.x; i < ROWS * CH; i += TC_THREADS) {
    const int r = i / CH, c = i % CH, t = row0 + r;
    const E *g = src + (int64_t)(t < T ? t : 0) * stride + c * 8; /* a valid address either way */
    st_cp16(dst + r * LDS + c * 8, g, t < T ? 16 : 0);
  }
}

/* Block-wide: v[row0..row0+N-1] (rows >= T as 0) into dst[N], fp32. */
template <int N>
__device__ __forceinline__ void tc_load_vec(float *dst, const float *v, int row0, int T) {
  if (threadIdx.x < N) {
    const int t = row0 + (int)threadIdx.x;
    st_cp4(dst + threadIdx.x, v + (t < T ? t : 0), t < T ? 4 : 0);
  }
}

/* ---- forward */

template <typename E, int HD, int MT>
__global__ void __launch_bounds__(TC_THREADS)
    tc_forward_kernel(E *out, float *lse, const E *qkv, int T, int C, int NH, int NKV, float sl2) {
  typedef tc_type<E> TT;
  constexpr int BR = TC_WARPS * 16 * MT, BC = 64, LDS = HD + 8;
  constexpr int KD = HD / 16, ND = HD / 8, NC = BC / 8;
  extern __shared__ __align__(16) unsigned char tc_smem[];
  E *Qs = (E *)tc_smem, *Ks = Qs + BR * LDS, *Vs = Ks + 2 * BC * LDS;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int nq = (T + BR - 1) / BR, qt = nq - 1 - (int)blockIdx.y; /* longest rows first */
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH, R = C + 2 * NKV * HD;
  const int q0 = qt * BR, wrow = warp * 16 * MT, w0 = q0 + wrow; /* the warp's first row */
  const E *base = qkv + (int64_t)b * T * R + h * HD;
  const E *kbase = qkv + (int64_t)b * T * R + C + (h / (NH / NKV)) * HD, *vbase = kbase + NKV * HD;
  const int kend = min(T, q0 + BR), nk = (kend + BC - 1) / BC;

  tc_load_rows<E, HD, BR>(Qs, base, R, q0, T);
  tc_load_rows<E, HD, BC>(Ks, kbase, R, 0, T);
  tc_load_rows<E, HD, BC>(Vs, vbase, R, 0, T);
  st_cp_commit();

  uint32_t qf[MT][KD][4];
  float o[MT][ND][4], m[MT][2], l[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; mi++) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) m[mi][hh] = -INFINITY, l[mi][hh] = 0.0f;
#pragma unroll
    for (int nd = 0; nd < ND; nd++)
#pragma unroll
      for (int e = 0; e < 4; e++) o[mi][nd][e] = 0.0f;
  }

  for (int kt = 0; kt < nk; kt++) {
    const int k0 = kt * BC;
    const E *Kb = Ks + (kt & 1) * BC * LDS, *Vb = Vs + (kt & 1) * BC * LDS;
    if (kt + 1 < nk) {
      /* that buffer was last read in iteration kt-1, which ended in a barrier */
      tc_load_rows<E, HD, BC>(Ks + ((kt + 1) & 1) * BC * LDS, kbase, R, k0 + BC, T);
      tc_load_rows<E, HD, BC>(Vs + ((kt + 1) & 1) * BC * LDS, vbase, R, k0 + BC, T);
      st_cp_commit();
      st_cp_wait<1>();
    } else {
      st_cp_wait<0>();
    }
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
          tc_ldsm4(qf[mi][kk], Qs + (wrow + 16 * mi + tc_arow(lane)) * LDS + 16 * kk + tc_acol(lane));
    }
    /* Tile 0 is never skipped (key 0 is visible to every row), so m is finite
     * from then on and fully masked rows of later tiles give alpha = 1, p = 0. */
    if (k0 <= w0 + 16 * MT - 1) {
      float s[MT][NC][4];
#pragma unroll
      for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int nj = 0; nj < NC; nj++)
#pragma unroll
          for (int e = 0; e < 4; e++) s[mi][nj][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KD; kk++)
#pragma unroll
        for (int np = 0; np < NC / 2; np++) {
          uint32_t kb[4];
          tc_ldsm4(kb, Kb + (16 * np + tc_brow(lane)) * LDS + 16 * kk + tc_bcol(lane));
#pragma unroll
          for (int mi = 0; mi < MT; mi++) {
            TT::mma(s[mi][2 * np], qf[mi][kk], kb[0], kb[1]);
            TT::mma(s[mi][2 * np + 1], qf[mi][kk], kb[2], kb[3]);
          }
        }
      const bool need_mask = k0 + BC - 1 > w0 || k0 + BC > T;
#pragma unroll
      for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          const int row = w0 + 16 * mi + g + 8 * hh;
          /* the maximum is taken over the unscaled scores (scale > 0) so that
           * scaling and subtracting are one fmaf in the exponent */
          float mx = -INFINITY;
#pragma unroll
          for (int nj = 0; nj < NC; nj++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
              if (need_mask) {
                const int col = k0 + 8 * nj + 2 * t4 + e;
                if (col > row || col >= T) s[mi][nj][2 * hh + e] = -INFINITY;
              }
              mx = fmaxf(mx, s[mi][nj][2 * hh + e]);
            }
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float mnew = fmaxf(m[mi][hh], mx * sl2);
          const float alpha = exp2f(m[mi][hh] - mnew); /* 0 on the first tile (m = -inf) */
          m[mi][hh] = mnew;
          float sum = 0.0f;
#pragma unroll
          for (int nj = 0; nj < NC; nj++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
              const float p = exp2f(fmaf(s[mi][nj][2 * hh + e], sl2, -mnew));
              s[mi][nj][2 * hh + e] = p;
              sum += p;
            }
          /* per-thread partial of the row sum; the quad is reduced once at the end */
          l[mi][hh] = l[mi][hh] * alpha + sum;
#pragma unroll
          for (int nd = 0; nd < ND; nd++) o[mi][nd][2 * hh] *= alpha, o[mi][nd][2 * hh + 1] *= alpha;
        }
#pragma unroll
      for (int kc = 0; kc < NC / 2; kc++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {
          pa[mi][0] = TT::pack(s[mi][2 * kc][0], s[mi][2 * kc][1]);
          pa[mi][1] = TT::pack(s[mi][2 * kc][2], s[mi][2 * kc][3]);
          pa[mi][2] = TT::pack(s[mi][2 * kc + 1][0], s[mi][2 * kc + 1][1]);
          pa[mi][3] = TT::pack(s[mi][2 * kc + 1][2], s[mi][2 * kc + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
          uint32_t vb[4];
          tc_ldsm4t(vb, Vb + (16 * kc + tc_arow(lane)) * LDS + 16 * dp + tc_acol(lane));
#pragma unroll
          for (int mi = 0; mi < MT; mi++) {
            TT::mma(o[mi][2 * dp], pa[mi], vb[0], vb[1]);
            TT::mma(o[mi][2 * dp + 1], pa[mi], vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();
  }

  /* Normalise into the warp's own Q rows (only this warp ever read them),
   * then copy them out 16 bytes per lane. */
#pragma unroll
  for (int mi = 0; mi < MT; mi++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float lt = l[mi][hh];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const float inv = 1.0f / lt;
      const int rl = wrow + 16 * mi + g + 8 * hh, row = q0 + rl;
#pragma unroll
      for (int nd = 0; nd < ND; nd++)
        *(uint32_t *)(Qs + rl * LDS + 8 * nd + 2 * t4) =
            TT::pack(o[mi][nd][2 * hh] * inv, o[mi][nd][2 * hh + 1] * inv);
      if (t4 == 0 && row < T) lse[(int64_t)bh * T + row] = (m[mi][hh] + log2f(lt)) * TC_LN2;
    }
  __syncwarp();
  constexpr int CH = HD / 8;
#pragma unroll
  for (int i = lane; i < 16 * MT * CH; i += 32) {
    const int r = i / CH, c = i % CH, row = w0 + r;
    if (row < T)
      *(uint4 *)(out + ((int64_t)b * T + row) * C + h * HD + c * 8) =
          *(const uint4 *)(Qs + (wrow + r) * LDS + c * 8);
  }
}

/* ---- backward */

/* D[b,h,t] = sum_d dout[b,t,h,d] * out[b,t,h,d], one warp per (b,t,h). */
template <typename E>
__global__ void tc_delta_kernel(float *D, const E *dout, const E *out, int64_t rows, int T, int C,
                                int NH) {
  typedef tc_type<E> TT;
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= rows) return; /* whole warps leave together */
  const int h = (int)(w % NH), hs = C / NH;
  const int64_t bt = w / NH;
  const E *o = out + bt * C + h * hs, *d = dout + bt * C + h * hs;
  float acc = 0.0f;
  for (int i = 2 * lane; i < hs; i += 64) {
    const float2 x = TT::unpack(*(const uint32_t *)(o + i));
    const float2 y = TT::unpack(*(const uint32_t *)(d + i));
    acc = fmaf(x.x, y.x, acc);
    acc = fmaf(x.y, y.y, acc);
  }
  acc = st_warp_sum(acc);
  if (lane == 0) D[((bt / T) * NH + h) * T + bt % T] = acc;
}

/* One block per (b,h) and query tile of 64: dQ, added into dqkv. */
template <typename E, int HD, int BC>
__global__ void __launch_bounds__(TC_THREADS)
    tc_dq_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *Dg, int T,
                 int C, int NH, int NKV, float sl2, float scale) {
  typedef tc_type<E> TT;
  constexpr int BR = TC_WARPS * 16, LDS = HD + 8, KD = HD / 16, ND = HD / 8, NC = BC / 8;
  extern __shared__ __align__(16) unsigned char tc_smem[];
  E *Qs = (E *)tc_smem, *dOs = Qs + BR * LDS, *Ks = dOs + BR * LDS, *Vs = Ks + 2 * BC * LDS;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int nq = (T + BR - 1) / BR, qt = nq - 1 - (int)blockIdx.y;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH, R = C + 2 * NKV * HD;
  const int q0 = qt * BR, wrow = 16 * warp, w0 = q0 + wrow;
  const E *base = qkv + (int64_t)b * T * R + h * HD;
  const E *kbase = qkv + (int64_t)b * T * R + C + (h / (NH / NKV)) * HD, *vbase = kbase + NKV * HD;
  const int kend = min(T, q0 + BR), nk = (kend + BC - 1) / BC;

  tc_load_rows<E, HD, BR>(Qs, base, R, q0, T);
  tc_load_rows<E, HD, BR>(dOs, dout + (int64_t)b * T * C + h * HD, C, q0, T);
  tc_load_rows<E, HD, BC>(Ks, kbase, R, 0, T);
  tc_load_rows<E, HD, BC>(Vs, vbase, R, 0, T);
  st_cp_commit();

  float L2[2], Dr[2];
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int row = w0 + g + 8 * hh;
    L2[hh] = row < T ? lse[(int64_t)bh * T + row] * TC_LOG2E : 0.0f;
    Dr[hh] = row < T ? Dg[(int64_t)bh * T + row] : 0.0f;
  }
  float dq[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; nd++)
#pragma unroll
    for (int e = 0; e < 4; e++) dq[nd][e] = 0.0f;

  for (int kt = 0; kt < nk; kt++) {
    const int k0 = kt * BC;
    const E *Kb = Ks + (kt & 1) * BC * LDS, *Vb = Vs + (kt & 1) * BC * LDS;
    if (kt + 1 < nk) {
      tc_load_rows<E, HD, BC>(Ks + ((kt + 1) & 1) * BC * LDS, kbase, R, k0 + BC, T);
      tc_load_rows<E, HD, BC>(Vs + ((kt + 1) & 1) * BC * LDS, vbase, R, k0 + BC, T);
      st_cp_commit();
      st_cp_wait<1>();
    } else {
      st_cp_wait<0>();
    }
    __syncthreads();
    if (k0 <= w0 + 15) {
      float s[NC][4], dp[NC][4];
#pragma unroll
      for (int nj = 0; nj < NC; nj++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[nj][e] = 0.0f, dp[nj][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        uint32_t qa[4], da[4];
        tc_ldsm4(qa, Qs + (wrow + tc_arow(lane)) * LDS + 16 * kk + tc_acol(lane));
        tc_ldsm4(da, dOs + (wrow + tc_arow(lane)) * LDS + 16 * kk + tc_acol(lane));
#pragma unroll
        for (int np = 0; np < NC / 2; np++) {
          uint32_t kb[4], vb[4];
          tc_ldsm4(kb, Kb + (16 * np + tc_brow(lane)) * LDS + 16 * kk + tc_bcol(lane));
          tc_ldsm4(vb, Vb + (16 * np + tc_brow(lane)) * LDS + 16 * kk + tc_bcol(lane));
          TT::mma(s[2 * np], qa, kb[0], kb[1]);
          TT::mma(s[2 * np + 1], qa, kb[2], kb[3]);
          TT::mma(dp[2 * np], da, vb[0], vb[1]);
          TT::mma(dp[2 * np + 1], da, vb[2], vb[3]);
        }
      }
      /* Only the causal cut needs a mask: col > row covers keys >= T for
       * rows < T, and rows >= T (zero Q, dO, lse, D: dS = 0) are never stored. */
      const bool need_mask = k0 + BC - 1 > w0;
#pragma unroll
      for (int nj = 0; nj < NC; nj++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int row = w0 + g + 8 * hh, col = k0 + 8 * nj + 2 * t4 + e;
            float p = exp2f(fmaf(s[nj][2 * hh + e], sl2, -L2[hh]));
            if (need_mask && col > row) p = 0.0f;
            s[nj][2 * hh + e] = p * (dp[nj][2 * hh + e] - Dr[hh]); /* dS, unscaled */
          }
#pragma unroll
      for (int kc = 0; kc < NC / 2; kc++) {
        uint32_t a[4];
        a[0] = TT::pack(s[2 * kc][0], s[2 * kc][1]);
        a[1] = TT::pack(s[2 * kc][2], s[2 * kc][3]);
        a[2] = TT::pack(s[2 * kc + 1][0], s[2 * kc + 1][1]);
        a[3] = TT::pack(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
        for (int dp2 = 0; dp2 < HD / 16; dp2++) {
          uint32_t kb[4];
          tc_ldsm4t(kb, Kb + (16 * kc + tc_arow(lane)) * LDS + 16 * dp2 + tc_acol(lane));
          TT::mma(dq[2 * dp2], a, kb[0], kb[1]);
          TT::mma(dq[2 * dp2 + 1], a, kb[2], kb[3]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int row = w0 + g + 8 * hh;
    if (row >= T) continue;
    E *gq = dqkv + ((int64_t)b * T + row) * R + h * HD + 2 * t4;
#pragma unroll
    for (int nd = 0; nd < ND; nd++) {
      uint32_t *p = (uint32_t *)(gq + 8 * nd);
      *p = TT::pack(dq[nd][2 * hh] * scale, dq[nd][2 * hh + 1] * scale);
    }
  }
}

/* One block per (b, kv head) and key tile of 64: dK and dV, written into
 * dqkv. The warp's accumulator rows are keys, its columns queries. With GQA
 * the block walks (query head of its group, query tile) in one flat
 * sequence, head-major, so the prefetch of the next Q/dO tile crosses from
 * one head to the next without a bubble and each element's sum over the
 * group is taken in a fixed order by its owner. */
template <typename E, int HD, int BQ>
__global__ void __launch_bounds__(TC_THREADS)
    tc_dkv_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *Dg, int T,
                  int C, int NH, int NKV, float sl2, float scale) {
  typedef tc_type<E> TT;
  constexpr int BK = TC_WARPS * 16, LDS = HD + 8, KD = HD / 16, ND = HD / 8, NQ = BQ / 8;
  extern __shared__ __align__(16) unsigned char tc_smem[];
  E *Ks = (E *)tc_smem, *Vs = Ks + BK * LDS, *Qs = Vs + BK * LDS, *dOs = Qs + 2 * BQ * LDS;
  float *Ls = (float *)(dOs + 2 * BQ * LDS), *Ds = Ls + 2 * BQ;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int k0 = (int)blockIdx.y * BK; /* key tile 0 has the most query tiles: first */
  const int bk = blockIdx.x, b = bk / NKV, kh = bk % NKV, grp = NH / NKV, R = C + 2 * NKV * HD;
  const int wrow = 16 * warp, w0 = k0 + wrow; /* the warp's first key */
  const E *kbase = qkv + (int64_t)b * T * R + C + kh * HD, *vbase = kbase + NKV * HD;
  const int nq = (T + BQ - 1) / BQ, qt0 = k0 / BQ, per = nq - qt0, count = grp * per;
  /* step j of the walk: query head kh*grp + j/per, query tile qt0 + j%per */
#define TC_DKV_LOAD(j, buf)                                                                      \
  do {                                                                                           \
    const int h_ = kh * grp + (j) / per, r0_ = (qt0 + (j) % per) * BQ;                           \
    const int64_t bh_ = (int64_t)b * NH + h_;                                                    \
    tc_load_rows<E, HD, BQ>(Qs + (buf) * BQ * LDS, qkv + (int64_t)b * T * R + h_ * HD, R, r0_, T); \
    tc_load_rows<E, HD, BQ>(dOs + (buf) * BQ * LDS, dout + (int64_t)b * T * C + h_ * HD, C, r0_, \
                            T);                                                                  \
    tc_load_vec<BQ>(Ls + (buf) * BQ, lse + bh_ * T, r0_, T);                                     \
    tc_load_vec<BQ>(Ds + (buf) * BQ, Dg + bh_ * T, r0_, T);                                      \
  } while (0)

  tc_load_rows<E, HD, BK>(Ks, kbase, R, k0, T);
  tc_load_rows<E, HD, BK>(Vs, vbase, R, k0, T);
  TC_DKV_LOAD(0, 0);
  st_cp_commit();

  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; nd++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[nd][e] = 0.0f, dv[nd][e] = 0.0f;

  for (int i = 0; i < count; i++) {
    const int q0 = (qt0 + i % per) * BQ, cur = i & 1, nxt = cur ^ 1;
    const E *Qb = Qs + cur * BQ * LDS, *dOb = dOs + cur * BQ * LDS;
    const float *Lb = Ls + cur * BQ, *Db = Ds + cur * BQ;
    if (i + 1 < count) {
      TC_DKV_LOAD(i + 1, nxt);
      st_cp_commit();
      st_cp_wait<1>();
    } else {
      st_cp_wait<0>();
    }
    __syncthreads();
    if (q0 + BQ - 1 >= w0) { /* else every query of the tile precedes the warp's keys */
      float st[NQ][4], dpt[NQ][4];
#pragma unroll
      for (int nj = 0; nj < NQ; nj++)
#pragma unroll
        for (int e = 0; e < 4; e++) st[nj][e] = 0.0f, dpt[nj][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        uint32_t ka[4], va[4];
        tc_ldsm4(ka, Ks + (wrow + tc_arow(lane)) * LDS + 16 * kk + tc_acol(lane));
        tc_ldsm4(va, Vs + (wrow + tc_arow(lane)) * LDS + 16 * kk + tc_acol(lane));
#pragma unroll
        for (int np = 0; np < NQ / 2; np++) {
          uint32_t qb[4], ob[4];
          tc_ldsm4(qb, Qb + (16 * np + tc_brow(lane)) * LDS + 16 * kk + tc_bcol(lane));
          tc_ldsm4(ob, dOb + (16 * np + tc_brow(lane)) * LDS + 16 * kk + tc_bcol(lane));
          TT::mma(st[2 * np], ka, qb[0], qb[1]);
          TT::mma(st[2 * np + 1], ka, qb[2], qb[3]);
          TT::mma(dpt[2 * np], va, ob[0], ob[1]);
          TT::mma(dpt[2 * np + 1], va, ob[2], ob[3]);
        }
      }
      /* queries >= T are masked too (zeros in Q, dO, lse and D would give P = 1) */
      const bool need_mask = q0 < w0 + 15 || q0 + BQ > T;
#pragma unroll
      for (int nj = 0; nj < NQ; nj++) {
        const int qc = 8 * nj + 2 * t4;
        const float2 lq = *(const float2 *)(Lb + qc), dq = *(const float2 *)(Db + qc);
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int key = w0 + g + 8 * hh, query = q0 + qc + e;
            float p = exp2f(fmaf(st[nj][2 * hh + e], sl2, -(e ? lq.y : lq.x) * TC_LOG2E));
            if (need_mask && (key > query || query >= T)) p = 0.0f;
            st[nj][2 * hh + e] = p;
            dpt[nj][2 * hh + e] = p * (dpt[nj][2 * hh + e] - (e ? dq.y : dq.x)); /* dS^T, unscaled */
          }
      }
#pragma unroll
      for (int kc = 0; kc < NQ / 2; kc++) {
        uint32_t pa[4], sa[4];
        pa[0] = TT::pack(st[2 * kc][0], st[2 * kc][1]);
        pa[1] = TT::pack(st[2 * kc][2], st[2 * kc][3]);
        pa[2] = TT::pack(st[2 * kc + 1][0], st[2 * kc + 1][1]);
        pa[3] = TT::pack(st[2 * kc + 1][2], st[2 * kc + 1][3]);
        sa[0] = TT::pack(dpt[2 * kc][0], dpt[2 * kc][1]);
        sa[1] = TT::pack(dpt[2 * kc][2], dpt[2 * kc][3]);
        sa[2] = TT::pack(dpt[2 * kc + 1][0], dpt[2 * kc + 1][1]);
        sa[3] = TT::pack(dpt[2 * kc + 1][2], dpt[2 * kc + 1][3]);
#pragma unroll
        for (int dp2 = 0; dp2 < HD / 16; dp2++) {
          uint32_t ob[4], qb[4];
          tc_ldsm4t(ob, dOb + (16 * kc + tc_arow(lane)) * LDS + 16 * dp2 + tc_acol(lane));
          tc_ldsm4t(qb, Qb + (16 * kc + tc_arow(lane)) * LDS + 16 * dp2 + tc_acol(lane));
          TT::mma(dv[2 * dp2], pa, ob[0], ob[1]);
          TT::mma(dv[2 * dp2 + 1], pa, ob[2], ob[3]);
          TT::mma(dk[2 * dp2], sa, qb[0], qb[1]);
          TT::mma(dk[2 * dp2 + 1], sa, qb[2], qb[3]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int key = w0 + g + 8 * hh;
    if (key >= T) continue;
    E *gk = dqkv + ((int64_t)b * T + key) * R + C + kh * HD + 2 * t4;
#pragma unroll
    for (int nd = 0; nd < ND; nd++) {
      uint32_t *pk = (uint32_t *)(gk + 8 * nd), *pv = (uint32_t *)(gk + NKV * HD + 8 * nd);
      *pk = TT::pack(dk[nd][2 * hh] * scale, dk[nd][2 * hh + 1] * scale);
      *pv = TT::pack(dv[nd][2 * hh], dv[nd][2 * hh + 1]);
    }
  }
}

#undef TC_DKV_LOAD

/* ---- host side */

/* Query rows per forward block: 2 m16 slices per warp where the registers
 * allow (hs <= 64), 1 for hs = 128. Backward column tiles shrink to 32 at
 * hs = 128 for the same reason. */
template <int HD>
struct tc_cfg {
  static constexpr int FWD_MT = HD <= 64 ? 2 : 1;
  static constexpr int BWD_BC = HD <= 64 ? 64 : 32;
};

static void tc_check(const void *p, const char *what) {
  if (((uintptr_t)p & 15) != 0) st_cuda_fail(what, __FILE__, __LINE__);
}

template <typename E, int HD>
static void tc_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                       int NKV) {
  constexpr int MT = tc_cfg<HD>::FWD_MT, BR = TC_WARPS * 16 * MT;
  const size_t sm = (size_t)(BR + 4 * 64) * (HD + 8) * sizeof(E);
  const float sl2 = TC_LOG2E / sqrtf((float)HD);
  ST_CUDA_CHECK(cudaFuncSetAttribute(tc_forward_kernel<E, HD, MT>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
  const dim3 grid((unsigned)(B * NH), (unsigned)((T + BR - 1) / BR));
  tc_forward_kernel<E, HD, MT><<<grid, TC_THREADS, sm>>>((E *)out, lse, (const E *)qkv, T, C, NH,
                                                         NKV, sl2);
  ST_CUDA_LAUNCHED();
}

/* D = rowsum(dout * out) [B,NH,T] fp32, the backward's first pass (both kernel families). */
static void tc_delta(float *D, const void *dout, const void *out, int B, int T, int C, int NH,
                     st_dtype dt) {
  const int64_t rows = (int64_t)B * T * NH;
  if (dt == ST_BF16)
    tc_delta_kernel<__nv_bfloat16><<<st_blocks(rows * 32, 256), 256>>>(
        D, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)out, rows, T, C, NH);
  else
    tc_delta_kernel<__half><<<st_blocks(rows * 32, 256), 256>>>(D, (const __half *)dout,
                                                                (const __half *)out, rows, T, C, NH);
  ST_CUDA_LAUNCHED();
}

template <typename E, int HD>
static void tc_backward(void *dqkv, float *D, const void *dout, const void *qkv, const void *out,
                        const float *lse, int B, int T, int C, int NH, int NKV) {
  constexpr int BC = tc_cfg<HD>::BWD_BC, BR = TC_WARPS * 16;
  const float scale = 1.0f / sqrtf((float)HD), sl2 = scale * TC_LOG2E;
  tc_delta(D, dout, out, B, T, C, NH, std::is_same<E, __half>::value ? ST_FP16 : ST_BF16);
  const dim3 grid((unsigned)(B * NH), (unsigned)((T + BR - 1) / BR));
  const size_t sq = (size_t)(2 * BR + 4 * BC) * (HD + 8) * sizeof(E);
  ST_CUDA_CHECK(cudaFuncSetAttribute(tc_dq_kernel<E, HD, BC>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sq));
  tc_dq_kernel<E, HD, BC><<<grid, TC_THREADS, sq>>>((E *)dqkv, (const E *)dout, (const E *)qkv, lse,
                                                    D, T, C, NH, NKV, sl2, scale);
  ST_CUDA_LAUNCHED();
  const size_t skv = (size_t)(2 * BR + 4 * BC) * (HD + 8) * sizeof(E) + 4 * BC * sizeof(float);
  ST_CUDA_CHECK(cudaFuncSetAttribute(tc_dkv_kernel<E, HD, BC>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)skv));
  const dim3 kvgrid((unsigned)(B * NKV), grid.y);
  tc_dkv_kernel<E, HD, BC><<<kvgrid, TC_THREADS, skv>>>((E *)dqkv, (const E *)dout,
                                                        (const E *)qkv, lse, D, T, C, NH, NKV,
                                                        sl2, scale);
  ST_CUDA_LAUNCHED();
}

int cuda_attention_tc_supported(int C, int NH, st_dtype dt) {
  return st_attention_tc_takes(C, NH, dt); /* the rule, unit-tested on the CPU */
}

/* -1 until the first call reads ST_ATTENTION_WGMMA: unset, "" or "1" on,
 * "0" off; anything else is reported once and leaves them on. */
static int g_use_wgmma = -1;

static int use_wgmma(void) {
  if (g_use_wgmma < 0) {
    const char *e = getenv("ST_ATTENTION_WGMMA");
    const int k = st_envparse_switch(e);
    if (k < 0)
      fprintf(stderr, "shardtrain: warning: ST_ATTENTION_WGMMA=%s is not 0 or 1; the "
              "warpgroup-MMA kernels stay on where they run\n", e);
    g_use_wgmma = !(e && *e) || k != 0;
  }
  return g_use_wgmma;
}

int cuda_attention_tc_use_wgmma(int on) {
  const int was = use_wgmma();
  g_use_wgmma = on != 0;
  return was;
}

int cuda_attention_tc_runs_wgmma(int B, int C, int NH, st_dtype dt) {
  return use_wgmma() && cuda_attention_tc_supported(C, NH, dt) &&
         cuda_attention_wgmma_takes(B, C / NH, NH, dt);
}

void cuda_attention_tc_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                               int NKV, st_dtype dt) {
  if ((int64_t)B * T * C == 0) return;
  if (!cuda_attention_tc_supported(C, NH, dt))
    st_cuda_fail("attention_tc: unsupported head size or dtype", __FILE__, __LINE__);
  if (NKV <= 0 || NH % NKV != 0)
    st_cuda_fail("attention_tc: NKV must divide NH", __FILE__, __LINE__);
  tc_check(out, "attention_tc: out is not 16-byte aligned");
  tc_check(qkv, "attention_tc: qkv is not 16-byte aligned");
  const int hs = C / NH;
  if (cuda_attention_tc_runs_wgmma(B, C, NH, dt)) {
    cuda_attention_wgmma_forward(out, lse, qkv, B, T, hs, NH, NKV, dt);
    return;
  }
  if (dt == ST_BF16) {
    if (hs == 32) tc_forward<__nv_bfloat16, 32>(out, lse, qkv, B, T, C, NH, NKV);
    else if (hs == 64) tc_forward<__nv_bfloat16, 64>(out, lse, qkv, B, T, C, NH, NKV);
    else tc_forward<__nv_bfloat16, 128>(out, lse, qkv, B, T, C, NH, NKV);
  } else {
    if (hs == 32) tc_forward<__half, 32>(out, lse, qkv, B, T, C, NH, NKV);
    else if (hs == 64) tc_forward<__half, 64>(out, lse, qkv, B, T, C, NH, NKV);
    else tc_forward<__half, 128>(out, lse, qkv, B, T, C, NH, NKV);
  }
}

void cuda_attention_tc_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                const void *out, const float *lse, int B, int T, int C, int NH,
                                int NKV, st_dtype dt) {
  if ((int64_t)B * T * C == 0) return;
  if (!cuda_attention_tc_supported(C, NH, dt))
    st_cuda_fail("attention_tc: unsupported head size or dtype", __FILE__, __LINE__);
  if (NKV <= 0 || NH % NKV != 0)
    st_cuda_fail("attention_tc: NKV must divide NH", __FILE__, __LINE__);
  tc_check(dqkv, "attention_tc: dqkv is not 16-byte aligned");
  tc_check(dout, "attention_tc: dout is not 16-byte aligned");
  tc_check(qkv, "attention_tc: qkv is not 16-byte aligned");
  tc_check(out, "attention_tc: out is not 16-byte aligned");
  const int hs = C / NH;
  if (cuda_attention_tc_runs_wgmma(B, C, NH, dt)) {
    tc_delta(scratch, dout, out, B, T, C, NH, dt);
    cuda_attention_wgmma_backward(dqkv, scratch, dout, qkv, lse, B, T, hs, NH, NKV, dt);
    return;
  }
  if (dt == ST_BF16) {
    if (hs == 32) tc_backward<__nv_bfloat16, 32>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV);
    else if (hs == 64) tc_backward<__nv_bfloat16, 64>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV);
    else tc_backward<__nv_bfloat16, 128>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV);
  } else {
    if (hs == 32) tc_backward<__half, 32>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV);
    else if (hs == 64) tc_backward<__half, 64>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV);
    else tc_backward<__half, 128>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV);
  }
}
