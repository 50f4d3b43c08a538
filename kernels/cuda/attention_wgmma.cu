/* attention_wgmma.cu - causal flash attention on Hopper's warpgroup MMA.
 * Interface in attention_wgmma.h; the same layouts as attention_tc.h.
 *
 * Primitive: wgmma.mma_async m64nNk16 (kernels/cuda/wgmma_mma.cuh), one
 * warpgroup (4 warps, 128 threads) computing D[64 x N] += A[64 x 16] B[16 x N]
 * with fp32 accumulators. A comes from shared memory or, for P and dS, from
 * registers: the accumulator layout of a 64 x 64 product (thread t of warp w
 * holds rows 16w + t/4 and +8, columns 8i + 2(t%4) and +1) packed to 16-bit
 * pairs is exactly the register A layout of the next product, so P and dS
 * never touch shared memory. B comes from shared memory.
 *
 * Shared-memory tiles are 64 rows x 64 columns (128 bytes a row) in the
 * 128-byte swizzle wgmma reads (16-byte chunk c of row r at c ^ (r % 8)); a
 * head size of 128 is two such column blocks, 8192 bytes apart. Descriptors
 * (PTX ISA, "Matrix Descriptor Format"): K-major operands (Q K^T: both
 * tiles row-major in the reduced dimension) use leading offset 16 and stride
 * 1024 (8 rows of 128 bytes); MN-major B operands (P V, dS K, P^T dO, dS^T
 * Q: the row-major tile IS B[k][n]) use stride 1024 between groups of 8
 * k-rows and leading offset 8192 between 64-column blocks. All were checked
 * on an H100 against a float64 reference (tests/test_cuda_attention_tc.cu).
 *
 * Tiles stream in with cp.async, two buffers, one commit group a tile; rows
 * past T are zero-filled, so padded query rows and keys give finite scores
 * and zero contributions, and only the diagonal tile needs the causal mask.
 *
 * Forward (one block per (b, h) and 64 NWG query rows, longest rows first):
 *   each warpgroup owns 64 query rows; the K/V tile of 64 keys is shared by
 *   the NWG warpgroups (2 at head size 64 where the grid is big enough).
 *   S = Q K^T (HD/16 k-steps), online softmax in the log2 domain, O += P V
 *   with P rounded to the storage type. lse = (m + log2 l) ln 2. Shared
 *   memory (NWG + 4) HD/64 8 KiB (+1 KiB for the alignment).
 * Backward, two kernels after the caller's D = rowsum(dO O), each with NWG
 * warpgroups a block sharing the tiles it streams (1 by default, which
 * measured faster; 2 when forced, checked by the tests):
 *   dq: a warpgroup per 64 query rows walking key tiles 0..diagonal:
 *     S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
 *   dkv: a warpgroup per (kv head, 64 keys), walking the query heads of
 *     its group in order and for each the query tiles from the block's
 *     diagonal down (a warpgroup skips the tiles above its own), in
 *     transposed form: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
 *     dK += dS^T Q. The lse and D of each query tile are staged in shared
 *     memory with the tile (read per accumulator column).
 *   Shared memory (2 NWG + 4) HD/64 8 KiB, +1 KiB for dkv's lse and D.
 *   Seven products per tile pair against the five of a backward that adds
 *   dQ with atomics: the price of determinism, and still O(T) memory.
 *
 * Software pipelining (wg_fwd_pipe_kernel, wg_dq_pipe_kernel,
 * wg_dkv_pipe_kernel; one warpgroup a block): a step issues the next
 * tile's score products, then its own output or gradient products, and
 * waits only for the former (wgmma.wait_group 1), so that the next tile's
 * softmax runs on the CUDA cores while the tensor cores finish this one
 * (FlashAttention-3's intra-warpgroup overlap). Tiles are triple-buffered.
 * ptxas serializes every wgmma of a kernel when it cannot prove that no
 * other instruction touches an in-flight wgmma's registers; the loops are
 * written so that it can (the last step peeled out of the loop, wg_keep on
 * the fragments of the in-flight products). WG_PIPELINE_FWD/_BWD pick the
 * default; the tests run both forms.
 *
 * Determinism: each output element has one owner thread, tiles and heads are
 * walked in a fixed order, no atomics: bit-identical from run to run.
 */
#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attention_wgmma.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/wgmma_mma.cuh"

#define WG_LOG2E 1.4426950408889634f

/* ---- PTX helpers */

