/* test_model_family.c - the one model definition (rank/model/) on Llama-
 * and Qwen2-shaped descriptions, CPU fp32 backend.
 *
 * Two small configs: llama-style (2 layers, C=32, NH=4, NKV=2, F=48, vocab
 * 67, RMSNorm, RoPE theta 1e4 with Llama 3 scaling whose bands all fall in
 * the head's 4 frequencies, SwiGLU, no biases, untied head) and qwen2-style
 * (q/k/v biases, tied head, NKV=1: MQA, RMSNorm eps 1e-6, theta 1e6).
 *
 *  - the parameter table: names and order of DESIGN.md's checkpoint format,
 *    st_model_num_params equal to its total, and the published parameter
 *    counts of Llama-3.2-1B, Llama-3.1-8B, Qwen2.5-0.5B and SmolLM2-135M
 *    (their safetensors' totals) from the presets;
 *  - initial weights as Hugging Face draws them: every matrix N(0, 0.02),
 *    RMSNorm gains 1, biases 0, padded vocabulary rows 0;
 *  - the RoPE table against inv_freq in double (HF's formula), each Llama 3
 *    band (kept, interpolated, divided by factor) present;
 *  - the whole-model gradient of every parameter tensor against central
 *    finite differences of the mean loss (fp32 forward, differences in
 *    double), on sampled entries and on one random direction over the whole
 *    tensor; padded vocabulary rows get exactly zero gradient;
 *  - recompute none / act / selective / full: loss and gradients bit for bit equal
 *    over two accumulated micro-steps (SwiGLU is never fused, so selective's
 *    forward is none's), and less activation memory;
 *  - ZeRO 2's bucketed backward, gathered through the hooks, bit for bit
 *    the full-vector backward, its ranges those st_model_grad_ranges walks;
 *  - st_model_measure_acts equal to the act_mem st_model_init allocates,
 *    parts adding up, for every policy;
 *  - the LM head in chunks (ST_HEAD_CHUNK_ROWS=5 of 48 rows, the last
 *    chunk short), tied (qwen2) and untied (llama), full vector and ZeRO 2
 *    buckets: the same loss, per-token losses and logits as one chunk of
 *    all rows, gradients within 1e-6 relative over two accumulated
 *    micro-steps, the logits part of the activations 5 rows; the default
 *    chunk rule at GPT-2 and Llama 3 sizes; a bad ST_HEAD_CHUNK_ROWS
 *    refused by st_model_init.
 */
#define _XOPEN_SOURCE 700 /* setenv, and M_PI */
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
#include "rank/model/config.h"
#include "rank/model/model.h"
#include "rank/model/params.h"
#include "rank/model/rope.h"
#include "tests/recompute_check.h"
#include "tests/tiny_config.h"
#include "util/error.h"
#include "util/rng.h"

static const st_ops *ops;

static st_model_config llama_cfg(void) {
  st_model_config c = tiny_llama_shape();
  /* HD = 8: wavelengths 2 pi * {1, 10, 100, 1000}; original 1024 puts the
   * first two below high (256), the third between, the fourth above low */
  c.rope_theta = 10000.0f;
  c.rope_scaling = (st_rope_scaling){ST_ROPE_SCALING_LLAMA3, 8.0f, 1.0f, 4.0f, 1024};
  assert_int_equal(st_model_validate(&c), 0);
  return c;
}

static st_model_config qwen2_cfg(void) {
  st_model_config c = tiny_config(ST_ARCH_QWEN2);
  c.n_kv_head = 1;
  c.ffn_dim = 48;
  assert_int_equal(st_model_validate(&c), 0);
  return c;
}

static st_model_config cfg_of(int which) { return which ? qwen2_cfg() : llama_cfg(); }
static const char *name_of(int which) { return which ? "qwen2" : "llama"; }

/* Weights of scale ~0.1 around the family init, so every path carries
 * signal; norm gains around 1, biases nonzero; padded vocabulary rows 0. */
static void random_weights(st_model *m, uint64_t seed) {
  st_rng r;
  st_rng_seed(&r, seed);
  float *w = malloc((size_t)m->padded_total * sizeof(float));
  assert_non_null(w);
  assert_int_equal(st_model_draw_weights(m, &r, w), 0);
  for (int i = 0; i < m->tab.n; i++) {
    const st_tensor *t = &m->tab.t[i];
    int64_t n = t->numel;
    if (!strcmp(t->name, "wte.weight") || !strcmp(t->name, "lm_head.weight"))
      n = (int64_t)m->cfg.vocab_size * m->cfg.n_embd;
    for (int64_t k = 0; k < n; k++) w[t->offset + k] += 0.1f * st_rng_normal(&r);
  }
  assert_int_equal(st_model_set_weights(m, w), 0);
  free(w);
}

