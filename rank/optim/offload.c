/* offload.c - the optimizer step on the host (see offload.h). */
#include "rank/optim/offload.h"

#include <string.h>

#include "kernels/arena.h"
#include "rank/memory/memory_plan.h"
#include "util/error.h"

static void *host_buffer(st_offload *o, const st_ops *ops, size_t bytes, const char *what) {
  void *p = ops->host_alloc(bytes, what);
  if (p) o->host_bytes += st_arena_round(bytes);
  return p;
}

int st_offload_alloc(st_offload *o, const st_ops *ops, int64_t n, int64_t chunk) {
  memset(o, 0, sizeof *o);
  o->on = 1;
  o->n = n;
  o->chunk = chunk > 0 ? chunk : ST_OFFLOAD_CHUNK_ELEMS;
  o->dtype = ops->dtype;
  const size_t f4 = sizeof(float), es = st_dtype_size(ops->dtype);
  const size_t stage = (size_t)(o->chunk < n ? o->chunk : n);
  /* the order and sizes of rank/memory/memory_plan.c's host section */
  o->master = host_buffer(o, ops, (size_t)n * f4, "host_master");
  o->m = host_buffer(o, ops, (size_t)n * f4, "host_adam_m");
  o->v = host_buffer(o, ops, (size_t)n * f4, "host_adam_v");
  for (int i = 0; i < 2; i++) o->gstage[i] = host_buffer(o, ops, stage * f4, "host_grad_staging");
  for (int i = 0; i < 2; i++) o->wstage[i] = host_buffer(o, ops, stage * es, "host_work_staging");
  if (!o->master || !o->m || !o->v || !o->gstage[0] || !o->gstage[1] || !o->wstage[0] ||
      !o->wstage[1])
    return st_error_setc(ST_EXIT_MEMORY, "--offload optimizer: cannot allocate %.1f MiB of %s "
                         "host memory for the optimizer state (%lld elements): the node has "
                         "less free memory than the plan's host check saw; use more nodes, "
                         "fewer ranks per node or --offload none",
                         ((3.0 * (double)n + 2.0 * (double)stage) * f4 + 2.0 * (double)stage * es) /
                             1048576.0,
                         ops->name, (long long)n);
  return 0;
}

void st_offload_free(st_offload *o, const st_ops *ops) {
  if (!o->on) return;
  ops->host_free(o->master);
  ops->host_free(o->m);
  ops->host_free(o->v);
  for (int i = 0; i < 2; i++) {
    ops->host_free(o->gstage[i]);
    ops->host_free(o->wstage[i]);
  }
  memset(o, 0, sizeof *o);
}

/* dst[n] (storage dtype) = src[n] rounded, in blocks over the OpenMP
 * threads: st_dtype_from_f32's rounding (the device's), at memory speed. */
static void round_to_storage(st_dtype d, void *dst, const float *src, int64_t n) {
  enum { BLOCKS = 64 };
  const int64_t per = (n + BLOCKS - 1) / BLOCKS;
  const size_t es = st_dtype_size(d);
#pragma omp parallel for
  for (int k = 0; k < BLOCKS; k++) {
    const int64_t b = k * per, e = b + per < n ? b + per : n;
    if (b < e) st_dtype_from_f32(d, (char *)dst + (size_t)b * es, src + b, (size_t)(e - b));
  }
}

/* Copy tags: 0/1 the gradient chunk in gstage[0/1], 2/3 the working-weight
 * chunk out of wstage[0/1]. */
enum { TAG_GRAD = 0, TAG_WORK = 2 };

void st_offload_step(st_offload *o, const st_ops *ops, const st_param_table *tab,
                     const st_optim_config *oc, float lr, float grad_scale, int64_t t,
                     const void *grads, st_dtype gdt, void *work, int64_t begin, int64_t end) {
  const int64_t n = end - begin, C = o->chunk;
  if (n <= 0) return;
  const size_t es = st_dtype_size(o->dtype), gs = st_dtype_size(gdt);
  const char *g = grads;
  const int64_t nchunks = (n + C - 1) / C;
  const st_ops *cpu = st_ops_cpu();
#define CHUNK_LEN(i) ((i) * C + C < n ? C : n - (i) * C)
  /* bf16 gradients come over as they are, half the bytes, and are widened
   * inside the host's AdamW */
  ops->to_host_async(o->gstage[0], g, (size_t)CHUNK_LEN(0) * gs, TAG_GRAD);
  for (int64_t i = 0; i < nchunks; i++) {
    const int b = (int)(i & 1);
    const int64_t off = i * C, len = CHUNK_LEN(i);
    /* the next chunk comes in while this one is updated; its buffer held
     * chunk i-1, whose update finished in the previous iteration */
    if (i + 1 < nchunks)
      ops->to_host_async(o->gstage[b ^ 1], g + (size_t)(off + C) * gs,
                         (size_t)CHUNK_LEN(i + 1) * gs, TAG_GRAD + (b ^ 1));
    ops->copy_wait(TAG_GRAD + b);
    st_adamw_range(cpu, tab, oc, lr, grad_scale, t, o->master + off, NULL, 0, o->gstage[b], gdt,
                   o->m + off, o->v + off, begin + off, begin + off + len);
    ops->copy_wait(TAG_WORK + b); /* chunk i-2's copy out of this buffer has finished */
    round_to_storage(o->dtype, o->wstage[b], o->master + off, len);
    ops->to_device_async((char *)work + (size_t)off * es, o->wstage[b], (size_t)len * es,
                         TAG_WORK + b);
  }
#undef CHUNK_LEN
  ops->copy_wait(TAG_WORK);
  ops->copy_wait(TAG_WORK + 1);
}

void st_offload_state_get(const st_offload *o, const st_ops *ops, void *host_dst,
                          const void *state_src, size_t bytes) {
  if (o->on) memcpy(host_dst, state_src, bytes);
  else ops->to_host(host_dst, state_src, bytes);
}

void st_offload_state_put(const st_offload *o, const st_ops *ops, void *state_dst,
                          const void *host_src, size_t bytes) {
  if (o->on) memcpy(state_dst, host_src, bytes);
  else ops->to_device(state_dst, host_src, bytes);
}
