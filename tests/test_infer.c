/* test_infer.c - the KV-cache inference path (rank/model/infer.h) and the
 * sampler (rank/model/sampler.h) on the CPU backend.
 *
 *  - attention_decode against attention_forward: the same rows bit for bit,
 *    whether the positions arrive at once, as a prefill then one by one,
 *    or in uneven chunks (both take the same float operations in the same
 *    order; see kernels/cpu/attention_decode.c);
 *  - greedy decoding with the cache against the argmax of a full
 *    st_model_logits over the growing sequence, at every step, and the
 *    logits of the last position equal bit for bit (the CPU matmul and
 *    LayerNorm compute each row alone, so the row count does not change a
 *    row): on random GPT-2 weights, on random Llama-shaped weights (RMSNorm,
 *    RoPE with Llama 3 scaling applied at the cache position, GQA's
 *    smaller cache, SwiGLU, untied head) and Qwen2-shaped ones (q/k/v
 *    biases, MQA, tied head), and on the checkpoint named by argv[1] when
 *    given (the e2e test passes one that train wrote);
 *  - the sampler: a seed repeats, top-k 1 and a tiny top-p are greedy,
 *    top-k K never leaves the K most likely, bad options are refused.
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

#include "io/model_source.h"
#include "kernels/ops.h"
#include "rank/model/infer.h"
#include "rank/model/model.h"
#include "util/rng.h"
#include "rank/model/sampler.h"
#include "util/error.h"

static const char *g_ckpt;

static float *randn(int64_t n, st_rng *r) {
  float *x = malloc((size_t)n * sizeof *x);
  assert_non_null(x);
  for (int64_t i = 0; i < n; i++) x[i] = st_rng_normal(r);
  return x;
}

static void test_decode_matches_forward(void **state) {
  const st_ops *op = st_ops_cpu();
  const int B = 2, T = 13, C = 24, NH = 3, maxT = 16;
  st_rng r;
  st_rng_seed(&r, 7);
  float *qkv = randn((int64_t)B * T * 3 * C, &r);
  float *ref = calloc((size_t)B * T * C, sizeof(float));
  float *att = calloc((size_t)op->attention_state_floats(B, T, NH), sizeof(float));
  op->attention_forward(ref, att, qkv, B, T, C, NH, NH);
  /* chunkings of the T positions: all at once, prefill 5 then one by one, uneven */
  static const int plans[3][14] = {{13, 0}, {5, 1, 1, 1, 1, 1, 1, 1, 1, 0}, {1, 4, 2, 6, 0}};
  float *kc = calloc((size_t)B * maxT * C, sizeof(float));
  float *vc = calloc((size_t)B * maxT * C, sizeof(float));
  float *out = calloc((size_t)B * T * C, sizeof(float));
  float *in = calloc((size_t)B * T * 3 * C, sizeof(float));
  for (int p = 0; p < 3; p++) {
    int pos = 0;
    for (int k = 0; plans[p][k]; k++) {
      const int n = plans[p][k];
      for (int b = 0; b < B; b++) /* the chunk's rows of each sequence, [B, n, 3C] */
        memcpy(in + (size_t)b * n * 3 * C, qkv + ((size_t)b * T + pos) * 3 * C,
               (size_t)n * 3 * C * sizeof(float));
      float *o = calloc((size_t)B * n * C, sizeof(float));
      op->attention_decode(o, kc, vc, in, B, n, pos, maxT, C, NH, NH);
      for (int b = 0; b < B; b++)
        memcpy(out + ((size_t)b * T + pos) * C, o + (size_t)b * n * C, (size_t)n * C * sizeof(float));
      free(o);
      pos += n;
    }
    assert_int_equal(pos, T);
    assert_memory_equal(out, ref, (size_t)B * T * C * sizeof(float));
    /* the cache holds every position's k and v */
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        assert_memory_equal(kc + ((size_t)b * maxT + t) * C, qkv + ((size_t)b * T + t) * 3 * C + C,
                            C * sizeof(float));
        assert_memory_equal(vc + ((size_t)b * maxT + t) * C,
                            qkv + ((size_t)b * T + t) * 3 * C + 2 * C, C * sizeof(float));
      }
  }
  free(qkv), free(ref), free(att), free(kc), free(vc), free(out), free(in);
}