static void random_tokens(int *x, int n, int V, st_rng *r) {
  for (int i = 0; i < n; i++) x[i] = (int)(st_rng_next(r) % (uint64_t)V);
}

/* ---- the parameter table ---- */

static void test_table_names(void **state) {
  (void)state;
  static const char *llama[] = {"wte.weight", "h.0.ln_1.weight", "h.0.attn.qkv.weight",
                                "h.0.attn.proj.weight", "h.0.ln_2.weight", "h.0.mlp.fc.weight",
                                "h.0.mlp.proj.weight"};
  static const char *qwen[] = {"wte.weight", "h.0.ln_1.weight", "h.0.attn.qkv.weight",
                               "h.0.attn.qkv.bias", "h.0.attn.proj.weight", "h.0.ln_2.weight",
                               "h.0.mlp.fc.weight", "h.0.mlp.proj.weight"};
  for (int which = 0; which < 2; which++) {
    st_model_config c = cfg_of(which);
    st_param_table tab;
    assert_int_equal(st_param_table_build(&c, &tab), 0);
    const char **want = which ? qwen : llama;
    const int nhead = 1, nblock = which ? 7 : 6;
    assert_int_equal(tab.block_first, nhead);
    assert_int_equal(tab.block_tensors, nblock);
    for (int i = 0; i < nhead + nblock; i++) assert_string_equal(tab.t[i].name, want[i]);
    assert_string_equal(tab.t[nhead + nblock].name, "h.1.ln_1.weight");
    const int last = nhead + 2 * nblock;
    assert_string_equal(tab.t[last].name, "ln_f.weight");
    assert_int_equal(tab.n, last + 1 + (which ? 0 : 1));
    if (!which) assert_string_equal(tab.t[last + 1].name, "lm_head.weight");
    /* shapes: qkv (NH + 2 NKV) * HD rows, SwiGLU fc [2F, C], proj [C, F] */
    const int q = st_param_find(&tab, "h.1.attn.qkv.weight");
    assert_int_equal(tab.t[q].shape[0], (4 + 2 * c.n_kv_head) * 8);
    assert_int_equal(tab.t[q].shape[1], 32);
    const int fc = st_param_find(&tab, "h.1.mlp.fc.weight");
    assert_int_equal(tab.t[fc].shape[0], 96);
    const int pr = st_param_find(&tab, "h.1.mlp.proj.weight");
    assert_int_equal(tab.t[pr].shape[0], 32);
    assert_int_equal(tab.t[pr].shape[1], 48);
    assert_int_equal(st_param_find(&tab, "wpe.weight"), -1);
    assert_int_equal(st_param_find(&tab, "ln_f.bias"), -1);
    assert_int_equal(st_model_num_params(&c), tab.total);
    /* views: NULL where the description has no tensor */
    float *flat = calloc((size_t)tab.total, sizeof(float));
    st_param_views v;
    assert_int_equal(st_param_views_bind(&c, &tab, flat, sizeof(float), &v), 0);
    assert_null(v.wpe);
    assert_null(v.lnf_b);
    assert_null(v.h[1].ln1_b);
    assert_null(v.h[1].fc_b);
    assert_null(v.h[1].attproj_b);
    assert_true(which ? v.h[1].qkv_b != NULL && v.lm_head == NULL
                      : v.h[1].qkv_b == NULL && v.lm_head == (void *)(flat + tab.t[last + 1].offset));
    assert_ptr_equal(v.h[1].fcproj_w, flat + tab.t[pr].offset);
    st_param_views_free(&v);
    free(flat);
    st_param_table_free(&tab);
  }
}

static void test_preset_param_counts(void **state) {
  (void)state;
  /* totals of the published checkpoints (model.safetensors metadata) */
  static const struct { const char *name; int64_t n; } want[] = {
      {"llama-3.2-1b", 1235814400LL}, {"llama-3.1-8b", 8030261248LL},
      {"qwen2.5-0.5b", 494032768LL},  {"smollm2-135m", 134515008LL}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    st_model_config c;
    memset(&c, 0, sizeof c);
    assert_int_equal(st_model_preset(want[i].name, &c), 0);
    assert_int_equal(st_model_validate(&c), 0);
    assert_int_equal(c.padded_vocab_size, c.vocab_size); /* these are multiples of 128 */
    st_param_table tab;
    assert_int_equal(st_param_table_build(&c, &tab), 0);
    printf("   %s: %lld parameters\n", want[i].name, (long long)tab.total);
    assert_int_equal(tab.total, want[i].n);
    assert_int_equal(st_model_num_params(&c), want[i].n);
    st_param_table_free(&tab);
  }
  /* GPT-2 124M keeps its number */
  st_model_config g = {.block_size = 1024, .vocab_size = 50257};
  assert_int_equal(st_model_preset("gpt2-124m", &g), 0);
  assert_int_equal(st_model_validate(&g), 0);
  assert_int_equal(st_model_num_params(&g), 124475904LL);
}

