/* attention_wgmma_bwd.cuh - the causal attention backward on Hopper's
 * warpgroup MMA (included by attention_wgmma.cu, which launches it): two
 * kernels after the caller's D = rowsum(dO O), deterministic (each output
 * element has one owner thread; no atomics).
 *   dq: a warpgroup per 64 query rows walking key tiles 0..diagonal:
 *     S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
 *   dkv: a warpgroup per (kv head, 64 keys), walking the query heads of
 *     its group in order and for each the query tiles from the block's
 *     diagonal down (a warpgroup skips the tiles above its own), in
 *     transposed form: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
 *     dK += dS^T Q. The lse and D of each query tile are staged in shared
 *     memory with the tile (read per accumulator column).
 * Two forms: software-pipelined (wg_dq_pipe_kernel, wg_dkv_pipe_kernel;
 * one warpgroup a block, head size 64, the block's own Q (dq) or K and V
 * (dkv) as register A operands of the score products, the streamed tiles
 * NS-buffered: 2 NS + 1 (dq: dO stays a tile) or 2 NS (dkv) HD/64 8 KiB
 * of shared memory, +NS/2 KiB for dkv's lse and D), the default there; plain
 * (wg_dq_kernel, wg_dkv_kernel; double-buffered, (2 NWG + 4) HD/64 8 KiB,
 * +1 KiB), for head size 128, where the second set of fragments the
 * pipeline needs does not fit the registers, and with NWG = 2 warpgroups a
 * block sharing the streamed tiles (tests only: slower).
 * Seven products per tile pair against the five of a backward that adds
 * dQ with atomics: the price of determinism, and still O(T) memory.
 */
#ifndef ST_ATTENTION_WGMMA_BWD_CUH
#define ST_ATTENTION_WGMMA_BWD_CUH

#include "kernels/cuda/wgmma.cuh"

/* ---- backward, dQ: NWG warpgroups of 64 query rows share each K/V tile */
template <typename E, int HD, int NWG>
__global__ void __launch_bounds__(128 * NWG)
wg_dq_kernel(E *dqkv, const E *qkv, const E *dout, const float *lse, const float *Dl, int T,
             int NH, int NKV, int hg) {
  constexpr int NT = 128 * NWG, TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (st_saddr(smem_raw) & 1023)) & 1023);
  char *sQ = sm, *sdO = sm + NWG * TILE, *sK = sdO + NWG * TILE, *sV = sK + 2 * TILE;
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const wg_slot pos = wg_block_slot(hg);
  const int qt = pos.n - 1 - pos.i, bh = pos.bh, b = bh / NH, h = bh % NH;
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
  st_cp_commit();
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
      st_cp_commit();
      st_cp_wait<1>();
    } else {
      st_cp_wait<0>();
    }
    wg_proxy_fence();
    __syncthreads();
    if (my0 < T && j <= diag) {
      const uint32_t k0 = st_saddr(sK + buf * TILE), v0 = st_saddr(sV + buf * TILE);
      float s[32], dp[32];
#pragma unroll
      for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.f;
      wg_fence();
      wg_qk<E, HD>(s, st_saddr(sQ + wg * TILE), k0);
      wg_qk<E, HD>(dp, st_saddr(sdO + wg * TILE), v0);
      wg_commit();
      wg_wait0();
      if (j == diag) {
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const int hi = (i >> 1) & 1;
          const float p =
              j * 64 + wg_col(l, i) > r0 + 8 * hi ? 0.f : wg_exp2(fmaf(s[i], sl2, -L2[hi]));
          dp[i] = p * (dp[i] - Dr[hi]); /* dS */
        }
      } else {
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const int hi = (i >> 1) & 1;
          dp[i] = wg_exp2(fmaf(s[i], sl2, -L2[hi])) * (dp[i] - Dr[hi]);
        }
      }
      uint32_t a[4][4];
      wg_frags<E>(dp, a);
      wg_fence();
      wg_rs4<E, HD>(dq, a, k0);
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
  if (tid < 64) st_cp4(sL + tid, lr + (ok ? q : 0), ok ? 4 : 0);
  else if (tid < 128) st_cp4(sD + tid - 64, dr + (ok ? q : 0), ok ? 4 : 0);
}

