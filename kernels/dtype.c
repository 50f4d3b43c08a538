/* dtype.c - host conversions between fp32 and the storage dtypes, used to
 * move weights between fp32 files (checkpoints, initialisation) and a
 * bf16/fp16 working copy, and by tests. Bit manipulation on IEEE-754 words,
 * so the results equal the GPU's round-to-nearest-even intrinsics. */
#include "kernels/dtype.h"

#include <stdint.h>
#include <string.h>

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet nan */
  u += 0x7fffu + ((u >> 16) & 1u); /* round half to even on the dropped 16 bits */
  return (uint16_t)(u >> 16);
}

static uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u; /* nan */
  if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {
    /* below fp16's smallest normal 2^-14: subnormal, in units of 2^-24.
     * Adding 0.5 (2^-1) in fp32 lets the FPU round to nearest even. */
    float v = bits_f32(a) + 0.5f;
    return sign | (uint16_t)(f32_bits(v) - 0x3f000000u);
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mant_odd; /* rebias exponent 127 -> 15 and round */
  return sign | (uint16_t)(a >> 13);
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) { /* zero or subnormal: m * 2^-24 */
    float v = (float)m * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

void st_dtype_from_f32(st_dtype d, void *dst, const float *src, size_t n) {
  uint16_t *o = dst;
  switch (d) {
  case ST_FP32: memcpy(dst, src, n * 4); break;
  case ST_BF16: for (size_t i = 0; i < n; i++) o[i] = f32_to_bf16(src[i]); break;
  case ST_FP16: for (size_t i = 0; i < n; i++) o[i] = f32_to_f16(src[i]); break;
  }
}

void st_dtype_to_f32(st_dtype d, float *dst, const void *src, size_t n) {
  const uint16_t *s = src;
  switch (d) {
  case ST_FP32: memcpy(dst, src, n * 4); break;
  case ST_BF16: for (size_t i = 0; i < n; i++) dst[i] = bits_f32((uint32_t)s[i] << 16); break;
  case ST_FP16: for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]); break;
  }
}
