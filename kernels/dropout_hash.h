/* dropout_hash.h - the counter-based uniform draw behind the dropout op, one
 * definition for the CPU and CUDA backends so that both keep the same
 * elements. splitmix64's finaliser (Steele, Lea & Flood 2014) of seed + i
 * times the golden-ratio increment; the top 24 bits make a float in [0, 1). */
#ifndef ST_DROPOUT_HASH_H
#define ST_DROPOUT_HASH_H

#include <stdint.h>

#ifdef __CUDACC__
#define ST_HD __host__ __device__ __forceinline__
#else
#define ST_HD static inline
#endif

ST_HD float st_dropout_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

#undef ST_HD
#endif
