// attention_wgmma.cuh - causal attention on Hopper's warpgroup MMA (wgmma,
// sm_90a): the general form of the two prototypes beside it, for any
// sequence length, grouped-query attention, bf16 or fp16, head sizes 64 and
// 128, in the layout of kernels/cuda/attention_tc.h:
//   qkv [B, T, (NH + 2 NKV) HD]: NH query heads, then NKV key heads, then NKV
//   value heads; query head h reads kv head h / (NH / NKV).
//   out [B, T, NH HD]; lse [B, NH, T] fp32, natural log of each row's
//   softmax denominator of the scaled scores (scale 1/sqrt(HD)).
//   dqkv laid out as qkv; Dl [B, NH, T] = rowsum(dO * O).
// Deterministic: no atomics; dK and dV of a kv head sum its query heads in
// order inside one block. An experiment (issue 17): not in the build.
#pragma once
#include <cuda_fp16.h>

#include "wgmma_common.cuh"

// ---- the element type: its MMA wrappers and packing
template <typename E> struct wg_elem;
template <> struct wg_elem<__nv_bfloat16> {
  static __device__ __forceinline__ void ss(float *d, uint64_t a, uint64_t b, int sc) { wgmma_ss(d, a, b, sc); }
  static __device__ __forceinline__ void rs64(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_tb(d, a, b, sc); }
  static __device__ __forceinline__ void rs128(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_tb_n128(d, a, b, sc); }
  static __device__ __forceinline__ uint32_t pack(float a, float b) { return pack_bf16(a, b); }
  static __device__ __forceinline__ __nv_bfloat162 two(float a, float b) { return __floats2bfloat162_rn(a, b); }
  static __device__ __forceinline__ float f(__nv_bfloat16 x) { return __bfloat162float(x); }
};
template <> struct wg_elem<__half> {
  static __device__ __forceinline__ void ss(float *d, uint64_t a, uint64_t b, int sc) { wgmma_ss_f16(d, a, b, sc); }
  static __device__ __forceinline__ void rs64(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_tb_f16(d, a, b, sc); }
  static __device__ __forceinline__ void rs128(float *d, const uint32_t *a, uint64_t b, int sc) { wgmma_rs_tb_n128_f16(d, a, b, sc); }
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&v);
  }
  static __device__ __forceinline__ __half2 two(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ __forceinline__ float f(__half x) { return __half2float(x); }
};

// O (+)= A B for A from registers (k-slice t) and B MN-major with HD columns:
// one m64nHDk16 product; B's 64-column atoms are 8192 bytes apart, its
// groups of 8 k-rows 1024
template <typename E, int HD>
__device__ __forceinline__ void wg_rs(float *d, const uint32_t *a, uint32_t b, int sc) {
  if (HD == 64) wg_elem<E>::rs64(d, a, make_desc(b, 8192, 1024), sc);
  else wg_elem<E>::rs128(d, a, make_desc(b, 8192, 1024), sc);
}

// S (+)= A B^T with A [64][HD] and B [64][HD] K-major tiles stored as HD/64
// column blocks 8192 bytes apart: m64n64, HD/16 steps of k16
template <typename E, int HD>
__device__ __forceinline__ void wg_qk(float *s, uint32_t a, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    const uint32_t off = (kk >> 2) * 8192 + (kk & 3) * 32;
    wg_elem<E>::ss(s, make_desc(a + off, 16, 1024), make_desc(b + off, 16, 1024), kk > 0);
  }
}

// 16-byte copy, zero-filled when !valid (the source must still be mapped)
__device__ __forceinline__ void cp16z(void *s, const void *g, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(s)), "l"(g),
               "r"(valid ? 16 : 0));
}

// rows [0, 64) x HD columns of a row-major global matrix (row stride ld)
// into HD/64 swizzled [64][64] blocks; rows >= nvalid are zeros
template <int HD, int NT>
__device__ __forceinline__ void wg_load(char *s, const void *g, int ld, int nvalid, int tid) {
  const char *gb = (const char *)g;
#pragma unroll
  for (int i = 0; i < 512 * (HD / 64) / NT; i++) {
    const int idx = tid + i * NT, cb = idx >> 9, r = (idx >> 3) & 63, c = idx & 7;
    const bool ok = r < nvalid;
    cp16z(s + cb * 8192 + swz(r, c), gb + (ok ? ((size_t)r * ld + cb * 64 + c * 8) * 2 : 0), ok);
  }
}