/* ---- initial weights: Hugging Face's _init_weights for the family ---- */

static void test_init(void **state) {
  (void)state;
  st_model_config c = qwen2_cfg();
  c.untied = 1;
  st_model m;
  assert_int_equal(st_model_init(&m, &c, ops, 1, 1, 1, ST_RECOMPUTE_NONE), 0);
  float *w = malloc((size_t)m.padded_total * sizeof(float));
  st_rng r;
  st_rng_seed(&r, 1);
  assert_int_equal(st_model_draw_weights(&m, &r, w), 0);
  for (int i = 0; i < m.tab.n; i++) {
    const st_tensor *t = &m.tab.t[i];
    const float *x = w + t->offset;
    int64_t n = t->numel;
    if (!strcmp(t->name, "wte.weight") || !strcmp(t->name, "lm_head.weight")) {
      n = (int64_t)c.vocab_size * c.n_embd;
      for (int64_t k = n; k < t->numel; k++) assert_true(x[k] == 0.0f);
    }
    if (t->ndim == 2) { /* every matrix N(0, 0.02), projections not scaled down */
      double ss = 0;
      for (int64_t k = 0; k < n; k++) ss += (double)x[k] * x[k];
      const double sd = sqrt(ss / n);
      if (fabs(sd - 0.02) > 0.002) print_error("%s: std %g\n", t->name, sd);
      assert_true(fabs(sd - 0.02) < 0.002); /* >= 1024 draws: 2.2% standard error */
    } else {
      const float want = strstr(t->name, "bias") ? 0.0f : 1.0f; /* RMSNorm gains 1 */
      for (int64_t k = 0; k < n; k++) assert_true(x[k] == want);
    }
  }
  free(w);
  st_model_free(&m);
}

/* ---- the RoPE table ---- */

static void test_rope_table(void **state) {
  (void)state;
  st_model_config c = llama_cfg();
  const int HD = 8, T = 16;
  float cs[16 * 8];
  st_rope_table(&c, T, cs);
  const st_rope_scaling *r = &c.rope_scaling;
  int bands[3] = {0, 0, 0};
  for (int i = 0; i < HD / 2; i++) {
    /* transformers' _compute_llama3_parameters, in double */
    double f = 1.0 / pow(c.rope_theta, 2.0 * i / HD), wl = 2 * M_PI / f;
    const double lo = r->original_max_pos / r->low_freq_factor;
    const double hi = r->original_max_pos / r->high_freq_factor;
    if (wl > lo) {
      f /= r->factor;
      bands[2]++;
    } else if (wl >= hi) {
      const double s = (r->original_max_pos / wl - r->low_freq_factor) /
                       (r->high_freq_factor - r->low_freq_factor);
      f = (1 - s) * f / r->factor + s * f;
      bands[1]++;
    } else {
      bands[0]++;
    }
    for (int p = 0; p < T; p++) {
      /* fp32 inv_freq and angle: relative error ~1e-7 of the angle */
      const double tol = 4e-7 * p * f + 1e-7;
      assert_true(fabs(cs[p * HD + i] - cos(p * f)) < tol);
      assert_true(fabs(cs[p * HD + HD / 2 + i] - sin(p * f)) < tol);
    }
  }
  assert_int_equal(bands[0], 2);
  assert_int_equal(bands[1], 1);
  assert_int_equal(bands[2], 1);
  /* without scaling the last frequency is factor times larger */
  st_model_config u = c;
  u.rope_scaling.kind = ST_ROPE_SCALING_NONE;
  float cu[16 * 8];
  st_rope_table(&u, T, cu);
  assert_true(fabs(asin(cu[15 * HD + HD - 1]) / asin(cs[15 * HD + HD - 1]) - 8.0) < 1e-3);
  assert_memory_equal(cu, cs, sizeof(float)); /* p = 0, i = 0: cos 0 = 1 */
}

/* ---- gradients against finite differences ---- */

typedef struct {
  st_model *m;
  int *inp, *tgt;
  int B, T;
} fd_ctx;

static double mean_loss(fd_ctx *c) {
  return st_model_forward(c->m, c->inp, c->tgt, c->B, c->T, 0.0f) / (c->B * c->T);
}

