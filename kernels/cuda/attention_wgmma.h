/* attention_wgmma.h - causal flash attention on Hopper's warpgroup MMA
 * (wgmma.mma_async, sm_90a), bf16 or fp16, head sizes 64 and 128, grouped-
 * query attention, deterministic backward. The same layouts and results as
 * kernels/cuda/attention_tc.h, whose entry points call these on a Hopper GPU
 * (cuda_attention_tc_use_wgmma); see attention_wgmma.cu and the kernels'
 * headers it names for the tiling.
 *
 * Built for sm_90a only (its own object library in CMakeLists.txt): call
 * nothing here unless cuda_attention_wgmma_takes says yes for the current
 * device. Launches on the legacy default stream (the backward's dQ kernel on
 * a second stream of its own, joined back before it returns: see
 * cuda_attention_wgmma_set_streams); pointers 16-byte aligned.
 */
#ifndef ST_ATTENTION_WGMMA_H
#define ST_ATTENTION_WGMMA_H

#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the current device is compute capability 9.0 (H100/H200; the
 * device is asked once per process), dt is ST_BF16 or ST_FP16, head size hs
 * is 64 or 128 and B * NH fits a grid dimension (65535). */
int cuda_attention_wgmma_takes(int B, int hs, int NH, st_dtype dt);

/* qkv [B,T,(NH+2*NKV)*hs] in dt; out [B,T,NH*hs] in dt (written); lse
 * [B,NH,T] fp32, natural log of each row's softmax denominator of the
 * scores scaled by 1/sqrt(hs). NKV divides NH. */
void cuda_attention_wgmma_forward(void *out, float *lse, const void *qkv, int B, int T, int hs,
                                  int NH, int NKV, st_dtype dt);

/* dqkv laid out as qkv, OVERWRITTEN with dQ, dK, dV (a kv head's the sum
 * over its query heads, in order). dout [B,T,NH*hs] in dt; lse as forward
 * wrote it; D [B,NH,T] fp32 = rowsum(dout * out), computed by the caller. */
void cuda_attention_wgmma_backward(void *dqkv, const float *D, const void *dout, const void *qkv,
                                   const float *lse, int B, int T, int hs, int NH, int NKV,
                                   st_dtype dt);

/* Warpgroups a block in the backward, each 64 query rows (dQ) or keys
 * (dK/dV) sharing the tiles the block streams: 2 forces two (the plain
 * kernels; measured slower), anything else one (the default). For tests
 * and benchmarks; the results do not depend on it. */
void cuda_attention_wgmma_set_groups(int groups);

/* The backward at head size 64 with one warpgroup a block: 1 its
 * software-pipelined kernels (the next step's S and dP products overlap
 * this step's gradient products; the default), 0 the plain ones, negative
 * the build's default. The same arithmetic in the same order either way;
 * for tests and benchmarks. (The forward has one kernel, pipelined.) */
void cuda_attention_wgmma_set_pipeline(int on);

/* Tile buffers of the pipelined backward: 3 (the default; each tile loaded
 * two steps ahead) or 4 (three steps ahead, 16 KiB more shared memory a
 * block, the same blocks an SM); anything else the default. The same
 * arithmetic in the same order either way; for tests and benchmarks. */
void cuda_attention_wgmma_set_stages(int stages);

/* The backward's two kernels at once: 1 (the default) runs dQ's on a
 * second stream beside dK/dV's, with events ordering it after the work
 * before the call and the legacy default stream after it; 0 runs them one
 * after the other on the default stream. The same results either way (the
 * kernels write disjoint parts of dqkv); for tests and benchmarks. */
void cuda_attention_wgmma_set_streams(int two);

/* The order blocks go out in, for every kernel here: heads in groups of
 * `group` (>= 1), each group's longest tile of every head first (1: head
 * after head, whose resident blocks share few heads' tiles in L2; -1 every
 * head in one group, its longest tile in the first wave); any other
 * negative value goes back to ST_ATTENTION_GRID ("heads", "tiles", a
 * number of heads a group, or "auto"; unset is auto:
 * st_attention_heads_group). The same bits in every order; for tests and
 * benchmarks. */
void cuda_attention_wgmma_set_grid(int group);

#ifdef __cplusplus
}
#endif

#endif