__device__ __forceinline__ uint32_t wg_saddr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* Shared-memory matrix descriptor, 128-byte swizzle; lbo and sbo in bytes. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= (uint64_t)((saddr & 0x3FFFF) >> 4);
  d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
  d |= (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
  d |= (uint64_t)1 << 62;
  return d;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Marks the 16 registers of four A fragments as read here: called after
 * the wait that ends the wgmmas reading them, it keeps their registers
 * from being reused for other values while those wgmmas run (which ptxas
 * would answer by serializing every wgmma of the kernel). */
__device__ __forceinline__ void wg_keep(uint32_t (*a)[4]) {
#pragma unroll
  for (int t = 0; t < 4; t++)
#pragma unroll
    for (int r = 0; r < 4; r++) asm volatile("" : "+r"(a[t][r])::"memory");
}
/* Waits until at most one wgmma commit group (the newest) is in flight. */
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
/* cp.async writes are generic-proxy; wgmma reads through the async proxy. */
__device__ __forceinline__ void wg_proxy_fence() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* 16 (or 4) bytes global -> shared, zero-filled when !valid (src stays mapped). */
__device__ __forceinline__ void wg_cp16(void *s, const void *g, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(wg_saddr(s)), "l"(g),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void wg_cp4(void *s, const void *g, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(wg_saddr(s)), "l"(g),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void wg_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* byte offset of 16-byte chunk c of row r in a swizzled [64][64] tile */
__device__ __forceinline__ int wg_swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

/* ---- the storage type: its MMA wrappers and packing */
template <typename E> struct wg_elem;
template <> struct wg_elem<__nv_bfloat16> {
  typedef __nv_bfloat162 E2;
  static __device__ __forceinline__ void ss(float *d, uint64_t a, uint64_t b, int sc) { wgmma_ss(d, a, b, sc); }
  static __device__ __forceinline__ void rs64(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_tb(d, a, b, sc); }
  static __device__ __forceinline__ void rs128(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_tb_n128(d, a, b, sc); }
  static __device__ __forceinline__ E2 two(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <> struct wg_elem<__half> {
  typedef __half2 E2;
  static __device__ __forceinline__ void ss(float *d, uint64_t a, uint64_t b, int sc) { wgmma_ss_f16(d, a, b, sc); }
  static __device__ __forceinline__ void rs64(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_tb_f16(d, a, b, sc); }
  static __device__ __forceinline__ void rs128(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_tb_n128_f16(d, a, b, sc); }
  static __device__ __forceinline__ E2 two(float a, float b) { return __floats2half2_rn(a, b); }
};

template <typename E>
__device__ __forceinline__ uint32_t wg_pack(float a, float b) {
  typename wg_elem<E>::E2 v = wg_elem<E>::two(a, b);
  return *reinterpret_cast<uint32_t *>(&v);
}

/* O (+)= A B, A one k16 slice in registers, B a row-major tile of 16 k-rows
 * and HD columns (MN-major): one m64nHDk16 product. */
template <typename E, int HD>
__device__ __forceinline__ void wg_rs(float *d, const uint32_t *a, uint32_t b) {
  if (HD == 64) wg_elem<E>::rs64(d, a, wg_desc(b, 8192, 1024), 1);
  else wg_elem<E>::rs128(d, a, wg_desc(b, 8192, 1024), 1);
}

/* S = A B^T, A and B [64][HD] row-major tiles (K-major): m64n64, HD/16 k-steps. */
template <typename E, int HD>
__device__ __forceinline__ void wg_qk(float *s, uint32_t a, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    const uint32_t off = (kk >> 2) * 8192 + (kk & 3) * 32;
    wg_elem<E>::ss(s, wg_desc(a + off, 16, 1024), wg_desc(b + off, 16, 1024), kk > 0);
  }
}

/* Rows [0, 64) x HD columns of a row-major global matrix (row stride ld
 * elements) into HD/64 swizzled tiles, NT threads; rows >= nvalid read as 0. */
template <int HD, int NT>
__device__ __forceinline__ void wg_load(char *s, const void *g, int ld, int nvalid, int tid) {
  const char *gb = (const char *)g;
#pragma unroll
  for (int i = 0; i < 512 * (HD / 64) / NT; i++) {
    const int idx = tid + i * NT, cb = idx >> 9, r = (idx >> 3) & 63, c = idx & 7;
    const bool ok = r < nvalid;
    wg_cp16(s + cb * 8192 + wg_swz(r, c), gb + (ok ? ((size_t)r * ld + cb * 64 + c * 8) * 2 : 0), ok);
  }
}

/* Accumulator element i of a warpgroup's m64nN tile: its row in the 64 and
 * its column. */
__device__ __forceinline__ int wg_row(int w, int l, int i) { return 16 * w + (l >> 2) + 8 * ((i >> 1) & 1); }
__device__ __forceinline__ int wg_col(int l, int i) { return (i >> 2) * 8 + (l & 3) * 2 + (i & 1); }

/* A 64 x 64 fp32 accumulator as the register A operand of four k16 slices. */
template <typename E>
__device__ __forceinline__ void wg_frags(const float *x, uint32_t (*a)[4]) {
#pragma unroll
  for (int t = 0; t < 4; t++)
#pragma unroll
    for (int r = 0; r < 4; r++) a[t][r] = wg_pack<E>(x[8 * t + 2 * r], x[8 * t + 2 * r + 1]);
}

/* ---- forward */
template <typename E, int HD, int NWG>
__global__ void __launch_bounds__(128 * NWG)
wg_fwd_kernel(const E *qkv, E *out, float *lse, int T, int NH, int NKV) {
  constexpr int NT = 128 * NWG, TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (wg_saddr(smem_raw) & 1023)) & 1023);
  char *sQ = sm, *sK = sm + NWG * TILE, *sV = sK + 2 * TILE;
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int kc = C + (h / G) * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld;
  const int row0 = qt * 64 * NWG;
#pragma unroll
  for (int g = 0; g < NWG; g++)
    wg_load<HD, NT>(sQ + g * TILE, base + (size_t)min(row0 + 64 * g, T - 1) * ld + h * HD, ld,
                    T - row0 - 64 * g, tid);
  wg_load<HD, NT>(sK, base + kc, ld, T, tid);
  wg_load<HD, NT>(sV, base + vc, ld, T, tid);
  wg_cp_commit();
  const float sl2 = WG_LOG2E / sqrtf((float)HD);
  float o[HD / 2], m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
  const int my0 = row0 + 64 * wg, r0 = my0 + 16 * w + (l >> 2);
  const int ntk = (T + 63) / 64, last = min(ntk - 1, qt * NWG + NWG - 1);
  const int diag = qt * NWG + wg; /* this warpgroup's diagonal key tile */
  for (int j = 0; j <= last; j++) {
    const int buf = j & 1;
    if (j < last) {
      const size_t k1 = (size_t)(j + 1) * 64;
      wg_load<HD, NT>(sK + (buf ^ 1) * TILE, base + k1 * ld + kc, ld, T - (int)k1, tid);
      wg_load<HD, NT>(sV + (buf ^ 1) * TILE, base + k1 * ld + vc, ld, T - (int)k1, tid);
      wg_cp_commit();
      wg_cp_wait<1>();
    } else {
      wg_cp_wait<0>();
    }
    wg_proxy_fence();
    __syncthreads();
    if (my0 < T && j <= diag) {
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; i++) s[i] = 0.f;
      wg_fence();
      wg_qk<E, HD>(s, wg_saddr(sQ + wg * TILE), wg_saddr(sK + buf * TILE));
      wg_commit();
      wg_wait0();
      float mx[2] = {m[0], m[1]};
      if (j == diag) {
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const int hi = (i >> 1) & 1;
          s[i] = j * 64 + wg_col(l, i) > r0 + 8 * hi ? -INFINITY : s[i] * sl2;
          mx[hi] = fmaxf(mx[hi], s[i]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 32; i++) {
          s[i] *= sl2;
          mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
        }
      }
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffff, mx[hi], 1));
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffff, mx[hi], 2));
      }
      float corr[2], ps[2] = {0.f, 0.f};
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        /* a row past T has seen only masked scores: keep it finite */
        const float nm = mx[hi] == -INFINITY ? 0.f : mx[hi];
        corr[hi] = exp2f(m[hi] - nm);
        m[hi] = nm;
      }
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1;
        s[i] = exp2f(s[i] - m[hi]);
        ps[hi] += s[i];
      }
