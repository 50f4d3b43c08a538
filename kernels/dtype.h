/* dtype.h - storage dtypes of activations and working weights.
 *
 * The op table stores activations, activation gradients and the working copy
 * of the weights in one storage dtype; parameter gradients, optimizer state,
 * fp32 master weights, LayerNorm statistics and losses are always fp32. The
 * CPU reference is fp32 only; CUDA offers all three (bf16 is the default for
 * training, fp16 needs the loss scaler, fp32 is for debugging).
 */
#ifndef ST_DTYPE_H
#define ST_DTYPE_H

#include <stddef.h>

typedef enum { ST_FP32 = 0, ST_BF16 = 1, ST_FP16 = 2 } st_dtype;

/* Bytes per element. */
static inline size_t st_dtype_size(st_dtype d) { return d == ST_FP32 ? 4 : 2; }
/* "fp32", "bf16", "fp16". */
static inline const char *st_dtype_name(st_dtype d) {
  return d == ST_BF16 ? "bf16" : d == ST_FP16 ? "fp16" : "fp32";
}

/* Host conversions between fp32 and a storage dtype, n elements, rounding
 * to nearest even (the rounding of CUDA's __float2bfloat16_rn and
 * __float2half_rn; fp16 overflow gives inf, underflow subnormals or 0).
 * dst and src must not overlap. For ST_FP32 they copy. */
void st_dtype_from_f32(st_dtype d, void *dst, const float *src, size_t n);
void st_dtype_to_f32(st_dtype d, float *dst, const void *src, size_t n);

#endif
