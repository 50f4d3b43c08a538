/* rng.c - xorshift128+ with splitmix64 seeding (see rng.h). */
#include "util/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void st_rng_seed(st_rng *r, uint64_t seed) {
  r->s[0] = splitmix64(&seed);
  r->s[1] = splitmix64(&seed);
}

uint64_t st_rng_next(st_rng *r) {
  uint64_t s1 = r->s[0];
  const uint64_t s0 = r->s[1];
  r->s[0] = s0;
  s1 ^= s1 << 23;
  r->s[1] = s1 ^ s0 ^ (s1 >> 17) ^ (s0 >> 26);
  return r->s[1] + s0;
}

float st_rng_uniform(st_rng *r) { return (float)(st_rng_next(r) >> 40) / 16777216.0f; }

float st_rng_normal(st_rng *r) {
  float u1 = st_rng_uniform(r), u2 = st_rng_uniform(r);
  if (u1 < 1e-7f) u1 = 1e-7f;
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}
