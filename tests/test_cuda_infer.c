/* test_cuda_infer.c - the CUDA attention_decode op against the CPU's, and
 * the KV-cache inference path (rank/model/infer.h) on CUDA against the CPU, in
 * fp32, bf16 and fp16. Needs a GPU: exits 77 (skipped) without one.
 *
 * attention_decode: random q|k|v rounded to the storage dtype (the CPU runs
 * fp32 on exactly those values), the positions fed in chunks (all at once;
 * a prefill then one by one; uneven), and a cache filled directly past 48
 * KiB of scores (13,000 positions, the kernel's opt-in shared memory). The
 * cache rows must equal the inputs bit for bit (a copy), the outputs
 *     |cuda - cpu| <= 1e-5 (1 + u) + (1e-4 + u) |cpu|
 * (sums in another order, and one rounding of the output: u = 2^-8 bf16,
 * 2^-11 fp16, 0 fp32; the kernel keeps p in fp32, so no P rounding term),
 * and a second run must give the same bits.
 *
 * The whole path: a random GPT-2 (2 layers, width 64, 4 heads, vocabulary
 * 300, 64 positions) prefills 7 tokens then decodes 40, both backends fed
 * the CPU's greedy ids (teacher forcing, so one near tie cannot derail the
 * comparison); at every step the logits are compared: fp32 within 1e-4 +
 * 1e-4 |cpu| (matmul sums in another order), bf16/fp16 within
 * 0.05 max|logit| (every activation is stored in the dtype, as in
 * training; the bound is loose on purpose, it catches a wrong cache or
 * position, which moves logits by O(max|logit|)). The greedy ids of fp32
 * CUDA must equal the CPU's wherever the CPU's top two logits differ by
 * more than 1e-3.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "rank/model/infer.h"
#include "rank/model/model.h"
#include "tests/cuda_check.h"

/* plan: chunk sizes ending in 0; positions before pos_start come from a
 * cache filled directly. */
static void test_decode(int B, int T, int C, int NH, int maxT, int pos_start, const int *plan,
                        const char *label) {
  printf("attention_decode B=%d T=%d C=%d NH=%d maxT=%d start=%d (%s)\n", B, T, C, NH, maxT,
         pos_start, label);
  const int64_t cache = (int64_t)B * maxT * C;
  float *kc = randn_st(cache, 1), *vc = randn_st(cache, 1); /* rows >= pos_start get written */
  float *d_kc = dev_st(kc, cache), *d_vc = dev_st(vc, cache);
  void *dk = d_kc, *dv = d_vc;
  float *ref_k = copy_of(kc, cache), *ref_v = copy_of(vc, cache);
  int pos = pos_start;
  for (int c = 0; plan[c]; c++) {
    const int n = plan[c];
    const int64_t rows = (int64_t)B * n;
    float *qkv = randn_st(rows * 3 * C, 1), *out = malloc((size_t)rows * C * sizeof(float));
    CPU->attention_decode(out, ref_k, ref_v, qkv, B, n, pos, maxT, C, NH, NH);
    void *d_qkv = dev_st(qkv, rows * 3 * C), *d_out = dev_st(NULL, rows * C);
    GPU->attention_decode(d_out, dk, dv, d_qkv, B, n, pos, maxT, C, NH, NH);
    float *g1 = back_st(d_out, rows * C);
    /* the same step again over the same cache prefix: same bits */
    GPU->attention_decode(d_out, dk, dv, d_qkv, B, n, pos, maxT, C, NH, NH);
    float *g2 = back_st(d_out, rows * C);
    if (c == 0 || !plan[c + 1]) { /* print the first and last chunk, check all */
      char what[96];
      snprintf(what, sizeof what, "out, %d new at position %d", n, pos);
      expect_close_st(what, g1, out, rows * C, 1e-5, 1e-4);
      expect_identical("out run to run", g1, g2, (size_t)rows * C * 4);
    } else {
      expect_close_st("out", g1, out, rows * C, 1e-5, 1e-4);
    }
    free(g1), free(g2), free(qkv), free(out);
    GPU->free(d_qkv), GPU->free(d_out);
    pos += n;
  }
  float *gk = back_st(dk, cache), *gv = back_st(dv, cache);
  expect_exact_st("k cache (a copy)", gk, ref_k, cache);
  expect_exact_st("v cache (a copy)", gv, ref_v, cache);
  free(gk), free(gv), free(kc), free(vc), free(ref_k), free(ref_v);
  GPU->free(dk), GPU->free(dv);
}

static int argmax2(const float *x, int n, float *gap) {
  int a = 0, b = -1;
  for (int i = 1; i < n; i++)
    if (x[i] > x[a]) b = a, a = i;
    else if (b < 0 || x[i] > x[b]) b = i;
  *gap = b >= 0 ? x[a] - x[b] : INFINITY;
  return a;
}

