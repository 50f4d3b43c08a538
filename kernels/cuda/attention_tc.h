/* attention_tc.h - causal multi-head flash attention (FlashAttention-2, Dao
 * 2023) on tensor cores for bf16 and fp16 storage: warp-level mma.sync with
 * fp32 accumulation and fp32 softmax statistics, deterministic backward (no
 * floating-point atomics). See attention_tc.cu for the tiling.
 *
 * All calls run on the legacy default stream of the current device. Pointers
 * must be 16-byte aligned (cudaMalloc'd buffers are); the functions end the
 * process through st_cuda_fail on an unsupported shape or dtype, so callers
 * ask cuda_attention_tc_supported first.
 */
#ifndef ST_ATTENTION_TC_H
#define ST_ATTENTION_TC_H

#include "kernels/dtype.h"

/* 1 when the tensor-core kernels handle this shape (head size C/NH) and dtype (ST_BF16 or ST_FP16):
 * head sizes 32, 64 and 128. */
int cuda_attention_tc_supported(int C, int NH, st_dtype dt);

/* Which kernels the two calls below run on a Hopper GPU (compute capability
 * 9.0) for head sizes 64 and 128: on (the default) the warpgroup-MMA kernels
 * of attention_wgmma.cu, off the mma.sync kernels of attention_tc.cu, which
 * run everywhere else. Environment ST_ATTENTION_WGMMA=0 starts it off (to
 * compare the two). Returns the previous setting. Same results within
 * rounding, both deterministic. */
int cuda_attention_tc_use_wgmma(int on);

/* 1 when the calls for B sequences of this width, heads and dtype run the
 * wgmma kernels now. */
int cuda_attention_tc_runs_wgmma(int B, int C, int NH, st_dtype dt);

/* qkv [B,T,(NH+2*NKV)*hs] in dtype dt (hs = C/NH): row (b,t) holds NH query heads, then NKV key
 * heads, then NKV value heads, hs columns each; query head h reads kv head h/(NH/NKV) (grouped-query
 * attention; NKV = NH is [B,T,3C]). NKV must divide NH. out [B,T,C] in dt (written, not
 * accumulated). lse [B,NH,T] fp32: log-sum-exp of the scaled scores (scale 1/sqrt(hs)) of each row,
 * natural log. */
void cuda_attention_tc_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                               int NKV, st_dtype dt);

/* dqkv, laid out as qkv, in dt: OVERWRITTEN with the gradients of q, k and v (each kv head's the
 * sum over the query heads of its group). dout, out [B,T,C] in dt (out is forward's output, used for
 * D = rowsum(dO*O)). lse as forward saved it. scratch: B*NH*T floats the function may overwrite
 * (for D). */
void cuda_attention_tc_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                const void *out, const float *lse, int B, int T, int C, int NH,
                                int NKV, st_dtype dt);

#endif