// accumulator element i of a warpgroup's m64nN tile: row within the 64, column
__device__ __forceinline__ int acc_row(int w, int l, int i) { return 16 * w + (l >> 2) + 8 * ((i >> 1) & 1); }
__device__ __forceinline__ int acc_col(int l, int i) { return (i >> 2) * 8 + (l & 3) * 2 + (i & 1); }

template <typename E>
__device__ __forceinline__ void to_frags(const float *x, uint32_t (*a)[4]) {
#pragma unroll
  for (int t = 0; t < 4; t++)
#pragma unroll
    for (int r = 0; r < 4; r++) a[t][r] = wg_elem<E>::pack(x[8 * t + 2 * r], x[8 * t + 2 * r + 1]);
}

constexpr float WG_LOG2E = 1.4426950408889634f;

// ---- forward: NWG warpgroups of 64 query rows share each K/V tile
template <typename E, int HD, int NWG>
__global__ void __launch_bounds__(128 * NWG)
wg_fwd(const E *qkv, E *out, float *lse, int T, int NH, int NKV) {
  constexpr int NT = 128 * NWG, CB = HD / 64, TILE = CB * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
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
  cp_commit();
  const float sl2 = WG_LOG2E / sqrtf((float)HD);
  float o[HD / 2], m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
  const int my0 = row0 + 64 * wg, r0 = my0 + 16 * w + (l >> 2);
  const int ntk = (T + 63) / 64, last = min(ntk - 1, qt * NWG + NWG - 1);
  const int mine = min(last, qt * NWG + wg);
  for (int j = 0; j <= last; j++) {
    const int buf = j & 1;
    if (j < last) {
      const size_t k1 = (size_t)(j + 1) * 64;
      wg_load<HD, NT>(sK + (buf ^ 1) * TILE, base + k1 * ld + kc, ld, T - (int)k1, tid);
      wg_load<HD, NT>(sV + (buf ^ 1) * TILE, base + k1 * ld + vc, ld, T - (int)k1, tid);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    proxy_fence();
    __syncthreads();
    if (my0 < T && j <= mine) {
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; i++) s[i] = 0.f;
      wg_fence();
      wg_qk<E, HD>(s, smem_u32(sQ + wg * TILE), smem_u32(sK + buf * TILE));
      wg_commit();
      wg_wait0();
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1, col = j * 64 + acc_col(l, i);
        const float v = col > r0 + 8 * hi ? -INFINITY : s[i] * sl2;
        s[i] = v;
        mx[hi] = fmaxf(mx[hi], v);
      }
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffff, mx[hi], 1));
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffff, mx[hi], 2));
      }
      float corr[2], ps[2] = {0.f, 0.f};
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        // a row past T has seen only masked scores: keep it finite
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
      to_frags<E>(s, a);
      const uint32_t v0 = smem_u32(sV + buf * TILE);
      wg_fence();
#pragma unroll
      for (int t = 0; t < 4; t++) wg_rs<E, HD>(o, a[t], v0 + t * 2048, 1);
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
      *reinterpret_cast<decltype(wg_elem<E>::two(0.f, 0.f)) *>(orow + (size_t)row * C + acc_col(l, i)) =
          wg_elem<E>::two(o[i] * inv, o[i + 1] * inv);
    }
  }
  if ((l & 3) == 0)
    for (int hi = 0; hi < 2; hi++)
      if (r0 + 8 * hi < T)
        lse[(size_t)bh * T + r0 + 8 * hi] = (m[hi] + log2f(lsum[hi])) / WG_LOG2E;
}

