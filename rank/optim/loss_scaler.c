/* loss_scaler.c - the dynamic loss scale state machine (see loss_scaler.h). */
#include "rank/optim/loss_scaler.h"

void st_loss_scaler_init(st_loss_scaler *s, int enabled, float max_scale) {
  s->enabled = enabled;
  s->min_scale = 1.0f;
  s->max_scale = max_scale >= 1.0f ? max_scale : 1.0f;
  s->scale = enabled ? 65536.0f : 1.0f;
  if (s->scale > s->max_scale) s->scale = s->max_scale;
  s->growth_interval = 1000;
  s->hysteresis = 2;
  s->hysteresis_left = s->hysteresis;
  s->clean_steps = 0;
  s->skipped_steps = 0;
}

int st_loss_scaler_update(st_loss_scaler *s, int overflow) {
  if (!s->enabled) {
    s->skipped_steps += overflow != 0;
    return overflow != 0;
  }
  if (overflow) {
    s->skipped_steps++;
    s->clean_steps = 0;
    if (s->hysteresis_left > 1) {
      s->hysteresis_left--; /* tolerated: a single spike does not cost precision */
    } else {
      float half = s->scale * 0.5f;
      s->scale = half < s->min_scale ? s->min_scale : half;
    }
    return 1;
  }
  if (++s->clean_steps >= s->growth_interval) {
    float twice = s->scale * 2.0f;
    s->scale = twice > s->max_scale ? s->max_scale : twice;
    s->clean_steps = 0;
    s->hysteresis_left = s->hysteresis;
  }
  return 0;
}
