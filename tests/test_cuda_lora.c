/* test_cuda_lora.c - LoRA on CUDA against the CPU reference, in fp32 and
 * bf16 (harness: cuda_check.c; bounds as test_cuda_model.c's, whose header
 * gives their reasoning).
 *
 * Ops: dropout's mask is the CPU's element for element (fp32: outputs
 * equal bit for bit, zeros at the same places in bf16 too); lora_add_cols
 * and lora_take_cols within one rounding (1e-6 + 1e-6|cpu| in fp32: the GPU
 * may fuse the multiply-add; bf16 one storage rounding); the frozen paths:
 * matmul_backward, layernorm_backward and rmsnorm_backward with dw NULL
 * give the same dinp bytes as with a weight gradient.
 *
 * Models: GPT-2 (L=2, NH=3, C=72, V=200; adapters on qkv, o, up, down) and
 * Llama (L=2, NH=4, NKV=2, C=64, F=96, untied; q, k, v, o, gate, up, down),
 * r = 4, alpha 8, dropout 0.1, B = 3 x T = 40, with the same base weights
 * and adapters (B random, so every adapter gradient carries signal; bf16:
 * both sides get the bf16-rounded values): eval logits, training loss and
 * every adapter gradient against the CPU. fp32: |cuda - cpu| <= 1e-4
 * max|cpu tensor| + 1e-3|cpu|, loss 1e-5 relative; bf16: 5e-2 and 5e-2,
 * loss 1e-2. A second CUDA step reproduces loss and gradients bit for bit.
 * QLoRA (the same models with --base-dtype nf4; the GPU under full
 * recompute): the dequantised base is the CPU's bit for bit (after the
 * storage dtype's rounding), then the same bounds; and GPT-2 with qkv only
 * (the fused GELU GEMMs on a dequantised weight).
 *
 * Exit 0: all passed; 1: a check failed; 77: no CUDA device (skipped).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "rank/model/lora.h"
#include "rank/model/model.h"
#include "tests/cuda_check.h"
#include "util/error.h"
#include "util/rng.h"

static void test_ops(void) {
  printf("ops (%s)\n", GPU->name);
  const int N = 37, OC = 50, col0 = 11, n = 23;
  const int64_t NY = (int64_t)N * OC, NV = (int64_t)N * n;
  float *y = randn_st(NY, 1), *v = randn_st(NV, 1);
  void *dy = dev_st(y, NY), *dv = dev_st(v, NV);
  /* dropout */
  const int64_t nd = 1000;
  float *x = randn_st(nd, 1), *ref = malloc((size_t)nd * sizeof(float));
  void *dx = dev_st(x, nd);
  CPU->dropout(ref, x, nd, 0.3f, 99);
  GPU->dropout(dx, dx, nd, 0.3f, 99);
  float *got = back_st(dx, nd);
  int same_zeros = 1, kept = 0;
  for (int64_t i = 0; i < nd; i++) {
    same_zeros &= (ref[i] == 0.0f) == (got[i] == 0.0f);
    kept += ref[i] != 0.0f;
  }
  expect_true("dropout: the CPU's mask", same_zeros && kept > 600 && kept < 800);
  if (DT == ST_FP32) expect_exact_st("dropout p=0.3 values", got, ref, nd);
  else expect_close_st("dropout p=0.3 values", got, ref, nd, 0, 0);
  free(got), free(ref), free(x);
  GPU->free(dx);
  /* the column slice add and gather */
  float *yc = copy_of(y, NY);
  CPU->lora_add_cols(yc, v, 0.75f, N, OC, col0, n);
  GPU->lora_add_cols(dy, dv, 0.75f, N, OC, col0, n);
  got = back_st(dy, NY);
  expect_close_st("lora_add_cols", got, yc, NY, 1e-6, 1e-6);
  free(got);
  float *tc = malloc((size_t)NV * sizeof(float));
  /* both sides gather from the same stored y: the GPU's is yc rounded to the
   * storage dtype by the upload below */
  round_st(yc, NY);
  CPU->lora_take_cols(tc, yc, 2.5f, N, OC, col0, n);
  upload_st(dy, yc, NY);
  GPU->lora_take_cols(dv, dy, 2.5f, N, OC, col0, n);
  got = back_st(dv, NV);
  expect_close_st("lora_take_cols", got, tc, NV, 1e-6, 1e-6);
  free(got), free(tc), free(yc);
  /* frozen weights: dinp unchanged by dw NULL */
  const int C = 48, O = 40;
  float *in = randn_st((int64_t)N * C, 1), *w = randn_st((int64_t)O * C, 0.2f),
        *dout = randn_st((int64_t)N * O, 1);
  void *din = dev_st(in, (int64_t)N * C), *dw_ = dev_st(w, (int64_t)O * C),
       *ddo = dev_st(dout, (int64_t)N * O), *di1 = dev_st(in, (int64_t)N * C),
       *di2 = dev_st(in, (int64_t)N * C);
  float *dwg = dev(w, (int64_t)O * C), *dbg = dev(w, O);
  GPU->matmul_backward(di1, dwg, dbg, ddo, din, dw_, N, C, O);
  GPU->matmul_backward(di2, NULL, NULL, ddo, din, dw_, N, C, O);
  GPU->synchronize();
  float *a1 = back_st(di1, (int64_t)N * C), *a2 = back_st(di2, (int64_t)N * C);
  expect_identical("matmul_backward dinp with dw NULL", a1, a2, (size_t)N * C * sizeof(float));
  free(a1), free(a2);
  float *g = randn_st((int64_t)N * C, 1), *gw = randn_st(C, 1);
  float *rstd = malloc((size_t)N * sizeof(float)), *mean = malloc((size_t)N * sizeof(float));
  for (int i = 0; i < N; i++) rstd[i] = 0.5f + 0.01f * (float)i, mean[i] = 0.1f;
  float *drstd = dev(rstd, N), *dmean = dev(mean, N);
  void *dg = dev_st(g, (int64_t)N * C), *dgw = dev_st(gw, C);
  for (int ln = 0; ln < 2; ln++) {
    upload_st(di1, in, (int64_t)N * C);
    upload_st(di2, in, (int64_t)N * C);
    if (ln) {
      GPU->layernorm_backward(di1, dwg, dbg, dg, din, dgw, dmean, drstd, N, C);
      GPU->layernorm_backward(di2, NULL, NULL, dg, din, dgw, dmean, drstd, N, C);
    } else {
      GPU->rmsnorm_backward(di1, dwg, dg, din, dgw, drstd, N, C);
      GPU->rmsnorm_backward(di2, NULL, dg, din, dgw, drstd, N, C);
    }
    a1 = back_st(di1, (int64_t)N * C), a2 = back_st(di2, (int64_t)N * C);
    expect_identical(ln ? "layernorm_backward dinp with dw NULL" : "rmsnorm_backward dinp with dw NULL",
                     a1, a2, (size_t)N * C * sizeof(float));
    free(a1), free(a2);
  }
  free(in), free(w), free(dout), free(g), free(gw), free(rstd), free(mean), free(y), free(v);
  GPU->free(din), GPU->free(dw_), GPU->free(ddo), GPU->free(di1), GPU->free(di2);
  GPU->free(dwg), GPU->free(dbg), GPU->free(drstd), GPU->free(dmean), GPU->free(dg);
  GPU->free(dgw), GPU->free(dy), GPU->free(dv);
}

