/* loss_scaler.h - dynamic loss scaling for fp16 training (Micikevicius et al.
 * 2018, "Mixed Precision Training"), with the hysteresis of DeepSpeed's
 * DynamicLossScaler.
 *
 * The loss (hence every gradient) is multiplied by `scale` so small fp16
 * gradients do not flush to zero; the optimizer divides it back out. A step
 * whose gradients hold inf or nan is skipped. The scale starts at 2^16,
 * doubles after `growth_interval` (1000) clean steps in a row, and is halved
 * on an overflow once `hysteresis` (2) overflows have been tolerated since
 * the last growth; it stays within [1, max_scale]. bf16 and fp32 runs keep
 * the scaler disabled (scale 1) but still skip a step whose gradients are
 * not finite, so the weights never take an inf or nan.
 */
#ifndef ST_LOSS_SCALER_H
#define ST_LOSS_SCALER_H

#include <stdint.h>

typedef struct {
  int enabled;
  float scale;            /* current loss scale */
  float min_scale, max_scale;
  int growth_interval;    /* clean steps before the scale doubles */
  int hysteresis;         /* overflows tolerated before halving */
  int hysteresis_left;    /* tolerance left until the next growth refills it */
  int64_t clean_steps;    /* clean steps since the last overflow or growth */
  int64_t skipped_steps;  /* steps skipped for overflow, over the whole run */
} st_loss_scaler;

/* enabled: fp16. max_scale >= 1 (default 2^24). */
void st_loss_scaler_init(st_loss_scaler *s, int enabled, float max_scale);

/* Account for one optimizer step whose reduced gradients were not finite
 * (overflow = 1) or were. Returns 1 when the step must be skipped (any
 * overflow), else 0. Only an enabled scaler changes its scale. */
int st_loss_scaler_update(st_loss_scaler *s, int overflow);

#endif
