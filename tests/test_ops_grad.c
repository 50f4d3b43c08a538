/* test_ops_grad.c - every CPU op's backward against central finite
 * differences, and the whole model's gradient likewise.
 * The check and its tolerance: tests/fd_check.h.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/ops.h"
#include "rank/model/model.h"
#include "tests/fd_check.h"
#include "tests/recompute_check.h"
#include "util/rng.h"

static const st_ops *ops;

/* ---- matmul ---- */
typedef struct { float *out, *inp, *w, *b, *R; int N, C, OC; } mm_ctx;
static double mm_loss(void *p) {
  mm_ctx *c = p;
  ops->matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->C, c->OC);
  return dot(c->out, c->R, (int64_t)c->N * c->OC);
}
static void test_matmul(void **state) {
  (void)state;
  mm_ctx c = {.N = 9, .C = 13, .OC = 70};
  c.inp = randn(c.N * c.C, 1); c.w = randn(c.OC * c.C, 1); c.b = randn(c.OC, 1);
  c.R = randn(c.N * c.OC, 1); c.out = zeros(c.N * c.OC);
  float *di = zeros(c.N * c.C), *dw = zeros(c.OC * c.C), *db = zeros(c.OC);
  ops->matmul_backward(di, dw, db, c.R, c.inp, c.w, c.N, c.C, c.OC);
  int bad = check("matmul dinp", c.inp, di, c.N * c.C, mm_loss, &c, 200) +
            check("matmul dw", c.w, dw, c.OC * c.C, mm_loss, &c, 200) +
            check("matmul dbias", c.b, db, c.OC, mm_loss, &c, 70);
  assert_int_equal(bad, 0);
  /* The projection into the residual stream is the two ops, bit for bit
   * (the model's forward relies on it for its CPU golden files). Two row
   * counts: the few-rows path and the tiled one. */
  for (int n = 2; n <= c.N; n += c.N - 2) {
    const int64_t no = (int64_t)n * c.OC;
    float *res = randn(no, 1), *fused = zeros(no), *two = zeros(no);
    ops->matmul_residual_forward(fused, c.inp, c.w, c.b, res, n, c.C, c.OC);
    ops->matmul_forward(two, c.inp, c.w, c.b, n, c.C, c.OC);
    ops->residual_forward(two, res, two, no);
    assert_memory_equal(fused, two, (size_t)no * sizeof(float));
    assert_true(fused[0] != 0.0f);
    free(res); free(fused); free(two);
  }
  free(c.inp); free(c.w); free(c.b); free(c.R); free(c.out); free(di); free(dw); free(db);
}

/* ---- layernorm ---- */
typedef struct { float *out, *mean, *rstd, *inp, *w, *b, *R; int N, C; } ln_ctx;
static double ln_loss(void *p) {
  ln_ctx *c = p;
  ops->layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
  return dot(c->out, c->R, (int64_t)c->N * c->C);
}
static void test_layernorm(void **state) {
  (void)state;
  ln_ctx c = {.N = 7, .C = 40};
  c.inp = randn(c.N * c.C, 2); c.w = randn(c.C, 1); c.b = randn(c.C, 1); c.R = randn(c.N * c.C, 1);
  c.out = zeros(c.N * c.C); c.mean = zeros(c.N); c.rstd = zeros(c.N);
  ln_loss(&c);
  float *di = zeros(c.N * c.C), *dw = zeros(c.C), *db = zeros(c.C);
  ops->layernorm_backward(di, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, c.N, c.C);
  int bad = check("layernorm dinp", c.inp, di, c.N * c.C, ln_loss, &c, 280) +
            check("layernorm dw", c.w, dw, c.C, ln_loss, &c, 40) +
            check("layernorm db", c.b, db, c.C, ln_loss, &c, 40);
  assert_int_equal(bad, 0);
  free(c.inp); free(c.w); free(c.b); free(c.R); free(c.out); free(c.mean); free(c.rstd);
  free(di); free(dw); free(db);
}

/* ---- attention ---- */
typedef struct { float *out, *att, *qkv, *R; int B, T, C, NH; } at_ctx;
static double at_loss(void *p) {
  at_ctx *c = p;
  ops->attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH, c->NH);
  return dot(c->out, c->R, (int64_t)c->B * c->T * c->C);
}
static void test_attention(void **state) {
  (void)state;
  at_ctx c = {.B = 2, .T = 6, .C = 12, .NH = 3};
  int64_t n = (int64_t)c.B * c.T * 3 * c.C;
  c.qkv = randn(n, 1); c.R = randn((int64_t)c.B * c.T * c.C, 1);
  c.out = zeros((int64_t)c.B * c.T * c.C); c.att = zeros((int64_t)c.B * c.NH * c.T * c.T);
  at_loss(&c);
  float *dqkv = zeros(n), *datt = zeros((int64_t)c.B * c.NH * c.T * c.T);
  ops->attention_backward(dqkv, datt, c.R, c.qkv, c.out, c.att, c.B, c.T, c.C, c.NH, c.NH);
  assert_int_equal(check("attention dqkv", c.qkv, dqkv, n, at_loss, &c, 432), 0);
  /* Causality: the first position's output must not depend on later keys. */
  float before = c.out[0];
  c.qkv[(int64_t)(c.T - 1) * 3 * c.C + c.C] += 5.0f;
  at_loss(&c);
  assert_true(c.out[0] == before);
  free(c.qkv); free(c.R); free(c.out); free(c.att); free(dqkv); free(datt);
}

