/* rng.h - the run's random number generator: xorshift128+ (Vigna 2014),
 * seeded with splitmix64. Small state (two uint64) so checkpoints carry it. */
#ifndef ST_RNG_H
#define ST_RNG_H

#include <stdint.h>

typedef struct {
  uint64_t s[2];
} st_rng;

void st_rng_seed(st_rng *r, uint64_t seed);
uint64_t st_rng_next(st_rng *r);
/* Uniform in [0, 1). */
float st_rng_uniform(st_rng *r);
/* Standard normal via Box-Muller. */
float st_rng_normal(st_rng *r);

#endif
