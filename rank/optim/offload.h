/* offload.h - the optimizer's state in host memory and its AdamW step on
 * the host cores (--offload optimizer, after ZeRO-Offload: Ren et al. 2021).
 *
 * With offload the fp32 master weights, Adam m and v of this rank's
 * optimizer range live in host memory from ops->host_alloc (pinned on
 * CUDA); the device keeps the working weights, the gradients and the
 * activations. A step copies the reduced gradients of the range to the
 * host in chunks, runs the CPU backend's AdamW on each chunk while the next
 * is copied in, rounds the updated weights to the storage dtype on the host
 * (round to nearest even, as the device does) and copies them back into the
 * working weights while the following chunk is updated (docs/memory.md,
 * "Offload"). Without offload nothing here is used (on = 0).
 */
#ifndef ST_OFFLOAD_H
#define ST_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "rank/model/params.h"
#include "rank/optim/optimizer.h"

typedef struct {
  int on;              /* --offload optimizer */
  int64_t n;           /* elements of the optimizer range (its buffers' length) */
  int64_t chunk;       /* elements per copy chunk; staging holds min(chunk, n) */
  st_dtype dtype;      /* the working weights' storage dtype */
  float *master, *m, *v;       /* host, n elements each */
  float *gstage[2];            /* host: gradient chunks copied in (fp32, or bf16 bits) */
  void *wstage[2];             /* host: updated working-weight chunks copied out */
  uint64_t host_bytes; /* what host_alloc was asked for, each buffer rounded to 256 */
} st_offload;

/* Allocate the host state of an n-element optimizer range (master, m, v
 * zeroed; two staging chunks each way) with ops->host_alloc, chunk
 * elements per copy (0: ST_OFFLOAD_CHUNK_ELEMS). 0, or -1 with st_error
 * naming the bytes that failed (what is allocated stays for
 * st_offload_free). */
int st_offload_alloc(st_offload *o, const st_ops *ops, int64_t n, int64_t chunk);
void st_offload_free(st_offload *o, const st_ops *ops);

/* One AdamW step of the range [begin, end) of the parameter vector on the
 * host (rank/optim/optimizer.h, st_adamw_range, on the CPU op table):
 * grads (backend memory) points at element begin of the reduced
 * gradients, in gdt (fp32, or bf16 under --grad-dtype bf16); work (backend memory) at element begin of the working
 * weights, which receive the updated weights in o->dtype. The copies use
 * tags 0-3 of ops' copy stream; returns when every copy has finished, so
 * the working weights may be used by the next op. end - begin <= o->n. */
void st_offload_step(st_offload *o, const st_ops *ops, const st_param_table *tab,
                     const st_optim_config *oc, float lr, float grad_scale, int64_t t,
                     const void *grads, st_dtype gdt, void *work, int64_t begin, int64_t end);

/* Copies of optimizer state (master weights, Adam m, v): under offload the
 * state is host memory and these are memcpy; otherwise it is backend
 * memory and they are ops->to_host / ops->to_device. */
void st_offload_state_get(const st_offload *o, const st_ops *ops, void *host_dst,
                          const void *state_src, size_t bytes);
void st_offload_state_put(const st_offload *o, const st_ops *ops, void *state_dst,
                          const void *host_src, size_t bytes);

#endif
