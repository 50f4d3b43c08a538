/* wgmma.cuh - device helpers for kernels on Hopper's warpgroup MMA
 * (wgmma.mma_async, sm_90a), used by the attention kernels
 * (attention_wgmma_fwd.cuh, attention_wgmma_bwd.cuh): shared-memory matrix
 * descriptors, wgmma fences and waits, cp.async copies, the 128-byte
 * swizzle, tile loads and the accumulator-to-fragment packing.
 *
 * Primitive: wgmma.mma_async m64nNk16 (wgmma_mma.cuh), one warpgroup (4
 * warps, 128 threads) computing D[64 x N] += A[64 x 16] B[16 x N] with fp32
 * accumulators. A comes from shared memory or from registers: the
 * accumulator layout of a 64 x 64 product (thread t of warp w holds rows
 * 16w + t/4 and +8, columns 8i + 2(t%4) and +1) packed to 16-bit pairs is
 * exactly the register A layout of the next product (wg_frags). B comes
 * from shared memory.
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
 * Included by one translation unit (attention_wgmma.cu), built for sm_90a.
 */
#ifndef ST_WGMMA_CUH
#define ST_WGMMA_CUH

#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/wgmma_mma.cuh"

#define WG_LOG2E 1.4426950408889634f

/* ---- PTX helpers */

/* Shared-memory matrix descriptor, 128-byte swizzle; lbo and sbo in bytes.
 * The address arithmetic below is __host__ too, for tests/test_wgmma_index.cu. */
__host__ __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= (uint64_t)((saddr & 0x3FFFF) >> 4);
  d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
  d |= (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
  d |= (uint64_t)1 << 62;
  return d;
}

/* wg_desc of saddr + off from the two words of wg_desc(saddr, lbo, sbo):
 * off moves only the address field (bits 0-13, the address / 16), and
 * never carries out of it while saddr + off < 2^18 (shared memory is 228
 * KiB), so one 32-bit add replaces rebuilding the descriptor; the kernels
 * issue 16 wgmmas a step. */
