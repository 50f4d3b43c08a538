/* attention_wgmma.cu - causal flash attention on Hopper's warpgroup MMA:
 * which kernels run, with what grid and shared memory. Interface in
 * attention_wgmma.h (the same layouts as attention_tc.h); the kernels in
 * attention_wgmma_fwd.cuh and attention_wgmma_bwd.cuh, their device
 * helpers in wgmma.cuh. Built for sm_90a as its own object library.
 *
 * Tiles stream in with cp.async, one commit group a tile; rows past T are
 * zero-filled, so padded query rows and keys give finite scores and zero
 * contributions, and only the diagonal tile needs the causal mask.
 *
 * Software pipelining (the forward; the backward at head size 64, one
 * warpgroup a block): a step issues the next tile's score products, then
 * its own output or gradient products, and waits only for the former
 * (wgmma.wait_group 1), so that the next tile's softmax runs on the CUDA
 * cores while the tensor cores finish this one (FlashAttention-3's
 * intra-warpgroup overlap). Tiles are triple-buffered (the backward's 3 or
 * 4 buffers: cuda_attention_wgmma_set_stages). ptxas serializes
 * every wgmma of a kernel when it cannot prove that no other instruction
 * touches an in-flight wgmma's registers; the loops are written so that it
 * can (the last step peeled out of the loop, wg_keep on the fragments of
 * the in-flight products). WG_PIPELINE_BWD picks the backward's default;
 * the tests run both forms.
 *
 * Determinism: each output element has one owner thread, tiles and heads are
 * walked in a fixed order, no atomics: bit-identical from run to run.
 */
#include "kernels/cuda/attention_wgmma.h"
#include "kernels/attention_choice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/attention_wgmma_bwd.cuh"
#include "kernels/cuda/attention_wgmma_fwd.cuh"

/* ---- host side */

/* Warpgroups a block in the backward: 1 unless a test forces 2. Two (128
 * query rows or keys sharing each streamed tile) measured slower at every
 * shape (an H100, 2026-12-05, test_cuda_attention_tc's timings: backward
 * 0.775 against 0.664 ms at B=32 T=1024, 1.158 against 1.053 at B=1
 * T=8192): the second warpgroup's registers halve the blocks an SM holds,
 * which costs more than the shared tiles save. */
static int g_groups = 1;

void cuda_attention_wgmma_set_groups(int groups) { g_groups = groups == 2 ? 2 : 1; }

/* The device's properties the kernels depend on, read once: whether it is
 * sm_90 (the wgmma and setmaxnreg instructions) and its SM count (the
 * block order, below). sms is -1 when it could not be read. */
static struct {
  int read, hopper, sms;
} g_dev;

static void device_props(void) {
  if (g_dev.read) return;
  int dev = 0, major = 0, minor = 0, sms = 0;
  const int have = cudaGetDevice(&dev) == cudaSuccess;
  g_dev.hopper = have &&
                 cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                 cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                 major == 9 && minor == 0;
  g_dev.sms = have && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess
                  ? sms : -1;
  g_dev.read = 1;
}

int cuda_attention_wgmma_takes(int B, int hs, int NH, st_dtype dt) {
  device_props();
  return g_dev.hopper && (dt == ST_BF16 || dt == ST_FP16) && (hs == 64 || hs == 128) &&
         (int64_t)B * NH <= 65535;
}

/* The backward's software-pipelined kernels (one warpgroup a block, head
 * size 64) by default (1), or the plain ones (0): pipelined, 2.5% faster
 * over the three head-size-64 shapes timed, 6% at T = 8192 (2026-12-05). */
#define WG_PIPELINE_BWD 1
static int g_pipe_bwd = WG_PIPELINE_BWD;

void cuda_attention_wgmma_set_pipeline(int on) { g_pipe_bwd = on < 0 ? WG_PIPELINE_BWD : on != 0; }