#pragma unroll
      for (int i = 0; i < HD / 2; i++) o[i] *= corr[(i >> 1) & 1];
#pragma unroll
      for (int hi = 0; hi < 2; hi++) lsum[hi] = lsum[hi] * corr[hi] + ps[hi];
      uint32_t a[4][4];
      wg_frags<E>(s, a);
      const uint32_t v0 = wg_saddr(sV + buf * TILE);
      wg_fence();
#pragma unroll
      for (int t = 0; t < 4; t++) wg_rs<E, HD>(o, a[t], v0 + t * 2048);
      wg_commit();
      wg_wait0();
    }
    __syncthreads();
  }
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    lsum[hi] += __shfl_xor_sync(0xffffffff, lsum[hi], 1);
    lsum[hi] += __shfl_xor_sync(0xffffffff, lsum[hi], 2);
  }
  E *orow = out + (size_t)b * T * C + h * HD;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int hi = (i >> 1) & 1, row = r0 + 8 * hi;
    if (row < T) {
      const float inv = 1.f / lsum[hi];
      *reinterpret_cast<typename wg_elem<E>::E2 *>(orow + (size_t)row * C + wg_col(l, i)) =
          wg_elem<E>::two(o[i] * inv, o[i + 1] * inv);
    }
  }
  if ((l & 3) == 0)
    for (int hi = 0; hi < 2; hi++)
      if (r0 + 8 * hi < T) lse[(size_t)bh * T + r0 + 8 * hi] = (m[hi] + log2f(lsum[hi])) / WG_LOG2E;
}

/* ---- forward, software-pipelined (one warpgroup a block): each step
 * issues the next key tile's S = Q K^T, then this tile's O += P V, and
 * waits only for the former, so the next tile's softmax (its maximum,
 * exponentials and the P fragments) runs while the tensor cores do P V;
 * O's rescaling waits for P V. K/V tiles triple-buffered, loaded two tiles
 * ahead. The arithmetic of every element is wg_fwd_kernel's, in the same
 * order. */
template <typename E, int HD>
__global__ void __launch_bounds__(128)
wg_fwd_pipe_kernel(const E *qkv, E *out, float *lse, int T, int NH, int NKV) {
  constexpr int TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (wg_saddr(smem_raw) & 1023)) & 1023);
  char *sQ = sm, *sK = sm + TILE, *sV = sK + 3 * TILE;
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int kc = C + (h / G) * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld;
  const int row0 = qt * 64, r0 = row0 + 16 * w + (l >> 2);
  const int steps = qt + 1; /* key tiles 0..qt; tile qt is the diagonal */
  auto load_step = [&](int j) {
    const size_t k1 = (size_t)j * 64;
    wg_load<HD, 128>(sK + (j % 3) * TILE, base + k1 * ld + kc, ld, T - (int)k1, tid);
    wg_load<HD, 128>(sV + (j % 3) * TILE, base + k1 * ld + vc, ld, T - (int)k1, tid);
    wg_cp_commit();
  };
  wg_load<HD, 128>(sQ, base + (size_t)row0 * ld + h * HD, ld, T - row0, tid);
  load_step(0);
  if (steps > 1) load_step(1);
  const float sl2 = WG_LOG2E / sqrtf((float)HD);
  float o[HD / 2], s[32], m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f}, corr[2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
  auto issue_s = [&](int j) {
    wg_fence();
    wg_qk<E, HD>(s, wg_saddr(sQ), wg_saddr(sK + (j % 3) * TILE));
    wg_commit();
  };
  /* tile j's softmax on s: the running maximum and sum, corr, P into a */
  auto softmax_step = [&](int j, uint32_t (*a)[4]) {
    float mx[2] = {m[0], m[1]};
    if (j == qt) {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1;
        s[i] = j * 64 + wg_col(l, i) > r0 + 8 * hi ? -INFINITY : s[i] * sl2;
        mx[hi] = fmaxf(mx[hi], s[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        s[i] *= sl2;
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
      }
    }
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffff, mx[hi], 1));
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffff, mx[hi], 2));
    }
    float ps[2] = {0.f, 0.f};
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      const float nm = mx[hi] == -INFINITY ? 0.f : mx[hi]; /* rows past T: finite */
      corr[hi] = exp2f(m[hi] - nm);
      m[hi] = nm;
    }
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const int hi = (i >> 1) & 1;
      s[i] = exp2f(s[i] - m[hi]);
      ps[hi] += s[i];
    }
#pragma unroll
    for (int hi = 0; hi < 2; hi++) lsum[hi] = lsum[hi] * corr[hi] + ps[hi];
    wg_frags<E>(s, a);
  };
  auto rescale = [&]() {
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] *= corr[(i >> 1) & 1];
  };
  auto issue_pv = [&](int j, uint32_t (*a)[4]) {
    const uint32_t v0 = wg_saddr(sV + (j % 3) * TILE);
    wg_fence();
#pragma unroll
    for (int t = 0; t < 4; t++) wg_rs<E, HD>(o, a[t], v0 + t * 2048);
    wg_commit();
  };
  uint32_t a[4][4];
  if (steps > 1) wg_cp_wait<1>();
  else wg_cp_wait<0>();
  wg_proxy_fence();
  __syncthreads();
  issue_s(0);
  wg_wait0();
  softmax_step(0, a);
  rescale();
  /* the last tile peeled off: ptxas serializes the wgmmas when the issue of
   * the next tile's product and the wait for it sit in branches */
  for (int j = 0; j + 1 < steps; j++) {
    wg_cp_wait<0>();
    wg_proxy_fence();
    /* tile j+1 visible to all; every thread's products of tile j-1 are
     * done, so buffer (j+2) % 3 is free */
    __syncthreads();
    if (j + 2 < steps) load_step(j + 2);
    issue_s(j + 1);
    issue_pv(j, a);
    uint32_t an[4][4];
    wg_wait1(); /* S of tile j+1; P V of tile j may still run */
    softmax_step(j + 1, an);
    wg_wait0();
    wg_keep(a);
    rescale();
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
      for (int r = 0; r < 4; r++) a[t][r] = an[t][r];
  }
  issue_pv(steps - 1, a);
  wg_wait0();
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    lsum[hi] += __shfl_xor_sync(0xffffffff, lsum[hi], 1);
    lsum[hi] += __shfl_xor_sync(0xffffffff, lsum[hi], 2);
  }
  E *orow = out + (size_t)b * T * C + h * HD;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int hi = (i >> 1) & 1, row = r0 + 8 * hi;
    if (row < T) {
      const float inv = 1.f / lsum[hi];
      *reinterpret_cast<typename wg_elem<E>::E2 *>(orow + (size_t)row * C + wg_col(l, i)) =
          wg_elem<E>::two(o[i] * inv, o[i + 1] * inv);
    }
  }
  if ((l & 3) == 0)
    for (int hi = 0; hi < 2; hi++)
      if (r0 + 8 * hi < T) lse[(size_t)bh * T + r0 + 8 * hi] = (m[hi] + log2f(lsum[hi])) / WG_LOG2E;
}