struct wg_dsc {
  uint32_t lo, hi;
};
__host__ __device__ __forceinline__ wg_dsc wg_dsc_at(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  const uint64_t d = wg_desc(saddr, lbo, sbo);
  return wg_dsc{(uint32_t)d, (uint32_t)(d >> 32)};
}
__host__ __device__ __forceinline__ uint64_t wg_dsc_off(wg_dsc d, uint32_t off) {
  return ((uint64_t)d.hi << 32) | (d.lo + (off >> 4));
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

/* byte offset of 16-byte chunk c of row r in a swizzled [64][64] tile */
__host__ __device__ __forceinline__ int wg_swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

/* ---- the storage type: its MMA wrappers and packing */
template <typename E> struct wg_elem;
template <> struct wg_elem<__nv_bfloat16> {
  typedef __nv_bfloat162 E2;
  static __device__ __forceinline__ void ss(float *d, uint64_t a, uint64_t b, int sc) { wgmma_ss(d, a, b, sc); }
  static __device__ __forceinline__ void rsk(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs(d, a, b, sc); }
  static __device__ __forceinline__ void rs64(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_tb(d, a, b, sc); }
  static __device__ __forceinline__ void rs128(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_tb_n128(d, a, b, sc); }
  static __device__ __forceinline__ E2 two(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <> struct wg_elem<__half> {
  typedef __half2 E2;
  static __device__ __forceinline__ void ss(float *d, uint64_t a, uint64_t b, int sc) { wgmma_ss_f16(d, a, b, sc); }
  static __device__ __forceinline__ void rsk(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_f16(d, a, b, sc); }
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

/* O (+)= A B over 64 k-rows: A four k16 slices in registers (wg_frags), B
 * a row-major [64][HD] tile (MN-major): wg_rs of slice t at b + 2048 t. */
template <typename E, int HD>
__device__ __forceinline__ void wg_rs4(float *d, const uint32_t (*a)[4], uint32_t b) {
  const wg_dsc d0 = wg_dsc_at(b, 8192, 1024);
#pragma unroll
  for (int t = 0; t < 4; t++) {
    if (HD == 64) wg_elem<E>::rs64(d, a[t], wg_dsc_off(d0, t * 2048), 1);
    else wg_elem<E>::rs128(d, a[t], wg_dsc_off(d0, t * 2048), 1);
  }
}

/* S = A B^T, A and B [64][HD] row-major tiles (K-major): m64n64, HD/16 k-steps. */
template <typename E, int HD>
__device__ __forceinline__ void wg_qk(float *s, uint32_t a, uint32_t b) {
  const wg_dsc da = wg_dsc_at(a, 16, 1024), db = wg_dsc_at(b, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    const uint32_t off = (kk >> 2) * 8192 + (kk & 3) * 32;
    wg_elem<E>::ss(s, wg_dsc_off(da, off), wg_dsc_off(db, off), kk > 0);
  }
}

/* S = A B^T with A's HD/16 k16 slices in registers (wg_load_frags) and B a
 * [64][HD] row-major tile (K-major): m64n64, HD/16 k-steps. Reads half the
 * shared memory of wg_qk, whose A comes from a tile too. */
template <typename E, int HD>
__device__ __forceinline__ void wg_qk_rs(float *s, const uint32_t (*a)[4], uint32_t b) {
  const wg_dsc db = wg_dsc_at(b, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    const uint32_t off = (kk >> 2) * 8192 + (kk & 3) * 32;
    wg_elem<E>::rsk(s, a[kk], wg_dsc_off(db, off), kk > 0);
  }
}

/* The register A operand of S = A B^T for rows [0, 64) x HD columns of a
 * row-major global matrix of 16-bit elements (row stride ld elements), read
 * straight from global memory once a block: warp w's thread l holds rows
 * 16w + l/4 and +8 (the m64k16 A layout, the one wg_frags packs), k16
 * slice kk in a[kk]; rows >= nvalid read as 0, as wg_load zero-fills them. */
template <int HD>
__device__ __forceinline__ void wg_load_frags(uint32_t (*a)[4], const void *g, int ld, int nvalid,
                                              int w, int l) {
  const uint16_t *gb = (const uint16_t *)g;
  const int rlo = 16 * w + (l >> 2), c0 = 2 * (l & 3);
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int row = rlo + 8 * (r & 1), col = 16 * kk + 8 * (r >> 1) + c0;
      a[kk][r] = row < nvalid ? __ldg((const unsigned int *)(gb + (size_t)row * ld + col)) : 0u;
    }
}

/* 2^x on the special-function unit, results below 2^-126 flushed to zero.
 * exp2f's non-flushing form costs about three more instructions an element
 * to keep such results; here they are attention probabilities in a row
 * whose largest term is 1 (forward) or whose terms sum to 1 (backward), so
 * what is flushed is below 2^-126 of the row's total. */
__device__ __forceinline__ float wg_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* 16-byte chunk idx of wg_load (column block idx / 512, row idx / 8 % 64,
 * chunk idx % 8): its row, its byte offset in the tiles and in global
 * memory (row stride ld 16-bit elements). */
__host__ __device__ __forceinline__ int wg_chunk_row(int idx) { return (idx >> 3) & 63; }
__host__ __device__ __forceinline__ int wg_chunk_dst(int idx) {
  return (idx >> 9) * 8192 + wg_swz(wg_chunk_row(idx), idx & 7);
}
__host__ __device__ __forceinline__ size_t wg_chunk_src(int idx, int ld) {
  return ((size_t)wg_chunk_row(idx) * ld + (idx >> 9) * 64 + (idx & 7) * 8) * 2;
}
/* Rows [0, 64) x HD columns of a row-major global matrix (row stride ld
 * elements) into HD/64 swizzled tiles, NT threads; rows >= nvalid read as 0. */
template <int HD, int NT>
__device__ __forceinline__ void wg_load(char *s, const void *g, int ld, int nvalid, int tid) {
  const char *gb = (const char *)g;
#pragma unroll
  for (int i = 0; i < 512 * (HD / 64) / NT; i++) {
    const int idx = tid + i * NT;
    const bool ok = wg_chunk_row(idx) < nvalid;
    st_cp16(s + wg_chunk_dst(idx), gb + (ok ? wg_chunk_src(idx, ld) : 0), ok ? 16 : 0);
  }
}

/* wg_load of one [64][64] tile by 128 threads, with each thread's share
 * worked out once a kernel (wg_rows_at) rather than at every tile: thread
 * t copies 16-byte chunk t % 8 of rows t / 8 + 16 i, i < 4, which all
 * share one swizzle (16 i leaves r % 8 alone). For the pipelined kernels,
 * whose loop reloads a tile every step: there the per-chunk arithmetic of
 * wg_load, recomputed each step for want of registers, was most of the
 * loop's integer work. */
struct wg_rows {
  uint32_t s; /* byte offset of the thread's first chunk in the tile */
  int g;      /* its byte offset in global memory from the tile's row 0 */
  int r;      /* its first row */
};
__host__ __device__ __forceinline__ wg_rows wg_rows_at(int tid, int ld) {
  const int r = tid >> 3, c = tid & 7;
  return wg_rows{(uint32_t)wg_swz(r, c), (r * ld + c * 8) * 2, r};
}
/* Chunk i (< 4) of a thread's share: whether its row is below nvalid, its
 * byte offset in the tile and in global memory (0 when not ok: the copy
 * then reads nothing but needs a mapped address). */
__host__ __device__ __forceinline__ bool wg_rows_ok(const wg_rows &p, int i, int nvalid) {
  return p.r + 16 * i < nvalid;
}
__host__ __device__ __forceinline__ uint32_t wg_rows_dst(const wg_rows &p, int i) {
  return p.s + 2048 * i;
}
__host__ __device__ __forceinline__ size_t wg_rows_src(const wg_rows &p, int i, int ld, bool ok) {
  return ok ? p.g + (size_t)i * 32 * ld : 0;
}
/* Rows [0, 64) x 64 columns of a row-major global matrix of 16-bit
 * elements (row stride ld elements; p = wg_rows_at(tid, ld)) into the
 * swizzled tile at shared address s; rows >= nvalid read as 0. */
__device__ __forceinline__ void wg_load64(uint32_t s, const void *g, int ld, int nvalid,
                                          const wg_rows &p) {
  const char *gb = (const char *)g;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const bool ok = wg_rows_ok(p, i, nvalid);
    st_cp16s(s + wg_rows_dst(p, i), gb + wg_rows_src(p, i, ld, ok), ok ? 16 : 0);
  }
}

/* A dK/dV block's walk over (query head, query tile): step m is head h0 +
 * m / per and tile kt + m % per, per = nq - kt, visited in order, so a
 * counter replaces the division by the run-time per (about 30
 * instructions a step). */
struct wg_walk {
  int h, t;
};
__host__ __device__ __forceinline__ void wg_walk_next(wg_walk &w, int kt, int nq) {
  if (++w.t == nq) w.t = kt, w.h++;
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

/* A block's place in its launch: i-th of n tiles in the kernel's own
 * longest-first count, and its batch-head (or batch-kv-head) bh. The grid
 * is (tiles, heads) and blocks go out in the order of their linear index L
 * (x fastest). That order is remapped in groups of g heads: the group's
 * first tile of every head, then its second of every head, and so on, then
 * the next group. g = 1 is head after head (the blocks running at once
 * share a head's K and V in L2, but the last head's longest tile starts
 * last and waits out the tail alone); g >= heads sends every head's
 * longest tile out in the first wave (no tail, but the resident blocks
 * span every head); a group in between keeps both (st_attention_heads_group
 * picks g). When g does not divide the heads, the last group takes the
 * rest (g to 2g - 1 heads), so that no group is too small to hide its own
 * longest tile. A bijection of [0, n heads) onto (i, bh), checked on the
 * host by test_wgmma_index. */
struct wg_slot {
  int i, n, bh;
};
__host__ __device__ __forceinline__ wg_slot wg_slot_at(unsigned L, unsigned n, unsigned heads,
                                                       unsigned g) {
  const unsigned groups = heads / g ? heads / g : 1, k = L / (g * n);
  const unsigned grp = k < groups - 1 ? k : groups - 1, first = grp * g;
  const unsigned gl = grp == groups - 1 ? heads - first : g; /* heads in this group */
  const unsigned r = L - first * n, i = r / gl;
  return wg_slot{(int)i, (int)n, (int)(first + r - i * gl)};
}
__device__ __forceinline__ wg_slot wg_block_slot(int g) {
  return wg_slot_at(blockIdx.x + gridDim.x * blockIdx.y, gridDim.x, gridDim.y, (unsigned)g);
}

/* The dynamic shared memory a kernel may ask for (host side). */
template <typename Kernel>
static void wg_smem_attr(Kernel k, int bytes) {
  ST_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

#endif