/* d/ds L(x0 + s dir) at s = 0 by the five-point stencil
 * (8 (L(h) - L(-h)) - (L(2h) - L(-2h))) / 12h, h = 1e-2: truncation is
 * O(h^4); the fp32 forward's rounding of L (about 1e-7 |L|, |L| ~ 4) enters
 * as at most 18 * 4e-7 / 12h = 6e-5, about 1.5e-5 seen. x (n entries) is
 * left at x0. */
static double fd_along(fd_ctx *c, float *x, const float *x0, const float *dir, int64_t n) {
  const double h = 1e-2, s[4] = {h, -h, 2 * h, -2 * h};
  double l[4];
  for (int j = 0; j < 4; j++) {
    for (int64_t k = 0; k < n; k++) x[k] = x0[k] + (float)s[j] * dir[k];
    l[j] = mean_loss(c);
  }
  memcpy(x, x0, (size_t)n * sizeof(float));
  return (8 * (l[0] - l[1]) - (l[2] - l[3])) / (12 * h);
}

static double g_max_rel, g_max_abs;

/* |ana - num| <= 5e-3 max(|ana|, |num|) + 5e-5. Gradients here are
 * 1e-4 .. 1; fd_along's error was at most 1.8e-5 when written (the max
 * seen is printed), so the bound has about 3x room and still catches a
 * wrong factor of a few percent in any gradient above 1e-2. */
static int close_enough(const char *what, double ana, double num) {
  const double err = fabs(ana - num), scale = fmax(fabs(ana), fabs(num));
  if (err > g_max_abs) g_max_abs = err;
  if (scale > 1e-2 && err / scale > g_max_rel) g_max_rel = err / scale;
  if (err <= 5e-3 * scale + 5e-5) return 0;
  print_error("%s: analytic %.7g numeric %.7g\n", what, ana, num);
  return 1;
}

static void fd_check_model(int which) {
  st_model_config cfg = cfg_of(which);
  const int B = 2, T = 8, BT = B * T;
  st_model m;
  assert_int_equal(st_model_init(&m, &cfg, ops, B, T, 1, ST_RECOMPUTE_NONE), 0);
  random_weights(&m, 5 + which);
  st_rng r;
  st_rng_seed(&r, 17 + which);
  int inp[16], tgt[16];
  random_tokens(inp, BT, cfg.vocab_size, &r);
  random_tokens(tgt, BT, cfg.vocab_size, &r);
  fd_ctx c = {&m, inp, tgt, B, T};
  st_model_zero_grad(&m);
  st_model_forward(&m, inp, tgt, B, T, 1.0f / BT);
  st_model_backward(&m, inp, B, T);
  float *p = m.params, *g = malloc((size_t)m.tab.total * sizeof(float));
  memcpy(g, m.grads, (size_t)m.tab.total * sizeof(float));
  int bad = 0;
  g_max_rel = g_max_abs = 0;
  float *dir = calloc((size_t)m.tab.total, sizeof(float));
  float *save = malloc((size_t)m.tab.total * sizeof(float));
  for (int i = 0; i < m.tab.n; i++) {
    const st_tensor *t = &m.tab.t[i];
    char what[96];
    memcpy(save, p + t->offset, (size_t)t->numel * sizeof(float));
    /* sampled entries, spread over the tensor */
    const int64_t stride = t->numel > 12 ? t->numel / 12 : 1;
    for (int64_t k = 0; k < t->numel; k += stride) {
      memset(dir, 0, (size_t)t->numel * sizeof(float));
      dir[k] = 1.0f;
      snprintf(what, sizeof what, "%s %s[%lld]", name_of(which), t->name, (long long)k);
      bad += close_enough(what, g[t->offset + k], fd_along(&c, p + t->offset, save, dir, t->numel));
    }
    /* one random direction over every entry (padded rows included) */
    double ana = 0;
    for (int64_t k = 0; k < t->numel; k++) {
      dir[k] = st_rng_normal(&r) / sqrtf((float)t->numel);
      ana += (double)dir[k] * g[t->offset + k];
    }
    snprintf(what, sizeof what, "%s %s (direction)", name_of(which), t->name);
    bad += close_enough(what, ana, fd_along(&c, p + t->offset, save, dir, t->numel));
  }
  printf("   %s: %d tensors, max |analytic - numeric| %.2e, max relative (|g| > 1e-2) %.2e\n",
         name_of(which), m.tab.n, g_max_abs, g_max_rel);
  assert_int_equal(bad, 0);
  /* padded vocabulary rows: exactly zero gradient */
  const int C = cfg.n_embd;
  for (int i = 0; i < m.tab.n; i++) {
    const st_tensor *t = &m.tab.t[i];
    if (strcmp(t->name, "wte.weight") && strcmp(t->name, "lm_head.weight")) continue;
    for (int64_t k = (int64_t)cfg.vocab_size * C; k < t->numel; k++)
      assert_true(g[t->offset + k] == 0.0f);
  }
  free(dir), free(save), free(g);
  st_model_free(&m);
}