// ---- backward, dQ: one warpgroup per 64 query rows, walking the key tiles
template <typename E, int HD>
__global__ void __launch_bounds__(128)
wg_dq(E *dqkv, const E *qkv, const E *dout, const float *lse, const float *Dl, int T, int NH,
      int NKV) {
  constexpr int CB = HD / 64, TILE = CB * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  char *sQ = sm, *sdO = sm + TILE, *sK = sm + 2 * TILE, *sV = sK + 2 * TILE;
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int kc = C + (h / G) * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld, *ob = dout + (size_t)b * T * C;
  const int row0 = qt * 64;
  wg_load<HD, 128>(sQ, base + (size_t)row0 * ld + h * HD, ld, T - row0, tid);
  wg_load<HD, 128>(sdO, ob + (size_t)row0 * C + h * HD, C, T - row0, tid);
  wg_load<HD, 128>(sK, base + kc, ld, T, tid);
  wg_load<HD, 128>(sV, base + vc, ld, T, tid);
  cp_commit();
  const float scale = 1.f / sqrtf((float)HD), sl2 = scale * WG_LOG2E;
  const int r0 = row0 + 16 * w + (l >> 2);
  float L2[2], Dr[2];
  for (int hi = 0; hi < 2; hi++) {
    const int r = r0 + 8 * hi;
    L2[hi] = r < T ? lse[(size_t)bh * T + r] * WG_LOG2E : 0.f;
    Dr[hi] = r < T ? Dl[(size_t)bh * T + r] : 0.f;
  }
  float dq[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dq[i] = 0.f;
  for (int j = 0; j <= qt; j++) {
    const int buf = j & 1;
    if (j < qt) {
      const size_t k1 = (size_t)(j + 1) * 64;
      wg_load<HD, 128>(sK + (buf ^ 1) * TILE, base + k1 * ld + kc, ld, T - (int)k1, tid);
      wg_load<HD, 128>(sV + (buf ^ 1) * TILE, base + k1 * ld + vc, ld, T - (int)k1, tid);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    proxy_fence();
    __syncthreads();
    const uint32_t k0 = smem_u32(sK + buf * TILE), v0 = smem_u32(sV + buf * TILE);
    float s[32], dp[32];
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.f;
    wg_fence();
    wg_qk<E, HD>(s, smem_u32(sQ), k0);
    wg_qk<E, HD>(dp, smem_u32(sdO), v0);
    wg_commit();
    wg_wait0();
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const int hi = (i >> 1) & 1, col = j * 64 + acc_col(l, i);
      const float p = col > r0 + 8 * hi ? 0.f : exp2f(s[i] * sl2 - L2[hi]);
      dp[i] = p * (dp[i] - Dr[hi]); // dS
    }
    uint32_t a[4][4];
    to_frags<E>(dp, a);
    wg_fence();
#pragma unroll
    for (int t = 0; t < 4; t++) wg_rs<E, HD>(dq, a[t], k0 + t * 2048, 1);
    wg_commit();
    wg_wait0();
    __syncthreads();
  }
  E *qout = dqkv + (size_t)b * T * ld + h * HD;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int row = r0 + 8 * ((i >> 1) & 1);
    if (row < T)
      *reinterpret_cast<decltype(wg_elem<E>::two(0.f, 0.f)) *>(qout + (size_t)row * ld + acc_col(l, i)) =
          wg_elem<E>::two(dq[i] * scale, dq[i + 1] * scale);
  }
}