/* ---- backward, dK and dV: NWG warpgroups of 64 keys share each Q/dO tile.
 * Accumulator rows are keys, columns query rows. */
template <typename E, int HD, int NWG>
__global__ void __launch_bounds__(128 * NWG)
wg_dkv_kernel(E *dqkv, const E *qkv, const E *dout, const float *lse, const float *Dl, int T,
              int NH, int NKV, int hg) {
  constexpr int NT = 128 * NWG, TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (st_saddr(smem_raw) & 1023)) & 1023);
  char *sK = sm, *sV = sm + NWG * TILE, *sQ = sV + NWG * TILE, *sdO = sQ + 2 * TILE;
  float *sL = (float *)(sdO + 2 * TILE), *sD = sL + 128; /* [2][64] each */
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const wg_slot pos = wg_block_slot(hg);
  const int kt = pos.i, bk = pos.bh, b = bk / NKV, kvh = bk % NKV;
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
  st_cp_commit();
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
      st_cp_commit();
      st_cp_wait<1>();
    } else {
      st_cp_wait<0>();
    }
    wg_proxy_fence();
    __syncthreads();
    if (wk0 < T && qi >= diag) {
      const uint32_t q0 = st_saddr(sQ + buf * TILE), o0 = st_saddr(sdO + buf * TILE);
      const float *L = sL + buf * 64, *Dd = sD + buf * 64;
      float s[32], dp[32];
#pragma unroll
      for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.f;
      wg_fence();
      wg_qk<E, HD>(s, st_saddr(sK + wg * TILE), q0);
      wg_qk<E, HD>(dp, st_saddr(sV + wg * TILE), o0);
      wg_commit();
      wg_wait0();
      if (qi == diag) {
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const int c = wg_col(l, i), key = kr0 + 8 * ((i >> 1) & 1);
          const float p = qi * 64 + c < key ? 0.f : wg_exp2(fmaf(s[i], sl2, -L[c] * WG_LOG2E));
          s[i] = p;                    /* P^T */
          dp[i] = p * (dp[i] - Dd[c]); /* dS^T */
        }
      } else {
#pragma unroll
        for (int i = 0; i < 32; i++) {
          const int c = wg_col(l, i);
          const float p = wg_exp2(fmaf(s[i], sl2, -L[c] * WG_LOG2E));
          s[i] = p;
          dp[i] = p * (dp[i] - Dd[c]);
        }
      }
      uint32_t ap[4][4], as[4][4];
      wg_frags<E>(s, ap);
      wg_frags<E>(dp, as);
      wg_fence();
      wg_rs4<E, HD>(dv, ap, o0);
      wg_rs4<E, HD>(dk, as, q0);
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
 * (or dV and dK). Streamed tiles are NS-buffered: step m's in buffer
 * m % NS, loaded NS - 1 steps ahead, one cp.async group a step (empty past
 * the last step, so that every wait counts the same groups). The arithmetic
 * of every element is that of wg_dq_kernel / wg_dkv_kernel, in the same
 * order, whatever NS. */

/* dQ, pipelined: a block per 64 query rows, key tiles 0..diagonal */
template <typename E, int HD, int NS>
__global__ void __launch_bounds__(128)
wg_dq_pipe_kernel(E *dqkv, const E *qkv, const E *dout, const float *lse, const float *Dl, int T,
                  int NH, int NKV, int hg) {
  static_assert(HD == 64, "the pipelined backward is for head size 64 (wg_load64)");
  constexpr int TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (st_saddr(smem_raw) & 1023)) & 1023);
  char *sdO = sm, *sK = sm + TILE, *sV = sK + NS * TILE;
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const wg_slot pos = wg_block_slot(hg);
  const int qt = pos.n - 1 - pos.i, bh = pos.bh, b = bh / NH, h = bh % NH;
  const int kc = C + (h / G) * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld, *ob = dout + (size_t)b * T * C;
  const int row0 = qt * 64, steps = qt + 1; /* step j: key tile j */
  const wg_rows rk = wg_rows_at(tid, ld);
  auto load_step = [&](int j) {
    if (j < steps) {
      const size_t k1 = (size_t)j * 64;
      wg_load64(st_saddr(sK + (j % NS) * TILE), base + k1 * ld + kc, ld, T - (int)k1, rk);
      wg_load64(st_saddr(sV + (j % NS) * TILE), base + k1 * ld + vc, ld, T - (int)k1, rk);
    }
    st_cp_commit();
  };
  wg_load<HD, 128>(sdO, ob + (size_t)row0 * C + h * HD, C, T - row0, tid);
