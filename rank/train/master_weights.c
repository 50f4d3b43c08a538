/* master_weights.c - this rank's fp32 master weights, whichever way they are
 * kept: an fp32 copy on the device or (--offload optimizer) the host, the
 * model's own params (fp32 storage), or split into the bf16 working weights
 * and a 16-bit rest (kernels/master_split.h). Setup, resume, the checkpoint
 * and the NaN fault go through the functions here, so none of them needs
 * to know which. */
#include "kernels/master_split.h"
#include "rank/train/trainer_state.h"

float *st_trainer_work_f32(const trainer *tr, int64_t at) {
  return (float *)st_trainer_work_at(tr, at);
}

void *st_trainer_work_at(const trainer *tr, int64_t at) {
  const st_model *m = &tr->model;
  if (m->shard_params) return (char *)m->shard_params + (size_t)(at - m->shard_begin) * m->es;
  return (char *)m->params + (size_t)at * m->es;
}

void st_trainer_master_put(trainer *tr, const float *host, int64_t begin, int64_t end) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  if (tr->master) {
    st_offload_state_put(&tr->offload, tr->ops, tr->master + (begin - tr->opt_part.begin), host,
                         (size_t)n * sizeof(float));
    return;
  }
  if (!tr->master_lo) {
    tr->ops->to_device(st_trainer_work_f32(tr, begin), host, (size_t)n * sizeof(float));
    return;
  }
  uint16_t *hi = tr->split_hi;
  int16_t *lo = tr->split_lo;
  for (int64_t k = 0; k < n; k += ST_SPLIT_STAGE) {
    const int64_t len = n - k < ST_SPLIT_STAGE ? n - k : ST_SPLIT_STAGE;
    for (int64_t i = 0; i < len; i++) st_master_split(host[k + i], &hi[i], &lo[i]);
    tr->ops->to_device(tr->master_lo + (begin + k - tr->opt_part.begin), lo,
                       (size_t)len * sizeof *lo);
    tr->ops->to_device(st_trainer_work_at(tr, begin + k), hi, (size_t)len * sizeof *hi);
  }
}

void st_trainer_weights_to_host(trainer *tr, float *host, int64_t begin, int64_t end) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  if (tr->master) {
    st_offload_state_get(&tr->offload, tr->ops, host, tr->master + (begin - tr->opt_part.begin),
                         (size_t)n * sizeof(float));
    return;
  }
  if (!tr->master_lo) {
    tr->ops->to_host(host, st_trainer_work_f32(tr, begin), (size_t)n * sizeof(float));
    return;
  }
  uint16_t *hi = tr->split_hi;
  int16_t *lo = tr->split_lo;
  for (int64_t k = 0; k < n; k += ST_SPLIT_STAGE) {
    const int64_t len = n - k < ST_SPLIT_STAGE ? n - k : ST_SPLIT_STAGE;
    tr->ops->to_host(lo, tr->master_lo + (begin + k - tr->opt_part.begin),
                     (size_t)len * sizeof *lo);
    tr->ops->to_host(hi, st_trainer_work_at(tr, begin + k), (size_t)len * sizeof *hi);
    for (int64_t i = 0; i < len; i++) host[k + i] = st_master_join(hi[i], lo[i]);
  }
}

void st_master_round_host(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint16_t hi;
    int16_t lo;
    st_master_split(x[i], &hi, &lo);
    x[i] = st_master_join(hi, 0);
  }
}