/* ---- backward, dQ: NWG warpgroups of 64 query rows share each K/V tile */
template <typename E, int HD, int NWG>
__global__ void __launch_bounds__(128 * NWG)
wg_dq_kernel(E *dqkv, const E *qkv, const E *dout, const float *lse, const float *Dl, int T,
             int NH, int NKV) {
  constexpr int NT = 128 * NWG, TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (wg_saddr(smem_raw) & 1023)) & 1023);
  char *sQ = sm, *sdO = sm + NWG * TILE, *sK = sdO + NWG * TILE, *sV = sK + 2 * TILE;
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int kc = C + (h / G) * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld, *ob = dout + (size_t)b * T * C;
  const int row0 = qt * 64 * NWG;
#pragma unroll
  for (int g = 0; g < NWG; g++) {
    const int r = min(row0 + 64 * g, T - 1);
    wg_load<HD, NT>(sQ + g * TILE, base + (size_t)r * ld + h * HD, ld, T - row0 - 64 * g, tid);
    wg_load<HD, NT>(sdO + g * TILE, ob + (size_t)r * C + h * HD, C, T - row0 - 64 * g, tid);
  }
  wg_load<HD, NT>(sK, base + kc, ld, T, tid);
  wg_load<HD, NT>(sV, base + vc, ld, T, tid);
  wg_cp_commit();
  const float scale = 1.f / sqrtf((float)HD), sl2 = scale * WG_LOG2E;
  const int my0 = row0 + 64 * wg, r0 = my0 + 16 * w + (l >> 2);
  float L2[2], Dr[2];
  for (int hi = 0; hi < 2; hi++) {
    const int r = r0 + 8 * hi;
    L2[hi] = r < T ? lse[(size_t)bh * T + r] * WG_LOG2E : 0.f;
    Dr[hi] = r < T ? Dl[(size_t)bh * T + r] : 0.f;
  }
  float dq[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dq[i] = 0.f;
  const int ntk = (T + 63) / 64, last = min(ntk - 1, qt * NWG + NWG - 1);
  const int diag = qt * NWG + wg; /* this warpgroup's diagonal key tile */
  for (int j = 0; j <= last; j++) {
    const int buf = j & 1;
    if (j < last) {
      const size_t k1 = (size_t)(j + 1) * 64;
      wg_load<HD, NT>(sK + (buf ^ 1) * TILE, base + k1 * ld + kc, ld, T - (int)k1, tid);
      wg_load<HD, NT>(sV + (buf ^ 1) * TILE, base + k1 * ld + vc, ld, T - (int)k1, tid);
      wg_cp_commit();
      wg_cp_wait<1>();
    } else {
      wg_cp_wait<0>();
    }
    wg_proxy_fence();
    __syncthreads();
    if (my0 < T && j <= diag) {
      const uint32_t k0 = wg_saddr(sK + buf * TILE), v0 = wg_saddr(sV + buf * TILE);
      float s[32], dp[32];
#pragma unroll
      for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.f;
      wg_fence();
      wg_qk<E, HD>(s, wg_saddr(sQ + wg * TILE), k0);
      wg_qk<E, HD>(dp, wg_saddr(sdO + wg * TILE), v0);
      wg_commit();
      wg_wait0();
      if (j == diag) {
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const int hi = (i >> 1) & 1;
          const float p = j * 64 + wg_col(l, i) > r0 + 8 * hi ? 0.f : exp2f(s[i] * sl2 - L2[hi]);
          dp[i] = p * (dp[i] - Dr[hi]); /* dS */
        }
      } else {
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const int hi = (i >> 1) & 1;
          dp[i] = exp2f(s[i] * sl2 - L2[hi]) * (dp[i] - Dr[hi]);
        }
      }
      uint32_t a[4][4];
      wg_frags<E>(dp, a);
      wg_fence();
#pragma unroll
      for (int t = 0; t < 4; t++) wg_rs<E, HD>(dq, a[t], k0 + t * 2048);
      wg_commit();
      wg_wait0();
    }
    __syncthreads();
  }
  E *qout = dqkv + (size_t)b * T * ld + h * HD;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int row = r0 + 8 * ((i >> 1) & 1);
    if (row < T)
      *reinterpret_cast<typename wg_elem<E>::E2 *>(qout + (size_t)row * ld + wg_col(l, i)) =
          wg_elem<E>::two(dq[i] * scale, dq[i + 1] * scale);
  }
}

/* lse and D of query rows q0 .. q0+63 of one head into shared memory (the
 * first 128 threads, one float each); rows past T read as 0. */
__device__ __forceinline__ void wg_load_stats(float *sL, float *sD, const float *lr,
                                              const float *dr, int q0, int T, int tid) {
  const int q = q0 + (tid & 63);
  const bool ok = q < T;
  if (tid < 64) wg_cp4(sL + tid, lr + (ok ? q : 0), ok);
  else if (tid < 128) wg_cp4(sD + tid - 64, dr + (ok ? q : 0), ok);
}

/* ---- backward, dK and dV: NWG warpgroups of 64 keys share each Q/dO tile.
 * Accumulator rows are keys, columns query rows. */
