// Experiment (issue 17), not part of the build or the trainer: a deterministic causal
// attention backward on Hopper's warpgroup MMA (wgmma), bf16, head size 64,
// as two kernels (no atomics): dK/dV per key tile walking the query tiles,
// dQ per query tile walking the key tiles. Against a naive fp32 reference.
//
// The same tiles and descriptors as attention_wgmma_fwd.cu; five products per
// tile pair (S^T, dP^T, dV, dK in one kernel; S, dP, dQ in the other: seven
// in all against the five of a backward that adds dQ atomically).
//
//   bash bench/wgmma_attention/run.sh     (on a Hopper GPU)
//   or: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a attention_wgmma_bwd.cu -o bwd
//       ./bwd B T H
#include <vector>

#include "wgmma_common.cuh"

typedef __nv_bfloat16 bf16;
constexpr int D = 64;
constexpr int LBO_MN = 16, SBO = 1024; // MN-major B: one 64-column atom (seen right on an H100)

// D_i = sum_d dO[i,d] O[i,d] for every (b, h, i): one warp per row
__global__ void delta_kernel(float *Dl, const bf16 *dout, const bf16 *out, int B, int T, int H) {
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int l = threadIdx.x & 31, C = H * D;
  if (row >= (long)B * H * T) return;
  const int i = row % T, h = (row / T) % H, b = row / ((long)T * H);
  const size_t off = ((size_t)b * T + i) * C + h * D;
  float s = __bfloat162float(dout[off + l]) * __bfloat162float(out[off + l]) +
            __bfloat162float(dout[off + l + 32]) * __bfloat162float(out[off + l + 32]);
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  if (l == 0) Dl[((size_t)b * H + h) * T + i] = s;
}

// 64 floats (a tile's lse or D) into shared memory by 16 threads
__device__ __forceinline__ void load_vec64(float *s, const float *g, int tid) {
  if (tid < 16) cp16(s + 4 * tid, g + 4 * tid);
}

