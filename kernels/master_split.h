/* master_split.h - the fp32 master weights of a bf16 run kept as two 16-bit
 * halves, so they cost 2 bytes a parameter beside the working copy instead
 * of 4.
 *
 * bf16 is the top half of fp32. The working weight hi is the master
 * rounded to bf16, and lo is the signed rest, so that
 *
 *     bits(master) = (bits(hi) << 16) + lo      (32-bit integer arithmetic)
 *
 * holds exactly. The rest of a round-to-nearest fits a signed 16-bit
 * integer only if exact ties go one way, so the rounding is half away from
 * zero (adding half an ulp to the magnitude bits, which are the low 31
 * bits): rests are -32768..32767. It differs from the round-to-nearest-even
 * of the other casts only at exact ties (1 value in 65536), by one bf16 ulp.
 * NaN keeps no payload: hi is a quiet NaN of the same sign, lo 0. inf, the
 * largest finite floats (which round to inf, as round-to-nearest does) and
 * subnormals split and join exactly.
 *
 * The same functions on the host (the CPU reference, checkpoints, setup)
 * and, compiled by nvcc, on the device (kernels/cuda/adamw.cu). */
#ifndef ST_MASTER_SPLIT_H
#define ST_MASTER_SPLIT_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define ST_SPLIT_FN static __host__ __device__ __forceinline__
#else
#define ST_SPLIT_FN static inline
#endif

/* fp32 bit pattern x -> bf16 bits *hi and the rest *lo. */
ST_SPLIT_FN void st_master_split_bits(uint32_t x, uint16_t *hi, int16_t *lo) {
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x007fffffu)) { /* NaN */
    *hi = (uint16_t)((x >> 16) | 0x0040u);
    *lo = 0;
    return;
  }
  /* |x| <= 0x7f800000 here, so the carry never reaches the sign bit */
  const uint32_t h = (x + 0x8000u) >> 16;
  *hi = (uint16_t)h;
  *lo = (int16_t)(int32_t)(x - (h << 16));
}

/* bf16 bits hi and rest lo -> the fp32 bit pattern. */
ST_SPLIT_FN uint32_t st_master_join_bits(uint16_t hi, int16_t lo) {
  return ((uint32_t)hi << 16) + (uint32_t)(int32_t)lo;
}

/* The float forms of the two above. */
ST_SPLIT_FN void st_master_split(float x, uint16_t *hi, int16_t *lo) {
#ifdef __CUDA_ARCH__
  const uint32_t b = __float_as_uint(x);
#else
  uint32_t b;
  memcpy(&b, &x, sizeof b);
#endif
  st_master_split_bits(b, hi, lo);
}

ST_SPLIT_FN float st_master_join(uint16_t hi, int16_t lo) {
  const uint32_t b = st_master_join_bits(hi, lo);
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
#endif
}

#undef ST_SPLIT_FN
#endif
