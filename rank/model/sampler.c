/* sampler.c - next-token choice (see sampler.h). */
#include "rank/model/sampler.h"

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

/* 1 when token i comes before token j in the candidates' order: the
 * larger logit first, the lower id among equal logits (as by_logit). */
static int before(const float *x, int i, int j) { return x[i] > x[j] || (x[i] == x[j] && i < j); }

/* The first k tokens of that order, sorted, into order[0 .. k): a heap of
 * the k best seen so far whose root is the last of them, O(V log k), so
 * top-k does not sort the whole vocabulary for every token. */
static void select_top_k(const float *x, int V, int k, int *order) {
  int n = 0;
  for (int i = 0; i < V; i++) {
    int c;
    if (n < k) {
      c = n++;
      order[c] = i;
      while (c > 0 && before(x, order[(c - 1) / 2], order[c])) { /* parent better: up */
        const int p = (c - 1) / 2, t = order[p];
        order[p] = order[c];
        order[c] = t;
        c = p;
      }
    } else if (before(x, i, order[0])) {
      order[0] = i;
      for (c = 0;;) { /* sift the new root down below every worse child */
        int w = c;
        const int l = 2 * c + 1, r = l + 1;
        if (l < k && before(x, order[w], order[l])) w = l;
        if (r < k && before(x, order[w], order[r])) w = r;
        if (w == c) break;
        const int t = order[w];
        order[w] = order[c];
        order[c] = t;
        c = w;
      }
    }
  }
  g_logits = x;
  qsort(order, (size_t)k, sizeof *order, by_logit);
}

/* Every token with a logit >= t, sorted, into order: a leading part of the
 * whole order (nothing outside ranks before anything inside). */
static int gather_above(const float *x, int V, float t, int *order) {
  int n = 0;
  for (int i = 0; i < V; i++)
    if (x[i] >= t) order[n++] = i;
  g_logits = x;
  qsort(order, (size_t)n, sizeof *order, by_logit);
  return n;
}

int st_sampler_next(st_sampler *s, const float *logits, st_rng *rng) {
  const st_sampler_opts *o = &s->o;
  const float T = o->temperature;
  if (T == 0.0f) return argmax(logits, s->V);
  const int V = s->V;
  const float maxv = logits[argmax(logits, V)];
  int n = V;
  double sum = 0.0;
  if (o->top_k > 0 && o->top_k < V) {
    n = o->top_k;
    select_top_k(logits, V, n, s->order);
  } else if (o->top_p < 1.0f) {
    /* The nucleus is a leading part of the order: sort only the tokens
     * above a logit threshold, lowered until they hold top_p of the mass
     * (each step doubles the log-probability range taken). */
    for (int i = 0; i < V; i++) sum += expf((logits[i] - maxv) / T);
    for (float range = 8.0f * T;; range *= 2.0f) {
      n = gather_above(logits, V, range > 1e30f ? -INFINITY : maxv - range, s->order);
      double cum = 0.0;
      int m = 0;
      while (m < n && cum < o->top_p * sum) cum += expf((logits[s->order[m++]] - maxv) / T);
      if (cum >= o->top_p * sum || n == V) {
        n = m > 0 ? m : 1;
        break;
      }
    }
  } else {
    for (int i = 0; i < n; i++) s->order[i] = i;
  }
  double kept = 0.0;
  for (int i = 0; i < n; i++) {
    s->prob[i] = expf((logits[s->order[i]] - maxv) / T);
    kept += s->prob[i];
  }
  if (o->top_k > 0 && o->top_k < V && o->top_p < 1.0f) {
    /* top-k, then the fewest leading of those k with mass >= top_p of theirs */
    double cum = 0.0, part = 0.0;
    int m = 0;
    while (m < n) {
      cum += s->prob[m] / kept;
      part += s->prob[m];
      m++;
      if (cum >= o->top_p) break;
    }
    n = m;
    kept = part;
  }
  const double u = (double)st_rng_uniform(rng) * kept;
  double cum = 0.0;
  for (int i = 0; i < n; i++) {
    cum += s->prob[i];
    if (u < cum) return s->order[i];
  }
  return s->order[n - 1]; /* u within rounding of the sum */
}

void st_sampler_free(st_sampler *s) {
  free(s->prob);
  free(s->order);
  memset(s, 0, sizeof *s);
}