static int argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

/* Greedy with the cache vs full forwards, for n_new tokens after prompt. */
static void greedy_check(const st_model_config *cfg, const float *weights, const int *prompt,
                         int P, int n_new) {
  const st_ops *op = st_ops_cpu();
  st_model m;
  st_infer inf;
  assert_int_equal(st_model_init(&m, cfg, op, 1, cfg->block_size, 1, ST_RECOMPUTE_NONE), 0);
  assert_int_equal(st_model_set_weights(&m, weights), 0);
  assert_int_equal(st_infer_init(&inf, cfg, op, P), 0);
  assert_int_equal(st_infer_set_weights(&inf, weights), 0);
  const int Vp = cfg->padded_vocab_size, V = cfg->vocab_size;
  int *seq = calloc((size_t)cfg->block_size, sizeof(int));
  float *all = malloc((size_t)cfg->block_size * Vp * sizeof(float));
  float *lg = malloc((size_t)Vp * sizeof(float));
  memcpy(seq, prompt, (size_t)P * sizeof(int));
  int len = P;
  assert_int_equal(st_infer_step(&inf, seq, P, lg), 0);
  for (int k = 0; k < n_new; k++) {
    assert_int_equal(st_model_logits(&m, seq, 1, len, all), 0); /* every position's logits */
    const float *full = all + (size_t)(len - 1) * Vp;
    assert_memory_equal(lg, full, (size_t)V * sizeof(float));
    const int id = argmax(lg, V);
    assert_int_equal(id, argmax(full, V));
    seq[len++] = id;
    if (k + 1 < n_new) assert_int_equal(st_infer_step(&inf, &id, 1, lg), 0);
  }
  assert_int_equal(inf.pos, len - 1);
  /* past the block size: refused, usage class */
  inf.pos = cfg->block_size;
  int one = 0;
  assert_int_equal(st_infer_step(&inf, &one, 1, lg), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
  free(seq), free(all), free(lg);
  st_infer_free(&inf);
  st_model_free(&m);
}

static void test_greedy_random_weights(void **state) {
  st_model_config cfg = {.n_layer = 2, .n_head = 3, .n_embd = 24, .block_size = 32,
                         .vocab_size = 70};
  assert_int_equal(st_model_validate(&cfg), 0);
  st_model m;
  assert_int_equal(st_model_init(&m, &cfg, st_ops_cpu(), 1, 1, 1, ST_RECOMPUTE_NONE), 0);
  float *w = malloc((size_t)m.padded_total * sizeof(float));
  st_rng r;
  st_rng_seed(&r, 11);
  assert_int_equal(st_model_draw_weights(&m, &r, w), 0);
  /* larger weights than GPT-2's init, so the argmax moves around */
  for (int64_t i = 0; i < m.padded_total; i++) w[i] *= 8.0f;
  st_model_free(&m);
  const int prompt[4] = {3, 14, 15, 9};
  greedy_check(&cfg, w, prompt, 4, 28);
  free(w);
}

/* Random weights of the family's description, larger than its init so the
 * argmax moves around; greedy against full forwards as for GPT-2. */
static void family_greedy(st_arch arch, int n_kv_head, int untied) {
  st_model_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 32,
                         .vocab_size = 70};
  st_model_arch_defaults(&cfg, arch);
  cfg.n_kv_head = n_kv_head;
  cfg.ffn_dim = 40;
  cfg.untied = untied;
  if (arch == ST_ARCH_LLAMA) {
    cfg.rope_theta = 10000.0f;
    cfg.rope_scaling = (st_rope_scaling){ST_ROPE_SCALING_LLAMA3, 8.0f, 1.0f, 4.0f, 1024};
  }
  assert_int_equal(st_model_validate(&cfg), 0);
  st_model m;
  assert_int_equal(st_model_init(&m, &cfg, st_ops_cpu(), 1, 1, 1, ST_RECOMPUTE_NONE), 0);
  float *w = malloc((size_t)m.padded_total * sizeof(float));
  st_rng r;
  st_rng_seed(&r, 13);
  assert_int_equal(st_model_draw_weights(&m, &r, w), 0);
  for (int i = 0; i < m.tab.n; i++) { /* biases and norm gains get noise too */
    const st_tensor *t = &m.tab.t[i];
    for (int64_t k = 0; k < t->numel; k++)
      w[t->offset + k] = t->ndim == 2 ? 8.0f * w[t->offset + k]
                                      : w[t->offset + k] + 0.2f * st_rng_normal(&r);
  }
  st_model_free(&m);
  const int prompt[5] = {3, 14, 15, 9, 26};
  greedy_check(&cfg, w, prompt, 5, 27);
  free(w);
}

