/* test_cuda_model.c - the whole GPT-2 model on CUDA against the same model
 * on the CPU reference, in fp32 and bf16 (harness: cuda_check.c).
 *
 * The model check builds a 2-layer, 3-head, width-72 GPT-2 (V=200, Vp=256,
 * B=3, T=40) on both backends with the same weights (randomised biases and
 * gains too; for bf16 the CPU gets the weights rounded to bf16), and
 * compares eval logits, the training loss and every gradient tensor. fp32:
 * |cuda - cpu| <= 1e-4 * max|cpu tensor| + 1e-3 * |cpu|, which a wrong index
 * or a lost accumulation fails by orders of magnitude. bf16 (activations
 * rounded at every op, errors compound through the layers): 5e-2 max|cpu
 * tensor| + 5e-2 |cpu|, loss within 1e-2 relative. A second CUDA step must
 * reproduce loss and gradients bit for bit. The bf16 model runs twice: with
 * our attention kernels, then with cuDNN's fused flash attention selected
 * (--attention cudnn; the same bounds, and its backward must be
 * deterministic too). Then fp32 and bf16 again with the LM head in chunks
 * of 37 rows (ST_HEAD_CHUNK_ROWS; 120 rows: 37, 37, 37, 9, the chunks'
 * rows at offsets only 16-byte aligned), on both backends: the per-chunk
 * GEMMs, cross-entropy and weight-gradient accumulation on the GPU.
 *
 * Exit 0: all passed; 1: a check failed; 77: no CUDA device (skipped).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "tests/cuda_check.h"
#include "rank/model/model.h"
#include "util/rng.h"
#include "util/error.h"

/* ---- the whole model, on the table of the current dtype. tol: 0 for the
 * fp32 bounds, else the loose bound of a low-precision model (header). */

