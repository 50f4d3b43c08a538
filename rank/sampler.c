/* sampler.c - next-token choice (see sampler.h). */
#include "rank/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int st_sampler_init(st_sampler *s, const st_sampler_opts *o, int V) {
  memset(s, 0, sizeof *s);
  const int U = ST_EXIT_USAGE;
  if (!(o->temperature >= 0.0f) || !isfinite(o->temperature))
    return st_error_setc(U, "--temperature %g: give a number >= 0 (0 is greedy)",
                         (double)o->temperature);
  if (o->top_k < 0)
    return st_error_setc(U, "--top-k %d: give a count >= 1 (or 0 for no limit)", o->top_k);
  if (!(o->top_p > 0.0f && o->top_p <= 1.0f))
    return st_error_setc(U, "--top-p %g: give a probability in (0, 1] (1 for no limit)",
                         (double)o->top_p);
  s->o = *o;
  s->V = V;
  s->prob = malloc((size_t)V * sizeof *s->prob);
  s->order = malloc((size_t)V * sizeof *s->order);
  if (!s->prob || !s->order) {
    st_sampler_free(s);
    return st_error_set("cannot allocate the sampler's work for %d tokens", V);
  }
  return 0;
}

static const float *g_logits; /* qsort has no context argument in C11 */
static int by_logit(const void *a, const void *b) {
  const int i = *(const int *)a, j = *(const int *)b;
  if (g_logits[i] != g_logits[j]) return g_logits[i] > g_logits[j] ? -1 : 1;
  return i - j;
}

static int argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

int st_sampler_next(st_sampler *s, const float *logits, st_rng *rng) {
  const st_sampler_opts *o = &s->o;
  if (o->temperature == 0.0f) return argmax(logits, s->V);
  /* candidates: every token in id order, or the top-k / top-p ones sorted */
  int n = s->V;
  const int sorted = o->top_k > 0 || o->top_p < 1.0f;
  for (int i = 0; i < n; i++) s->order[i] = i;
  if (sorted) {
    g_logits = logits;
    qsort(s->order, (size_t)n, sizeof *s->order, by_logit);
    if (o->top_k > 0 && o->top_k < n) n = o->top_k;
  }
  const float maxv = logits[sorted ? s->order[0] : argmax(logits, n)];
  double sum = 0.0;
  for (int i = 0; i < n; i++) {
    s->prob[i] = expf((logits[s->order[i]] - maxv) / o->temperature);
    sum += s->prob[i];
  }
  if (o->top_p < 1.0f) {
    /* the fewest leading (most likely) candidates with mass >= top_p; at least one */
    double cum = 0.0, kept = 0.0;
    int m = 0;
    while (m < n) {
      cum += s->prob[m] / sum;
      kept += s->prob[m];
      m++;
      if (cum >= o->top_p) break;
    }
    n = m;
    sum = kept;
  }
  const double u = (double)st_rng_uniform(rng) * sum;
  double cum = 0.0;
  for (int i = 0; i < n; i++) {
    cum += s->prob[i];
    if (u < cum) return s->order[i];
  }
  return s->order[n - 1]; /* u within rounding of sum */
}

void st_sampler_free(st_sampler *s) {
  free(s->prob);
  free(s->order);
  memset(s, 0, sizeof *s);
}