/* nf4: QLoRA (lora.nf4_base): both bases quantised on their own backend,
 * the GPU model under full recompute (so its backward re-dequantises every
 * projection after the recompute's forward used the scratch). */
static void test_model(int llama, const char *spec, double tol, int nf4) {
  st_model_config cfg = {.n_layer = 2, .n_head = 3, .n_embd = 72, .block_size = 40,
                         .vocab_size = 200};
  if (llama) {
    cfg.n_head = 4, cfg.n_embd = 64;
    st_model_arch_defaults(&cfg, ST_ARCH_LLAMA);
    cfg.n_kv_head = 2, cfg.ffn_dim = 96, cfg.untied = 1;
  } else {
    st_model_arch_defaults(&cfg, ST_ARCH_GPT2);
  }
  st_lora_config l;
  if (st_model_validate(&cfg) || st_lora_parse(spec, &l) || st_lora_resolve(&l, &cfg)) {
    printf("  config: %s  FAIL\n", st_error_msg());
    g_checks++, g_failures++;
    return;
  }
  l.nf4_base = nf4;
  const int B = 3, T = 40, BT = B * T;
  printf("model (%s): %s, %s %s, B=%d T=%d\n", GPU->name, llama ? "llama" : "gpt2",
         nf4 ? "QLoRA (NF4 base, GPU recompute full)" : "LoRA", spec, B, T);
  st_model mc, mg, plain;
  if (st_model_init(&plain, &cfg, CPU, 1, 1, 1, ST_RECOMPUTE_NONE) ||
      st_model_init_lora(&mc, &cfg, &l, CPU, B, T, 4, ST_RECOMPUTE_NONE, 0) ||
      st_model_init_lora(&mg, &cfg, &l, GPU, B, T, 4, nf4 ? ST_RECOMPUTE_FULL : ST_RECOMPUTE_NONE,
                         0)) {
    printf("  init failed: %s  FAIL\n", st_error_msg());
    g_checks++, g_failures++;
    return;
  }
  st_rng r;
  st_rng_seed(&r, 1337);
  float *base = malloc((size_t)plain.padded_total * sizeof(float));
  st_model_draw_weights(&plain, &r, base);
  for (int64_t i = 0; i < plain.tab.total; i++) base[i] += 0.02f * st_rng_normal(&g_rng);
  round_st(base, plain.tab.total);
  const int64_t P = mc.padded_total;
  float *ad = malloc((size_t)P * sizeof(float));
  st_model_draw_weights(&mc, &r, ad);
  for (int i = 0; i < mc.ltab.n; i++) {
    const st_lora_slot *s = &mc.ltab.slot[i];
    for (int64_t k = 0; k < (int64_t)s->out * l.rank; k++) ad[s->b_off + k] = 0.1f * st_rng_normal(&r);
  }
  round_st(ad, P);
  int ok = !st_model_set_base_weights(&mc, base) && !st_model_set_base_weights(&mg, base) &&
           !st_model_set_weights(&mc, ad) && !st_model_set_weights(&mg, ad);
  expect_true("weights set", ok);
  if (nf4) {
    /* the same NF4 arrays on both sides (base values representable in the
     * storage dtype): the GPU's dequantised base is the CPU's rounded once
     * to the storage dtype, bit for bit */
    const int64_t nb = mc.base_tab.total;
    float *bc = malloc((size_t)nb * sizeof(float)), *bg = malloc((size_t)nb * sizeof(float));
    ok = !st_model_get_base_weights(&mc, bc) && !st_model_get_base_weights(&mg, bg);
    round_st(bc, nb);
    g_checks++;
    const int same = ok && memcmp(bc, bg, (size_t)nb * sizeof(float)) == 0;
    int moved = 0;
    for (int64_t i = 0; i < nb && ok; i++) moved += bc[i] != base[i];
    printf("  %-40s %s (%d of %lld values moved by NF4)\n", "dequantised base, gpu vs cpu",
           same && moved ? "bit-identical" : "DIFFERENT  FAIL", moved, (long long)nb);
    if (!same || !moved) g_failures++;
    free(bc), free(bg);
  }
  mc.lora_seed = mg.lora_seed = 42;
  mc.lora_dropout_on = mg.lora_dropout_on = 1;
  int *inp = rand_ints(BT + 1, cfg.vocab_size);
  const int *tgt = inp + 1;
  int *d_inp = dev_bytes(inp, (size_t)BT * sizeof(int)), *d_tgt = dev_bytes(tgt, (size_t)BT * sizeof(int));
  const double atol = tol ? tol : 1e-4, rtol = tol ? tol : 1e-3, loss_rtol = tol ? 1e-2 : 1e-5;
  const int64_t NL = (int64_t)BT * cfg.padded_vocab_size;
  float *lg = malloc((size_t)NL * sizeof(float)), *lc = malloc((size_t)NL * sizeof(float));
  expect_true("logits", !st_model_logits(&mg, d_inp, B, T, lg) && !st_model_logits(&mc, inp, B, T, lc));
  expect_close("eval logits (dropout on)", lg, lc, NL, atol * maxabs(lc, NL), rtol);
  free(lg), free(lc);
  const float dloss = 1.0f / BT;
  st_model_zero_grad(&mc);
  const double loss_c = st_model_forward(&mc, inp, tgt, B, T, dloss);
  st_model_backward(&mc, inp, B, T);
  float *grads[2];
  double loss_g[2];
  for (int k = 0; k < 2; k++) {
    st_model_zero_grad(&mg);
    loss_g[k] = st_model_forward(&mg, d_inp, d_tgt, B, T, dloss);
    st_model_backward(&mg, d_inp, B, T);
    grads[k] = back(mg.grads, P);
  }
  const double rel = fabs(loss_g[0] - loss_c) / fabs(loss_c);
  g_checks++;
  printf("  %-40s cpu %.9g cuda %.9g rel %.2e (tol %.0e)  %s\n", "training loss", loss_c,
         loss_g[0], rel, loss_rtol, rel <= loss_rtol ? "ok" : "FAIL");
  if (!(rel <= loss_rtol)) g_failures++;
  for (int i = 0; i < mc.tab.n; i++) {
    const st_tensor *t = &mc.tab.t[i];
    char what[96];
    snprintf(what, sizeof what, "grad %s", t->name);
    const float *ref = mc.grads + t->offset;
    expect_true(what, maxabs(ref, t->numel) > 0);
    expect_close(what, grads[0] + t->offset, ref, t->numel, atol * maxabs(ref, t->numel), rtol);
  }
  g_checks++;
  const int same = loss_g[0] == loss_g[1] && memcmp(grads[0], grads[1], (size_t)P * 4) == 0;
  printf("  %-40s run twice: %s\n", "training loss and adapter gradients",
         same ? "bit-identical" : "DIFFERENT  FAIL");
  if (!same) g_failures++;
  free(grads[0]), free(grads[1]), free(base), free(ad), free(inp);
  GPU->free(d_inp), GPU->free(d_tgt);
  st_model_free(&mc);
  st_model_free(&mg);
  st_model_free(&plain);
}

int main(void) {
  char name[128];
  int rc = cuda_check_start("test_cuda_lora", name, sizeof name);
  if (rc) return rc;
  printf("test_cuda_lora: LoRA on %s against %s\n", name, CPU->name);
  const st_dtype dts[2] = {ST_FP32, ST_BF16};
  for (int k = 0; k < 2; k++) {
    use_dtype(dts[k]);
    const double tol = dts[k] == ST_FP32 ? 0 : 5e-2;
    test_ops();
    for (int nf4 = 0; nf4 < 2; nf4++) {
      test_model(0, "4,alpha=8,dropout=0.1,targets=qkv,o,up,down", tol, nf4);
      test_model(1, "4,alpha=8,dropout=0.1,targets=q,k,v,o,gate,up,down", tol, nf4);
      test_model(0, "4,alpha=8,targets=qkv", tol, nf4); /* GPT-2's fused GELU GEMMs */
    }
  }
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
