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

/* The tensors that intersect [begin, end), in groups of up to
 * ST_ADAMW_SEGS segments, each with its own decay setting (a partition
 * boundary may cut a tensor anywhere): run(ctx, k, n, seg_end, seg_wd, nseg)
 * per group, k its offset from begin, n its length. */
typedef void (*seg_run)(void *ctx, int64_t k, int64_t n, const int64_t *seg_end,
                        const float *seg_wd, int nseg);
static void walk_segments(const st_param_table *tab, const st_optim_config *o, int64_t begin,
                          int64_t end, seg_run run, void *ctx) {
  int64_t seg_end[ST_ADAMW_SEGS];
  float seg_wd[ST_ADAMW_SEGS];
  int nseg = 0;
  int64_t first = begin; /* where the pending group starts */
  for (int i = 0; i < tab->n; i++) {
    const st_tensor *ts = &tab->t[i];
    int64_t b = ts->offset > begin ? ts->offset : begin;
    int64_t e = ts->offset + ts->numel < end ? ts->offset + ts->numel : end;
    if (b >= e) continue;
    seg_end[nseg] = e - first;
    seg_wd[nseg++] = ts->decay ? o->weight_decay : 0.0f;
    if (nseg == ST_ADAMW_SEGS || e == end) {
      run(ctx, first - begin, e - first, seg_end, seg_wd, nseg);
      nseg = 0;
      first = e;
    }
  }
}

typedef struct {
  const st_ops *ops;
  const st_optim_config *o;
  float lr, grad_scale;
  int64_t t;
  float *master;
  int16_t *lo;
  void *work;
  size_t es;
  const void *grads;
  st_dtype gdt;
  float *m, *v;
} adamw_call;

/* Element k of gradients in gdt. */
static const void *grads_at(const void *grads, st_dtype gdt, int64_t k) {
  return (const char *)grads + (size_t)k * st_dtype_size(gdt);
}

static void run_segments(void *ctx, int64_t k, int64_t n, const int64_t *seg_end,
                         const float *seg_wd, int nseg) {
  const adamw_call *a = ctx;
  a->ops->adamw_update_segments(a->master + k, grads_at(a->grads, a->gdt, k), a->gdt, a->m + k, a->v + k, n, seg_end,
                                seg_wd, nseg, a->lr, a->o->beta1, a->o->beta2, a->o->eps,
                                a->grad_scale, a->t,
                                a->work ? (char *)a->work + (size_t)k * a->es : NULL);
}

static void run_split(void *ctx, int64_t k, int64_t n, const int64_t *seg_end,
                      const float *seg_wd, int nseg) {
  const adamw_call *a = ctx;
  a->ops->adamw_update_segments_split(a->lo + k, grads_at(a->grads, a->gdt, k), a->gdt, a->m + k,
                                      a->v + k, n, seg_end, seg_wd, nseg, a->lr, a->o->beta1, a->o->beta2, a->o->eps,
                                      a->grad_scale, a->t, (uint16_t *)a->work + k);
}

void st_adamw_range(const st_ops *ops, const st_param_table *tab, const st_optim_config *o,
                    float lr, float grad_scale, int64_t t, float *master, void *work, size_t es,
                    const void *grads, st_dtype gdt, float *m, float *v, int64_t begin,
                    int64_t end) {
  if (ops->adamw_update_segments) {
    adamw_call a = {ops, o, lr, grad_scale, t, master, NULL, work, es, grads, gdt, m, v};
    walk_segments(tab, o, begin, end, run_segments, &a);
    return;
  }
  for (int i = 0; i < tab->n; i++) {
    const st_tensor *ts = &tab->t[i];
    int64_t b = ts->offset > begin ? ts->offset : begin;
    int64_t e = ts->offset + ts->numel < end ? ts->offset + ts->numel : end;
    if (b >= e) continue;
    const int64_t k = b - begin;
    ops->adamw_update(master + k, grads_at(grads, gdt, k), gdt, m + k, v + k, e - b, lr, o->beta1, o->beta2, o->eps,
                      ts->decay ? o->weight_decay : 0.0f, grad_scale, t,
                      work ? (char *)work + (size_t)k * es : NULL);
  }
}

void st_adamw_range_split(const st_ops *ops, const st_param_table *tab, const st_optim_config *o,
                          float lr, float grad_scale, int64_t t, int16_t *lo, uint16_t *work,
                          const void *grads, st_dtype gdt, float *m, float *v, int64_t begin,
                          int64_t end) {
  adamw_call a = {ops, o, lr, grad_scale, t, NULL, lo, work, 2, grads, gdt, m, v};
  walk_segments(tab, o, begin, end, run_split, &a);
}