static void test_greedy_llama(void **state) {
  (void)state;
  family_greedy(ST_ARCH_LLAMA, 2, 1);
}

static void test_greedy_qwen2(void **state) {
  (void)state;
  family_greedy(ST_ARCH_QWEN2, 1, 0);
}

static void test_greedy_checkpoint(void **state) {
  if (!g_ckpt) {
    printf("   (no checkpoint given: the e2e test e2e_sample passes one train wrote)\n");
    return;
  }
  st_model_source s;
  assert_int_equal(st_model_source_open(g_ckpt, &s), 0);
  assert_int_equal(st_model_validate(&s.cfg), 0);
  st_param_table tab;
  assert_int_equal(st_param_table_build(&s.cfg, &tab), 0);
  float *w = malloc((size_t)tab.total * sizeof(float));
  assert_int_equal(st_model_source_read(&s, &tab, w), 0);
  const int prompt[3] = {73, 110, 32}; /* "In " in bytes; any ids below the vocabulary */
  const int n = s.cfg.block_size - 3 < 40 ? s.cfg.block_size - 3 : 40;
  greedy_check(&s.cfg, w, prompt, 3, n);
  printf("   checkpoint %s: %d greedy steps agree with full forwards\n", g_ckpt, n);
  free(w);
  st_param_table_free(&tab);
}

static void test_sampler(void **state) {
  const int V = 50;
  st_rng r;
  st_rng_seed(&r, 3);
  float *lg = randn(V, &r);
  for (int i = 0; i < V; i++) lg[i] *= 2.0f;
  int best = 0;
  for (int i = 1; i < V; i++)
    if (lg[i] > lg[best]) best = i;
  st_sampler s;
  st_sampler_opts greedy = {0.0f, 0, 1.0f}, temp = {1.0f, 0, 1.0f}, k1 = {1.0f, 1, 1.0f},
                  p0 = {1.5f, 0, 1e-6f}, k5 = {2.0f, 5, 1.0f}, kp = {1.0f, 10, 0.5f};
  assert_int_equal(st_sampler_init(&s, &greedy, V), 0);
  assert_int_equal(st_sampler_next(&s, lg, &r), best);
  st_sampler_free(&s);
  /* a seed repeats; different draws happen */
  int a[64], b[64], distinct = 0;
  for (int pass = 0; pass < 2; pass++) {
    st_rng rr;
    st_rng_seed(&rr, 99);
    assert_int_equal(st_sampler_init(&s, &temp, V), 0);
    for (int i = 0; i < 64; i++) (pass ? b : a)[i] = st_sampler_next(&s, lg, &rr);
    st_sampler_free(&s);
  }
  assert_memory_equal(a, b, sizeof a);
  for (int i = 1; i < 64; i++) distinct += a[i] != a[0];
  assert_true(distinct > 0);
  const st_sampler_opts *gr[2] = {&k1, &p0};
  for (int g = 0; g < 2; g++) {
    assert_int_equal(st_sampler_init(&s, gr[g], V), 0);
    for (int i = 0; i < 32; i++) assert_int_equal(st_sampler_next(&s, lg, &r), best);
    st_sampler_free(&s);
  }
  /* top-k 5: only the five largest logits ever come out */
  assert_int_equal(st_sampler_init(&s, &k5, V), 0);
  for (int i = 0; i < 200; i++) {
    const int id = st_sampler_next(&s, lg, &r);
    int above = 0;
    for (int j = 0; j < V; j++) above += lg[j] > lg[id];
    assert_true(above < 5);
  }
  st_sampler_free(&s);
  assert_int_equal(st_sampler_init(&s, &kp, V), 0);
  for (int i = 0; i < 50; i++) {
    const int id = st_sampler_next(&s, lg, &r);
    assert_true(id >= 0 && id < V);
  }
  st_sampler_free(&s);
  const st_sampler_opts bad[5] = {{-1.0f, 0, 1.0f}, {1.0f, -1, 1.0f}, {1.0f, 0, 0.0f},
                                  {1.0f, 0, 1.5f}, {NAN, 0, 1.0f}};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(st_sampler_init(&s, &bad[i], V), -1);
    assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
  }
  free(lg);
}