#pragma unroll
  for (int j = 0; j < NS - 1; j++) load_step(j);
  /* this block's Q rows: the A operand of every S (dO's too would cost the
   * registers of a third block an SM) */
  uint32_t qa[HD / 16][4];
  wg_load_frags<HD>(qa, base + (size_t)row0 * ld + h * HD, ld, T - row0, w, l);
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
    wg_qk_rs<E, HD>(s, qa, st_saddr(sK + (j % NS) * TILE));
    wg_qk<E, HD>(dp, st_saddr(sdO), st_saddr(sV + (j % NS) * TILE));
    wg_commit();
  };
  auto ds_step = [&](int j, uint32_t (*a)[4]) {
    if (j == qt) {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1;
        const float p =
            j * 64 + wg_col(l, i) > r0 + 8 * hi ? 0.f : wg_exp2(fmaf(s[i], sl2, -L2[hi]));
        dp[i] = p * (dp[i] - Dr[hi]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1;
        dp[i] = wg_exp2(fmaf(s[i], sl2, -L2[hi])) * (dp[i] - Dr[hi]);
      }
    }
    wg_frags<E>(dp, a);
  };
  uint32_t a[4][4];
  st_cp_wait<NS - 2>(); /* group 0: dO and step 0's tiles */
  wg_proxy_fence();
  __syncthreads();
  issue_sdp(0);
  wg_wait0();
  ds_step(0, a);
  auto issue_dq = [&](int j) {
    const uint32_t k0 = st_saddr(sK + (j % NS) * TILE);
    wg_fence();
    wg_rs4<E, HD>(dq, a, k0);
    wg_commit();
  };
  for (int j = 0; j + 1 < steps; j++) {
    st_cp_wait<NS - 3>(); /* groups up to j + 1 of the j + NS - 1 committed */
    wg_proxy_fence();
    /* tile j+1 visible to all; every thread's step j-1 products are done,
     * so buffer (j + NS - 1) % NS, step j-1's, is free */
    __syncthreads();
    load_step(j + NS - 1);
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
template <typename E, int HD, int NS>
__global__ void __launch_bounds__(128)
wg_dkv_pipe_kernel(E *dqkv, const E *qkv, const E *dout, const float *lse, const float *Dl,
                   int T, int NH, int NKV, int hg) {
  static_assert(HD == 64, "the pipelined backward is for head size 64 (wg_load64)");
  constexpr int TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (st_saddr(smem_raw) & 1023)) & 1023);
  char *sQ = sm, *sdO = sQ + NS * TILE;
  float *sL = (float *)(sdO + NS * TILE), *sD = sL + NS * 64; /* [NS][64] each */
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const wg_slot pos = wg_block_slot(hg);
  const int kt = pos.i, bk = pos.bh, b = bk / NKV, kvh = bk % NKV;
  const int kc = C + kvh * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld, *ob = dout + (size_t)b * T * C;
  const float *lb = lse + (size_t)b * NH * T, *db = Dl + (size_t)b * NH * T;
  const int key0 = kt * 64, nq = (T + 63) / 64, per = nq - kt, steps = G * per;
  /* step m: query head kvh G + m / per, query tile kt + m % per; the
   * loads (NS - 1 steps ahead) and the exponentials each walk the steps in
   * order (wg_walk) */
  wg_walk lw{kvh * G, kt}; /* the step the next load_step fills */
  const wg_rows rq = wg_rows_at(tid, ld), ro = wg_rows_at(tid, C);
  auto load_step = [&](int m) {
    if (m < steps) {
      const int hm = lw.h, q = lw.t * 64, bf = m % NS;
      wg_load64(st_saddr(sQ + bf * TILE), base + (size_t)q * ld + hm * HD, ld, T - q, rq);
      wg_load64(st_saddr(sdO + bf * TILE), ob + (size_t)q * C + hm * HD, C, T - q, ro);
      wg_load_stats(sL + bf * 64, sD + bf * 64, lb + (size_t)hm * T, db + (size_t)hm * T, q, T,
                    tid);
      wg_walk_next(lw, kt, nq);
    }
    st_cp_commit();
  };