/* Tile buffers of the pipelined backward (3: loaded two steps ahead; 4:
 * three). The same arithmetic in the same order either way. */
#define WG_STAGES_BWD 3
static int g_stages_bwd = WG_STAGES_BWD;

void cuda_attention_wgmma_set_stages(int stages) {
  g_stages_bwd = stages == 3 || stages == 4 ? stages : WG_STAGES_BWD;
}

/* dQ's kernel on a second stream beside dK/dV's (1, the default), or after
 * it on the caller's (0). The two read the same inputs and write disjoint
 * parts of dqkv, so running them at once changes no result; it lets each
 * kernel's short last blocks share the SMs with the other's instead of
 * leaving them idle at the boundary between the two launches. */
static int g_two_streams = 1;

void cuda_attention_wgmma_set_streams(int two) { g_two_streams = two != 0; }

/* Block order of every kernel here (wg_block_slot): heads in groups, the
 * group's longest tiles of every head first (st_attention_heads_group,
 * kernels/attention_choice.c, unit-tested on the CPU, picks the group).
 * Timed on an H100 (2026-12-06, test_cuda_attention_tc, backward ms, every
 * head in one group against head after head, the only orders then): B x NH
 * 12 at T 8192, 0.821 against 0.884; 32 (2 x 16, head size 128) at 4096,
 * 1.036 against 1.063; 48 at 4096, 0.897 against 0.909; 48 at 8192, 3.376
 * against 3.342 (and 1.7% fewer tokens/s in training); 384 at 1024, 0.868
 * against 0.632: with every head in the first wave the resident blocks
 * span every head's K and V, and L2 stops holding them. Hence one group
 * while B x NH <= 32, and above it groups just large enough to hide their
 * own longest tile, at most 7 heads. Timed on an H100 (2026-12-07, the
 * same call, two runs each, backward ms, head after head / groups of 4, 7,
 * 12, 24 / every head): B x NH 384 at T 1024, 0.599 / 0.595, 0.593, 0.593,
 * 0.600 / 0.858 (groups of 47, the model's uncapped choice, 0.631); 192 at
 * 2048, 0.935 / 0.933, 0.931, 0.942, 0.935 / 1.110; 48 at 4096, 0.830 /
 * 0.828, 0.808, 0.814, 0.812 / 0.828; 48 at 8192, 3.007 / 2.994, 2.964,
 * 2.976, 2.999 / 3.114. In training (GPT-2 124M, bf16, bench/ab_tokens.sh)
 * groups of 7 against head after head: +0.8% tokens/s at 4 x 8192.
 * ST_ATTENTION_GRID = "heads", "tiles" (groups of one head) or a number of
 * heads a group forces an order (anything else is reported once and leaves
 * the default). Every order gives the same bits: each block's work does
 * not depend on when it runs. */
#define GRID_UNREAD (-3) /* ST_ATTENTION_GRID not read yet */
static int g_grid = GRID_UNREAD; /* else st_attention_grid_parse's result */

static int grid_setting(void) {
  if (g_grid == GRID_UNREAD) {
    const char *e = getenv("ST_ATTENTION_GRID");
    g_grid = st_attention_grid_parse(e);
    if (g_grid == ST_ATTENTION_GRID_BAD) {
      fprintf(stderr, "shardtrain: warning: ST_ATTENTION_GRID=%s is not heads, tiles, auto or "
              "a number of heads a group (1-65535); auto it is\n", e);
      g_grid = ST_ATTENTION_GRID_AUTO;
    }
  }
  return g_grid;
}

void cuda_attention_wgmma_set_grid(int group) {
  /* ST_ATTENTION_GRID_HEADS is -1: it and every group size stand as given */
  g_grid = group < ST_ATTENTION_GRID_HEADS ? GRID_UNREAD : group;
}