static void test_fd_llama(void **state) {
  (void)state;
  fd_check_model(0);
}
static void test_fd_qwen2(void **state) {
  (void)state;
  fd_check_model(1);
}

/* ---- recompute, buckets and measured activations ---- */

/* Two accumulated micro-steps; loss, the gradient vector and act_bytes out. */
static void run_steps(int which, st_recompute rec, double *loss, float *grad, size_t *act) {
  st_model_config cfg = cfg_of(which);
  const int B = 2, T = 8, BT = B * T;
  st_model m;
  assert_int_equal(st_model_init(&m, &cfg, ops, B, T, 1, rec), 0);
  random_weights(&m, 11);
  st_rng r;
  st_rng_seed(&r, 23);
  int inp[16], tgt[16];
  st_model_zero_grad(&m);
  *loss = 0;
  for (int k = 0; k < 2; k++) {
    random_tokens(inp, BT, cfg.vocab_size, &r);
    random_tokens(tgt, BT, cfg.vocab_size, &r);
    *loss += st_model_forward(&m, inp, tgt, B, T, 1.0f / (2 * BT));
    st_model_backward(&m, inp, B, T);
  }
  memcpy(grad, m.grads, (size_t)m.tab.total * sizeof(float));
  *act = m.act_bytes;
  st_model_free(&m);
}

static void run_steps_ctx(void *ctx, st_recompute rec, double *loss, float *grad, size_t *act) {
  run_steps(*(const int *)ctx, rec, loss, grad, act);
}

static void test_recompute(void **state) {
  (void)state;
  for (int which = 0; which < 2; which++) {
    const st_model_config cfg = cfg_of(which);
    recompute_check(name_of(which), (size_t)st_model_num_params(&cfg), run_steps_ctx, &which);
  }
}

/* Hook context: gathers ready ranges into a full vector, records the order. */
typedef struct {
  float *full;
  int64_t begin[16], end[16];
  int slot[16], n;
} gather;

static void on_ready(void *ctx, const float *grads, int64_t begin, int64_t end, int slot) {
  gather *g = ctx;
  memcpy(g->full + begin, grads, (size_t)(end - begin) * sizeof(float));
  g->begin[g->n] = begin, g->end[g->n] = end, g->slot[g->n] = slot;
  g->n++;
}
static void on_range(void *ctx, int64_t begin, int64_t end, int slot) {
  gather *g = ctx;
  g->begin[g->n] = begin, g->end[g->n] = end, g->slot[g->n] = slot;
  g->n++;
}

static void test_bucketed(void **state) {
  (void)state;
  for (int which = 0; which < 2; which++) {
    for (int rec = 0; rec < ST_RECOMPUTE_POLICIES; rec++) {
      st_model_config cfg = cfg_of(which);
      const int B = 2, T = 8, BT = B * T;
      st_model full, bk;
      assert_int_equal(st_model_init(&full, &cfg, ops, B, T, 4, (st_recompute)rec), 0);
      assert_int_equal(st_model_init_bucketed(&bk, &cfg, ops, B, T, 4, (st_recompute)rec), 0);
      assert_null(bk.grads);
      random_weights(&full, 3);
      random_weights(&bk, 3);
      gather gt = {calloc((size_t)bk.padded_total, sizeof(float)), {0}, {0}, {0}, 0};
      st_grad_hooks hooks = {on_ready, NULL, &gt};
      st_rng r;
      st_rng_seed(&r, 31);
      int inp[16], tgt[16];
      random_tokens(inp, BT, cfg.vocab_size, &r);
      random_tokens(tgt, BT, cfg.vocab_size, &r);
      st_model_zero_grad(&full);
      st_model_zero_grad(&bk);
      const double l0 = st_model_forward(&full, inp, tgt, B, T, 1.0f / BT);
      st_model_backward(&full, inp, B, T);
      const double l1 = st_model_forward(&bk, inp, tgt, B, T, 1.0f / BT);
      st_model_backward_hooked(&bk, inp, B, T, &hooks);
      assert_true(l0 == l1);
      assert_memory_equal(gt.full, full.grads, (size_t)full.tab.total * sizeof(float));
      /* ranges: blocks L-1 .. 0, [0, first block), [ln_f, total), as grad_ranges says */
      gather walk = {NULL, {0}, {0}, {0}, 0};
      st_model_grad_ranges(&bk, on_range, &walk);
      assert_int_equal(gt.n, cfg.n_layer + 2);
      assert_int_equal(walk.n, gt.n);
      int64_t covered = 0;
      for (int i = 0; i < gt.n; i++) {
        assert_int_equal(gt.begin[i], walk.begin[i]);
        assert_int_equal(gt.end[i], walk.end[i]);
        assert_int_equal(gt.slot[i], walk.slot[i]);
        covered += gt.end[i] - gt.begin[i];
      }
      assert_int_equal(covered, bk.tab.total);
      assert_int_equal(gt.slot[gt.n - 1], 3);
      assert_int_equal(gt.end[gt.n - 1], bk.tab.total);
      free(gt.full);
      st_model_free(&full);
      st_model_free(&bk);
    }
  }
}

