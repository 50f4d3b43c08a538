/* lora_fixtures.h - the models and checks the CPU LoRA tests share
 * (test_lora.c, test_qlora.c); include after <cmocka.h>.
 *
 * Every model here runs micro-batch 2 x 8 tokens (16 in all). The adapters'
 * gradients are checked against central differences along a random
 * direction over each tensor, h = 1e-2 on a mean loss near 4.2: fp32
 * rounding of the two losses is about 1e-7 * 4.2 / 1e-2 = 4e-5 (the largest
 * error seen when written was 7e-5 on a 2e-3 gradient), so the checks allow
 * 1e-2 relative + 1e-4.
 */
#ifndef ST_TESTS_LORA_FIXTURES_H
#define ST_TESTS_LORA_FIXTURES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "rank/model/config.h"
#include "rank/model/lora.h"
#include "rank/model/model.h"
#include "tests/tiny_config.h"
#include "util/rng.h"

/* The ops under test (the CPU reference): main sets them before the tests. */
static const st_ops *ops;

static inline st_model_config gpt2_cfg(void) {
  st_model_config c = tiny_config(ST_ARCH_GPT2);
  assert_int_equal(st_model_validate(&c), 0);
  return c;
}

static inline st_model_config llama_cfg(void) {
  st_model_config c = tiny_llama_shape();
  assert_int_equal(st_model_validate(&c), 0);
  return c;
}

/* The --lora spec parsed and resolved for c's family (base in fp32). */
static inline st_lora_config lora_of(const st_model_config *c, const char *spec) {
  st_lora_config l;
  assert_int_equal(st_lora_parse(spec, &l), 0);
  assert_int_equal(st_lora_resolve(&l, c), 0);
  return l;
}

static inline void random_tokens(int *x, int n, int V, st_rng *r) {
  for (int i = 0; i < n; i++) x[i] = (int)(st_rng_next(r) % (uint64_t)V);
}

/* Base weights drawn like a model's, plus noise on every entry so that
 * biases and gains are not their trivial values; *n is the table's total. */
static inline float *base_weights(const st_model_config *c, int64_t *n, uint64_t seed) {
  st_model plain;
  assert_int_equal(st_model_init(&plain, c, ops, 1, 1, 1, ST_RECOMPUTE_NONE), 0);
  float *w = calloc((size_t)plain.padded_total, sizeof(float));
  st_rng r;
  st_rng_seed(&r, seed);
  st_model_draw_weights(&plain, &r, w);
  for (int64_t i = 0; i < plain.tab.total; i++) w[i] += 0.05f * st_rng_normal(&r);
  *n = plain.tab.total;
  st_model_free(&plain);
  return w;
}

/* A LoRA model (QLoRA with l->nf4_base) on base w, adapters drawn (B = 0)
 * or, with b_std > 0, B random too; dropout on, with a fixed seed. */
static inline void lora_model(st_model *m, const st_model_config *c, const st_lora_config *l,
                              const float *w, float b_std, st_recompute rec, uint64_t seed) {
  assert_int_equal(st_model_init_lora(m, c, l, ops, 2, 8, 1, rec, 0), 0);
  assert_int_equal(st_model_set_base_weights(m, w), 0);
  float *ad = calloc((size_t)m->padded_total, sizeof(float));
  st_rng r;
  st_rng_seed(&r, seed);
  assert_int_equal(st_model_draw_weights(m, &r, ad), 0);
  if (b_std > 0)
    for (int i = 0; i < m->ltab.n; i++) {
      const st_lora_slot *s = &m->ltab.slot[i];
      for (int64_t k = 0; k < (int64_t)s->out * l->rank; k++)
        ad[s->b_off + k] = b_std * st_rng_normal(&r);
    }
  assert_int_equal(st_model_set_weights(m, ad), 0);
  m->lora_seed = 0x1234;
  m->lora_dropout_on = 1;
  free(ad);
}

typedef struct {
  st_model *m;
  int *inp, *tgt;
} fd_ctx;

static inline double loss_of(fd_ctx *c) {
  return st_model_forward(c->m, c->inp, c->tgt, 2, 8, 0.0f) / 16.0;
}

/* Central difference along dir of the adapters (fp32 host copy ad). */
static inline double fd_along(fd_ctx *c, const float *ad, const float *dir, int64_t n,
                              double h) {
  float *p = malloc((size_t)n * sizeof(float));
  assert_non_null(p);
  for (int64_t k = 0; k < n; k++) p[k] = ad[k] + (float)h * dir[k];
  st_model_set_weights(c->m, p);
  double lp = loss_of(c);
  for (int64_t k = 0; k < n; k++) p[k] = ad[k] - (float)h * dir[k];
  st_model_set_weights(c->m, p);
  double lm = loss_of(c);
  st_model_set_weights(c->m, ad);
  free(p);
  return (lp - lm) / (2 * h);
}