// dK, dV for one key tile of 64 keys of head h, walking the query tiles from
// the diagonal down. Accumulator rows are keys, columns query rows (S^T).
__global__ void __launch_bounds__(128) dkv_kernel(bf16 *dqkv, const bf16 *qkv, const bf16 *dout,
                                                  const float *lse, const float *Dl, int T, int H,
                                                  float scale) {
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  char *sK = sm, *sV = sm + 8192, *sQ = sm + 16384, *sdO = sm + 32768; // sQ, sdO: [2][8192]
  float *sL = (float *)(sm + 49152), *sD = sL + 128;                    // [2][64] each
  const int C = H * D, ld = 3 * C;
  const int kt = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const bf16 *qb = qkv + (size_t)b * T * ld, *ob = dout + (size_t)b * T * C;
  const float *lb = lse + (size_t)bh * T, *db = Dl + (size_t)bh * T;
  const int nq = T / 64;
  load_tile(sK, qb + (size_t)kt * 64 * ld + C + h * D, ld, tid);
  load_tile(sV, qb + (size_t)kt * 64 * ld + 2 * C + h * D, ld, tid);
  load_tile(sQ, qb + (size_t)kt * 64 * ld + h * D, ld, tid);
  load_tile(sdO, ob + (size_t)kt * 64 * C + h * D, C, tid);
  load_vec64(sL, lb + kt * 64, tid);
  load_vec64(sD, db + kt * 64, tid);
  cp_commit();
  const float sl2 = scale * 1.4426950408889634f;
  float dk[32], dv[32];
#pragma unroll
  for (int i = 0; i < 32; i++) dk[i] = dv[i] = 0.f;
  const int key0 = kt * 64 + 16 * w + (l >> 2); // this thread's key rows: key0, key0 + 8
  for (int qi = kt; qi < nq; qi++) {
    const int buf = (qi - kt) & 1;
    if (qi + 1 < nq) {
      const int nb = buf ^ 1;
      load_tile(sQ + nb * 8192, qb + (size_t)(qi + 1) * 64 * ld + h * D, ld, tid);
      load_tile(sdO + nb * 8192, ob + (size_t)(qi + 1) * 64 * C + h * D, C, tid);
      load_vec64(sL + nb * 64, lb + (qi + 1) * 64, tid);
      load_vec64(sD + nb * 64, db + (qi + 1) * 64, tid);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    proxy_fence();
    __syncthreads();
    const uint32_t q0 = smem_u32(sQ + buf * 8192), o0 = smem_u32(sdO + buf * 8192);
    float s[32], dp[32];
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      wgmma_ss(s, make_desc(smem_u32(sK) + kk * 32, 16, 1024), make_desc(q0 + kk * 32, 16, 1024),
               kk > 0);
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      wgmma_ss(dp, make_desc(smem_u32(sV) + kk * 32, 16, 1024), make_desc(o0 + kk * 32, 16, 1024),
               kk > 0);
    wg_commit();
    wg_wait0();
    const float *L = sL + buf * 64, *Dd = sD + buf * 64;
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const int hi = (i >> 1) & 1, c = (i >> 2) * 8 + (l & 3) * 2 + (i & 1);
      const int key = key0 + 8 * hi, q = qi * 64 + c;
      float p = exp2f(s[i] * sl2 - L[c] * 1.4426950408889634f);
      if (q < key) p = 0.f; // causal: query q sees keys <= q
      s[i] = p;                       // P^T
      dp[i] = p * (dp[i] - Dd[c]);    // dS^T
    }
    uint32_t ap[4][4], as[4][4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
      ap[t][0] = pack_bf16(s[8 * t + 0], s[8 * t + 1]);
      ap[t][1] = pack_bf16(s[8 * t + 2], s[8 * t + 3]);
      ap[t][2] = pack_bf16(s[8 * t + 4], s[8 * t + 5]);
      ap[t][3] = pack_bf16(s[8 * t + 6], s[8 * t + 7]);
      as[t][0] = pack_bf16(dp[8 * t + 0], dp[8 * t + 1]);
      as[t][1] = pack_bf16(dp[8 * t + 2], dp[8 * t + 3]);
      as[t][2] = pack_bf16(dp[8 * t + 4], dp[8 * t + 5]);
      as[t][3] = pack_bf16(dp[8 * t + 6], dp[8 * t + 7]);
    }
    wg_fence();
#pragma unroll
    for (int t = 0; t < 4; t++) wgmma_rs_tb(dv, ap[t], make_desc(o0 + t * 2048, LBO_MN, SBO), 1);
#pragma unroll
    for (int t = 0; t < 4; t++) wgmma_rs_tb(dk, as[t], make_desc(q0 + t * 2048, LBO_MN, SBO), 1);
    wg_commit();
    wg_wait0();
    __syncthreads();
  }
  bf16 *kout = dqkv + (size_t)b * T * ld + C + h * D, *vout = kout + C;
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    const int hi = (i >> 1) & 1, key = key0 + 8 * hi, c = (i >> 2) * 8 + (l & 3) * 2;
    *reinterpret_cast<__nv_bfloat162 *>(kout + (size_t)key * ld + c) =
        __floats2bfloat162_rn(dk[i] * scale, dk[i + 1] * scale);
    *reinterpret_cast<__nv_bfloat162 *>(vout + (size_t)key * ld + c) =
        __floats2bfloat162_rn(dv[i], dv[i + 1]);
  }
}

