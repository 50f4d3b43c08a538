/* ops_cuda.h - the CUDA backend's op table and device binding.
 *
 * Built only when the build has a CUDA toolkit (SHARDTRAIN_HAVE_CUDA). The
 * table's memory functions work on device memory of the current device, so
 * a rank binds its GPU (st_cuda_bind_device) before the first op or alloc.
 * One table per storage dtype (fp32, bf16, fp16): arithmetic is fp32 inside
 * every kernel, matmuls go through cuBLASLt (fp32 compute; bf16/fp16 inputs
 * on tensor cores), attention is flash attention. Every reduction runs in a
 * fixed order, so results are bit-for-bit repeatable on the same GPU model.
 */
#ifndef ST_OPS_CUDA_H
#define ST_OPS_CUDA_H

#include <stddef.h>

#include "kernels/attention_choice.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA implementation of every op with storage dtype dt (see
 * kernels/ops.h and kernels/dtype.h). */
const st_ops *st_ops_cuda(st_dtype dt);

/* Number of visible CUDA devices; 0 when there is none, no driver, or the
 * driver is too old for this build. Never aborts. */
int st_cuda_device_count(void);

/* Make device local_rank % count current for this process, write its name
 * into name[cap] (when name is not NULL), and return its index; -1 with
 * st_error when no device is visible or it cannot be selected. */
int st_cuda_bind_device(int local_rank, char *name, size_t cap);

/* The current device's free and total memory (cudaMemGetInfo): 0, or -1
 * when it cannot be read. Never aborts. */
int st_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* Attention implementations of the CUDA tables (--attention):
 * st_attention_impl, kernels/attention_choice.h. */
typedef struct {
  st_attention_impl impl;  /* what runs: ST_ATTENTION_CUDNN, _FLASH or _MIXED */
  size_t workspace_bytes;  /* cuDNN's device workspace (0 for ours), made by reserve */
  int deterministic;       /* cuDNN: its backward engine has no nondeterminism note */
  char note[512];          /* one line for the configuration block */
} st_attention_choice;

/* Make the workspace the table's reserve will make at least bytes (the
 * memory plan's figure, which rounds cuDNN's per sequence), so an arena
 * sized by the plan comes out exactly full. */
void st_cuda_attention_workspace_at_least(size_t bytes);

/* Hold total - cap bytes of the current GPU with one cudaMalloc, so at
 * most cap stays usable by everything on it (this process's later
 * allocations, the libraries' own, and any other process's): a GPU of
 * cap bytes emulated on a larger one (train --enforce-gpu-mem). *held gets
 * the bytes held (0 when cap >= total). -1 with st_error (memory class)
 * when more than cap is already in use. Freed when the process exits. */
int st_cuda_hold_above(uint64_t cap, uint64_t *held);

/* The most sequences one cuDNN attention backward call takes: the plans
 * and workspace of the next st_cuda_attention_select follow it
 * (st_attention_cudnn_group, kernels/attention_choice.h); 0 (the start):
 * the whole micro-batch, or ST_ATTENTION_CUDNN_SEQS. */
void st_cuda_attention_group_cap(int cap);

/* Choose the attention of every CUDA table for B sequences of T tokens,
 * width C, NH heads, storage dt, at setup (builds cuDNN's plans; allocates
 * no device memory: the table's reserve makes the workspace afterwards).
 * FLASH: our kernels. CUDNN: cuDNN's fused flash attention, or -1 with
 * st_error (usage class for fp32) when it cannot run the shape. MIXED:
 * cuDNN's forward and our O(T) deterministic backward (no O(T^2)
 * workspace), or -1 as CUDNN. AUTO: MIXED where st_attention_auto_mixed
 * says our backward is the faster (head size 64 on Hopper), else cuDNN for
 * bf16/fp16 when it builds both plans, MIXED when only its forward builds,
 * else ours; fp32 always ours. (The trainer's pre-flight turns AUTO's
 * cuDNN into MIXED when the backward's workspace does not fit:
 * memory_preflight.c.)
 * Shapes other than the selected one run our kernels. 0 or -1. */
int st_cuda_attention_select(st_attention_impl want, st_dtype dt, int B, int T, int C, int NH,
                             st_attention_choice *out);
/* The same for grouped-query attention: NKV key/value heads (NKV divides
 * NH; NKV = NH is st_cuda_attention_select). cuDNN's plans are built for
 * that head layout; -1 with st_error (usage class) when NKV does not
 * divide NH. */
int st_cuda_attention_select_gqa(st_attention_impl want, st_dtype dt, int B, int T, int C, int NH,
                                 int NKV, st_attention_choice *out);
/* The same, the note naming --attention asked (what the user gave) while
 * want runs: the trainer's pre-flight selecting MIXED or FLASH after AUTO's
 * cuDNN did not fit. */
int st_cuda_attention_select_as(st_attention_impl want, st_attention_impl asked, st_dtype dt,
                                int B, int T, int C, int NH, int NKV, st_attention_choice *out);

#ifdef __cplusplus
}
#endif

#endif