static void test_measure_acts(void **state) {
  (void)state;
  for (int which = 0; which < 2; which++) {
    st_model_config cfg = cfg_of(which);
    for (int rec = 0; rec < ST_RECOMPUTE_POLICIES; rec++) {
      const int B = 3, T = 16;
      st_model m;
      assert_int_equal(st_model_init(&m, &cfg, ops, B, T, 1, (st_recompute)rec), 0);
      st_act_bytes a;
      st_model_measure_acts(&cfg, ops->dtype, ops->attention_state_floats(B, T, cfg.n_head), B,
                            T, (st_recompute)rec, &a);
      assert_int_equal(a.total, m.act_bytes);
      assert_int_equal(a.embed + a.blocks + a.recompute + a.attention + a.head + a.logits +
                           a.grad_scratch,
                       a.total);
      /* the RoPE table [T, HD] fp32 lives with the encoder output */
      assert_true(a.embed >= (size_t)B * T * cfg.n_embd * 4 + (size_t)T * 8 * 4);
      st_model_free(&m);
    }
  }
}

/* ---- the LM head in row chunks ---- */

typedef struct {
  double loss;     /* summed over both micro-steps */
  float *losses;   /* [2, BT] per-token losses of both micro-steps */
  float *grads;    /* [total], gathered through the hooks when bucketed */
  float *logits;   /* [BT, Vp] st_model_logits of the second micro-step's inputs */
  int head_rows;
  size_t logit_bytes, scratch_bytes, act_bytes;
} head_run;

/* Two accumulated training micro-steps of B x T on model `which`, the
 * head's chunk as ST_HEAD_CHUNK_ROWS says (NULL: unset). */
/* calloc that ends the test program when memory is short (abort is
 * noreturn, so the analyzer follows only the path where it succeeded). */
static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n, size);
  if (!p) abort();
  return p;
}