// dQ for one query tile of 64 rows of head h, walking the key tiles up to the
// diagonal. Accumulator rows are query rows, columns keys (S).
__global__ void __launch_bounds__(128) dq_kernel(bf16 *dqkv, const bf16 *qkv, const bf16 *dout,
                                                 const float *lse, const float *Dl, int T, int H,
                                                 float scale) {
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  char *sQ = sm, *sdO = sm + 8192, *sK = sm + 16384, *sV = sm + 32768; // sK, sV: [2][8192]
  const int C = H * D, ld = 3 * C;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const bf16 *qb = qkv + (size_t)b * T * ld, *ob = dout + (size_t)b * T * C;
  load_tile(sQ, qb + (size_t)qt * 64 * ld + h * D, ld, tid);
  load_tile(sdO, ob + (size_t)qt * 64 * C + h * D, C, tid);
  load_tile(sK, qb + C + h * D, ld, tid);
  load_tile(sV, qb + 2 * C + h * D, ld, tid);
  cp_commit();
  const float sl2 = scale * 1.4426950408889634f;
  const int r0 = qt * 64 + 16 * w + (l >> 2);
  float L2[2], Dr[2];
  for (int hi = 0; hi < 2; hi++) {
    L2[hi] = lse[(size_t)bh * T + r0 + 8 * hi] * 1.4426950408889634f;
    Dr[hi] = Dl[(size_t)bh * T + r0 + 8 * hi];
  }
  float dq[32];
#pragma unroll
  for (int i = 0; i < 32; i++) dq[i] = 0.f;
  for (int j = 0; j <= qt; j++) {
    const int buf = j & 1;
    if (j < qt) {
      const int nb = buf ^ 1;
      load_tile(sK + nb * 8192, qb + (size_t)(j + 1) * 64 * ld + C + h * D, ld, tid);
      load_tile(sV + nb * 8192, qb + (size_t)(j + 1) * 64 * ld + 2 * C + h * D, ld, tid);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    proxy_fence();
    __syncthreads();
    const uint32_t k0 = smem_u32(sK + buf * 8192), v0 = smem_u32(sV + buf * 8192);
    float s[32], dp[32];
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      wgmma_ss(s, make_desc(smem_u32(sQ) + kk * 32, 16, 1024), make_desc(k0 + kk * 32, 16, 1024),
               kk > 0);
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      wgmma_ss(dp, make_desc(smem_u32(sdO) + kk * 32, 16, 1024), make_desc(v0 + kk * 32, 16, 1024),
               kk > 0);
    wg_commit();
    wg_wait0();
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const int hi = (i >> 1) & 1, col = j * 64 + (i >> 2) * 8 + (l & 3) * 2 + (i & 1);
      float p = exp2f(s[i] * sl2 - L2[hi]);
      if (col > r0 + 8 * hi) p = 0.f;
      dp[i] = p * (dp[i] - Dr[hi]); // dS
    }
    uint32_t as[4][4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
      as[t][0] = pack_bf16(dp[8 * t + 0], dp[8 * t + 1]);
      as[t][1] = pack_bf16(dp[8 * t + 2], dp[8 * t + 3]);
      as[t][2] = pack_bf16(dp[8 * t + 4], dp[8 * t + 5]);
      as[t][3] = pack_bf16(dp[8 * t + 6], dp[8 * t + 7]);
    }
    wg_fence();
#pragma unroll
    for (int t = 0; t < 4; t++) wgmma_rs_tb(dq, as[t], make_desc(k0 + t * 2048, LBO_MN, SBO), 1);
    wg_commit();
    wg_wait0();
    __syncthreads();
  }
  bf16 *qout = dqkv + (size_t)b * T * ld + h * D;
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    const int hi = (i >> 1) & 1, row = r0 + 8 * hi, c = (i >> 2) * 8 + (l & 3) * 2;
    *reinterpret_cast<__nv_bfloat162 *>(qout + (size_t)row * ld + c) =
        __floats2bfloat162_rn(dq[i] * scale, dq[i + 1] * scale);
  }
}

// ---- naive fp32 reference. Forward per row: out, lse. Then per row i: dQ;
// per column j: dK, dV. One warp each; lane l owns columns l and l + 32.
__device__ float dot64(const bf16 *a, const bf16 *b, int l) {
  float d = __bfloat162float(a[l]) * __bfloat162float(b[l]) +
            __bfloat162float(a[l + 32]) * __bfloat162float(b[l + 32]);
  for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffff, d, o);
  return d;
}

__global__ void ref_fwd(const bf16 *qkv, float *out, bf16 *out16, float *lse, int B, int T, int H) {
  const int C = H * D, ld = 3 * C;
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int l = threadIdx.x & 31;
  if (row >= (long)B * H * T) return;
  const int i = row % T, h = (row / T) % H, b = row / ((long)T * H);
  const bf16 *q = qkv + ((size_t)b * T + i) * ld + h * D;
  const float sc = 1.f / sqrtf((float)D);
  float mx = -INFINITY;
  for (int j = 0; j <= i; j++) mx = fmaxf(mx, dot64(q, qkv + ((size_t)b * T + j) * ld + C + h * D, l) * sc);
  float a0 = 0.f, a1 = 0.f, sum = 0.f;
  for (int j = 0; j <= i; j++) {
    const bf16 *k = qkv + ((size_t)b * T + j) * ld + C + h * D, *v = k + C;
    const float p = expf(dot64(q, k, l) * sc - mx);
    sum += p;
    a0 += p * __bfloat162float(v[l]);
    a1 += p * __bfloat162float(v[l + 32]);
  }
  const size_t o = ((size_t)b * T + i) * C + h * D;
  out[o + l] = a0 / sum;
  out[o + l + 32] = a1 / sum;
  out16[o + l] = __float2bfloat16(a0 / sum);
  out16[o + l + 32] = __float2bfloat16(a1 / sum);
  if (l == 0) lse[((size_t)b * H + h) * T + i] = mx + logf(sum);
}