template <typename E, int HD, int NWG>
__global__ void __launch_bounds__(128 * NWG)
wg_dkv_kernel(E *dqkv, const E *qkv, const E *dout, const float *lse, const float *Dl, int T,
              int NH, int NKV) {
  constexpr int NT = 128 * NWG, TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (wg_saddr(smem_raw) & 1023)) & 1023);
  char *sK = sm, *sV = sm + NWG * TILE, *sQ = sV + NWG * TILE, *sdO = sQ + 2 * TILE;
  float *sL = (float *)(sdO + 2 * TILE), *sD = sL + 128; /* [2][64] each */
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const int kt = blockIdx.x, bk = blockIdx.y, b = bk / NKV, kvh = bk % NKV;
  const int kc = C + kvh * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld, *ob = dout + (size_t)b * T * C;
  const float *lb = lse + (size_t)b * NH * T, *db = Dl + (size_t)b * NH * T;
  const int key0 = kt * 64 * NWG, q00 = kt * NWG; /* first query tile: the block's diagonal */
  const int nq = (T + 63) / 64, per = nq - q00, steps = G * per;
  /* step n: query head kvh G + n / per, query tile q00 + n % per */
#pragma unroll
  for (int g = 0; g < NWG; g++) {
    const int k = min(key0 + 64 * g, T - 1);
    wg_load<HD, NT>(sK + g * TILE, base + (size_t)k * ld + kc, ld, T - key0 - 64 * g, tid);
    wg_load<HD, NT>(sV + g * TILE, base + (size_t)k * ld + vc, ld, T - key0 - 64 * g, tid);
  }
  wg_load<HD, NT>(sQ, base + (size_t)key0 * ld + (kvh * G) * HD, ld, T - key0, tid);
  wg_load<HD, NT>(sdO, ob + (size_t)key0 * C + (kvh * G) * HD, C, T - key0, tid);
  wg_load_stats(sL, sD, lb + (size_t)(kvh * G) * T, db + (size_t)(kvh * G) * T, key0, T, tid);
  wg_cp_commit();
  const float scale = 1.f / sqrtf((float)HD), sl2 = scale * WG_LOG2E;
  float dk[HD / 2], dv[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.f;
  const int wk0 = key0 + 64 * wg, diag = q00 + wg; /* this warpgroup's keys and diagonal */
  const int kr0 = wk0 + 16 * w + (l >> 2);         /* this thread's keys: kr0, kr0 + 8 */
  for (int n = 0; n < steps; n++) {
    const int buf = n & 1, qi = q00 + n % per;
    if (n + 1 < steps) {
      const int h1 = kvh * G + (n + 1) / per, q1 = (q00 + (n + 1) % per) * 64, nb = buf ^ 1;
      wg_load<HD, NT>(sQ + nb * TILE, base + (size_t)q1 * ld + h1 * HD, ld, T - q1, tid);
      wg_load<HD, NT>(sdO + nb * TILE, ob + (size_t)q1 * C + h1 * HD, C, T - q1, tid);
      wg_load_stats(sL + nb * 64, sD + nb * 64, lb + (size_t)h1 * T, db + (size_t)h1 * T, q1, T,
                    tid);
      wg_cp_commit();
      wg_cp_wait<1>();
    } else {
      wg_cp_wait<0>();
    }
    wg_proxy_fence();
    __syncthreads();
    if (wk0 < T && qi >= diag) {
      const uint32_t q0 = wg_saddr(sQ + buf * TILE), o0 = wg_saddr(sdO + buf * TILE);
      const float *L = sL + buf * 64, *Dd = sD + buf * 64;
      float s[32], dp[32];
#pragma unroll
      for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.f;
      wg_fence();
      wg_qk<E, HD>(s, wg_saddr(sK + wg * TILE), q0);
      wg_qk<E, HD>(dp, wg_saddr(sV + wg * TILE), o0);
      wg_commit();
      wg_wait0();
      if (qi == diag) {
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const int c = wg_col(l, i), key = kr0 + 8 * ((i >> 1) & 1);
          const float p = qi * 64 + c < key ? 0.f : exp2f(s[i] * sl2 - L[c] * WG_LOG2E);
          s[i] = p;                    /* P^T */
          dp[i] = p * (dp[i] - Dd[c]); /* dS^T */
        }
      } else {
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const int c = wg_col(l, i);
          const float p = exp2f(s[i] * sl2 - L[c] * WG_LOG2E);
          s[i] = p;
          dp[i] = p * (dp[i] - Dd[c]);
        }
      }
      uint32_t ap[4][4], as[4][4];
      wg_frags<E>(s, ap);
      wg_frags<E>(dp, as);
      wg_fence();
#pragma unroll
      for (int t = 0; t < 4; t++) wg_rs<E, HD>(dv, ap[t], o0 + t * 2048);
#pragma unroll
      for (int t = 0; t < 4; t++) wg_rs<E, HD>(dk, as[t], q0 + t * 2048);
      wg_commit();
      wg_wait0();
    }
    __syncthreads();
  }
  E *kout = dqkv + (size_t)b * T * ld + kc, *vout = dqkv + (size_t)b * T * ld + vc;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int key = kr0 + 8 * ((i >> 1) & 1), c = wg_col(l, i);
    if (key < T) {
      *reinterpret_cast<typename wg_elem<E>::E2 *>(kout + (size_t)key * ld + c) =
          wg_elem<E>::two(dk[i] * scale, dk[i + 1] * scale);
      *reinterpret_cast<typename wg_elem<E>::E2 *>(vout + (size_t)key * ld + c) =
          wg_elem<E>::two(dv[i], dv[i + 1]);
    }
  }
}

/* ---- the backward, software-pipelined (one warpgroup a block, head size
 * 64; the default there, wg_backward): each step
 * issues the NEXT step's S and dP products (a wgmma commit group), then this
 * step's gradient products, and waits only for the former, so the next
 * step's exponentials and dS run while the tensor cores do this step's dQ
 * (or dV and dK). Streamed tiles are triple-buffered: step m's in buffer
 * m % 3, loaded two steps ahead. The arithmetic of every element is that of
 * wg_dq_kernel / wg_dkv_kernel, in the same order. */