static void run_head(int which, const char *rows, int bucketed, int B, int T, head_run *o) {
  if (rows) setenv("ST_HEAD_CHUNK_ROWS", rows, 1);
  else unsetenv("ST_HEAD_CHUNK_ROWS");
  st_model_config cfg = cfg_of(which);
  const int BT = B * T;
  st_model m;
  assert_int_equal(bucketed ? st_model_init_bucketed(&m, &cfg, ops, B, T, 4, ST_RECOMPUTE_NONE)
                            : st_model_init(&m, &cfg, ops, B, T, 4, ST_RECOMPUTE_NONE),
                   0);
  st_act_bytes a;
  st_model_measure_acts(&cfg, ops->dtype, ops->attention_state_floats(B, T, cfg.n_head), B, T,
                        ST_RECOMPUTE_NONE, &a);
  assert_int_equal(a.total, m.act_bytes);
  o->head_rows = m.head_rows;
  o->logit_bytes = a.logits;
  o->scratch_bytes = a.grad_scratch;
  o->act_bytes = a.total;
  random_weights(&m, 41);
  const int Vp = m.cfg.padded_vocab_size;
  o->losses = xcalloc(2 * (size_t)BT, sizeof(float));
  o->grads = xcalloc((size_t)m.padded_total, sizeof(float));
  o->logits = xcalloc((size_t)BT * Vp, sizeof(float));
  int *inp = xcalloc((size_t)BT, sizeof(int)), *tgt = xcalloc((size_t)BT, sizeof(int));
  st_rng r;
  st_rng_seed(&r, 57);
  gather gt = {o->grads, {0}, {0}, {0}, 0};
  st_grad_hooks hooks = {on_ready, NULL, &gt};
  o->loss = 0;
  st_model_zero_grad(&m);
  for (int k = 0; k < 2; k++) {
    random_tokens(inp, BT, cfg.vocab_size, &r);
    random_tokens(tgt, BT, cfg.vocab_size, &r);
    if (bucketed) st_model_zero_grad(&m); /* ZeRO 2: the head's buffer, per micro-step */
    o->loss += st_model_forward(&m, inp, tgt, B, T, 1.0f / (2 * BT));
    memcpy(o->losses + (size_t)k * BT, m.losses_host, (size_t)BT * sizeof(float));
    if (bucketed) {
      /* the hooks hand out one micro-step's gradients: add them up */
      float *step = xcalloc((size_t)m.padded_total, sizeof(float)), *sum = gt.full;
      gt.full = step;
      gt.n = 0;
      st_model_backward_hooked(&m, inp, B, T, &hooks);
      for (int64_t i = 0; i < m.tab.total; i++) sum[i] += step[i];
      gt.full = sum;
      free(step);
    } else {
      st_model_backward(&m, inp, B, T);
    }
  }
  if (!bucketed) memcpy(o->grads, m.grads, (size_t)m.tab.total * sizeof(float));
  /* an evaluation forward touches no gradient */
  float *before = malloc((size_t)m.padded_total * sizeof(float));
  assert_non_null(before);
  const float *g = bucketed ? m.head_grads : m.grads;
  /* ZeRO 2's head_grads: every tensor outside the blocks */
  const size_t gn = bucketed ? (size_t)(m.tab.total - m.cfg.n_layer * m.block_numel)
                             : (size_t)m.padded_total;
  memcpy(before, g, gn * sizeof(float));
  st_model_forward(&m, inp, tgt, B, T, 0.0f);
  assert_memory_equal(before, g, gn * sizeof(float));
  free(before);
  assert_int_equal(st_model_logits(&m, inp, B, T, o->logits), 0);
  free(inp);
  free(tgt);
  st_model_free(&m);
  unsetenv("ST_HEAD_CHUNK_ROWS");
}

static void head_run_free(head_run *o) {
  free(o->losses);
  free(o->grads);
  free(o->logits);
}

