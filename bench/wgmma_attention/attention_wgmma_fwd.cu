// Experiment (issue 17), not part of the build or the trainer: a causal
// attention forward on Hopper's warpgroup MMA (wgmma), bf16, head sizes 64
// and 128, one or two warpgroups of 64 query rows per block, K/V tiles of 64
// keys double-buffered with cp.async, P kept in registers as the A operand
// of the PV product (FlashAttention-3's register reuse, without its warp
// specialisation or TMA). Checked against a naive fp32 reference with
// poisoned outputs, after a single-tile GEMM check of the shared-memory
// descriptors it relies on (K-major and MN-major, 128-byte swizzle).
// Results: docs/benchmarks.md, "wgmma attention experiment".
//
//   bash bench/wgmma_attention/run.sh     (on a Hopper GPU)
//   or: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a attention_wgmma_fwd.cu -o fwd
//       ./fwd B T H HEAD_SIZE
#include <vector>

#include "wgmma_common.cuh"

// ---- 1. one 64x64x64 tile: C = A B with A [m][k], B given either as
// Bk [n][k] (K-major) or Bm [k][n] (MN-major, transposed by wgmma)
__global__ void gemm_tile(const __nv_bfloat16 *A, const __nv_bfloat16 *Bk,
                          const __nv_bfloat16 *Bm, float *Ck, float *Cm, int lbo, int sbo) {
  __shared__ __align__(1024) char sA[8192], sBk[8192], sBm[8192];
  const int tid = threadIdx.x;
  load_tile(sA, A, 64, tid);
  load_tile(sBk, Bk, 64, tid);
  load_tile(sBm, Bm, 64, tid);
  cp_commit();
  cp_wait<0>();
  proxy_fence();
  __syncthreads();
  float dk[32], dm[32];
#pragma unroll
  for (int i = 0; i < 32; i++) dk[i] = dm[i] = 0.f;
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    wgmma_ss(dk, make_desc(smem_u32(sA) + kk * 32, 16, 1024),
             make_desc(smem_u32(sBk) + kk * 32, 16, 1024), kk > 0);
  }
  wg_commit();
  wg_wait0();
  // MN-major B: k rows of 128 bytes, 16 k per step
  wg_fence();
  uint32_t a[4][4];
  (void)a;
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
    wgmma_ss_tb(dm, make_desc(smem_u32(sA) + kk * 32, 16, 1024),
                make_desc(smem_u32(sBm) + kk * 2048, lbo, sbo), kk > 0);
  wg_commit();
  wg_wait0();
  const int w = tid >> 5, l = tid & 31;
#pragma unroll
  for (int i = 0; i < 32; i++) {
    const int row = 16 * w + (l >> 2) + 8 * ((i >> 1) & 1), col = (i >> 2) * 8 + (l & 3) * 2 + (i & 1);
    Ck[row * 64 + col] = dk[i];
    Cm[row * 64 + col] = dm[i];
  }
}