// dQ_i = scale sum_j dS_ij K_j with dS_ij = P_ij (dO_i . V_j - D_i)
__global__ void ref_dq(const bf16 *qkv, const bf16 *dout, const float *lse, const float *Dl,
                       float *dq, int B, int T, int H) {
  const int C = H * D, ld = 3 * C;
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int l = threadIdx.x & 31;
  if (row >= (long)B * H * T) return;
  const int i = row % T, h = (row / T) % H, b = row / ((long)T * H);
  const bf16 *q = qkv + ((size_t)b * T + i) * ld + h * D, *dO = dout + ((size_t)b * T + i) * C + h * D;
  const float sc = 1.f / sqrtf((float)D), L = lse[((size_t)b * H + h) * T + i],
              Di = Dl[((size_t)b * H + h) * T + i];
  float a0 = 0.f, a1 = 0.f;
  for (int j = 0; j <= i; j++) {
    const bf16 *k = qkv + ((size_t)b * T + j) * ld + C + h * D, *v = k + C;
    const float p = expf(dot64(q, k, l) * sc - L), ds = p * (dot64(dO, v, l) - Di);
    a0 += ds * __bfloat162float(k[l]);
    a1 += ds * __bfloat162float(k[l + 32]);
  }
  float *o = dq + ((size_t)b * T + i) * C + h * D;
  o[l] = a0 * sc;
  o[l + 32] = a1 * sc;
}

// dK_j = scale sum_i dS_ij Q_i, dV_j = sum_i P_ij dO_i over i >= j
__global__ void ref_dkv(const bf16 *qkv, const bf16 *dout, const float *lse, const float *Dl,
                        float *dk, float *dv, int B, int T, int H) {
  const int C = H * D, ld = 3 * C;
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int l = threadIdx.x & 31;
  if (row >= (long)B * H * T) return;
  const int j = row % T, h = (row / T) % H, b = row / ((long)T * H);
  const bf16 *k = qkv + ((size_t)b * T + j) * ld + C + h * D, *v = k + C;
  const float sc = 1.f / sqrtf((float)D);
  float k0 = 0.f, k1 = 0.f, v0 = 0.f, v1 = 0.f;
  for (int i = j; i < T; i++) {
    const bf16 *q = qkv + ((size_t)b * T + i) * ld + h * D, *dO = dout + ((size_t)b * T + i) * C + h * D;
    const float L = lse[((size_t)b * H + h) * T + i], Di = Dl[((size_t)b * H + h) * T + i];
    const float p = expf(dot64(q, k, l) * sc - L), ds = p * (dot64(dO, v, l) - Di);
    k0 += ds * __bfloat162float(q[l]);
    k1 += ds * __bfloat162float(q[l + 32]);
    v0 += p * __bfloat162float(dO[l]);
    v1 += p * __bfloat162float(dO[l + 32]);
  }
  const size_t o = ((size_t)b * T + j) * C + h * D;
  dk[o + l] = k0 * sc;
  dk[o + l + 32] = k1 * sc;
  dv[o + l] = v0;
  dv[o + l + 32] = v1;
}

static float bf(const bf16 &x) { return __bfloat162float(x); }