static void test_infer_path(void) {
  st_model_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 64,
                         .vocab_size = 300};
  printf("infer (KV cache) %s vs cpu-fp32: L=2 C=64 NH=4 V=300, prefill 7, decode 40\n",
         GPU->name);
  if (st_model_validate(&cfg)) {
    expect_true("model config", 0);
    return;
  }
  st_model m;
  if (st_model_init(&m, &cfg, CPU, 1, 1, 1, ST_RECOMPUTE_NONE)) {
    expect_true("model init", 0);
    return;
  }
  float *w = malloc((size_t)m.padded_total * sizeof(float));
  st_rng r;
  st_rng_seed(&r, 5);
  st_model_draw_weights(&m, &r, w);
  const int64_t nw = m.padded_total;
  for (int64_t i = 0; i < nw; i++) w[i] *= 4.0f;
  st_model_free(&m);
  round_st(w, nw); /* the CPU reference runs on the weights rounded to the GPU's dtype */
  st_infer c, g;
  const int P = 7, N = 40, Vp = cfg.padded_vocab_size, V = cfg.vocab_size;
  if (st_infer_init(&c, &cfg, CPU, P) || st_infer_init(&g, &cfg, GPU, P) ||
      st_infer_set_weights(&c, w) || st_infer_set_weights(&g, w)) {
    expect_true("infer init", 0);
    free(w);
    return;
  }
  float *lc = malloc((size_t)Vp * 4), *lg = malloc((size_t)Vp * 4);
  int toks[7] = {1, 42, 7, 299, 100, 0, 5}, agree = 1, compared = 0;
  double worst = 0, scale = 0;
  int ok = !st_infer_step(&c, toks, P, lc) && !st_infer_step(&g, toks, P, lg);
  for (int k = 0; ok && k < N; k++) {
    double d = maxabs_diff(lg, lc, V), mx = maxabs(lc, V);
    if (d > worst) worst = d;
    if (mx > scale) scale = mx;
    const double bound = DT == ST_FP32 ? 1e-4 + 1e-4 * mx : 0.05 * mx;
    if (d > bound) {
      printf("  step %d: max |cuda - cpu| logit %.3g > %.3g\n", k, d, bound);
      ok = 0;
    }
    float gap, gap_g;
    const int id = argmax2(lc, V, &gap), id_g = argmax2(lg, V, &gap_g);
    if (DT == ST_FP32 && gap > 1e-3f) {
      compared++;
      agree &= id == id_g;
    }
    ok = ok && !st_infer_step(&c, &id, 1, lc) && !st_infer_step(&g, &id, 1, lg);
  }
  char what[160];
  snprintf(what, sizeof what, "logits at every step within bounds (worst %.3g, max|logit| %.3g)",
           worst, scale);
  expect_true(what, ok);
  if (DT == ST_FP32) {
    snprintf(what, sizeof what, "greedy ids equal the CPU's (%d steps without a near tie)",
             compared);
    expect_true(what, agree);
  }
  free(lc), free(lg), free(w);
  st_infer_free(&c);
  st_infer_free(&g);
}

int main(void) {
  char name[128];
  int rc = cuda_check_start("test_cuda_infer", name, sizeof name);
  if (rc) return rc;
  printf("test_cuda_infer: attention_decode and the KV-cache path, cuda vs %s on %s\n",
         CPU->name, name);
  const st_dtype dts[] = {ST_FP32, ST_BF16, ST_FP16};
  static const int all13[] = {13, 0}, pre5[] = {5, 1, 1, 1, 1, 1, 1, 1, 1, 0},
                   uneven[] = {1, 4, 2, 6, 0}, p300[] = {200, 1, 1, 1, 97, 0},
                   gpt2[] = {1000, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                             1, 1, 1, 1, 0},
                   tail[] = {3, 1, 1, 5, 0};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    use_dtype(dts[i]);
    printf("== %s\n", GPU->name);
    test_decode(2, 13, 72, 3, 16, 0, all13, "all at once");
    test_decode(2, 13, 72, 3, 16, 0, pre5, "prefill 5, then one by one");
    test_decode(2, 13, 24, 3, 13, 0, uneven, "uneven chunks, hs 8");
    test_decode(1, 300, 128, 2, 320, 0, p300, "hs 64");
    test_decode(1, 1024, 768, 12, 1024, 0, gpt2, "GPT-2 124M shape");
    test_decode(1, 13000, 64, 2, 13010, 12990, tail, "13,000 cached positions: 52 KB of scores");
    test_decode(1, 40, 512, 2, 40, 0, pre5, "hs 256");
    test_infer_path();
  }
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