/* The heads a group for bnh heads of `tiles` tiles on this GPU. */
static int wg_heads_group(int64_t bnh, unsigned tiles) {
  device_props(); /* sms -1: st_attention_heads_group's default */
  return st_attention_heads_group(grid_setting(), bnh, tiles, g_dev.sms);
}

/* The side stream and its two events, made once; 0 when any of them could
 * not be (the backward then runs on the caller's stream alone). */
static int side_stream(cudaStream_t *s, cudaEvent_t *fork, cudaEvent_t *join) {
  static cudaStream_t st;
  static cudaEvent_t ef, ej;
  static int state; /* 0 not tried, 1 ready, -1 failed */
  if (!state) {
    state = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess &&
                    cudaEventCreateWithFlags(&ef, cudaEventDisableTiming) == cudaSuccess &&
                    cudaEventCreateWithFlags(&ej, cudaEventDisableTiming) == cudaSuccess
                ? 1
                : -1;
    if (state < 0) (void)cudaGetLastError(); /* not sticky: clear it */
  }
  *s = st, *fork = ef, *join = ej;
  return state > 0;
}

template <typename E, int HD, int NWG>
static void wg_backward(void *dqkv, const float *D, const void *dout, const void *qkv,
                        const float *lse, int B, int T, int NH, int NKV) {
  constexpr int TILE = (HD / 64) * 8192;
  const int sq = 1024 + (2 * NWG + 4) * TILE, skv = sq + 1024;
  /* pipelined, NS tile buffers: dO and NS K/V, or NS Q/dO and their stats */
  const int ns = g_stages_bwd;
  const int sqp = 1024 + (2 * ns + 1) * TILE, skvp = 1024 + 2 * ns * TILE + ns * 512;
  static bool attr;
  if (!attr) {
    wg_smem_attr(wg_dq_kernel<E, HD, NWG>, sq);
    wg_smem_attr(wg_dkv_kernel<E, HD, NWG>, skv);
    if constexpr (NWG == 1 && HD == 64) {
      wg_smem_attr(wg_dq_pipe_kernel<E, HD, 3>, 1024 + 7 * TILE);
      wg_smem_attr(wg_dkv_pipe_kernel<E, HD, 3>, 1024 + 6 * TILE + 3 * 512);
      wg_smem_attr(wg_dq_pipe_kernel<E, HD, 4>, 1024 + 9 * TILE);
      wg_smem_attr(wg_dkv_pipe_kernel<E, HD, 4>, 1024 + 8 * TILE + 4 * 512);
    }
    attr = true;
  }
  const unsigned tiles = (unsigned)((T + 64 * NWG - 1) / (64 * NWG));
  const int gkv = wg_heads_group((int64_t)B * NKV, tiles), gq = wg_heads_group((int64_t)B * NH, tiles);
  const dim3 kvgrid(tiles, (unsigned)(B * NKV)), qgrid(tiles, (unsigned)(B * NH));
  const int pipe = NWG == 1 && HD == 64 && g_pipe_bwd;
  /* dQ waits for what came before on the caller's stream (D, the forward's
   * lse and output), and the caller's stream for dQ */
  cudaStream_t qs = 0, side = 0;
  cudaEvent_t fork = 0, join = 0;
  const int two = g_two_streams && side_stream(&side, &fork, &join);
  if (two) {
    ST_CUDA_CHECK(cudaEventRecord(fork, 0));
    ST_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
    qs = side;
  }
  /* dK/dV first: its blocks walk the most query tiles (the longest first),
   * and dQ's, longest first too, fill the tail behind (or beside) them */
  if constexpr (NWG == 1 && HD == 64) {
    if (pipe && ns == 4)
      wg_dkv_pipe_kernel<E, HD, 4><<<kvgrid, 128, skvp>>>((E *)dqkv, (const E *)qkv,
                                                          (const E *)dout, lse, D, T, NH, NKV, gkv);
    else if (pipe)
      wg_dkv_pipe_kernel<E, HD, 3><<<kvgrid, 128, skvp>>>((E *)dqkv, (const E *)qkv,
                                                          (const E *)dout, lse, D, T, NH, NKV, gkv);
  }
  if (!pipe)
    wg_dkv_kernel<E, HD, NWG><<<kvgrid, 128 * NWG, skv>>>((E *)dqkv, (const E *)qkv,
                                                          (const E *)dout, lse, D, T, NH, NKV, gkv);
  ST_CUDA_LAUNCHED();
  if constexpr (NWG == 1 && HD == 64) {
    if (pipe && ns == 4)
      wg_dq_pipe_kernel<E, HD, 4><<<qgrid, 128, sqp, qs>>>((E *)dqkv, (const E *)qkv,
                                                           (const E *)dout, lse, D, T, NH, NKV, gq);
    else if (pipe)
      wg_dq_pipe_kernel<E, HD, 3><<<qgrid, 128, sqp, qs>>>((E *)dqkv, (const E *)qkv,
                                                           (const E *)dout, lse, D, T, NH, NKV, gq);
  }
  if (!pipe)
    wg_dq_kernel<E, HD, NWG><<<qgrid, 128 * NWG, sq, qs>>>((E *)dqkv, (const E *)qkv,
                                                           (const E *)dout, lse, D, T, NH, NKV, gq);
  ST_CUDA_LAUNCHED();
  if (two) {
    ST_CUDA_CHECK(cudaEventRecord(join, side));
    ST_CUDA_CHECK(cudaStreamWaitEvent(0, join, 0));
  }
}

