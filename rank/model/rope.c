/* rope.c - the rotary cos/sin table, Hugging Face's arithmetic (see rope.h). */
#include "rank/model/rope.h"

#include <math.h>
#include <stddef.h>

/* inv_freq_i as transformers computes it in fp32, Llama 3 scaling included.
 * torch evaluates `scalar / tensor` as reciprocal(tensor) * scalar and casts
 * Python scalars to the tensor's fp32, which the steps below repeat. */
static float inv_freq(const st_model_config *cfg, int i, int HD) {
  const float e = (float)(2 * i) / (float)HD;
  const float pw = (float)pow((double)cfg->rope_theta, (double)e);
  float f = 1.0f / pw;
  const st_rope_scaling *r = &cfg->rope_scaling;
  if (r->kind != ST_ROPE_SCALING_LLAMA3) return f;
  const float two_pi = (float)(2.0 * 3.14159265358979323846);
  const float wavelen = (1.0f / f) * two_pi;
  const float low_wavelen = (float)((double)r->original_max_pos / (double)r->low_freq_factor);
  const float high_wavelen = (float)((double)r->original_max_pos / (double)r->high_freq_factor);
  const float scaled = wavelen > low_wavelen ? f / r->factor : f;
  if (wavelen < high_wavelen || wavelen > low_wavelen) return scaled;
  const float band = (float)((double)r->high_freq_factor - (double)r->low_freq_factor);
  const float s = ((1.0f / wavelen) * (float)r->original_max_pos - r->low_freq_factor) / band;
  return (1.0f - s) * scaled / r->factor + s * scaled;
}

void st_rope_table(const st_model_config *cfg, int maxT, float *cs) {
  const int HD = st_model_head_dim(cfg), half = HD / 2;
  for (int i = 0; i < half; i++) {
    const float f = inv_freq(cfg, i, HD);
    for (int p = 0; p < maxT; p++) {
      const float angle = (float)p * f;
      cs[(size_t)p * HD + i] = (float)cos((double)angle);
      cs[(size_t)p * HD + half + i] = (float)sin((double)angle);
    }
  }
}