/* One adapter gradient against its central difference: a failure is printed
 * (spec, tensor name, entry k or -1 for a direction) and counted in *bad. */
static inline void fd_compare(const char *spec, const char *name, int64_t k, double ana,
                              double num, double *worst, int *bad) {
  const double err = fabs(ana - num), scale = fmax(fabs(ana), fabs(num));
  if (err > *worst) *worst = err;
  if (err > 1e-2 * scale + 1e-4) {
    if (k < 0)
      print_error("%s %s: analytic %.7g numeric %.7g\n", spec, name, ana, num);
    else
      print_error("%s %s[%lld]: analytic %.7g numeric %.7g\n", spec, name, (long long)k, ana,
                  num);
    (*bad)++;
  }
}

/* The adapters' gradients of the model l on c (B random, recompute rec)
 * against central differences: one random direction over each adapter
 * tensor and, with entries, a few of its single entries too. spec names
 * the case in the messages. */
static inline void fd_adapters(const st_model_config *c, const st_lora_config *l,
                               const char *spec, st_recompute rec, int entries) {
  int64_t nb;
  float *w = base_weights(c, &nb, 11);
  st_model m;
  lora_model(&m, c, l, w, 0.2f, rec, 13);
  st_rng r;
  st_rng_seed(&r, 7);
  int inp[16], tgt[16];
  random_tokens(inp, 16, c->vocab_size, &r);
  random_tokens(tgt, 16, c->vocab_size, &r);
  fd_ctx ctx = {&m, inp, tgt};
  st_model_zero_grad(&m);
  st_model_forward(&m, inp, tgt, 2, 8, 1.0f / 16);
  st_model_backward(&m, inp, 2, 8);
  const int64_t n = m.padded_total;
  float *g = malloc((size_t)n * sizeof(float)), *ad = malloc((size_t)n * sizeof(float));
  float *dir = calloc((size_t)n, sizeof(float));
  memcpy(g, m.grads, (size_t)n * sizeof(float));
  st_model_get_weights(&m, ad);
  int bad = 0;
  double worst = 0;
  for (int i = 0; i < m.tab.n; i++) {
    const st_tensor *t = &m.tab.t[i];
    double ana = 0;
    memset(dir, 0, (size_t)n * sizeof(float));
    for (int64_t k = 0; k < t->numel; k++) {
      dir[t->offset + k] = st_rng_normal(&r) / sqrtf((float)t->numel);
      ana += (double)dir[t->offset + k] * g[t->offset + k];
    }
    fd_compare(spec, t->name, -1, ana, fd_along(&ctx, ad, dir, n, 1e-2), &worst, &bad);
    for (int64_t k = 0; entries && k < t->numel; k += t->numel / 3 + 1) {
      memset(dir, 0, (size_t)n * sizeof(float));
      dir[t->offset + k] = 1.0f;
      fd_compare(spec, t->name, k, g[t->offset + k], fd_along(&ctx, ad, dir, n, 1e-2), &worst,
                 &bad);
    }
  }
  printf("   %s%s (%s): %d tensors, max |analytic - numeric| %.2e\n",
         l->nf4_base ? "QLoRA " : "", st_arch_name(c->arch), spec, m.tab.n, worst);
  assert_int_equal(bad, 0);
  free(g), free(ad), free(dir), free(w);
  st_model_free(&m);
}

/* none, act, selective and full give the same loss and adapter gradients,
 * bit for bit, for the model l on c. */
static inline void recompute_agree(const st_model_config *c, const st_lora_config *l) {
  int64_t nb;
  float *w = base_weights(c, &nb, 31);
  double loss[ST_RECOMPUTE_POLICIES];
  float *grad[ST_RECOMPUTE_POLICIES];
  st_rng r;
  int inp[16], tgt[16];
  for (int p = 0; p < ST_RECOMPUTE_POLICIES; p++) {
    st_model m;
    lora_model(&m, c, l, w, 0.2f, (st_recompute)p, 37);
    st_rng_seed(&r, 41);
    random_tokens(inp, 16, c->vocab_size, &r);
    random_tokens(tgt, 16, c->vocab_size, &r);
    st_model_zero_grad(&m);
    loss[p] = st_model_forward(&m, inp, tgt, 2, 8, 1.0f / 16);
    st_model_backward(&m, inp, 2, 8);
    grad[p] = malloc((size_t)m.padded_total * sizeof(float));
    memcpy(grad[p], m.grads, (size_t)m.padded_total * sizeof(float));
    if (p) {
      assert_true(loss[p] == loss[0]);
      assert_memory_equal(grad[p], grad[0], (size_t)m.padded_total * sizeof(float));
    }
    st_model_free(&m);
  }
  for (int p = 0; p < ST_RECOMPUTE_POLICIES; p++) free(grad[p]);
  free(w);
}

#endif
