/* rope.h - the rotary position table (Su et al. 2021) that ops->rope_forward
 * and rope_backward read, computed as Hugging Face transformers does so that
 * imported Llama and Qwen2 weights see the same rotations. */
#ifndef ST_ROPE_H
#define ST_ROPE_H

#include "rank/model/config.h"

/* Fill cs[maxT * HD] (host, fp32; HD = head_dim) with, for position p and
 * frequency i < HD/2: cs[p*HD + i] = cos(p * inv_freq_i) and
 * cs[p*HD + HD/2 + i] = sin(p * inv_freq_i), where
 *   inv_freq_i = 1 / theta^(2i / HD)            (theta = cfg->rope_theta)
 * and, when cfg->rope_scaling.kind is ST_ROPE_SCALING_LLAMA3, Llama 3's
 * rescaling of it: with wavelength w = 2 pi / inv_freq, low = original /
 * low_freq_factor, high = original / high_freq_factor,
 *   w > low:          inv_freq / factor
 *   high <= w <= low: (1 - s) inv_freq / factor + s inv_freq,
 *                     s = (original / w - low_freq_factor)
 *                         / (high_freq_factor - low_freq_factor)
 *   w < high:         inv_freq.
 * Source: transformers' modeling_rope_utils (_compute_default_rope_parameters,
 * _compute_llama3_parameters) and LlamaRotaryEmbedding.forward; every step is
 * taken in fp32 as torch does there (the exponent, the power, the
 * reciprocal, the angle p * inv_freq), the power and cos/sin rounded
 * correctly from double. cfg must be validated (rope_theta set, even HD). */
void st_rope_table(const st_model_config *cfg, int maxT, float *cs);

#endif
