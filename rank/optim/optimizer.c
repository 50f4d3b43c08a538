/* optimizer.c - schedule, clipping and partitioned AdamW (see optimizer.h). */
#include "rank/optim/optimizer.h"

#include <math.h>

#define ST_PI 3.14159265358979323846

float st_lr_at(const st_optim_config *o, int64_t s) {
  if (s < o->warmup_steps) return o->lr * (float)(s + 1) / (float)o->warmup_steps;
  float min_lr = o->lr * o->min_lr_frac;
  int64_t span = o->total_steps - o->warmup_steps;
  if (span <= 0 || s >= o->total_steps) return min_lr;
  double ratio = (double)(s - o->warmup_steps) / (double)span;
  double coeff = 0.5 * (1.0 + cos(ST_PI * ratio));
  return (float)(min_lr + coeff * (o->lr - min_lr));
}

float st_clip_scale(const st_optim_config *o, double norm) {
  if (o->grad_clip <= 0) return 1.0f;
  double s = o->grad_clip / (norm + 1e-6);
  return s < 1.0 ? (float)s : 1.0f;
}

void st_adamw_range(const st_ops *ops, const st_param_table *tab, const st_optim_config *o,
                    float lr, float grad_scale, int64_t t, float *master, void *work, size_t es,
                    const float *grads, float *m, float *v, int64_t begin, int64_t end) {
  /* Walk the tensors that intersect [begin, end): each segment gets its own
   * decay setting. A partition boundary may cut a tensor anywhere. */
  if (ops->adamw_update_segments) {
    int64_t seg_end[ST_ADAMW_SEGS];
    float seg_wd[ST_ADAMW_SEGS];
    int nseg = 0;
    int64_t first = begin; /* where the pending launch starts */
    for (int i = 0; i < tab->n; i++) {
      const st_tensor *ts = &tab->t[i];
      int64_t b = ts->offset > begin ? ts->offset : begin;
      int64_t e = ts->offset + ts->numel < end ? ts->offset + ts->numel : end;
      if (b >= e) continue;
      seg_end[nseg] = e - first;
      seg_wd[nseg++] = ts->decay ? o->weight_decay : 0.0f;
      if (nseg == ST_ADAMW_SEGS || e == end) {
        const int64_t k = first - begin;
        ops->adamw_update_segments(master + k, grads + k, m + k, v + k, e - first, seg_end, seg_wd,
                                   nseg, lr, o->beta1, o->beta2, o->eps, grad_scale, t,
                                   work ? (char *)work + (size_t)k * es : NULL);
        nseg = 0;
        first = e;
      }
    }
    return;
  }
  for (int i = 0; i < tab->n; i++) {
    const st_tensor *ts = &tab->t[i];
    int64_t b = ts->offset > begin ? ts->offset : begin;
    int64_t e = ts->offset + ts->numel < end ? ts->offset + ts->numel : end;
    if (b >= e) continue;
    const int64_t k = b - begin;
    ops->adamw_update(master + k, grads + k, m + k, v + k, e - b, lr, o->beta1, o->beta2, o->eps,
                      ts->decay ? o->weight_decay : 0.0f, grad_scale, t,
                      work ? (char *)work + (size_t)k * es : NULL);
  }
}
