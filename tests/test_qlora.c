/* test_qlora.c - QLoRA on the CPU reference (lora.nf4_base in
 * rank/model/model.c): the base's projection weights held only as NF4.
 * A QLoRA model is exactly a LoRA model on the dequantised base (the same
 * loss, logits and adapter gradients, bit for bit: the same ops on the same
 * fp32 weights); the dequantised base is the host reference's quantise then
 * dequantise of each projection (kernels/cpu/nf4.c) and the other tensors
 * unchanged; the adapters' gradients match central differences through the
 * NF4 weights; the recompute policies agree bit for bit; a NaN in a
 * projection is refused naming the tensor. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/nf4.h"
#include "kernels/ops.h"
#include "rank/model/config.h"
#include "rank/model/lora.h"
#include "rank/model/model.h"
#include "tests/lora_fixtures.h"
#include "util/error.h"
#include "util/rng.h"

/* The --lora spec resolved for c's family, on an NF4 base. */
static st_lora_config qlora_of(const st_model_config *c, const char *spec) {
  st_lora_config l = lora_of(c, spec);
  l.nf4_base = 1;
  return l;
}

static int is_proj(const char *name) {
  return strstr(name, ".attn.qkv.weight") || strstr(name, ".attn.proj.weight") ||
         strstr(name, ".mlp.fc.weight") || strstr(name, ".mlp.proj.weight");
}

/* QLoRA == LoRA on the dequantised base, and that base is the host
 * reference's round trip of each projection. */
static void same_as_lora(const st_model_config *c, const char *spec) {
  int64_t nb;
  float *w = base_weights(c, &nb, 3);
  st_lora_config lq = qlora_of(c, spec), lb = lora_of(c, spec);
  st_model q, b;
  lora_model(&q, c, &lq, w, 0.2f, ST_RECOMPUTE_NONE, 9);
  assert_non_null(q.nf4);
  float *dq = malloc((size_t)nb * sizeof(float));
  assert_int_equal(st_model_get_base_weights(&q, dq), 0);
  int nproj = 0;
  double qerr = 0;
  for (int i = 0; i < q.base_tab.n; i++) {
    const st_tensor *t = &q.base_tab.t[i];
    if (!is_proj(t->name)) {
      assert_memory_equal(dq + t->offset, w + t->offset, (size_t)t->numel * sizeof(float));
      continue;
    }
    nproj++;
    st_nf4 h;
    void *mem = aligned_alloc(256, st_nf4_bytes(t->shape[0], t->shape[1]));
    st_nf4_carve(&h, t->shape[0], t->shape[1], mem);
    assert_int_equal(st_nf4_quantize(&h, w + t->offset), 0);
    float *ref = malloc((size_t)t->numel * sizeof(float));
    st_nf4_dequantize(&h, ref);
    assert_memory_equal(dq + t->offset, ref, (size_t)t->numel * sizeof(float));
    for (int64_t k = 0; k < t->numel; k++) qerr = fmax(qerr, fabs(ref[k] - w[t->offset + k]));
    free(ref);
    free(mem);
  }
  assert_int_equal(nproj, 4 * c->n_layer);
  assert_true(qerr > 0); /* it was quantised ... */
  assert_true(qerr < 0.1); /* ... to within half an NF4 step of weights of |w| < 0.3 */
  lora_model(&b, c, &lb, dq, 0.2f, ST_RECOMPUTE_NONE, 9);
  st_rng r;
  st_rng_seed(&r, 5);
  int inp[16], tgt[16];
  random_tokens(inp, 16, c->vocab_size, &r);
  random_tokens(tgt, 16, c->vocab_size, &r);
  st_model_zero_grad(&q);
  st_model_zero_grad(&b);
  const double lq0 = st_model_forward(&q, inp, tgt, 2, 8, 1.0f / 16);
  st_model_backward(&q, inp, 2, 8);
  const double lb0 = st_model_forward(&b, inp, tgt, 2, 8, 1.0f / 16);
  st_model_backward(&b, inp, 2, 8);
  printf("   %s (%s): QLoRA loss %.9g, LoRA on the dequantised base %.9g, max NF4 error %.3g\n",
         st_arch_name(c->arch), spec, lq0 / 16, lb0 / 16, qerr);
  assert_true(lq0 == lb0);
  assert_int_equal(q.padded_total, b.padded_total);
  assert_memory_equal(q.grads, b.grads, (size_t)q.padded_total * sizeof(float));
  const size_t nl = (size_t)16 * c->padded_vocab_size;
  float *la = malloc(nl * sizeof(float)), *lbl = malloc(nl * sizeof(float));
  assert_int_equal(st_model_logits(&q, inp, 2, 8, la), 0);
  assert_int_equal(st_model_logits(&b, inp, 2, 8, lbl), 0);
  assert_memory_equal(la, lbl, nl * sizeof(float));
  /* the NF4 model keeps no full-precision projection: its base buffer is
   * the rest of the base alone */
  int64_t kept = 0;
  for (int i = 0; i < q.base_tab.n; i++)
    if (!is_proj(q.base_tab.t[i].name)) kept += q.base_tab.t[i].numel;
  uint64_t nf4b, scr;
  int64_t base_n;
  st_model_nf4_bytes(c, ops->dtype, &nf4b, &scr, &base_n);
  assert_int_equal(base_n, kept);
  assert_true(nf4b > 0 && scr > 0);
  free(la), free(lbl), free(dq), free(w);
  st_model_free(&q);
  st_model_free(&b);
}