static void test_model(double tol) {
  st_model_config cfg = {.n_layer = 2, .n_head = 3, .n_embd = 72, .block_size = 40,
                         .vocab_size = 200, .padded_vocab_size = 256};
  const int B = 3, T = 40, BT = B * T;
  printf("model (%s): GPT-2 L=%d NH=%d C=%d V=%d Vp=%d, B=%d T=%d\n", GPU->name, cfg.n_layer,
         cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.padded_vocab_size, B, T);
  st_model mc, mg;
  if (st_model_init(&mc, &cfg, CPU, B, T, 4, ST_RECOMPUTE_NONE) ||
      st_model_init(&mg, &cfg, GPU, B, T, 4, ST_RECOMPUTE_NONE)) {
    printf("  st_model_init failed: %s  FAIL\n", st_error_msg());
    g_failures++;
    return;
  }
  printf("  LM head in chunks of %d rows of %d\n", mg.head_rows, BT);
  const int64_t P = mc.padded_total;
  st_rng r;
  st_rng_seed(&r, 1337);
  float *params = malloc((size_t)P * sizeof(float));
  if (st_model_draw_weights(&mc, &r, params)) {
    printf("  st_model_draw_weights failed: %s  FAIL\n", st_error_msg());
    g_failures++;
    return;
  }
  /* randomise biases and gains too, so every parameter path carries signal;
   * both models get the weights the storage dtype can hold */
  for (int64_t i = 0; i < mc.tab.total; i++) params[i] += 0.02f * st_rng_normal(&g_rng);
  round_st(params, P);
  int set_ok = st_model_set_weights(&mc, params) == 0 && st_model_set_weights(&mg, params) == 0;
  float *readback = malloc((size_t)P * sizeof(float));
  set_ok = set_ok && st_model_get_weights(&mg, readback) == 0;
  expect_true("set_weights then get_weights round trip",
              set_ok && memcmp(readback, params, (size_t)P * 4) == 0);
  free(readback);
  int *inp = rand_ints(BT + 1, cfg.vocab_size);
  const int *tgt = inp + 1;
  int *d_inp = dev_bytes(inp, (size_t)BT * sizeof(int)), *d_tgt = dev_bytes(tgt, (size_t)BT * sizeof(int));
  const double l_atol = tol ? tol : 1e-4, l_rtol = tol ? tol : 1e-4;
  const double g_atol = tol ? tol : 1e-4, g_rtol = tol ? tol : 1e-3;
  const double loss_rtol = tol ? 1e-2 : 1e-5;

  /* eval forward: logits */
  const int64_t NL = (int64_t)BT * cfg.padded_vocab_size;
  double lc = st_model_forward(&mc, inp, tgt, B, T, 0.0f);
  double lg = st_model_forward(&mg, d_inp, d_tgt, B, T, 0.0f);
  float *logits = malloc((size_t)NL * sizeof *logits);
  float *ref_logits = malloc((size_t)NL * sizeof *ref_logits);
  expect_true("logits of both models",
              logits && ref_logits && st_model_logits(&mg, d_inp, B, T, logits) == 0 &&
                  st_model_logits(&mc, inp, B, T, ref_logits) == 0);
  expect_close("eval logits", logits, ref_logits, NL, l_atol * maxabs(ref_logits, NL), l_rtol);
  free(logits);
  free(ref_logits);
  printf("  eval loss sum: cpu %.9g cuda %.9g\n", lc, lg);

  /* training step */
  const float dloss = 1.0f / BT;
  st_model_zero_grad(&mc);
  lc = st_model_forward(&mc, inp, tgt, B, T, dloss);
  st_model_backward(&mc, inp, B, T);
  float *grads[2];
  double lgk[2];
  for (int k = 0; k < 2; k++) {
    st_model_zero_grad(&mg);
    lgk[k] = st_model_forward(&mg, d_inp, d_tgt, B, T, dloss);
    st_model_backward(&mg, d_inp, B, T);
    grads[k] = back(mg.grads, P);
  }
  double rel = fabs(lgk[0] - lc) / fabs(lc);
  g_checks++;
  printf("  %-40s cpu %.9g cuda %.9g rel %.2e (tol %.0e)  %s\n", "training loss (sum over B*T)",
         lc, lgk[0], rel, loss_rtol, rel <= loss_rtol ? "ok" : "FAIL");
  if (!(rel <= loss_rtol)) g_failures++;
  for (int i = 0; i < mc.tab.n; i++) {
    const st_tensor *t = &mc.tab.t[i];
    char what[96];
    snprintf(what, sizeof what, "grad %s", t->name);
    const float *ref = mc.grads + t->offset;
    expect_close(what, grads[0] + t->offset, ref, t->numel, g_atol * maxabs(ref, t->numel),
                 g_rtol);
  }
  g_checks++;
  int same = lgk[0] == lgk[1] && memcmp(grads[0], grads[1], (size_t)P * 4) == 0;
  printf("  %-40s run twice: %s\n", "training loss and all gradients",
         same ? "bit-identical" : "DIFFERENT  FAIL");
  if (!same) g_failures++;
  free(grads[0]), free(grads[1]), free(params), free(inp);
  GPU->free(d_inp), GPU->free(d_tgt);
  st_model_free(&mc);
  st_model_free(&mg);
}


int main(void) {
  char name[128];
  int rc = cuda_check_start("test_cuda_model", name, sizeof name);
  if (rc) return rc;
  printf("test_cuda_model: GPT-2 on %s against %s\n", name, CPU->name);
  use_dtype(ST_FP32);
  test_model(0);
  use_dtype(ST_BF16);
  test_model(5e-2);
  st_attention_choice ch; /* the model's shape: B=3 T=40 C=72 NH=3 */
  if (st_cuda_attention_select(ST_ATTENTION_CUDNN, ST_BF16, 3, 40, 72, 3, &ch) ||
      GPU->reserve(0, 0)) {
    g_checks++, g_failures++;
    printf("model with cuDNN attention: cannot select it: %s  FAIL\n", st_error_msg());
  } else {
    printf("model with cuDNN attention: %s\n", ch.note);
    test_model(5e-2);
    st_attention_choice back_to_ours;
    st_cuda_attention_select(ST_ATTENTION_FLASH, ST_BF16, 3, 40, 72, 3, &back_to_ours);
  }
  setenv("ST_HEAD_CHUNK_ROWS", "37", 1);
  printf("LM head in chunks of 37 rows (ST_HEAD_CHUNK_ROWS=37):\n");
  use_dtype(ST_FP32);
  test_model(0);
  use_dtype(ST_BF16);
  test_model(5e-2);
  unsetenv("ST_HEAD_CHUNK_ROWS");
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