// ---- 2. causal attention forward. qkv [B, T, 3C] (q, k, v of head h at
// columns hD, C + hD, 2C + hD), out [B, T, C], lse [B, H, T] (natural log of
// the softmax denominator of the scaled scores). NWG warpgroups, each its
// own 64 query rows of the block's 64 x NWG, sharing every K/V tile of 64
// keys, double-buffered with cp.async by all threads. While one warpgroup
// runs its softmax the other's MMAs can run (the scheduler interleaves them).
template <int NWG>
__global__ void __launch_bounds__(128 * NWG) fa_fwd64(const __nv_bfloat16 *qkv, __nv_bfloat16 *out,
                                                      float *lse, int T, int H, int vlbo, int vsbo) {
  constexpr int D = 64, NT = 128 * NWG, BR = 64 * NWG;
  __shared__ __align__(1024) char sQ[NWG][8192];
  __shared__ __align__(1024) char sK[2][8192];
  __shared__ __align__(1024) char sV[2][8192];
  const int C = H * D, ld = 3 * C;
  const int qt = gridDim.x - 1 - blockIdx.x; // the longest rows first
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, l = tid & 31;
  const __nv_bfloat16 *base = qkv + (size_t)b * T * ld;
#pragma unroll
  for (int g = 0; g < NWG; g++) load_tile<NT>(sQ[g], base + ((size_t)qt * BR + 64 * g) * ld + h * D, ld, tid);
  load_tile<NT>(sK[0], base + C + h * D, ld, tid);
  load_tile<NT>(sV[0], base + 2 * C + h * D, ld, tid);
  cp_commit();
  const float sl2 = 1.4426950408889634f / sqrtf((float)D);
  float o[32], m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 32; i++) o[i] = 0.f;
  const int r0 = qt * BR + 64 * wg + 16 * w + (l >> 2);
  const int last = qt * NWG + NWG - 1;   // the block's last key tile
  const int mine = qt * NWG + wg;        // this warpgroup's diagonal tile
  for (int j = 0; j <= last; j++) {
    const int buf = j & 1;
    if (j < last) {
      load_tile<NT>(sK[buf ^ 1], base + (size_t)(j + 1) * 64 * ld + C + h * D, ld, tid);
      load_tile<NT>(sV[buf ^ 1], base + (size_t)(j + 1) * 64 * ld + 2 * C + h * D, ld, tid);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    proxy_fence();
    __syncthreads();
    if (j <= mine) {
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; i++) s[i] = 0.f;
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; kk++)
        wgmma_ss(s, make_desc(smem_u32(sQ[wg]) + kk * 32, 16, 1024),
                 make_desc(smem_u32(sK[buf]) + kk * 32, 16, 1024), kk > 0);
      wg_commit();
      wg_wait0();
      // scale into log2 units, mask the diagonal tile, new row maxima
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1, col = j * 64 + (i >> 2) * 8 + (l & 3) * 2 + (i & 1);
        float v = s[i] * sl2;
        if (j == mine && col > r0 + 8 * hi) v = -INFINITY;
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
        corr[hi] = exp2f(m[hi] - mx[hi]); // m = -inf at the start: 0
        m[hi] = mx[hi];
      }
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1;
        s[i] = exp2f(s[i] - m[hi]);
        ps[hi] += s[i];
        o[i] *= corr[hi];
      }
#pragma unroll
      for (int hi = 0; hi < 2; hi++) lsum[hi] = lsum[hi] * corr[hi] + ps[hi];
      // P (bf16, registers) times V: the accumulator layout of S is the A
      // fragment layout of the next MMA, k-slice t from n-blocks 2t, 2t+1
      uint32_t a[4][4];
#pragma unroll
      for (int t = 0; t < 4; t++) {
        a[t][0] = pack_bf16(s[8 * t + 0], s[8 * t + 1]);
        a[t][1] = pack_bf16(s[8 * t + 2], s[8 * t + 3]);
        a[t][2] = pack_bf16(s[8 * t + 4], s[8 * t + 5]);
        a[t][3] = pack_bf16(s[8 * t + 6], s[8 * t + 7]);
      }
      wg_fence();
#pragma unroll
      for (int t = 0; t < 4; t++)
        wgmma_rs_tb(o, a[t], make_desc(smem_u32(sV[buf]) + t * 2048, vlbo, vsbo), 1);
      wg_commit();
      wg_wait0();
    }
    __syncthreads(); // the next loads overwrite this buffer
  }
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    lsum[hi] += __shfl_xor_sync(0xffffffff, lsum[hi], 1);
    lsum[hi] += __shfl_xor_sync(0xffffffff, lsum[hi], 2);
  }
  __nv_bfloat16 *orow = out + (size_t)b * T * C + h * D;
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    const int hi = (i >> 1) & 1, row = r0 + 8 * hi, col = (i >> 2) * 8 + (l & 3) * 2;
    const float inv = 1.f / lsum[hi];
    *reinterpret_cast<__nv_bfloat162 *>(orow + (size_t)row * C + col) =
        __floats2bfloat162_rn(o[i] * inv, o[i + 1] * inv);
  }
  if ((l & 3) == 0)
    for (int hi = 0; hi < 2; hi++)
      lse[(size_t)bh * T + r0 + 8 * hi] = (m[hi] + log2f(lsum[hi])) * 0.6931471805599453f;
}