static void test_same_as_lora(void **state) {
  (void)state;
  st_model_config g = gpt2_cfg(), m = llama_cfg();
  same_as_lora(&g, "4,targets=qkv,o,up,down");
  same_as_lora(&g, "2"); /* GPT-2's fused GELU path (no adapter on the MLP) */
  same_as_lora(&m, "4,targets=q,k,v,o,gate,up,down");
  same_as_lora(&m, "2,dropout=0.3");
}

/* The adapters' gradients through the NF4 base, every tensor along a
 * direction, with every activation recomputed. */
static void fd_qlora(const st_model_config *c, const char *spec) {
  st_lora_config l = qlora_of(c, spec);
  fd_adapters(c, &l, spec, ST_RECOMPUTE_FULL, 0);
}

static void test_fd(void **state) {
  (void)state;
  st_model_config g = gpt2_cfg(), m = llama_cfg();
  fd_qlora(&g, "3,alpha=6,targets=qkv,o,up,down");
  fd_qlora(&m, "3,alpha=6,targets=q,k,v,o,gate,up,down");
}

/* none, selective and full: the same loss and gradients, bit for bit. */
static void test_recompute(void **state) {
  (void)state;
  st_model_config cs[2] = {gpt2_cfg(), llama_cfg()};
  const char *specs[2] = {"4,dropout=0.2,targets=qkv,o,up,down", "4,dropout=0.2,targets=q,k,v,o,gate,up,down"};
  for (int k = 0; k < 2; k++) {
    st_lora_config l = qlora_of(&cs[k], specs[k]);
    recompute_agree(&cs[k], &l);
  }
}

/* A projection holding a NaN cannot be quantised: exit 3 naming it. */
static void test_nan_refused(void **state) {
  (void)state;
  st_model_config c = llama_cfg();
  int64_t nb;
  float *w = base_weights(&c, &nb, 43);
  st_lora_config l = qlora_of(&c, "2");
  st_model m;
  assert_int_equal(st_model_init_lora(&m, &c, &l, ops, 2, 8, 1, ST_RECOMPUTE_NONE, 0), 0);
  const int i = st_param_find(&m.base_tab, "h.1.mlp.proj.weight");
  assert_true(i >= 0);
  w[m.base_tab.t[i].offset + 5] = NAN;
  st_error_code(ST_EXIT_ERROR);
  assert_int_equal(st_model_set_base_weights(&m, w), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_CHECKPOINT);
  assert_non_null(strstr(st_error_msg(), "h.1.mlp.proj.weight"));
  free(w);
  st_model_free(&m);
}

int main(void) {
  ops = st_ops_cpu();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_as_lora), cmocka_unit_test(test_fd),
      cmocka_unit_test(test_recompute), cmocka_unit_test(test_nan_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