/* dQ, pipelined: a block per 64 query rows, key tiles 0..diagonal */
template <typename E, int HD>
__global__ void __launch_bounds__(128)
wg_dq_pipe_kernel(E *dqkv, const E *qkv, const E *dout, const float *lse, const float *Dl, int T,
                  int NH, int NKV) {
  constexpr int TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (wg_saddr(smem_raw) & 1023)) & 1023);
  char *sQ = sm, *sdO = sm + TILE, *sK = sdO + TILE, *sV = sK + 3 * TILE;
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int kc = C + (h / G) * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld, *ob = dout + (size_t)b * T * C;
  const int row0 = qt * 64, steps = qt + 1; /* step j: key tile j */
  auto load_step = [&](int j) {
    const size_t k1 = (size_t)j * 64;
    wg_load<HD, 128>(sK + (j % 3) * TILE, base + k1 * ld + kc, ld, T - (int)k1, tid);
    wg_load<HD, 128>(sV + (j % 3) * TILE, base + k1 * ld + vc, ld, T - (int)k1, tid);
    wg_cp_commit();
  };
  wg_load<HD, 128>(sQ, base + (size_t)row0 * ld + h * HD, ld, T - row0, tid);
  wg_load<HD, 128>(sdO, ob + (size_t)row0 * C + h * HD, C, T - row0, tid);
  load_step(0);
  if (steps > 1) load_step(1);
  const float scale = 1.f / sqrtf((float)HD), sl2 = scale * WG_LOG2E;
  const int r0 = row0 + 16 * w + (l >> 2);
  float L2[2], Dr[2];
  for (int hi = 0; hi < 2; hi++) {
    const int r = r0 + 8 * hi;
    L2[hi] = r < T ? lse[(size_t)bh * T + r] * WG_LOG2E : 0.f;
    Dr[hi] = r < T ? Dl[(size_t)bh * T + r] : 0.f;
  }
  float dq[HD / 2], s[32], dp[32];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dq[i] = 0.f;
  auto issue_sdp = [&](int j) {
    wg_fence();
    wg_qk<E, HD>(s, wg_saddr(sQ), wg_saddr(sK + (j % 3) * TILE));
    wg_qk<E, HD>(dp, wg_saddr(sdO), wg_saddr(sV + (j % 3) * TILE));
    wg_commit();
  };
  auto ds_step = [&](int j, uint32_t (*a)[4]) {
    if (j == qt) {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1;
        const float p = j * 64 + wg_col(l, i) > r0 + 8 * hi ? 0.f : exp2f(s[i] * sl2 - L2[hi]);
        dp[i] = p * (dp[i] - Dr[hi]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1;
        dp[i] = exp2f(s[i] * sl2 - L2[hi]) * (dp[i] - Dr[hi]);
      }
    }
    wg_frags<E>(dp, a);
  };
  uint32_t a[4][4];
  if (steps > 1) wg_cp_wait<1>();
  else wg_cp_wait<0>();
  wg_proxy_fence();
  __syncthreads();
  issue_sdp(0);
  wg_wait0();
  ds_step(0, a);
  auto issue_dq = [&](int j) {
    const uint32_t k0 = wg_saddr(sK + (j % 3) * TILE);
    wg_fence();
#pragma unroll
    for (int t = 0; t < 4; t++) wg_rs<E, HD>(dq, a[t], k0 + t * 2048);
    wg_commit();
  };
  for (int j = 0; j + 1 < steps; j++) {
    wg_cp_wait<0>();
    wg_proxy_fence();
    /* tile j+1 visible to all; every thread's step j-1 products are done,
     * so buffer (j+2) % 3 is free */
    __syncthreads();
    if (j + 2 < steps) load_step(j + 2);
    issue_sdp(j + 1);
    issue_dq(j);
    uint32_t an[4][4];
    wg_wait1(); /* S, dP of step j+1 are done; dQ of step j may still run */
    ds_step(j + 1, an);
    wg_wait0();
    wg_keep(a);
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
      for (int r = 0; r < 4; r++) a[t][r] = an[t][r];
  }
  issue_dq(steps - 1);
  wg_wait0();
  E *qout = dqkv + (size_t)b * T * ld + h * HD;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int row = r0 + 8 * ((i >> 1) & 1);
    if (row < T)
      *reinterpret_cast<typename wg_elem<E>::E2 *>(qout + (size_t)row * ld + wg_col(l, i)) =
          wg_elem<E>::two(dq[i] * scale, dq[i + 1] * scale);
  }
}

/* dK and dV, pipelined: a block per (kv head, 64 keys), the query heads of
 * its group in order, for each the query tiles from the diagonal down */
