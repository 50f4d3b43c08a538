/* attention_cudnn.h - causal multi-head attention through cuDNN's fused
 * flash attention (scaled dot-product attention, cuDNN 9 backend graph API),
 * forward and backward, for bf16 and fp16 storage.
 *
 * Layouts are the op table's (kernels/ops.h): qkv and dqkv [B,T,(NH+2*NKV)*hs]
 * (NH query heads, then NKV key heads, then NKV value heads per row, hs
 * columns each; query head h reads kv head h/(NH/NKV): grouped-query
 * attention, NKV = NH being [B,T,3C]), out and dout [B,T,C], stats [B,NH,T]
 * fp32. cuDNN reads and writes them in place as strided [B,NH,T,hs] and
 * [B,NKV,T,hs] views; nothing is copied. With NKV < NH the backward forms
 * dK and dV per query head inside the fused graph and sums each group into
 * its kv head there (the cuDNN frontend's SDPA pattern).
 *
 * stats is cuDNN's softmax statistic: the natural-log log-sum-exp of the
 * scaled scores, max_j(s_ij) + log(sum_j exp(s_ij - max)), s = q.k / sqrt(hs)
 * with the causal mask applied: the same quantity, in the same layout, as
 * the `lse` of our own flash kernels (attention.cu, attention_tc.cu), so a
 * forward of either can feed a backward of the other.
 *
 * Determinism: the backward graph is built without cuDNN's fp32 dQ
 * accumulator tensor, which selects the "dP workspace" algorithm (dQ summed
 * in a fixed order through a workspace holding dP, about B*NH*T'^2*2 bytes
 * with T' = T rounded up to 64) rather than the one that adds dQ with
 * atomics; among the engines cuDNN's heuristics return, one without
 * CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC is taken when any builds, and
 * cuda_attention_cudnn_prepare reports whether it was. The workspace is
 * the price: O(NH*T^2) per sequence of a call, not O(T) like our own
 * kernels. When memory asks for it the backward runs on groups of
 * sequences (st_attention_cudnn_group, kernels/attention_choice.h), one
 * call per group, so the workspace is a group's, not the micro-batch's;
 * the results are the same bytes (checked by test_cuda_attention_cudnn),
 * since no sequence's gradient reads another's.
 *
 * Plans are built at setup, once per (B, T, NH, NKV, hs, dtype) (causal always),
 * and kept in a small fixed cache; the forward and backward calls only look
 * them up, so nothing is built or allocated inside a training step. All
 * work runs on the legacy default stream of the device that was current at
 * the first prepare. This is host code only (plain C).
 */
#ifndef ST_ATTENTION_CUDNN_H
#define ST_ATTENTION_CUDNN_H

#include <stddef.h>

#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Build (or find) the forward and backward execution plans for B sequences
 * of T tokens, width C, NH query heads (hs = C/NH) and NKV key/value heads
 * (NKV divides NH), storage dt (ST_BF16 or ST_FP16). The first call creates the cuDNN handle on the current device.
 * *workspace_bytes: the device workspace the larger of the two plans needs
 * (bytes; the caller allocates it once, at setup): the forward's for B
 * sequences, the backward's for st_attention_cudnn_group(B, cap) of them
 * (cap: the last cuda_attention_cudnn_group_cap), which *seqs_per_call
 * gets; *deterministic: 1 when
 * the backward engine carries no nondeterminism note. 0 on success; -1 when
 * cuDNN cannot run the shape (no engine builds, unsupported dtype or head
 * size, cache full, no cuDNN library), with the reason in
 * cuda_attention_cudnn_error(). Never aborts. */
int cuda_attention_cudnn_prepare(int B, int T, int C, int NH, int NKV, st_dtype dt,
                                 size_t *workspace_bytes, int *deterministic,
                                 int *seqs_per_call);

/* The forward's plan alone, for --attention mixed (cuDNN's forward, our
 * O(T) deterministic backward: its stats are our kernels' lse, above):
 * *workspace_bytes gets the forward's workspace for B sequences. No
 * backward plan is built, so none of its O(T^2) workspace is asked for.
 * 0, or -1 with the reason in cuda_attention_cudnn_error(). Never aborts. */
int cuda_attention_cudnn_prepare_forward(int B, int T, int C, int NH, int NKV, st_dtype dt,
                                         size_t *workspace_bytes);

/* The most sequences a backward call takes from now on (0: all of B, or
 * ST_ATTENTION_CUDNN_SEQS); prepare and the calls look plans up with it. */
void cuda_attention_cudnn_group_cap(int cap);

/* 1 when a forward plan exists for this shape and dtype (prepare or
 * prepare_forward succeeded; a cache lookup: builds nothing). */
int cuda_attention_cudnn_ready(int B, int T, int C, int NH, int NKV, st_dtype dt);

/* 1 when a backward plan exists too (prepare succeeded). */
int cuda_attention_cudnn_ready_backward(int B, int T, int C, int NH, int NKV, st_dtype dt);

/* out [B,T,C] and stats [B,NH,T] written from qkv. workspace: at
 * least prepare's *workspace_bytes of device memory (may be NULL when that
 * is 0). 0, or -1 with the reason in cuda_attention_cudnn_error() when the
 * shape was not prepared or cuDNN fails (callers treat that as fatal). */
int cuda_attention_cudnn_forward(void *out, float *stats, const void *qkv, int B, int T, int C,
                                 int NH, int NKV, st_dtype dt, void *workspace);

/* dqkv (laid out as qkv) OVERWRITTEN with the gradients of q, k and v from dout
 * [B,T,C], forward's qkv, out and stats. workspace and return as for
 * forward. */
int cuda_attention_cudnn_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                  const float *stats, int B, int T, int C, int NH, int NKV,
                                  st_dtype dt, void *workspace);

/* Destroy every prepared plan and the cuDNN handle, so that what cuDNN
 * keeps on the device for them (its handle's state, the plans' compiled
 * kernels) can go when our attention runs instead; a later prepare makes
 * them again. Never fails. */
void cuda_attention_cudnn_release(void);

/* Destroy every prepared plan except this shape's at the current group cap
 * (the one that will run), keeping the handle: plans prepared for a group
 * cap or micro-batch that setup tried and left (--auto-fit, the budget's
 * groups) hold device memory for nothing. backward 0: this shape's backward
 * plan goes too (--attention mixed runs cuDNN's forward alone; a later
 * prepare builds it again). Never fails. */
void cuda_attention_cudnn_keep_only(int B, int T, int C, int NH, int NKV, st_dtype dt,
                                    int backward);

/* The last failure's reason ("" when none). */
const char *cuda_attention_cudnn_error(void);

/* The cuDNN library's version (cudnnGetVersion: 91400 for 9.14.0). */
int cuda_attention_cudnn_version(void);

#ifdef __cplusplus
}
#endif

#endif
