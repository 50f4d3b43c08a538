/* test_lora.c - LoRA on the CPU reference (rank/model/lora.h, the LoRA
 * paths of rank/model/model.c): the --lora spec, the flat layout of the
 * shared contract, B = 0 giving exactly the base model, the adapters'
 * gradients against central differences (GPT-2 and Llama, every target,
 * with and without dropout), the merged base giving the adapter model's
 * logits, and the recompute policies agreeing bit for bit. */
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
#include "rank/model/lora.h"
#include "rank/model/model.h"
#include "tests/lora_fixtures.h"
#include "util/error.h"
#include "util/rng.h"

static void test_parse(void **state) {
  (void)state;
  st_lora_config l;
  assert_int_equal(st_lora_parse("8", &l), 0);
  assert_int_equal(l.rank, 8);
  assert_true(l.alpha == 8.0f && l.dropout == 0.0f && l.targets == 0);
  assert_int_equal(st_lora_parse("16,alpha=32,dropout=0.05,targets=q,k,v,o", &l), 0);
  assert_int_equal(l.rank, 16);
  assert_true(l.alpha == 32.0f && fabsf(l.dropout - 0.05f) < 1e-9f);
  assert_int_equal(l.targets, 1u << ST_LORA_Q | 1u << ST_LORA_K | 1u << ST_LORA_V | 1u << ST_LORA_O);
  /* docs/lora.md's grammar: targets= comes last and the rank is bare; a key
   * after targets= (read as a target by the grammar) and PEFT's r= are
   * refused with the spec written in order */
  const char *order[][2] = {{"4,targets=gate,up,alpha=2", "write --lora 4,alpha=2,targets=gate,up"},
                            {"r=16,targets=q,v,alpha=32", "write --lora 16,alpha=32,targets=q,v"},
                            {"16,targets=q,v,alpha=32", "write --lora 16,alpha=32,targets=q,v"},
                            {"8,targets=q,dropout=0.1,targets=v",
                             "write --lora 8,dropout=0.1,targets=q,v"}};
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    st_error_code(ST_EXIT_ERROR);
    assert_int_equal(st_lora_parse(order[i][0], &l), -1);
    assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
    if (!strstr(st_error_msg(), order[i][1]))
      fail_msg("--lora %s: '%s' does not say '%s'", order[i][0], st_error_msg(), order[i][1]);
    assert_int_equal(st_lora_parse(strstr(order[i][1], "--lora ") + 7, &l), 0);
  }
  const char *bad[] = {"", "0", "x", "8,alpha=-1", "8,dropout=1", "8,foo=1", "8,q", "8.5"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    st_error_code(ST_EXIT_ERROR);
    assert_int_equal(st_lora_parse(bad[i], &l), -1);
    assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
    assert_non_null(strstr(st_error_msg(), "--lora"));
  }
  /* the family's defaults and its missing targets */
  st_model_config g = gpt2_cfg(), m = llama_cfg();
  assert_int_equal(st_lora_parse("8", &l), 0);
  assert_int_equal(st_lora_resolve(&l, &g), 0);
  assert_int_equal(l.targets, 1u << ST_LORA_QKV);
  assert_int_equal(st_lora_parse("8", &l), 0);
  assert_int_equal(st_lora_resolve(&l, &m), 0);
  assert_int_equal(l.targets, 1u << ST_LORA_Q | 1u << ST_LORA_V);
  assert_int_equal(st_lora_parse("8,targets=gate", &l), 0);
  st_error_code(ST_EXIT_ERROR);
  assert_int_equal(st_lora_resolve(&l, &g), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
  assert_non_null(strstr(st_error_msg(), "gate"));
  assert_int_equal(st_lora_parse("8,targets=qkv", &l), 0);
  assert_int_equal(st_lora_resolve(&l, &m), -1);
  /* an unknown target is refused once the family is known, with the
   * family's own list (the parser offered qkv to Llama), through the
   * normalised text too */
  char text[256];
  assert_int_equal(st_lora_parse("8,targets=q,z", &l), 0);
  st_lora_format(&l, text, sizeof text);
  assert_string_equal(text, "8,alpha=8,dropout=0,targets=q,z");
  assert_int_equal(st_lora_parse(text, &l), 0);
  st_error_code(ST_EXIT_ERROR);
  assert_int_equal(st_lora_resolve(&l, &m), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
  if (!strstr(st_error_msg(), "'z'") || !strstr(st_error_msg(), "q, k, v, o, gate, up, down") ||
      strstr(st_error_msg(), "qkv"))
    fail_msg("Llama's unknown-target message lists another family's: %s", st_error_msg());
  assert_int_equal(st_lora_parse("8,targets=z", &l), 0);
  assert_int_equal(st_lora_resolve(&l, &g), -1);
  if (!strstr(st_error_msg(), "'z'") || !strstr(st_error_msg(), "qkv, o, up, down") ||
      strstr(st_error_msg(), "gate"))
    fail_msg("GPT-2's unknown-target message lists another family's: %s", st_error_msg());
  assert_int_equal(st_lora_parse("8,targets=q_proj", &l), 0);
  assert_int_equal(st_lora_resolve(&l, &m), -1);
  assert_non_null(strstr(st_error_msg(), "our q;"));
  /* the text form reads back to the same config */
  st_lora_config a = lora_of(&m, "4,alpha=16,dropout=0.1,targets=down,q"), b;
  st_lora_format(&a, text, sizeof text);
  assert_int_equal(st_lora_parse(text, &b), 0);
  assert_memory_equal(&a, &b, sizeof a);
  assert_string_equal(st_lora_peft_module(&m, ST_LORA_Q), "self_attn.q_proj");
  assert_string_equal(st_lora_peft_module(&g, ST_LORA_QKV), "attn.c_attn");
  assert_string_equal(st_lora_peft_module(&g, ST_LORA_UP), "mlp.c_fc");
}

/* The contract's layout: per layer, targets in qkv, q, k, v, o, gate, up,
 * down order, A [r, in] then B [out, r]; rows of the fused projections. */
static void test_layout(void **state) {
  (void)state;
  st_model_config c = llama_cfg(); /* C 32, 4 heads of 8, 2 KV heads, F 48 */
  st_lora_config l = lora_of(&c, "4,targets=down,v,q,gate,up,k,o");
  st_lora_table t;
  assert_int_equal(st_lora_table_build(&c, &l, &t), 0);
  assert_int_equal(t.per_layer, 7);
  const struct { st_lora_target tg; int in, out, row0, proj_out; } want[7] = {
      {ST_LORA_Q, 32, 32, 0, 64},  {ST_LORA_K, 32, 16, 32, 64},   {ST_LORA_V, 32, 16, 48, 64},
      {ST_LORA_O, 32, 32, 0, 32},  {ST_LORA_GATE, 32, 48, 0, 96}, {ST_LORA_UP, 32, 48, 48, 96},
      {ST_LORA_DOWN, 48, 32, 0, 32}};
  int64_t off = 0;
  for (int i = 0; i < t.n; i++) {
    const st_lora_slot *s = &t.slot[i];
    assert_int_equal(s->layer, i / 7);
    assert_int_equal(s->target, want[i % 7].tg);
    assert_int_equal(s->in, want[i % 7].in);
    assert_int_equal(s->out, want[i % 7].out);
    assert_int_equal(s->row0, want[i % 7].row0);
    assert_int_equal(s->proj_out, want[i % 7].proj_out);
    assert_int_equal(s->a_off, off);
    off += 4 * s->in;
    assert_int_equal(s->b_off, off);
    off += 4 * s->out;
  }
  assert_int_equal(t.total, off);
  assert_int_equal(t.layer_numel * c.n_layer, off);
  st_param_table pt;
  assert_int_equal(st_lora_param_table(&c, &t, &pt), 0);
  assert_string_equal(pt.t[0].name, "h.0.lora_q.A");
  assert_string_equal(pt.t[13].name, "h.0.lora_down.B");
  assert_int_equal(pt.t[13].shape[0], 32);
  assert_int_equal(pt.t[13].shape[1], 4);
  st_param_table_free(&pt);
  st_lora_table_free(&t);
}

static void b_zero_is_base(const st_model_config *c, const char *spec) {
  int64_t nb;
  float *w = base_weights(c, &nb, 3);
  st_model plain, lm;
  assert_int_equal(st_model_init(&plain, c, ops, 2, 8, 1, ST_RECOMPUTE_NONE), 0);
  assert_int_equal(st_model_set_weights(&plain, w), 0);
  st_lora_config l = lora_of(c, spec);
  lora_model(&lm, c, &l, w, 0.0f, ST_RECOMPUTE_NONE, 9);
  st_rng r;
  st_rng_seed(&r, 5);
  int inp[16], tgt[16];
  random_tokens(inp, 16, c->vocab_size, &r);
  random_tokens(tgt, 16, c->vocab_size, &r);
  const double a = st_model_forward(&plain, inp, tgt, 2, 8, 0.0f);
  const double b = st_model_forward(&lm, inp, tgt, 2, 8, 0.0f);
  assert_true(a == b);
  const size_t nl = (size_t)16 * c->padded_vocab_size;
  float *la = malloc(nl * sizeof(float)), *lb = malloc(nl * sizeof(float));
  assert_int_equal(st_model_logits(&plain, inp, 2, 8, la), 0);
  assert_int_equal(st_model_logits(&lm, inp, 2, 8, lb), 0);
  assert_memory_equal(la, lb, nl * sizeof(float));
  free(la), free(lb), free(w);
  st_model_free(&plain);
  st_model_free(&lm);
}

static void test_b_zero_is_base(void **state) {
  (void)state;
  st_model_config g = gpt2_cfg(), m = llama_cfg();
  b_zero_is_base(&g, "4,targets=qkv,o,up,down");
  b_zero_is_base(&m, "4,targets=q,k,v,o,gate,up,down");
  b_zero_is_base(&m, "2,dropout=0.3");
}

/* The adapters' gradients, every tensor along a direction and at a few entries. */
static void fd_lora(const st_model_config *c, const char *spec) {
  st_lora_config l = lora_of(c, spec);
  fd_adapters(c, &l, spec, ST_RECOMPUTE_NONE, 1);
}

static void test_fd_gpt2(void **state) {
  (void)state;
  st_model_config c = gpt2_cfg();
  fd_lora(&c, "3,alpha=6,targets=qkv,o,up,down");
  fd_lora(&c, "2,alpha=4,dropout=0.25,targets=qkv,o,up,down");
}

static void test_fd_llama(void **state) {
  (void)state;
  st_model_config c = llama_cfg();
  fd_lora(&c, "3,alpha=6,targets=q,k,v,o,gate,up,down");
  fd_lora(&c, "2,alpha=4,dropout=0.25,targets=q,k,v,o,gate,up,down");
}

/* W += scale B A gives the adapter model's logits. */
static void merged_matches(const st_model_config *c, const char *spec) {
  int64_t nb;
  float *w = base_weights(c, &nb, 21);
  st_lora_config l = lora_of(c, spec);
  st_model lm, plain;
  lora_model(&lm, c, &l, w, 0.3f, ST_RECOMPUTE_NONE, 23);
  float *ad = malloc((size_t)lm.padded_total * sizeof(float));
  st_model_get_weights(&lm, ad);
  assert_int_equal(st_lora_merge(&lm.ltab, &l, &lm.base_tab, w, ad), 0);
  assert_int_equal(st_model_init(&plain, c, ops, 2, 8, 1, ST_RECOMPUTE_NONE), 0);
  assert_int_equal(st_model_set_weights(&plain, w), 0);
  st_rng r;
  st_rng_seed(&r, 29);
  int inp[16];
  random_tokens(inp, 16, c->vocab_size, &r);
  const size_t nl = (size_t)16 * c->padded_vocab_size;
  float *la = malloc(nl * sizeof(float)), *lb = malloc(nl * sizeof(float));
  assert_int_equal(st_model_logits(&plain, inp, 2, 8, la), 0);
  assert_int_equal(st_model_logits(&lm, inp, 2, 8, lb), 0);
  double worst = 0, diff = 0;
  for (size_t i = 0; i < nl; i++) {
    const double e = fabs((double)la[i] - lb[i]);
    if (e > worst) worst = e;
    diff += e;
  }
  printf("   merged %s (%s): max |logit difference| %.2e\n", st_arch_name(c->arch), spec, worst);
  assert_true(worst < 2e-5);
  free(la), free(lb), free(ad), free(w);
  st_model_free(&lm);
  st_model_free(&plain);
}

static void test_merge(void **state) {
  (void)state;
  st_model_config g = gpt2_cfg(), m = llama_cfg();
  merged_matches(&g, "4,alpha=16,targets=qkv,o,up,down");
  merged_matches(&m, "4,alpha=16,targets=q,k,v,o,gate,up,down");
}

/* none, selective and full give the same loss and adapter gradients, bit for bit. */
static void test_recompute(void **state) {
  (void)state;
  st_model_config g = gpt2_cfg(), m = llama_cfg();
  st_lora_config lg = lora_of(&g, "4,dropout=0.2,targets=qkv,o,up,down");
  st_lora_config lm = lora_of(&m, "4,dropout=0.2,targets=q,k,v,o,gate,up,down");
  recompute_agree(&g, &lg);
  recompute_agree(&m, &lm);
}

/* The kernels' frozen paths: matmul_backward with dw NULL gives the same
 * dinp as with a weight gradient. */
static void test_frozen_matmul(void **state) {
  (void)state;
  const int N = 5, C = 7, OC = 3;
  float x[35], w[21], d[15], di1[35], di2[35], dw[21] = {0}, db[3] = {0};
  st_rng r;
  st_rng_seed(&r, 1);
  for (int i = 0; i < 35; i++) x[i] = st_rng_normal(&r);
  for (int i = 0; i < 21; i++) w[i] = st_rng_normal(&r);
  for (int i = 0; i < 15; i++) d[i] = st_rng_normal(&r);
  ops->matmul_backward(di1, dw, db, d, x, w, N, C, OC);
  ops->matmul_backward(di2, NULL, NULL, d, x, w, N, C, OC);
  assert_memory_equal(di1, di2, sizeof di1);
}

int main(void) {
  ops = st_ops_cpu();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),        cmocka_unit_test(test_layout),
      cmocka_unit_test(test_b_zero_is_base), cmocka_unit_test(test_fd_gpt2),
      cmocka_unit_test(test_fd_llama),     cmocka_unit_test(test_merge),
      cmocka_unit_test(test_recompute),    cmocka_unit_test(test_frozen_matmul),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