/* ---- gelu ---- */
typedef struct { float *out, *inp, *R; int64_t n; } ge_ctx;
static double ge_loss(void *p) {
  ge_ctx *c = p;
  ops->gelu_forward(c->out, c->inp, c->n);
  return dot(c->out, c->R, c->n);
}
static void test_gelu(void **state) {
  (void)state;
  ge_ctx c = {.n = 300};
  c.inp = randn(c.n, 3); c.R = randn(c.n, 1); c.out = zeros(c.n);
  float *di = zeros(c.n);
  ops->gelu_backward(di, c.inp, c.R, c.n);
  assert_int_equal(check("gelu", c.inp, di, c.n, ge_loss, &c, 300), 0);
  /* Known value: gelu_tanh(1) = 0.841192. */
  float one = 1.0f, y;
  ops->gelu_forward(&y, &one, 1);
  assert_float_equal(y, 0.841192f, 1e-5f);
  free(c.inp); free(c.R); free(c.out); free(di);
}

/* ---- encoder ---- */
typedef struct { float *out, *wte, *wpe, *R; int *inp; int B, T, C; } en_ctx;
static double en_loss(void *p) {
  en_ctx *c = p;
  ops->encoder_forward(c->out, c->inp, c->wte, c->wpe, c->B, c->T, c->C);
  return dot(c->out, c->R, (int64_t)c->B * c->T * c->C);
}
static void test_encoder(void **state) {
  (void)state;
  en_ctx c = {.B = 2, .T = 5, .C = 8};
  int V = 6;
  int toks[10] = {1, 3, 3, 0, 5, 3, 1, 1, 2, 4}; /* repeats: rows collide */
  c.inp = toks;
  c.wte = randn(V * c.C, 1); c.wpe = randn(c.T * c.C, 1); c.R = randn(c.B * c.T * c.C, 1);
  c.out = zeros(c.B * c.T * c.C);
  float *dwte = zeros(V * c.C), *dwpe = zeros(c.T * c.C);
  ops->encoder_backward(dwte, dwpe, c.R, c.inp, c.B, c.T, c.C, NULL, 0);
  int bad = check("encoder dwte", c.wte, dwte, V * c.C, en_loss, &c, 48) +
            check("encoder dwpe", c.wpe, dwpe, c.T * c.C, en_loss, &c, 40);
  assert_int_equal(bad, 0);
  free(c.wte); free(c.wpe); free(c.R); free(c.out); free(dwte); free(dwpe);
}

/* ---- softmax cross-entropy with padded vocabulary ---- */
typedef struct { float *logits, *loss; int *tgt; int N, V, Vp; } ce_ctx;
static double ce_loss(void *p) {
  ce_ctx *c = p;
  ops->softmax_crossentropy(c->loss, NULL, c->logits, c->tgt, 0.0f, c->N, c->V, c->Vp);
  double s = 0;
  for (int i = 0; i < c->N; i++) s += c->loss[i];
  return s * 0.5; /* dloss = 0.5 */
}
static void test_crossentropy(void **state) {
  (void)state;
  ce_ctx c = {.N = 5, .V = 20, .Vp = 32};
  int tg[5] = {0, 19, 7, 7, 3};
  c.tgt = tg;
  c.logits = randn(c.N * c.Vp, 2); c.loss = zeros(c.N);
  for (int n = 0; n < c.N; n++) c.logits[n * c.Vp + 25] = 100.0f; /* padded: must never win */
  float *d = zeros(c.N * c.Vp);
  ops->softmax_crossentropy(c.loss, d, c.logits, c.tgt, 0.5f, c.N, c.V, c.Vp);
  assert_int_equal(check("crossentropy dlogits", c.logits, d, c.N * c.Vp, ce_loss, &c, 160), 0);
  for (int n = 0; n < c.N; n++) {
    assert_true(c.loss[n] < 50.0f); /* the padded 100 was ignored */
    for (int v = c.V; v < c.Vp; v++) assert_true(d[n * c.Vp + v] == 0.0f);
  }
  free(c.logits); free(c.loss); free(d);
}