#pragma unroll
  for (int m = 0; m < NS - 1; m++) load_step(m);
  /* this block's keys and values: the A operands of every S^T and dP^T */
  uint32_t ka[HD / 16][4], va[HD / 16][4];
  wg_load_frags<HD>(ka, base + (size_t)key0 * ld + kc, ld, T - key0, w, l);
  wg_load_frags<HD>(va, base + (size_t)key0 * ld + vc, ld, T - key0, w, l);
  const float scale = 1.f / sqrtf((float)HD), sl2 = scale * WG_LOG2E;
  float dk[HD / 2], dv[HD / 2], s[32], dp[32];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.f;
  const int kr0 = key0 + 16 * w + (l >> 2); /* this thread's keys: kr0, kr0 + 8 */
  auto issue_sdp = [&](int m) {
    wg_fence();
    wg_qk_rs<E, HD>(s, ka, st_saddr(sQ + (m % NS) * TILE));
    wg_qk_rs<E, HD>(dp, va, st_saddr(sdO + (m % NS) * TILE));
    wg_commit();
  };
  wg_walk dw{kvh * G, kt}; /* the step of the next p_ds_step */
  auto p_ds_step = [&](int m, uint32_t (*pa)[4], uint32_t (*sa)[4]) {
    const int qi = dw.t;
    wg_walk_next(dw, kt, nq);
    const float *L = sL + (m % NS) * 64, *Dd = sD + (m % NS) * 64;
    /* a thread's 16 columns are 8 even-odd pairs (wg_col): one 64-bit
     * shared load brings a pair's lse (or D), half the loads of one a column */
    float2 Lp[8], Dp[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const int c = wg_col(l, 4 * k);
      Lp[k] = *reinterpret_cast<const float2 *>(L + c);
      Dp[k] = *reinterpret_cast<const float2 *>(Dd + c);
    }
    if (qi == kt) {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int c = wg_col(l, i), key = kr0 + 8 * ((i >> 1) & 1);
        const float Lc = i & 1 ? Lp[i >> 2].y : Lp[i >> 2].x, Dc = i & 1 ? Dp[i >> 2].y : Dp[i >> 2].x;
        const float p = qi * 64 + c < key ? 0.f : wg_exp2(fmaf(s[i], sl2, -Lc * WG_LOG2E));
        s[i] = p;
        dp[i] = p * (dp[i] - Dc);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const float Lc = i & 1 ? Lp[i >> 2].y : Lp[i >> 2].x, Dc = i & 1 ? Dp[i >> 2].y : Dp[i >> 2].x;
        const float p = wg_exp2(fmaf(s[i], sl2, -Lc * WG_LOG2E));
        s[i] = p;
        dp[i] = p * (dp[i] - Dc);
      }
    }
    wg_frags<E>(s, pa);
    wg_frags<E>(dp, sa);
  };
  uint32_t ap[4][4], as[4][4];
  st_cp_wait<NS - 2>(); /* group 0: step 0's tiles */
  wg_proxy_fence();
  __syncthreads();
  issue_sdp(0);
  wg_wait0();
  p_ds_step(0, ap, as);
  auto issue_dkv = [&](int n) {
    const uint32_t q0 = st_saddr(sQ + (n % NS) * TILE), o0 = st_saddr(sdO + (n % NS) * TILE);
    wg_fence();
    wg_rs4<E, HD>(dv, ap, o0);
    wg_rs4<E, HD>(dk, as, q0);
    wg_commit();
  };
  /* the last step peeled off: ptxas serializes the wgmmas when the issue
   * of the next step's products and the wait for them sit in branches */
  for (int n = 0; n + 1 < steps; n++) {
    st_cp_wait<NS - 3>();
    wg_proxy_fence();
    __syncthreads(); /* as in wg_dq_pipe_kernel */
    load_step(n + NS - 1);
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

#endif