// ---- 3. the same for head size 128 (the Llama family): Q, K and V tiles of
// [64][128] as two [64][64] column blocks (8 KB apart), S over k = 128 in 8
// steps, O [64 rows][128] from m64n128 MMAs whose B (V, MN-major) spans the
// two column blocks. Dynamic shared memory, 1024-aligned by hand.
template <int NWG>
__global__ void __launch_bounds__(128 * NWG) fa_fwd128(const __nv_bfloat16 *qkv, __nv_bfloat16 *out,
                                                       float *lse, int T, int H, int vlbo, int vsbo) {
  constexpr int D = 128, NT = 128 * NWG, BR = 64 * NWG;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  char *sQ = sm;                        // [NWG][2][8192]
  char *sK = sm + NWG * 16384;          // [2 bufs][2][8192]
  char *sV = sK + 2 * 16384;            // [2 bufs][2][8192]
  const int C = H * D, ld = 3 * C;
  const int qt = gridDim.x - 1 - blockIdx.x;
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, l = tid & 31;
  const __nv_bfloat16 *base = qkv + (size_t)b * T * ld;
  for (int g = 0; g < NWG; g++)
    for (int cb = 0; cb < 2; cb++)
      load_tile<NT>(sQ + g * 16384 + cb * 8192, base + ((size_t)qt * BR + 64 * g) * ld + h * D + 64 * cb, ld, tid);
  for (int cb = 0; cb < 2; cb++) {
    load_tile<NT>(sK + cb * 8192, base + C + h * D + 64 * cb, ld, tid);
    load_tile<NT>(sV + cb * 8192, base + 2 * C + h * D + 64 * cb, ld, tid);
  }
  cp_commit();
  const float sl2 = 1.4426950408889634f / sqrtf((float)D);
  float o[64], m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 64; i++) o[i] = 0.f;
  const int r0 = qt * BR + 64 * wg + 16 * w + (l >> 2);
  const int last = qt * NWG + NWG - 1, mine = qt * NWG + wg;
  for (int j = 0; j <= last; j++) {
    const int buf = j & 1;
    if (j < last) {
      for (int cb = 0; cb < 2; cb++) {
        load_tile<NT>(sK + (buf ^ 1) * 16384 + cb * 8192, base + (size_t)(j + 1) * 64 * ld + C + h * D + 64 * cb, ld, tid);
        load_tile<NT>(sV + (buf ^ 1) * 16384 + cb * 8192, base + (size_t)(j + 1) * 64 * ld + 2 * C + h * D + 64 * cb, ld, tid);
      }
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    proxy_fence();
    __syncthreads();
    if (j <= mine) {
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; i++) s[i] = 0.f;
      const uint32_t q0 = smem_u32(sQ + wg * 16384), k0 = smem_u32(sK + buf * 16384);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < 8; kk++)
        wgmma_ss(s, make_desc(q0 + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024),
                 make_desc(k0 + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024), kk > 0);
      wg_commit();
      wg_wait0();
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1, col = j * 64 + (i >> 2) * 8 + (l & 3) * 2 + (i & 1);
        float v = s[i] * sl2;
        if (j == mine && col > r0 + 8 * hi) v = -INFINITY;
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
        corr[hi] = exp2f(m[hi] - mx[hi]);
        m[hi] = mx[hi];
      }
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1;
        s[i] = exp2f(s[i] - m[hi]);
        ps[hi] += s[i];
      }