/* ---- AdamW against a hand-computed step ---- */
static void test_adamw(void **state) {
  (void)state;
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  ops->adamw_update(&p, &g, ST_FP32, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f, 1,
                    NULL);
  /* step 1: m_hat = g, v_hat = g^2 -> update = 1; p = 1*(1-0.001) - 0.1*1 */
  assert_float_equal(p, 0.899f, 1e-6f);
  assert_float_equal(m, 0.05f, 1e-7f);
  assert_float_equal(v, 0.00025f, 1e-8f);
  float x[3] = {1, 2, 3};
  assert_true(fabs(ops->sum_squares(x, ST_FP32, 3) - 14.0) < 1e-12);
  /* bf16 gradients: 0.5 is exact, so the same step from its bits */
  float p2 = 1.0f, m2 = 0.0f, v2 = 0.0f;
  const uint16_t g16 = 0x3f00; /* 0.5 */
  ops->adamw_update(&p2, &g16, ST_BF16, &m2, &v2, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f, 1,
                    NULL);
  assert_true(p2 == p && m2 == m && v2 == v);
  const uint16_t x16[3] = {0x3f80, 0x4000, 0x4040}; /* 1, 2, 3 */
  assert_true(ops->sum_squares(x16, ST_BF16, 3) == 14.0);
}

/* ---- the whole model: forward loss vs backward gradients ---- */
typedef struct { st_model *m; int *inp, *tgt; int B, T; } md_ctx;
static double md_loss(void *p) {
  md_ctx *c = p;
  return st_model_forward(c->m, c->inp, c->tgt, c->B, c->T, 0.0f) / (c->B * c->T);
}
static void test_model(void **state) {
  (void)state;
  st_model_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8,
                         .vocab_size = 50};
  assert_int_equal(st_model_validate(&cfg), 0);
  assert_int_equal(cfg.padded_vocab_size, 128);
  st_model m;
  assert_int_equal(st_model_init(&m, &cfg, ops, 2, 8, 1, ST_RECOMPUTE_NONE), 0);
  st_rng r;
  st_rng_seed(&r, 7);
  st_model_init_weights(&m, &r);
  /* Larger weights than GPT-2's init so every path carries signal. */
  float *mp = m.params; /* the CPU table's storage dtype is fp32 */
  for (int64_t i = 0; i < m.tab.total; i++) mp[i] += 0.1f * st_rng_normal(&r);
  int inp[16], tgt[16];
  for (int i = 0; i < 16; i++) {
    inp[i] = (int)(st_rng_next(&r) % 50);
    tgt[i] = (int)(st_rng_next(&r) % 50);
  }
  md_ctx c = {&m, inp, tgt, 2, 8};
  st_model_zero_grad(&m);
  st_model_forward(&m, inp, tgt, 2, 8, 1.0f / 16);
  st_model_backward(&m, inp, 2, 8);
  float *grad = malloc((size_t)m.tab.total * sizeof(float));
  memcpy(grad, m.grads, (size_t)m.tab.total * sizeof(float));
  int bad = 0;
  for (int i = 0; i < m.tab.n; i++) {
    const st_tensor *t = &m.tab.t[i];
    bad += check(t->name, mp + t->offset, grad + t->offset, t->numel, md_loss, &c, 24);
  }
  assert_int_equal(bad, 0);
  /* Padded vocabulary rows get exactly zero gradient. */
  for (int64_t i = 50 * 16; i < 128 * 16; i++) assert_true(grad[i] == 0.0f);
  free(grad);
  st_model_free(&m);
}

/* ---- recompute: act, selective and full give the same loss and gradients,
 * bit for bit, as keeping everything, over two micro-steps (accumulation),
 * and each needs less activation memory than the one before. ---- */
static void run_policy(st_recompute rec, double *loss, float *grad, size_t *act_bytes) {
  st_model_config cfg = {.n_layer = 3, .n_head = 2, .n_embd = 16, .block_size = 8,
                         .vocab_size = 50};
  assert_int_equal(st_model_validate(&cfg), 0);
  st_model m;
  assert_int_equal(st_model_init(&m, &cfg, ops, 2, 8, 1, rec), 0);
  st_rng r;
  st_rng_seed(&r, 11);
  st_model_init_weights(&m, &r);
  int inp[16], tgt[16];
  st_model_zero_grad(&m);
  *loss = 0;
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < 16; i++) {
      inp[i] = (int)(st_rng_next(&r) % 50);
      tgt[i] = (int)(st_rng_next(&r) % 50);
    }
    *loss += st_model_forward(&m, inp, tgt, 2, 8, 1.0f / 32);
    st_model_backward(&m, inp, 2, 8);
  }
  memcpy(grad, m.grads, (size_t)m.tab.total * sizeof(float));
  *act_bytes = m.act_bytes;
  st_model_free(&m);
}

static void run_policy_ctx(void *ctx, st_recompute rec, double *loss, float *grad,
                           size_t *act_bytes) {
  (void)ctx;
  run_policy(rec, loss, grad, act_bytes);
}

static void test_recompute(void **state) {
  (void)state;
  recompute_check("gpt2", 1 << 16, run_policy_ctx, NULL);
}

int main(void) {
  st_rng_seed(&g_rng, 42);
  ops = st_ops_cpu();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul),    cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_attention), cmocka_unit_test(test_gelu),
      cmocka_unit_test(test_encoder),   cmocka_unit_test(test_crossentropy),
      cmocka_unit_test(test_adamw),     cmocka_unit_test(test_model),
      cmocka_unit_test(test_recompute),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