int main(int argc, char **argv) {
  const int B = argc > 1 ? atoi(argv[1]) : 4, T = argc > 2 ? atoi(argv[2]) : 1024,
            H = argc > 3 ? atoi(argv[3]) : 12;
  if (T % 64) { fprintf(stderr, "T must be a multiple of 64\n"); return 2; }
  const int C = H * D, ld = 3 * C;
  srand(4321);
  auto rnd = [] { return (float)rand() / RAND_MAX * 2.f - 1.f; };
  const size_t nq = (size_t)B * T * ld, no = (size_t)B * T * C, nr = (size_t)B * H * T;
  std::vector<bf16> hq(nq), hdo(no);
  for (auto &x : hq) x = __float2bfloat16(rnd() * 2.f);
  for (auto &x : hdo) x = __float2bfloat16(rnd());
  bf16 *qkv, *dout, *out16, *dqkv;
  float *out, *lse, *Dl, *rdq, *rdk, *rdv;
  CK(cudaMalloc(&qkv, nq * 2)); CK(cudaMalloc(&dqkv, nq * 2)); CK(cudaMalloc(&dout, no * 2));
  CK(cudaMalloc(&out16, no * 2)); CK(cudaMalloc(&out, no * 4)); CK(cudaMalloc(&lse, nr * 4));
  CK(cudaMalloc(&Dl, nr * 4)); CK(cudaMalloc(&rdq, no * 4)); CK(cudaMalloc(&rdk, no * 4));
  CK(cudaMalloc(&rdv, no * 4));
  CK(cudaMemcpy(qkv, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dout, hdo.data(), no * 2, cudaMemcpyHostToDevice));
  const unsigned rb = (unsigned)((nr * 32 + 255) / 256);
  ref_fwd<<<rb, 256>>>(qkv, out, out16, lse, B, T, H);
  delta_kernel<<<rb, 256>>>(Dl, dout, out16, B, T, H);
  ref_dq<<<rb, 256>>>(qkv, dout, lse, Dl, rdq, B, T, H);
  ref_dkv<<<rb, 256>>>(qkv, dout, lse, Dl, rdk, rdv, B, T, H);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  const int smkv = 1024 + 49152 + 1024, smq = 1024 + 49152;
  CK(cudaFuncSetAttribute(dkv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smkv));
  CK(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smq));
  const float scale = 1.f / sqrtf((float)D);
  auto run = [&] {
    dq_kernel<<<dim3(T / 64, B * H), 128, smq>>>(dqkv, qkv, dout, lse, Dl, T, H, scale);
    dkv_kernel<<<dim3(T / 64, B * H), 128, smkv>>>(dqkv, qkv, dout, lse, Dl, T, H, scale);
  };
  CK(cudaMemset(dqkv, 0xff, nq * 2)); // poisoned: NaN bf16
  run();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<bf16> g(nq), g2(nq);
  CK(cudaMemcpy(g.data(), dqkv, nq * 2, cudaMemcpyDeviceToHost));
  std::vector<float> r[3] = {std::vector<float>(no), std::vector<float>(no), std::vector<float>(no)};
  CK(cudaMemcpy(r[0].data(), rdq, no * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r[1].data(), rdk, no * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r[2].data(), rdv, no * 4, cudaMemcpyDeviceToHost));
  const char *names[3] = {"dq", "dk", "dv"};
  int ok = 1;
  for (int p = 0; p < 3; p++) {
    double err = 0, mag = 0;
    for (size_t t = 0; t < (size_t)B * T; t++)
      for (int c = 0; c < C; c++) {
        const double x = bf(g[t * ld + p * C + c]), y = r[p][t * C + c];
        const double e = fabs(x - y);
        err = (e == e && err == err) ? fmax(err, e) : NAN;
        mag = fmax(mag, fabs(y));
      }
    const int good = err == err && err <= 0.02 * mag + 1e-3;
    ok &= good;
    printf("%s: max|got-ref| %.3g (max|ref| %.3g)%s\n", names[p], err, mag, good ? "  <- OK" : "  <- WRONG");
  }
  // run to run: bit-identical
  CK(cudaMemset(dqkv, 0xff, nq * 2));
  run();
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(g2.data(), dqkv, nq * 2, cudaMemcpyDeviceToHost));
  printf("run to run: %s\n", memcmp(g.data(), g2.data(), nq * 2) ? "DIFFERENT" : "bit-identical");
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int it = 0; it < 3; it++) run();
  CK(cudaEventRecord(e0));
  const int N = 20;
  for (int it = 0; it < N; it++) run();
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  ms /= N;
  const double ffwd = 4.0 * B * H * (double)T * T * D / 2;
  printf("bwd64 B=%d T=%d H=%d: %.3f ms (dq + dkv kernels), %.1f TFLOP/s counted as 2.5x forward "
         "(the usual count), %s\n", B, T, H, ms, 2.5 * ffwd / ms / 1e9, ok ? "correct" : "WRONG");
  return ok ? 0 : 1;
}