#pragma unroll
      for (int i = 0; i < 64; i++) o[i] *= corr[(i >> 1) & 1];
#pragma unroll
      for (int hi = 0; hi < 2; hi++) lsum[hi] = lsum[hi] * corr[hi] + ps[hi];
      uint32_t a[4][4];
#pragma unroll
      for (int t = 0; t < 4; t++) {
        a[t][0] = pack_bf16(s[8 * t + 0], s[8 * t + 1]);
        a[t][1] = pack_bf16(s[8 * t + 2], s[8 * t + 3]);
        a[t][2] = pack_bf16(s[8 * t + 4], s[8 * t + 5]);
        a[t][3] = pack_bf16(s[8 * t + 6], s[8 * t + 7]);
      }
      const uint32_t v0 = smem_u32(sV + buf * 16384);
      wg_fence();
#pragma unroll
      for (int t = 0; t < 4; t++) wgmma_rs_tb_n128(o, a[t], make_desc(v0 + t * 2048, vlbo, vsbo), 1);
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
  __nv_bfloat16 *orow = out + (size_t)b * T * C + h * D;
#pragma unroll
  for (int i = 0; i < 64; i += 2) {
    const int hi = (i >> 1) & 1, row = r0 + 8 * hi, col = (i >> 2) * 8 + (l & 3) * 2;
    const float inv = 1.f / lsum[hi];
    *reinterpret_cast<__nv_bfloat162 *>(orow + (size_t)row * C + col) =
        __floats2bfloat162_rn(o[i] * inv, o[i + 1] * inv);
  }
  if ((l & 3) == 0)
    for (int hi = 0; hi < 2; hi++)
      lse[(size_t)bh * T + r0 + 8 * hi] = (m[hi] + log2f(lsum[hi])) * 0.6931471805599453f;
}

// ---- reference: one warp per (b, h, query row), fp32
template <int D>
__global__ void ref_fwd(const __nv_bfloat16 *qkv, float *out, float *lse, int B, int T, int H) {
  constexpr int PL = D / 32; // output columns per lane: l + 32 i
  const int C = H * D, ld = 3 * C;
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int l = threadIdx.x & 31;
  if (row >= (long)B * H * T) return;
  const int i = row % T, h = (row / T) % H, b = row / ((long)T * H);
  const __nv_bfloat16 *q = qkv + ((size_t)b * T + i) * ld + h * D;
  const float sc = 1.f / sqrtf((float)D);
  float mx = -INFINITY;
  for (int j = l; j <= i; j += 32) {
    const __nv_bfloat16 *k = qkv + ((size_t)b * T + j) * ld + C + h * D;
    float d = 0.f;
    for (int e = 0; e < D; e++) d += __bfloat162float(q[e]) * __bfloat162float(k[e]);
    mx = fmaxf(mx, d * sc);
  }
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
  float acc[PL], sum = 0.f;
  for (int e = 0; e < PL; e++) acc[e] = 0.f;
  for (int j = 0; j <= i; j++) {
    const __nv_bfloat16 *k = qkv + ((size_t)b * T + j) * ld + C + h * D;
    const __nv_bfloat16 *v = k + C;
    float d = 0.f;
    for (int e = 0; e < PL; e++) d += __bfloat162float(q[l + 32 * e]) * __bfloat162float(k[l + 32 * e]);
    for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffff, d, o);
    const float p = expf(d * sc - mx);
    sum += p;
    for (int e = 0; e < PL; e++) acc[e] += p * __bfloat162float(v[l + 32 * e]);
  }
  float *orow = out + ((size_t)b * T + i) * C + h * D;
  for (int e = 0; e < PL; e++) orow[l + 32 * e] = acc[e] / sum;
  if (l == 0) lse[((size_t)b * H + h) * T + i] = mx + logf(sum);
}

