/* ops.h - the op table: every kernel the model needs, behind one struct.
 *
 * The trainer calls ops only through an st_ops table, so the same forward and
 * backward schedule runs on the CPU reference (kernels/cpu/, fp32, OpenMP) or
 * on CUDA (kernels/cuda/). Shapes are row-major; N = B*T rows.
 *
 * Dtypes: a table has one storage dtype (`dtype`, kernels/dtype.h). Every
 * `void *` tensor below (activations, their gradients, the working copy of
 * the weights) is in that dtype; every `float *` is fp32 whatever the table
 * (parameter gradients, LayerNorm statistics, attention state, losses,
 * master weights, Adam moments). Arithmetic is fp32 inside every op.
 * Backward ops ACCUMULATE (+=) into parameter gradients (fp32), so callers
 * zero those once per optimizer step. Input gradients are OVERWRITTEN,
 * except layernorm_backward's dinp, which accumulates: it is the residual
 * stream, whose gradient gathers both branches of every block. Overwriting
 * saves a memset and a read of every activation gradient.
 * Reductions run in a fixed order independent of the thread count, so a run
 * is bit-for-bit repeatable on the same machine.
 */
#ifndef ST_OPS_H
#define ST_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/arena.h"
#include "kernels/dtype.h"

struct st_nf4; /* kernels/nf4.h */