/* The sampler's definition, by sorting the whole vocabulary for every token
 * (what st_sampler_next did before it selected and thresholded): candidates
 * by logit then id, the first top_k, then the fewest leading with mass >=
 * top_p, one uniform draw. The sampler must choose the same ids. */
static int argmax_of(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}
static const float *g_ref_logits;
static int ref_by_logit(const void *a, const void *b) {
  const int i = *(const int *)a, j = *(const int *)b;
  if (g_ref_logits[i] != g_ref_logits[j]) return g_ref_logits[i] > g_ref_logits[j] ? -1 : 1;
  return i - j;
}
static int ref_next(const st_sampler_opts *o, const float *x, int V, int *order, double *prob,
                    st_rng *rng) {
  for (int i = 0; i < V; i++) order[i] = i;
  g_ref_logits = x;
  qsort(order, (size_t)V, sizeof *order, ref_by_logit);
  int n = o->top_k > 0 && o->top_k < V ? o->top_k : V;
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += prob[i] = expf((x[order[i]] - x[order[0]]) / o->temperature);
  if (o->top_p < 1.0f) {
    double cum = 0.0, kept = 0.0;
    int m = 0;
    while (m < n) {
      cum += prob[m] / sum;
      kept += prob[m++];
      if (cum >= o->top_p) break;
    }
    n = m;
    sum = kept;
  }
  const double u = (double)st_rng_uniform(rng) * sum;
  double cum = 0.0;
  for (int i = 0; i < n; i++)
    if (u < (cum += prob[i])) return order[i];
  return order[n - 1];
}

static void test_sampler_fast_equals_full_sort(void **state) {
  (void)state;
  const int V = 50257; /* GPT-2's vocabulary */
  st_rng r;
  st_rng_seed(&r, 11);
  float *lg = randn(V, &r);
  for (int i = 0; i < V; i++) lg[i] *= 3.0f;
  lg[17] = lg[4242] = lg[argmax_of(lg, V)]; /* ties at the top: the lower id comes first */
  int *order = malloc((size_t)V * sizeof *order);
  double *prob = malloc((size_t)V * sizeof *prob);
  assert_non_null(order);
  assert_non_null(prob);
  const st_sampler_opts cases[] = {{1.0f, 40, 1.0f}, {0.8f, 1, 1.0f},  {1.0f, 0, 0.9f},
                                   {0.7f, 0, 0.5f},  {2.0f, 0, 0.99f}, {1.0f, 50, 0.8f},
                                   {1.0f, 3000, 1.0f}, {0.3f, 0, 1e-6f}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    st_sampler s;
    assert_int_equal(st_sampler_init(&s, &cases[c], V), 0);
    st_rng a, b;
    st_rng_seed(&a, 5 + c);
    st_rng_seed(&b, 5 + c);
    for (int i = 0; i < 50; i++)
      assert_int_equal(st_sampler_next(&s, lg, &a), ref_next(&cases[c], lg, V, order, prob, &b));
    st_sampler_free(&s);
  }
  free(order);
  free(prob);
  free(lg);
}

int main(int argc, char **argv) {
  g_ckpt = argc > 1 ? argv[1] : NULL;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_matches_forward),
      cmocka_unit_test(test_greedy_random_weights),
      cmocka_unit_test(test_greedy_llama),
      cmocka_unit_test(test_greedy_qwen2),
      cmocka_unit_test(test_greedy_checkpoint),
      cmocka_unit_test(test_sampler),
      cmocka_unit_test(test_sampler_fast_equals_full_sort),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