static float bf(const __nv_bfloat16 &x) { return __bfloat162float(x); }

int main(int argc, char **argv) {
  const int B = argc > 1 ? atoi(argv[1]) : 4, T = argc > 2 ? atoi(argv[2]) : 1024,
            H = argc > 3 ? atoi(argv[3]) : 12, HD = argc > 4 ? atoi(argv[4]) : 64;
  if (HD != 64 && HD != 128) { fprintf(stderr, "head size 64 or 128\n"); return 2; }
  if (T % 64) { fprintf(stderr, "T must be a multiple of 64\n"); return 2; }
  srand(1234);
  int failed = 0;
  auto rnd = [] { return (float)rand() / RAND_MAX * 2.f - 1.f; };
  // 1. the tile GEMM, every (lbo, sbo) candidate for the MN-major operand
  {
    std::vector<__nv_bfloat16> A(4096), Bk(4096), Bm(4096);
    for (int i = 0; i < 4096; i++) A[i] = __float2bfloat16(rnd());
    for (int n = 0; n < 64; n++)
      for (int k = 0; k < 64; k++) {
        Bk[n * 64 + k] = __float2bfloat16(rnd());
        Bm[k * 64 + n] = Bk[n * 64 + k];
      }
    std::vector<float> ref(4096);
    for (int m = 0; m < 64; m++)
      for (int n = 0; n < 64; n++) {
        double s = 0;
        for (int k = 0; k < 64; k++) s += (double)bf(A[m * 64 + k]) * bf(Bk[n * 64 + k]);
        ref[m * 64 + n] = (float)s;
      }
    __nv_bfloat16 *dA, *dBk, *dBm;
    float *dCk, *dCm;
    CK(cudaMalloc(&dA, 8192)); CK(cudaMalloc(&dBk, 8192)); CK(cudaMalloc(&dBm, 8192));
    CK(cudaMalloc(&dCk, 16384)); CK(cudaMalloc(&dCm, 16384));
    CK(cudaMemcpy(dA, A.data(), 8192, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dBk, Bk.data(), 8192, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dBm, Bm.data(), 8192, cudaMemcpyHostToDevice));
    // MN-major B: sbo is the stride of 8-row k groups, lbo that of 64-column
    // atoms along n (one atom here). Seen on an H100 (2026-12-05): (16, 1024)
    // and (8192, 1024) right, (1024, 16) wrong, (1024, 8192) an illegal address.
    const int cand[][2] = {{16, 1024}, {8192, 1024}};
    std::vector<float> Ck(4096), Cm(4096);
    for (auto &c : cand) {
      CK(cudaMemset(dCk, 0, 16384)); CK(cudaMemset(dCm, 0, 16384));
      gemm_tile<<<1, 128>>>(dA, dBk, dBm, dCk, dCm, c[0], c[1]);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(Ck.data(), dCk, 16384, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(Cm.data(), dCm, 16384, cudaMemcpyDeviceToHost));
      double ek = 0, em = 0;
      for (int i = 0; i < 4096; i++) {
        ek = fmax(ek, fabs(Ck[i] - ref[i]));
        em = fmax(em, fabs(Cm[i] - ref[i]));
      }
      printf("gemm_tile: K-major B max|err| %.3g; MN-major B (lbo %d, sbo %d) max|err| %.3g%s\n", ek,
             c[0], c[1], em, ek < 1e-2 && em < 1e-2 ? "  <- OK" : "  <- WRONG");
      if (!(ek < 1e-2 && em < 1e-2)) failed = 1;
    }
  }
  // 2. attention
  const int C = H * HD;
  const size_t nq = (size_t)B * T * 3 * C;
  std::vector<__nv_bfloat16> hq(nq);
  for (size_t i = 0; i < nq; i++) hq[i] = __float2bfloat16(rnd() * 2.f);
  __nv_bfloat16 *qkv, *out;
  float *lse, *rout, *rlse;
  CK(cudaMalloc(&qkv, nq * 2));
  CK(cudaMalloc(&out, (size_t)B * T * C * 2));
  CK(cudaMalloc(&rout, (size_t)B * T * C * 4));
  CK(cudaMalloc(&lse, (size_t)B * H * T * 4));
  CK(cudaMalloc(&rlse, (size_t)B * H * T * 4));
  CK(cudaMemcpy(qkv, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  const long rows = (long)B * H * T;
  (HD == 64 ? ref_fwd<64> : ref_fwd<128>)<<<(unsigned)((rows * 32 + 255) / 256), 256>>>(qkv, rout, rlse, B, T, H);
  CK(cudaGetLastError());
  std::vector<float> ro((size_t)B * T * C), rl((size_t)B * H * T), ol((size_t)B * H * T);
  std::vector<__nv_bfloat16> oo((size_t)B * T * C);
  CK(cudaMemcpy(ro.data(), rout, ro.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(rl.data(), rlse, rl.size() * 4, cudaMemcpyDeviceToHost));
  // V's descriptor: 1024 bytes between 8-key groups, 8192 between the two
  // 64-column blocks of a head size of 128 (unused at 64)
  const int vcand[][2] = {{8192, 1024}};
  CK(cudaFuncSetAttribute(fa_fwd128<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 82944));
  CK(cudaFuncSetAttribute(fa_fwd128<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 99328));
  for (int nwg = 1; nwg <= 2; nwg++)
  for (auto &vc : vcand) {
    if (T % (64 * nwg)) continue;
    auto launch = [&] {
      if (HD == 64 && nwg == 1) fa_fwd64<1><<<dim3(T / 64, B * H), 128>>>(qkv, out, lse, T, H, vc[0], vc[1]);
      else if (HD == 64) fa_fwd64<2><<<dim3(T / 128, B * H), 256>>>(qkv, out, lse, T, H, vc[0], vc[1]);
      else if (nwg == 1) fa_fwd128<1><<<dim3(T / 64, B * H), 128, 82944>>>(qkv, out, lse, T, H, vc[0], vc[1]);
      else fa_fwd128<2><<<dim3(T / 128, B * H), 256, 99328>>>(qkv, out, lse, T, H, vc[0], vc[1]);
    };
    CK(cudaMemset(out, 0xff, (size_t)B * T * C * 2)); // poisoned: NaN bf16
    CK(cudaMemset(lse, 0xff, (size_t)B * H * T * 4));
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(oo.data(), out, oo.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ol.data(), lse, ol.size() * 4, cudaMemcpyDeviceToHost));
    double eo = 0, el = 0;
    for (size_t i = 0; i < oo.size(); i++) {
      const double e = fabs((double)bf(oo[i]) - ro[i]);
      eo = (e == e && eo == eo) ? fmax(eo, e) : NAN;
    }
    for (size_t i = 0; i < ol.size(); i++) {
      const double e = fabs((double)ol[i] - rl[i]);
      el = (e == e && el == el) ? fmax(el, e) : NAN;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (int it = 0; it < 3; it++) launch();
    CK(cudaEventRecord(e0));
    const int N = 20;
    for (int it = 0; it < N; it++) launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ms /= N;
    const double flops = 4.0 * B * H * (double)T * T * HD / 2;
    printf("fa_fwd%d<%d> B=%d T=%d H=%d (V lbo %d, sbo %d): max|out-ref| %.3g, max|lse-ref| %.3g%s; "
           "%.3f ms, %.1f TFLOP/s (causal)\n", HD, nwg, B, T, H, vc[0], vc[1], eo, el,
           eo < 2e-2 && el < 1e-3 ? "  <- OK" : "  <- WRONG", ms, flops / ms / 1e9);
    if (!(eo < 2e-2 && el < 1e-3)) failed = 1;
  }
  return failed;
}
