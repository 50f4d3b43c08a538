/* sampler.h - choosing the next token from one row of logits, on the host:
 * greedy, or temperature sampling restricted by top-k and top-p (nucleus,
 * Holtzman et al. 2020), drawn from util/rng.h so a seed repeats. */
#ifndef ST_SAMPLER_H
#define ST_SAMPLER_H

#include "util/rng.h"

typedef struct {
  float temperature; /* 0: greedy (argmax); > 0: softmax(logits / temperature) */
  int top_k;         /* 0: off; k: only the k most likely tokens */
  float top_p;       /* 1: off; p in (0, 1]: the fewest most likely tokens whose
                      * probabilities (after temperature and top-k) add up to >= p */
} st_sampler_opts;

typedef struct {
  st_sampler_opts o;
  int V;        /* tokens that may be chosen: logits[0 .. V-1] (padded columns never) */
  float *prob;  /* [V] work */
  int *order;   /* [V] work */
} st_sampler;

/* Check o (one line naming the flag, usage class) and allocate work for V
 * tokens. 0 or -1 with st_error. */
int st_sampler_init(st_sampler *s, const st_sampler_opts *o, int V);
/* The next token from logits[0 .. V-1] (fp32). Greedy takes the first
 * maximum (the lowest id among equal logits, as torch.argmax); sampling
 * orders candidates by logit, ties by id, and draws one uniform number
 * from rng per token. */
int st_sampler_next(st_sampler *s, const float *logits, st_rng *rng);
void st_sampler_free(st_sampler *s);

#endif