static void test_head_chunks(void **state) {
  (void)state;
  const int B = 3, T = 16, BT = B * T;
  for (int which = 0; which < 2; which++) {
    const st_model_config cfg = cfg_of(which);
    const int Vp = cfg.padded_vocab_size;
    for (int bucketed = 0; bucketed < 2; bucketed++) {
      head_run whole, chunked;
      run_head(which, NULL, bucketed, B, T, &whole); /* 48 x 128 fp32: one chunk */
      run_head(which, "5", bucketed, B, T, &chunked);
      assert_int_equal(whole.head_rows, BT);
      assert_int_equal(chunked.head_rows, 5);
      /* the logits part holds 5 of the 48 rows (plus the alignment padding
       * before it, under 256 bytes). Backward's scratch shares the chunk's
       * region, so what the region lacks of it counts as scratch: only
       * those two parts move */
      const size_t row = (size_t)Vp * 4;
      assert_true(whole.logit_bytes >= BT * row && whole.logit_bytes < BT * row + 256);
      assert_true(chunked.logit_bytes >= 5 * row && chunked.logit_bytes < 5 * row + 256);
      assert_int_equal(whole.act_bytes - whole.logit_bytes - whole.scratch_bytes,
                       chunked.act_bytes - chunked.logit_bytes - chunked.scratch_bytes);
      assert_true(chunked.scratch_bytes > whole.scratch_bytes);
      /* each row's logits and loss are computed alone: equal bit for bit */
      assert_true(whole.loss == chunked.loss);
      assert_memory_equal(whole.losses, chunked.losses, 2 * (size_t)BT * sizeof(float));
      assert_memory_equal(whole.logits, chunked.logits, (size_t)BT * Vp * sizeof(float));
      /* the head's weight gradient sums its rows chunk by chunk */
      st_model_config c = cfg;
      st_param_table tab;
      assert_int_equal(st_param_table_build(&c, &tab), 0);
      double worst = 0, scale = 0;
      for (int64_t i = 0; i < tab.total; i++) scale = fmax(scale, fabs(whole.grads[i]));
      for (int64_t i = 0; i < tab.total; i++)
        worst = fmax(worst, fabs((double)chunked.grads[i] - whole.grads[i]));
      printf("   %s%s: 10 chunks of <= 5 rows vs one of 48: loss %.9g, max |dgrad| %.3g of "
             "max |grad| %.3g\n",
             name_of(which), bucketed ? " (ZeRO 2 buckets)" : "", whole.loss, worst, scale);
      assert_true(scale > 0 && worst <= 1e-6 * scale);
      st_param_table_free(&tab);
      head_run_free(&whole);
      head_run_free(&chunked);
    }
  }
  /* the rule: all rows up to 256 MiB of logits, else the larger of what
   * fits 256 MiB and a floor of 2048 rows, raised to an eighth of the rows
   * up to 4096 (lowered to what fits 2 GiB), in multiples of 128 */
  unsetenv("ST_HEAD_CHUNK_ROWS");
  st_model_config g = {.n_layer = 1, .n_head = 1, .n_embd = 64, .block_size = 8,
                       .vocab_size = 50257};
  assert_int_equal(st_model_validate(&g), 0);
  assert_int_equal(st_model_head_rows(&g, ST_BF16, 32768), 4096); /* 100,608 B a row; 1/8 */
  assert_int_equal(st_model_head_rows(&g, ST_FP32, 32768), 4096); /* 1,334.1 fit */
  assert_int_equal(st_model_head_rows(&g, ST_BF16, 16384), 2560); /* 1/8 is 2048 */
  assert_int_equal(st_model_head_rows(&g, ST_FP32, 16384), 2048); /* 1,334.1 fit */
  assert_int_equal(st_model_head_rows(&g, ST_BF16, 24576), 3072); /* 1/8, over 2,560 */
  assert_int_equal(st_model_head_rows(&g, ST_BF16, 25000), 3072); /* 3,125 rounded to 128 */
  assert_int_equal(st_model_head_rows(&g, ST_BF16, 100000), 4096); /* 1/8 capped */
  assert_int_equal(st_model_head_rows(&g, ST_BF16, 2668), 2668);  /* 268.4 MB: fits */
  assert_int_equal(st_model_head_rows(&g, ST_BF16, 2669), 2560);  /* 2,668.1 rows fit */
  assert_int_equal(st_model_head_rows(&g, ST_FP32, 2049), 2048);
  assert_int_equal(st_model_head_rows(&g, ST_FP32, 1500), 1500);  /* under 2048 rows */
  st_model_config l = g;
  l.vocab_size = 128256;
  assert_int_equal(st_model_validate(&l), 0);
  assert_int_equal(st_model_head_rows(&l, ST_BF16, 8192), 2048); /* 1,046.5 fit */
  assert_int_equal(st_model_head_rows(&l, ST_FP32, 8192), 2048); /* 0.98 GiB */
  assert_int_equal(st_model_head_rows(&l, ST_BF16, 65536), 4096); /* 1 GiB */
  assert_int_equal(st_model_head_rows(&l, ST_FP32, 65536), 4096); /* 1.96 GiB: fits 2 GiB */
  l.vocab_size = 4 << 20; /* 8 MiB a row in bf16: 256 rows fit 2 GiB */
  assert_int_equal(st_model_validate(&l), 0);
  assert_int_equal(st_model_head_rows(&l, ST_BF16, 8192), 256);
  assert_int_equal(st_model_head_rows(&l, ST_BF16, 65536), 256); /* 2 GiB caps the floor */
  /* 16 MiB a row in fp32: 16 rows fit 256 MiB, 128 fit 2 GiB */
  assert_int_equal(st_model_head_rows(&l, ST_FP32, 8192), 128);
  assert_int_equal(st_model_head_rows(&l, ST_FP32, 100), 100);
  setenv("ST_HEAD_CHUNK_ROWS", "100000", 1); /* forced, clamped to the rows there are */
  assert_int_equal(st_model_head_rows(&g, ST_BF16, 48), 48);
  /* a bad value: st_model_init names it */
  st_model_config q = qwen2_cfg();
  st_model m;
  const char *bad[] = {"0", "12x", "-3", " 5"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("ST_HEAD_CHUNK_ROWS", bad[i], 1);
    assert_int_equal(st_model_init(&m, &q, ops, B, T, 1, ST_RECOMPUTE_NONE), -1);
    assert_non_null(strstr(st_error_msg(), "ST_HEAD_CHUNK_ROWS"));
  }
  unsetenv("ST_HEAD_CHUNK_ROWS");
}

int main(void) {
  ops = st_ops_cpu();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_names),  cmocka_unit_test(test_preset_param_counts),
      cmocka_unit_test(test_init),         cmocka_unit_test(test_rope_table),   cmocka_unit_test(test_fd_llama),
      cmocka_unit_test(test_fd_qwen2),     cmocka_unit_test(test_recompute),
      cmocka_unit_test(test_bucketed),     cmocka_unit_test(test_measure_acts),
      cmocka_unit_test(test_head_chunks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
