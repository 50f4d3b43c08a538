/* optimizer.h - learning-rate schedule, global-norm clipping and the AdamW
 * update of one ZeRO partition. */
#ifndef ST_OPTIMIZER_H
#define ST_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "rank/model/params.h"

typedef struct {
  float lr;           /* peak learning rate */
  float min_lr_frac;  /* cosine decays to lr * min_lr_frac */
  int warmup_steps;
  int64_t total_steps;
  float beta1, beta2, eps;
  float weight_decay; /* applied to tensors with decay=1 (matrices) only */
  float grad_clip;    /* max global L2 norm; 0 disables clipping */
} st_optim_config;

/* Learning rate for 0-based step s: linear warmup lr*(s+1)/warmup for
 * s < warmup, then cosine from lr to lr*min_lr_frac at total_steps
 * (Loshchilov & Hutter 2017, without restarts). */
float st_lr_at(const st_optim_config *o, int64_t s);

/* Gradient multiplier for global norm `norm`: min(1, clip/(norm + 1e-6)),
 * the rule of torch.nn.utils.clip_grad_norm_. 1 when clip is 0. */
float st_clip_scale(const st_optim_config *o, double norm);

/* AdamW on the flat range [begin, end) of the parameter vector. master
 * (fp32 weights), grads, m and v point at element `begin` (length
 * end-begin). work, when not NULL, points at element `begin` of the working
 * weights in the storage dtype (elements of es bytes) and receives the
 * updated values; NULL when master is itself the working copy (fp32).
 * grads are in gdt: ST_FP32, or ST_BF16 under --grad-dtype bf16.
 * Weight decay follows each tensor's decay flag. t is the 1-based step. */
void st_adamw_range(const st_ops *ops, const st_param_table *tab, const st_optim_config *o,
                    float lr, float grad_scale, int64_t t, float *master, void *work, size_t es,
                    const void *grads, st_dtype gdt, float *m, float *v, int64_t begin,
                    int64_t end);

/* st_adamw_range with the master weights split (kernels/master_split.h,
 * ops->adamw_update_segments_split; bf16): lo (the rests) and work (the bf16
 * working weights, the high halves) point at element `begin` and are both
 * updated; no fp32 master exists. */
void st_adamw_range_split(const st_ops *ops, const st_param_table *tab, const st_optim_config *o,
                          float lr, float grad_scale, int64_t t, int16_t *lo, uint16_t *work,
                          const void *grads, st_dtype gdt, float *m, float *v, int64_t begin,
                          int64_t end);

#endif