template <typename E, int HD>
static void wg_forward(void *out, float *lse, const void *qkv, int B, int T, int NH, int NKV) {
  const int sm = 1024 + 6 * (HD / 64) * 8192;
  static bool attr;
  if (!attr) {
    wg_smem_attr(wg_fwd_kernel<E, HD>, sm);
    attr = true;
  }
  const unsigned tiles = (unsigned)((T + 63) / 64);
  const int g = wg_heads_group((int64_t)B * NH, tiles);
  wg_fwd_kernel<E, HD><<<dim3(tiles, (unsigned)(B * NH)), 128, sm>>>((const E *)qkv, (E *)out,
                                                                     lse, T, NH, NKV, g);
  ST_CUDA_LAUNCHED();
}

void cuda_attention_wgmma_forward(void *out, float *lse, const void *qkv, int B, int T, int hs,
                                  int NH, int NKV, st_dtype dt) {
  if (dt == ST_BF16) (hs == 64 ? wg_forward<__nv_bfloat16, 64> : wg_forward<__nv_bfloat16, 128>)(out, lse, qkv, B, T, NH, NKV);
  else (hs == 64 ? wg_forward<__half, 64> : wg_forward<__half, 128>)(out, lse, qkv, B, T, NH, NKV);
}

void cuda_attention_wgmma_backward(void *dqkv, const float *D, const void *dout, const void *qkv,
                                   const float *lse, int B, int T, int hs, int NH, int NKV,
                                   st_dtype dt) {
  const int two = g_groups == 2; /* 1 unless forced: see g_groups */
  if (dt == ST_BF16) {
    if (hs == 64) (two ? wg_backward<__nv_bfloat16, 64, 2> : wg_backward<__nv_bfloat16, 64, 1>)(dqkv, D, dout, qkv, lse, B, T, NH, NKV);
    else (two ? wg_backward<__nv_bfloat16, 128, 2> : wg_backward<__nv_bfloat16, 128, 1>)(dqkv, D, dout, qkv, lse, B, T, NH, NKV);
  } else {
    if (hs == 64) (two ? wg_backward<__half, 64, 2> : wg_backward<__half, 64, 1>)(dqkv, D, dout, qkv, lse, B, T, NH, NKV);
    else (two ? wg_backward<__half, 128, 2> : wg_backward<__half, 128, 1>)(dqkv, D, dout, qkv, lse, B, T, NH, NKV);
  }
}