template <typename E, int HD>
__global__ void __launch_bounds__(128)
wg_dkv_pipe_kernel(E *dqkv, const E *qkv, const E *dout, const float *lse, const float *Dl,
                   int T, int NH, int NKV) {
  constexpr int TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (wg_saddr(smem_raw) & 1023)) & 1023);
  char *sK = sm, *sV = sm + TILE, *sQ = sV + TILE, *sdO = sQ + 3 * TILE;
  float *sL = (float *)(sdO + 3 * TILE), *sD = sL + 192; /* [3][64] each */
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const int kt = blockIdx.x, bk = blockIdx.y, b = bk / NKV, kvh = bk % NKV;
  const int kc = C + kvh * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld, *ob = dout + (size_t)b * T * C;
  const float *lb = lse + (size_t)b * NH * T, *db = Dl + (size_t)b * NH * T;
  const int key0 = kt * 64, nq = (T + 63) / 64, per = nq - kt, steps = G * per;
  /* step m: query head kvh G + m / per, query tile kt + m % per */
  auto load_step = [&](int m) {
    const int hm = kvh * G + m / per, q = (kt + m % per) * 64, bf = m % 3;
    wg_load<HD, 128>(sQ + bf * TILE, base + (size_t)q * ld + hm * HD, ld, T - q, tid);
    wg_load<HD, 128>(sdO + bf * TILE, ob + (size_t)q * C + hm * HD, C, T - q, tid);
    wg_load_stats(sL + bf * 64, sD + bf * 64, lb + (size_t)hm * T, db + (size_t)hm * T, q, T, tid);
    wg_cp_commit();
  };
  wg_load<HD, 128>(sK, base + (size_t)key0 * ld + kc, ld, T - key0, tid);
  wg_load<HD, 128>(sV, base + (size_t)key0 * ld + vc, ld, T - key0, tid);
  load_step(0);
  if (steps > 1) load_step(1);
  const float scale = 1.f / sqrtf((float)HD), sl2 = scale * WG_LOG2E;
  float dk[HD / 2], dv[HD / 2], s[32], dp[32];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.f;
  const int kr0 = key0 + 16 * w + (l >> 2); /* this thread's keys: kr0, kr0 + 8 */
  auto issue_sdp = [&](int m) {
    wg_fence();
    wg_qk<E, HD>(s, wg_saddr(sK), wg_saddr(sQ + (m % 3) * TILE));
    wg_qk<E, HD>(dp, wg_saddr(sV), wg_saddr(sdO + (m % 3) * TILE));
    wg_commit();
  };
  auto p_ds_step = [&](int m, uint32_t (*pa)[4], uint32_t (*sa)[4]) {
    const int qi = kt + m % per;
    const float *L = sL + (m % 3) * 64, *Dd = sD + (m % 3) * 64;
    if (qi == kt) {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int c = wg_col(l, i), key = kr0 + 8 * ((i >> 1) & 1);
        const float p = qi * 64 + c < key ? 0.f : exp2f(s[i] * sl2 - L[c] * WG_LOG2E);
        s[i] = p;
        dp[i] = p * (dp[i] - Dd[c]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int c = wg_col(l, i);
        const float p = exp2f(s[i] * sl2 - L[c] * WG_LOG2E);
        s[i] = p;
        dp[i] = p * (dp[i] - Dd[c]);
      }
    }
    wg_frags<E>(s, pa);
    wg_frags<E>(dp, sa);
  };
  uint32_t ap[4][4], as[4][4];
  if (steps > 1) wg_cp_wait<1>();
  else wg_cp_wait<0>();
  wg_proxy_fence();
  __syncthreads();
  issue_sdp(0);
  wg_wait0();
  p_ds_step(0, ap, as);
  auto issue_dkv = [&](int n) {
    const uint32_t q0 = wg_saddr(sQ + (n % 3) * TILE), o0 = wg_saddr(sdO + (n % 3) * TILE);
    wg_fence();
#pragma unroll
    for (int t = 0; t < 4; t++) wg_rs<E, HD>(dv, ap[t], o0 + t * 2048);
#pragma unroll
    for (int t = 0; t < 4; t++) wg_rs<E, HD>(dk, as[t], q0 + t * 2048);
    wg_commit();
  };
  /* the last step peeled off: ptxas serializes the wgmmas when the issue
   * of the next step's products and the wait for them sit in branches */
  for (int n = 0; n + 1 < steps; n++) {
    wg_cp_wait<0>();
    wg_proxy_fence();
    __syncthreads(); /* as in wg_dq_pipe_kernel */
    if (n + 2 < steps) load_step(n + 2);
    issue_sdp(n + 1);
    issue_dkv(n);
    uint32_t apn[4][4], asn[4][4];
    wg_wait1();
    p_ds_step(n + 1, apn, asn);
    wg_wait0();
    wg_keep(ap);
    wg_keep(as);
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
      for (int r = 0; r < 4; r++) ap[t][r] = apn[t][r], as[t][r] = asn[t][r];
  }
  issue_dkv(steps - 1);
  wg_wait0();
  E *kout = dqkv + (size_t)b * T * ld + kc, *vout = dqkv + (size_t)b * T * ld + vc;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int key = kr0 + 8 * ((i >> 1) & 1), c = wg_col(l, i);
    if (key < T) {
      *reinterpret_cast<typename wg_elem<E>::E2 *>(kout + (size_t)key * ld + c) =
          wg_elem<E>::two(dk[i] * scale, dk[i + 1] * scale);
      *reinterpret_cast<typename wg_elem<E>::E2 *>(vout + (size_t)key * ld + c) =
          wg_elem<E>::two(dv[i], dv[i + 1]);
    }
  }
}

/* ---- host side */

/* 0: warpgroups per block chosen by wg_groups; 1 or 2: forced (tests) */
static int g_groups;

void cuda_attention_wgmma_set_groups(int groups) { g_groups = groups == 1 || groups == 2 ? groups : 0; }

/* Forward warpgroups per block: 2 (128 query rows sharing each K/V tile)
 * at head size 64 unless that leaves fewer than about two waves of blocks
 * on the SMs (blocks: B x heads times the tiles of 128 rows), else 1. At
 * head size 128, and in the backward, 1 measured faster (an H100,
 * 2026-12-05, test_cuda_attention_tc's timings: hs 128 forward 0.431 ms
 * against 0.499; backward 0.664 against 0.775 ms at B=32 T=1024 and 1.053
 * against 1.158 at B=1 T=8192): the second warpgroup's registers halve the
 * blocks an SM holds, which costs more than the shared tiles save. */
static int wg_fwd_groups(int64_t rows, int T, int hs, int sms) {
  if (g_groups) return g_groups;
  return hs == 64 && rows * ((T + 127) / 128) >= 2 * (int64_t)sms ? 2 : 1;
}