typedef struct {
  const char *name;   /* "cpu-fp32", "cuda-bf16", ... */
  st_dtype dtype;     /* storage dtype of the void * tensors */

  /* Memory the ops read and write: host memory for the CPU backend, device
   * memory for CUDA. alloc returns zeroed, 256-byte aligned memory or NULL;
   * category names what it is for (a memory-plan category, e.g. "weights",
   * "activations"), which an arena tallies and an out-of-memory report
   * names. Copies are synchronous from the caller's point of view. */
  void *(*alloc)(size_t bytes, const char *category);
  void (*free)(void *p);
  /* Carve from this arena (kernels/arena.h) from now on: while it is set
   * and not sealed, alloc and reserve take their memory from it (NULL when
   * it is full, the failure kept in the arena) and make no allocation of
   * their own; once sealed, alloc goes back to the raw allocator. free
   * ignores pointers inside it. NULL: no arena. The block itself comes
   * from alloc before this call, and is freed with free after
   * use_arena(NULL). */
  void (*use_arena)(st_arena *arena);
  void (*zero)(void *p, size_t bytes);
  void (*to_device)(void *dst, const void *host_src, size_t bytes);
  void (*to_host)(void *host_dst, const void *src, size_t bytes);
  /* Wait until every op issued so far has finished (timing; a no-op on CPU). */
  void (*synchronize)(void);
  /* Host memory for state that lives off the device (--offload optimizer,
   * rank/optim/offload.h): zeroed, 256-byte aligned, NULL when it is not
   * there. CUDA: page-locked (cudaHostAlloc), so the asynchronous copies
   * below run at full speed and truly overlap the host's work; CPU: plain
   * aligned malloc. Counted in `allocations`; never from an arena. Freed
   * with host_free (NULL is ignored). */
  void *(*host_alloc)(size_t bytes, const char *category);
  void (*host_free)(void *p);
  /* Asynchronous copies between backend memory and host memory from
   * host_alloc, in issue order on one copy stream that waits for every op
   * issued on the compute stream before it (so a copy sees what those ops
   * wrote). tag in [0, ST_COPY_TAGS) names the copy; copy_wait(tag) returns
   * once the latest copy issued with that tag has finished (its host
   * buffer may be read or reused). A copy that writes device memory is
   * seen by later ops only after copy_wait. The CPU copies at once. */
  void (*to_host_async)(void *host_dst, const void *src, size_t bytes, int tag);
  void (*to_device_async)(void *dst, const void *host_src, size_t bytes, int tag);
  void (*copy_wait)(int tag);
  /* Make the backend's own buffers now, at setup, at the sizes the memory
   * plan gives (rank/memory/memory_plan.h: cublaslt, scratch), so no op allocates
   * inside the step loop. CUDA: the cuBLASLt handle and workspace,
   * cuda_scratch grown to scratch_bytes once, and the cuDNN attention
   * workspace st_cuda_attention_select asked for (kernels/ops_cuda.h), all
   * from the arena when one is in use. The CPU has none: 0. Returns 0, or
   * -1 (with nothing fatal) when the memory is not there. */
  int (*reserve)(size_t workspace_bytes, size_t scratch_bytes);
  /* How many raw allocations the backend has made in this process: every
   * alloc not carved from an arena (the arena's own block is one), plus its
   * own buffers when not carved (CUDA: the cuBLASLt workspace, each growth
   * of cuda_scratch, the cuDNN attention workspace). When last is not NULL,
   * *last describes the latest ("alloc of 4096 bytes"). The trainer reads it after setup and after
   * every step, validation and checkpoint: nothing may allocate there. */
  int64_t (*allocations)(const char **last);
  /* Diagnostics (ST_TIMELINE, kernels/cuda/timeline.h): a GPU timestamp
   * named label[tag] on the compute stream, and the end of step `step`,
   * when this rank prints its marks. NULL where the backend has none (CPU). */
  void (*timeline_mark)(const char *label, int tag);
  void (*timeline_step_end)(long long step, int rank);

  /* out[B,T,C] = wte[inp[b,t]] + wpe[t].  inp: token ids in [0, V). wpe
   * NULL (rotary positions): out = wte[inp]. */
  void (*encoder_forward)(void *out, const int *inp, const void *wte,
                          const void *wpe, int B, int T, int C);
  /* dwte[inp] += dout; dwpe[t] += sum_b dout[b,t] (skipped when dwpe is NULL).
   * Each dwte row sums its positions in ascending order (bit-identical
   * across backends). scratch: scratch_bytes of device memory the op may
   * overwrite (256-byte aligned; about 12 B*T bytes and a sort's temporary
   * storage make the CUDA backend linear in B*T instead of quadratic), or
   * NULL; the result does not depend on it. */
  void (*encoder_backward)(float *dwte, float *dwpe, const void *dout,
                           const int *inp, int B, int T, int C, void *scratch,
                           size_t scratch_bytes);

  /* LayerNorm over the last dim (eps 1e-5). mean/rstd [N] saved for backward. */
  void (*layernorm_forward)(void *out, float *mean, float *rstd,
                            const void *inp, const void *w, const void *b,
                            int N, int C);
  /* dw and db NULL together: a frozen norm (LoRA's base), the input gradient only. */
  void (*layernorm_backward)(void *dinp, float *dw, float *db,
                             const void *dout, const void *inp,
                             const void *w, const float *mean,
                             const float *rstd, int N, int C);

  /* RMSNorm (Zhang & Sennrich 2019; Llama): out = inp * rstd * w with
   * rstd = 1/sqrt(mean(inp^2) + eps), over the last dim; rstd [N] saved
   * for backward. No bias. */
  void (*rmsnorm_forward)(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                          float eps);
  /* dinp ACCUMULATES (the residual stream, as layernorm_backward's); dw += (dw NULL: a
   * frozen norm, the input gradient only). */
  void (*rmsnorm_backward)(void *dinp, float *dw, const void *dout, const void *inp,
                           const void *w, const float *rstd, int N, int C);

  /* Rotary position embedding (Su et al. 2021), Hugging Face Llama's
   * rotate-half form, IN PLACE on the q and k heads of qkv[B,T,(NH+2*NKV)*HD]
   * (q heads, then k heads, then v heads, per row; v is untouched): for
   * pair i < HD/2 of a head at position p = pos0 + t,
   *   x[i]      <- x[i] cos - x[i+HD/2] sin,
   *   x[i+HD/2] <- x[i+HD/2] cos + x[i] sin,
   * with cos = cs[p*HD + i], sin = cs[p*HD + HD/2 + i]: cs is an fp32 table
   * [maxT, HD] (rank/model/rope.h builds it, Llama 3 scaling included) in
   * the backend's memory. */
  void (*rope_forward)(void *qkv, const float *cs, int B, int T, int pos0, int NH, int NKV,
                       int HD);
  /* The transpose (inverse rotation) IN PLACE on the dq and dk heads of
   * dqkv, positions 0..T-1: turns the gradient w.r.t. rotated q, k into the
   * gradient w.r.t. the projection's output. */
  void (*rope_backward)(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int HD);

  /* out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC] (bias may be NULL). */
  void (*matmul_forward)(void *out, const void *inp, const void *w,
                         const void *bias, int N, int C, int OC);
  /* out[N,OC] = res[N,OC] + (inp[N,C] @ w[OC,C]^T + bias[OC]): a projection
   * whose output joins the residual stream (bias may be NULL; out must
   * alias neither inp nor res). The CPU computes exactly matmul_forward then residual_forward
   * (bit for bit); CUDA adds res in the GEMM's epilogue, so the sum is
   * rounded once to the storage type and no [N,OC] projection output is
   * ever written or kept. */
  void (*matmul_residual_forward)(void *out, const void *inp, const void *w, const void *bias,
                                  const void *res, int N, int C, int OC);
  /* dinp = dout @ w; dw += dout^T @ inp; dbias += colsum(dout) (if not NULL). dw NULL:
   * a frozen weight (LoRA's base), no weight gradient is computed (then dbias is NULL
   * too, as every backend may assume). */
  void (*matmul_backward)(void *dinp, float *dw, float *dbias,
                          const void *dout, const void *inp, const void *w,
                          int N, int C, int OC);

  /* dinp[N,C] = dout[N,OC] @ w[OC,C], OVERWRITTEN: matmul_backward's input
   * gradient alone, for a frozen weight (QLoRA's base: no dw, no dbias). */
  void (*matmul_backward_input)(void *dinp, const void *dout, const void *w, int N, int C,
                                int OC);

  /* NF4 weights (kernels/nf4.h) whose arrays live in this backend's memory.
   * nf4_dequantize: dst[rows*cols] (storage dtype) = the dequantised weight,
   * the fp32 of st_nf4_dequantize rounded once to the storage dtype (bit for
   * bit the host reference's). nf4_quantize: q (arrays carved by
   * st_nf4_carve, shape set) from src[rows*cols] in the storage dtype, with
   * q->offset set on return; workspace: st_nf4_quantize_scratch_bytes of
   * backend memory. Bit for bit st_nf4_quantize of the same values widened
   * to fp32. Returns 0, or -1 when src holds a NaN or an infinity. Both
   * synchronous from the caller's point of view only in that nf4_quantize
   * waits for its offset. */
  void (*nf4_dequantize)(void *dst, const struct st_nf4 *q);
  int (*nf4_quantize)(struct st_nf4 *q, const void *src, void *workspace);

  /* The MLP's first linear layer and its GELU in one: pre[N,OC] = inp @ w^T
   * + bias (the GELU input, kept for backward), out[N,OC] = gelu(pre).
   * Exactly matmul_forward then gelu_forward; backends fuse the GELU into
   * the GEMM's epilogue where they can. */
  void (*matmul_gelu_forward)(void *out, void *pre, const void *inp, const void *w,
                              const void *bias, int N, int C, int OC);
  /* matmul_backward of the layer that follows a GELU, with the GELU's
   * backward folded in: dinp = (dout @ w) * gelu'(pre), pre [N,C] the GELU
   * input; dw, dbias as in matmul_backward. */
  void (*matmul_backward_gelu)(void *dinp, float *dw, float *dbias, const void *dout,
                               const void *inp, const void *w, const void *pre, int N, int C,
                               int OC);

  /* Causal multi-head self-attention with grouped-query attention
   * (Ainslie et al. 2023): qkv[B,T,(NH+2*NKV)*HD] holds NH query heads, then
   * NKV key heads, then NKV value heads per row, HD = C/NH; query head h
   * reads kv head h / (NH/NKV). NKV == NH is GPT-2's [B,T,3C]; NKV divides
   * NH. out[B,T,C], scale 1/sqrt(HD). att is what forward saves for backward and datt
   * backward's scratch, each attention_state_floats(B, T, NH) floats: the CPU
   * reference keeps the softmax [B,NH,T,T]; a flash-attention backend keeps
   * only per-row statistics (O(B*NH*T)), so no T x T matrix exists. */
  int64_t (*attention_state_floats)(int B, int T, int NH);
  void (*attention_forward)(void *out, float *att, const void *qkv,
                            int B, int T, int C, int NH, int NKV);
  /* out: forward's output (flash backends take D = rowsum(dO * O) from it). */
  void (*attention_backward)(void *dqkv, float *datt, const void *dout,
                             const void *qkv, const void *out, const float *att,
                             int B, int T, int C, int NH, int NKV);

  /* Inference (rank/model/infer.h): causal attention of n_new new positions
   * over a KV cache. kcache and vcache [B, maxT, NKV*HD] (storage dtype)
   * hold the keys and values of positions 0 .. pos0-1 of each sequence; the
   * op first writes the new rows' keys and values (from qkv[B, n_new,
   * (NH+2*NKV)*HD], laid out as in attention_forward, RoPE already applied) at positions pos0 .. pos0+n_new-1, then
   * out[B, n_new, C] gets the attention of the query at position pos0+i over
   * keys 0 .. pos0+i. pos0 + n_new <= maxT. With pos0 = 0 and n_new = T the
   * rows equal attention_forward's; each later call costs n_new positions,
   * not a re-run of the prefix. Keeps no softmax state (no backward). */
  void (*attention_decode)(void *out, void *kcache, void *vcache, const void *qkv, int B,
                           int n_new, int pos0, int maxT, int C, int NH, int NKV);

  /* GELU, tanh approximation (Hendrycks & Gimpel 2016, as in GPT-2). */
  void (*gelu_forward)(void *out, const void *inp, int64_t n);
  void (*gelu_backward)(void *dinp, const void *inp, const void *dout, int64_t n);

  /* SwiGLU (Shazeer 2020): inp[N,2F] holds gate | up per row;
   * out[N,F] = silu(gate) * up, silu(x) = x / (1 + exp(-x)). */
  void (*swiglu_forward)(void *out, const void *inp, int N, int F);
  /* dinp[N,2F] (OVERWRITTEN) = d gate | d up from dout[N,F] and inp. */
  void (*swiglu_backward)(void *dinp, const void *dout, const void *inp, int N, int F);

  /* out = a + b, n elements. */
  void (*residual_forward)(void *out, const void *a, const void *b, int64_t n);
  /* dst += src, n fp32 elements (gradient shards). */
  void (*accumulate_f32)(float *dst, const float *src, int64_t n);
  /* dst[i] = src[i] rounded to bf16 (nearest even; NaN stays NaN), n
   * elements: reduced fp32 gradients into a bf16 gradient shard
   * (--grad-dtype bf16). dst holds the bf16 bits. */
  void (*f32_to_bf16)(uint16_t *dst, const float *src, int64_t n);

  /* LoRA (Hu et al. 2021; rank/model/lora.h): an adapter owns columns
   * [col0, col0 + n) of a projection's output y[N, OC].
   * lora_add_cols: y[i, col0 + j] += scale * v[i, j], v [N, n].
   * lora_take_cols: dst[i, j] = scale * y[i, col0 + j], dst [N, n] (the
   * adapter's share of the output gradient, contiguous for its GEMMs). */
  void (*lora_add_cols)(void *y, const void *v, float scale, int N, int OC, int col0, int n);
  void (*lora_take_cols)(void *dst, const void *y, float scale, int N, int OC, int col0, int n);
  /* Inverted dropout (Srivastava et al. 2014) with a counter-based mask:
   * out[i] = keep(seed, i) ? in[i] / (1 - p) : 0, keep(seed, i) iff
   * st_dropout_uniform(seed, i) >= p (kernels/dropout_hash.h). The same
   * (seed, i) keeps the same elements on every backend, so backward applies
   * the op again to the gradient and recompute rebuilds the same mask; no
   * mask is stored. in may alias out. 0 <= p < 1. */
  void (*dropout)(void *out, const void *in, int64_t n, float p, uint64_t seed);

  /* Softmax over the first V of Vp logits per row (padded columns get
   * probability 0), loss[N] = -log p[target], and, when dlogits is not NULL,
   * dlogits[N,Vp] = (p - onehot(target)) * dloss (padded columns get 0).
   * logits may alias dlogits. Returns nothing; targets in [0, V). */
  void (*softmax_crossentropy)(float *loss, void *dlogits, const void *logits,
                               const int *targets, float dloss, int N, int V, int Vp);

  /* One AdamW step on n elements (Loshchilov & Hutter 2019, the form of
   * torch.optim.AdamW): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
   * p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p), with bias corrections
   * 1-b1^t and 1-b2^t. g is scaled by grad_scale first (clipping, loss
   * scale). t >= 1. p is the fp32 master copy; when work is not NULL the
   * updated p is also written to work[n] in the storage dtype. g is in
   * gdt, ST_FP32 or ST_BF16 (--grad-dtype; widened exactly, so bf16 g
   * updates bit for bit as fp32 g holding the same values). */
  void (*adamw_update)(float *p, const void *g, st_dtype gdt, float *m, float *v, int64_t n,
                       float lr, float b1, float b2, float eps, float wd,
                       float grad_scale, int64_t t, void *work);
  /* The same update over nseg (1..ST_ADAMW_SEGS) consecutive segments of
   * one flat range in one launch: segment k is [seg_end[k-1], seg_end[k])
   * (seg_end[-1] = 0, seg_end[nseg-1] = n, offsets from p) with weight decay
   * seg_wd[k]; seg_end and seg_wd are host arrays. Bit-identical to one
   * adamw_update per segment; it exists because a model has hundreds of
   * small tensors whose separate launches cost more than their arithmetic.
   * NULL where the backend has none (CPU): callers loop adamw_update. */
  void (*adamw_update_segments)(float *p, const void *g, st_dtype gdt, float *m, float *v,
                                int64_t n,
                                const int64_t *seg_end, const float *seg_wd, int nseg, float lr,
                                float b1, float b2, float eps, float grad_scale, int64_t t,
                                void *work);
  /* adamw_update_segments with the fp32 master weights split in two 16-bit
   * halves (kernels/master_split.h; bf16 storage): element i's master is
   * work[i], the bf16 working weight, as its high half and lo[i] as the
   * rest; both are read and rewritten. Bit for bit the update of
   * adamw_update on the joined master, then the split. 2 bytes a parameter
   * instead of the 4 of an fp32 master beside the working copy. */
  void (*adamw_update_segments_split)(int16_t *lo, const void *g, st_dtype gdt, float *m,
                                      float *v, int64_t n, const int64_t *seg_end, const float *seg_wd,
                                      int nseg, float lr, float b1, float b2, float eps,
                                      float grad_scale, int64_t t, uint16_t *work);

  /* Sum of squares of n elements of x in dt (ST_FP32 or ST_BF16: the
   * gradient dtype), accumulated in double; inf or nan when any element is
   * (the loss scaler's overflow test). */
  double (*sum_squares)(const void *x, st_dtype dt, int64_t n);
} st_ops;

#define ST_ADAMW_SEGS 128 /* segments per adamw_update_segments call */
#define ST_COPY_TAGS 4    /* tags of to_host_async / to_device_async / copy_wait */

/* The CPU fp32 reference implementation. */
const st_ops *st_ops_cpu(void);

#endif