// ---- backward, dK and dV: one warpgroup per 64 keys of a kv head, walking
// its query heads in order and, for each, the query tiles from the diagonal
// down. Accumulator rows are keys, columns query rows (S^T).
template <typename E, int HD>
__global__ void __launch_bounds__(128)
wg_dkv(E *dqkv, const E *qkv, const E *dout, const float *lse, const float *Dl, int T, int NH,
       int NKV) {
  constexpr int CB = HD / 64, TILE = CB * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  char *sK = sm, *sV = sm + TILE, *sQ = sm + 2 * TILE, *sdO = sQ + 2 * TILE;
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const int kt = blockIdx.x, bk = blockIdx.y, b = bk / NKV, kvh = bk % NKV;
  const int kc = C + kvh * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld, *ob = dout + (size_t)b * T * C;
  const int key0 = kt * 64, nq = (T + 63) / 64, per = nq - kt, steps = G * per;
  wg_load<HD, 128>(sK, base + (size_t)key0 * ld + kc, ld, T - key0, tid);
  wg_load<HD, 128>(sV, base + (size_t)key0 * ld + vc, ld, T - key0, tid);
  // step n: query head kvh G + n / per, query tile kt + n % per
  wg_load<HD, 128>(sQ, base + (size_t)key0 * ld + (kvh * G) * HD, ld, T - key0, tid);
  wg_load<HD, 128>(sdO, ob + (size_t)key0 * C + (kvh * G) * HD, C, T - key0, tid);
  cp_commit();
  const float scale = 1.f / sqrtf((float)HD), sl2 = scale * WG_LOG2E;
  float dk[HD / 2], dv[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.f;
  const int kr0 = key0 + 16 * w + (l >> 2); // this thread's keys: kr0, kr0 + 8
  for (int n = 0; n < steps; n++) {
    const int buf = n & 1, h = kvh * G + n / per, qi = kt + n % per;
    if (n + 1 < steps) {
      const int h1 = kvh * G + (n + 1) / per, q1 = (kt + (n + 1) % per) * 64;
      wg_load<HD, 128>(sQ + (buf ^ 1) * TILE, base + (size_t)q1 * ld + h1 * HD, ld, T - q1, tid);
      wg_load<HD, 128>(sdO + (buf ^ 1) * TILE, ob + (size_t)q1 * C + h1 * HD, C, T - q1, tid);
      cp_commit();
    }
    // this tile's statistics, per accumulator column (query row)
    float Lc[16], Dc[16];
    const float *lr = lse + ((size_t)b * NH + h) * T, *dr = Dl + ((size_t)b * NH + h) * T;
#pragma unroll
    for (int u = 0; u < 16; u++) {
      const int q = qi * 64 + acc_col(l, (u >> 1) * 4 + (u & 1));
      Lc[u] = q < T ? lr[q] * WG_LOG2E : 0.f;
      Dc[u] = q < T ? dr[q] : 0.f;
    }
    if (n + 1 < steps) cp_wait<1>();
    else cp_wait<0>();
    proxy_fence();
    __syncthreads();
    const uint32_t q0 = smem_u32(sQ + buf * TILE), o0 = smem_u32(sdO + buf * TILE);
    float s[32], dp[32];
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.f;
    wg_fence();
    wg_qk<E, HD>(s, smem_u32(sK), q0);
    wg_qk<E, HD>(dp, smem_u32(sV), o0);
    wg_commit();
    wg_wait0();
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const int hi = (i >> 1) & 1, u = (i >> 2) * 2 + (i & 1);
      const int key = kr0 + 8 * hi, q = qi * 64 + acc_col(l, i);
      const float p = (q < key || q >= T) ? 0.f : exp2f(s[i] * sl2 - Lc[u]);
      s[i] = p;                   // P^T
      dp[i] = p * (dp[i] - Dc[u]); // dS^T
    }
    uint32_t ap[4][4], as[4][4];
    to_frags<E>(s, ap);
    to_frags<E>(dp, as);
    wg_fence();
#pragma unroll
    for (int t = 0; t < 4; t++) wg_rs<E, HD>(dv, ap[t], o0 + t * 2048, 1);
#pragma unroll
    for (int t = 0; t < 4; t++) wg_rs<E, HD>(dk, as[t], q0 + t * 2048, 1);
    wg_commit();
    wg_wait0();
    __syncthreads();
  }
  E *kout = dqkv + (size_t)b * T * ld + kc, *vout = dqkv + (size_t)b * T * ld + vc;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int key = kr0 + 8 * ((i >> 1) & 1), c = acc_col(l, i);
    if (key < T) {
      *reinterpret_cast<decltype(wg_elem<E>::two(0.f, 0.f)) *>(kout + (size_t)key * ld + c) =
          wg_elem<E>::two(dk[i] * scale, dk[i + 1] * scale);
      *reinterpret_cast<decltype(wg_elem<E>::two(0.f, 0.f)) *>(vout + (size_t)key * ld + c) =
          wg_elem<E>::two(dv[i], dv[i + 1]);
    }
  }
}

// Dl = rowsum(dO * O) per (b, h, row): one warp per row
template <typename E, int HD>
__global__ void wg_delta(float *Dl, const E *dout, const E *out, int B, int T, int NH) {
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int l = threadIdx.x & 31, C = NH * HD;
  if (row >= (long)B * NH * T) return;
  const int i = row % T, h = (row / T) % NH, b = row / ((long)T * NH);
  const size_t off = ((size_t)b * T + i) * C + h * HD;
  float s = 0.f;
  for (int c = l; c < HD; c += 32) s += wg_elem<E>::f(dout[off + c]) * wg_elem<E>::f(out[off + c]);
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  if (l == 0) Dl[((size_t)b * NH + h) * T + i] = s;
}

// shared memory each kernel asks for (1024 of it for the alignment)
template <int HD> constexpr int wg_fwd_smem(int nwg) { return 1024 + (nwg + 4) * (HD / 64) * 8192; }
template <int HD> constexpr int wg_bwd_smem() { return 1024 + 6 * (HD / 64) * 8192; }