static int wg_device_sms(void) {
  static int sms;
  if (!sms) {
    int dev = 0;
    ST_CUDA_CHECK(cudaGetDevice(&dev));
    ST_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  return sms;
}

int cuda_attention_wgmma_takes(int B, int hs, int NH, st_dtype dt) {
  static int hopper = -1;
  if (hopper < 0) {
    int dev = 0, major = 0, minor = 0;
    hopper = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
             major == 9 && minor == 0;
  }
  return hopper && (dt == ST_BF16 || dt == ST_FP16) && (hs == 64 || hs == 128) &&
         (int64_t)B * NH <= 65535;
}

template <typename E, int HD, int NWG>
static void wg_forward(void *out, float *lse, const void *qkv, int B, int T, int NH, int NKV) {
  const int sm = 1024 + (NWG + 4) * (HD / 64) * 8192;
  static bool attr;
  if (!attr) {
    ST_CUDA_CHECK(cudaFuncSetAttribute(wg_fwd_kernel<E, HD, NWG>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
    attr = true;
  }
  const dim3 grid((unsigned)((T + 64 * NWG - 1) / (64 * NWG)), (unsigned)(B * NH));
  wg_fwd_kernel<E, HD, NWG><<<grid, 128 * NWG, sm>>>((const E *)qkv, (E *)out, lse, T, NH, NKV);
  ST_CUDA_LAUNCHED();
}

/* The software-pipelined kernels by default (1) or the plain ones (0): the
 * forward's (one warpgroup a block, any head size) and the backward's (one
 * warpgroup a block, head size 64; at 128 the second set of fragments does
 * not fit the registers and ptxas would serialize the wgmmas). */
#define WG_PIPELINE_FWD 1
#define WG_PIPELINE_BWD 1
static int g_pipe_fwd = WG_PIPELINE_FWD, g_pipe_bwd = WG_PIPELINE_BWD;

void cuda_attention_wgmma_set_pipeline(int on) {
  g_pipe_fwd = on < 0 ? WG_PIPELINE_FWD : on != 0;
  g_pipe_bwd = on < 0 ? WG_PIPELINE_BWD : on != 0;
}

template <typename Kernel>
static void wg_smem_attr(Kernel k, int bytes) {
  ST_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <typename E, int HD, int NWG>
static void wg_backward(void *dqkv, const float *D, const void *dout, const void *qkv,
                        const float *lse, int B, int T, int NH, int NKV) {
  constexpr int TILE = (HD / 64) * 8192;
  const int sq = 1024 + (2 * NWG + 4) * TILE, skv = sq + 1024;
  const int sq3 = 1024 + 8 * TILE, skv3 = sq3 + 1536; /* pipelined: three buffers */
  static bool attr;
  if (!attr) {
    wg_smem_attr(wg_dq_kernel<E, HD, NWG>, sq);
    wg_smem_attr(wg_dkv_kernel<E, HD, NWG>, skv);
    if constexpr (NWG == 1 && HD == 64) {
      wg_smem_attr(wg_dq_pipe_kernel<E, HD>, sq3);
      wg_smem_attr(wg_dkv_pipe_kernel<E, HD>, skv3);
    }
    attr = true;
  }
  const unsigned tiles = (unsigned)((T + 64 * NWG - 1) / (64 * NWG));
  const dim3 kvgrid(tiles, (unsigned)(B * NKV)), qgrid(tiles, (unsigned)(B * NH));
  const int pipe = NWG == 1 && HD == 64 && g_pipe_bwd;
  /* dK/dV first: its blocks walk the most query tiles (the longest first),
   * and dQ's, longest first too, fill the tail behind them */
  if constexpr (NWG == 1 && HD == 64) {
    if (pipe)
      wg_dkv_pipe_kernel<E, HD><<<kvgrid, 128, skv3>>>((E *)dqkv, (const E *)qkv,
                                                       (const E *)dout, lse, D, T, NH, NKV);
  }
  if (!pipe)
    wg_dkv_kernel<E, HD, NWG><<<kvgrid, 128 * NWG, skv>>>((E *)dqkv, (const E *)qkv,
                                                          (const E *)dout, lse, D, T, NH, NKV);
  ST_CUDA_LAUNCHED();
  if constexpr (NWG == 1 && HD == 64) {
    if (pipe)
      wg_dq_pipe_kernel<E, HD><<<qgrid, 128, sq3>>>((E *)dqkv, (const E *)qkv, (const E *)dout,
                                                    lse, D, T, NH, NKV);
  }
  if (!pipe)
    wg_dq_kernel<E, HD, NWG><<<qgrid, 128 * NWG, sq>>>((E *)dqkv, (const E *)qkv,
                                                       (const E *)dout, lse, D, T, NH, NKV);
  ST_CUDA_LAUNCHED();
}

template <typename E, int HD>
static void wg_forward_pipe(void *out, float *lse, const void *qkv, int B, int T, int NH, int NKV) {
  const int sm = 1024 + 7 * (HD / 64) * 8192;
  static bool attr;
  if (!attr) {
    wg_smem_attr(wg_fwd_pipe_kernel<E, HD>, sm);
    attr = true;
  }
  const dim3 grid((unsigned)((T + 63) / 64), (unsigned)(B * NH));
  wg_fwd_pipe_kernel<E, HD><<<grid, 128, sm>>>((const E *)qkv, (E *)out, lse, T, NH, NKV);
  ST_CUDA_LAUNCHED();
}

void cuda_attention_wgmma_forward(void *out, float *lse, const void *qkv, int B, int T, int hs,
                                  int NH, int NKV, st_dtype dt) {
  if (g_pipe_fwd && g_groups != 2) {
    if (dt == ST_BF16) (hs == 64 ? wg_forward_pipe<__nv_bfloat16, 64> : wg_forward_pipe<__nv_bfloat16, 128>)(out, lse, qkv, B, T, NH, NKV);
    else (hs == 64 ? wg_forward_pipe<__half, 64> : wg_forward_pipe<__half, 128>)(out, lse, qkv, B, T, NH, NKV);
    return;
  }
  const int two = wg_fwd_groups((int64_t)B * NH, T, hs, wg_device_sms()) == 2;
  if (dt == ST_BF16) {
    if (hs == 64) (two ? wg_forward<__nv_bfloat16, 64, 2> : wg_forward<__nv_bfloat16, 64, 1>)(out, lse, qkv, B, T, NH, NKV);
    else (two ? wg_forward<__nv_bfloat16, 128, 2> : wg_forward<__nv_bfloat16, 128, 1>)(out, lse, qkv, B, T, NH, NKV);
  } else {
    if (hs == 64) (two ? wg_forward<__half, 64, 2> : wg_forward<__half, 64, 1>)(out, lse, qkv, B, T, NH, NKV);
    else (two ? wg_forward<__half, 128, 2> : wg_forward<__half, 128, 1>)(out, lse, qkv, B, T, NH, NKV);
  }
}

void cuda_attention_wgmma_backward(void *dqkv, const float *D, const void *dout, const void *qkv,
                                   const float *lse, int B, int T, int hs, int NH, int NKV,
                                   st_dtype dt) {
  const int two = g_groups == 2; /* 1 unless forced: see wg_fwd_groups */
  if (dt == ST_BF16) {
    if (hs == 64) (two ? wg_backward<__nv_bfloat16, 64, 2> : wg_backward<__nv_bfloat16, 64, 1>)(dqkv, D, dout, qkv, lse, B, T, NH, NKV);
    else (two ? wg_backward<__nv_bfloat16, 128, 2> : wg_backward<__nv_bfloat16, 128, 1>)(dqkv, D, dout, qkv, lse, B, T, NH, NKV);
  } else {
    if (hs == 64) (two ? wg_backward<__half, 64, 2> : wg_backward<__half, 64, 1>)(dqkv, D, dout, qkv, lse, B, T, NH, NKV);
    else (two ? wg_backward<__half, 128, 2> : wg_backward<__half, 128, 1>)(dqkv, D, dout, qkv, lse, B, T, NH, NKV);
  }
}
