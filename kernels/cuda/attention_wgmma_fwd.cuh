/* attention_wgmma_fwd.cuh - the causal attention forward on Hopper's
 * warpgroup MMA (included by attention_wgmma.cu, which launches it).
 *
 * S = Q K^T (HD/16 k-steps, Q's fragments in registers for the whole
 * block), online softmax in the log2 domain (the scale folded into the
 * exponent's argument, one FFMA an element), O += P V with P rounded to the
 * storage type; lse = (m + log2 l) ln 2. Shared memory: three K/V buffers,
 * 6 HD/64 8 KiB (+1 KiB for the alignment). It replaced a plain
 * (unpipelined) forward with one or two warpgroups a block, 7% slower over
 * the four shapes timed on an H100 (2026-12-05).
 */
#ifndef ST_ATTENTION_WGMMA_FWD_CUH
#define ST_ATTENTION_WGMMA_FWD_CUH

#include "kernels/cuda/wgmma.cuh"

/* The forward, software-pipelined: one warpgroup a block per (b, h) and 64
 * query rows, longest rows first (wg_block_slot). Each step issues the next key tile's
 * S = Q K^T, then this tile's O += P V, and waits only for the former, so
 * the next tile's softmax (its maximum, exponentials and the P fragments)
 * runs while the tensor cores do P V; O's rescaling waits for P V. K/V
 * tiles of 64 keys triple-buffered, loaded two tiles ahead. */
template <typename E, int HD>
__global__ void __launch_bounds__(128)
wg_fwd_kernel(const E *qkv, E *out, float *lse, int T, int NH, int NKV, int hg) {
  constexpr int TILE = (HD / 64) * 8192;
  extern __shared__ char smem_raw[];
  char *sm = smem_raw + ((1024 - (st_saddr(smem_raw) & 1023)) & 1023);
  char *sK = sm, *sV = sK + 3 * TILE;
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const wg_slot pos = wg_block_slot(hg);
  const int qt = pos.n - 1 - pos.i, bh = pos.bh, b = bh / NH, h = bh % NH;
  const int kc = C + (h / G) * HD, vc = kc + NKV * HD;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31;
  const E *base = qkv + (size_t)b * T * ld;
  const int row0 = qt * 64, r0 = row0 + 16 * w + (l >> 2);
  const int steps = qt + 1; /* key tiles 0..qt; tile qt is the diagonal */
  auto load_step = [&](int j) {
    const size_t k1 = (size_t)j * 64;
    wg_load<HD, 128>(sK + (j % 3) * TILE, base + k1 * ld + kc, ld, T - (int)k1, tid);
    wg_load<HD, 128>(sV + (j % 3) * TILE, base + k1 * ld + vc, ld, T - (int)k1, tid);
    st_cp_commit();
  };
  load_step(0);
  if (steps > 1) load_step(1);
  uint32_t qa[HD / 16][4]; /* Q's rows of this block, the A operand of every S */
  wg_load_frags<HD>(qa, base + (size_t)row0 * ld + h * HD, ld, T - row0, w, l);
  const float sl2 = WG_LOG2E / sqrtf((float)HD);
  float o[HD / 2], s[32], m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f}, corr[2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
  auto issue_s = [&](int j) {
    wg_fence();
    wg_qk_rs<E, HD>(s, qa, st_saddr(sK + (j % 3) * TILE));
    wg_commit();
  };
  /* tile j's softmax on s: the running maximum and sum, corr, P into a.
   * The maximum is taken over the unscaled scores: rounding x sl2 (> 0)
   * keeps order, so max(s) sl2 is the maximum of the scaled ones. */
  auto softmax_step = [&](int j, uint32_t (*a)[4]) {
    float mx[2] = {-INFINITY, -INFINITY};
    if (j == qt) {
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int hi = (i >> 1) & 1;
        s[i] = j * 64 + wg_col(l, i) > r0 + 8 * hi ? -INFINITY : s[i];
        mx[hi] = fmaxf(mx[hi], s[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; i++) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    }
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffff, mx[hi], 1));
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffff, mx[hi], 2));
    }
    float ps[2] = {0.f, 0.f}, nmn[2];
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      float nm = fmaxf(m[hi], mx[hi] * sl2);
      nm = nm == -INFINITY ? 0.f : nm; /* rows past T: finite */
      corr[hi] = wg_exp2(m[hi] - nm);
      m[hi] = nm;
      nmn[hi] = -nm;
    }
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const int hi = (i >> 1) & 1;
      s[i] = wg_exp2(fmaf(s[i], sl2, nmn[hi]));
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
    const uint32_t v0 = st_saddr(sV + (j % 3) * TILE);
    wg_fence();
    wg_rs4<E, HD>(o, a, v0);
    wg_commit();
  };
  uint32_t a[4][4];
  if (steps > 1) st_cp_wait<1>();
  else st_cp_wait<0>();
  wg_proxy_fence();
  __syncthreads();
  issue_s(0);
  wg_wait0();
  softmax_step(0, a);
  rescale();
  /* the last tile peeled off: ptxas serializes the wgmmas when the issue of
   * the next tile's product and the wait for it sit in branches */
  for (int j = 0; j + 1 < steps; j++) {
    st_cp_wait<0>();
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

#endif
