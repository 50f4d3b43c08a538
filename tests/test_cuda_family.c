/* test_cuda_family.c - the CUDA ops of the Llama family against the CPU
 * reference, in fp32, bf16 and fp16, with run-to-run bit-identity: RMSNorm,
 * RoPE, SwiGLU, the encoder without position embeddings, and grouped-query
 * attention (forward, backward, decode) through each of our attention
 * paths and cuDNN's. Harness and tolerance reasoning: cuda_check.c and the
 * header of test_cuda_ops.c (storage-dtype outputs get the fp32 bound plus
 * one rounding, u = 2^-8 bf16, 2^-11 fp16).
 *
 * RMSNorm, RoPE, SwiGLU: CPU op and CUDA op on the same rounded inputs
 * (gradient buffers start from the same random values, so dinp's and dw's
 * accumulation is checked; swiglu's dinp starts dirty: it is overwritten).
 * Bounds as for the ops they resemble in test_cuda_ops.c: RMSNorm like
 * LayerNorm (1e-5 + 1e-5|cpu| forward, 1e-5/1e-4 dinp, 1e-4/1e-4 dw (the
 * 1e-4 scaled by N/300 past 300 rows: a longer fp32 sum) and
 * the fp32 rstd 1e-6/1e-5); SwiGLU like GELU (expf: 2e-6 + 1e-5|cpu|);
 * RoPE one rotation (fused multiply-adds on the GPU: 1e-6 + 1e-5|cpu|), v
 * heads untouched bit for bit, and in fp32 backward(forward(x)) = x within
 * 1e-5 (the rotation is orthogonal). A missing CPU entry is a FAIL line.
 *
 * Attention with NKV < NH: the reference is the CPU's multi-head op on the
 * same inputs with each kv head repeated for the NH/NKV query heads of its
 * group (that is the definition of GQA), and the reference dk, dv are the
 * group sums of its per-head gradients. Shapes NH=8 NKV=2, NH=4 NKV=1 and
 * NKV=NH; T not a multiple of the tiles. The path is named on each line:
 * fp32 runs our fp32-arithmetic (SIMT) kernels; bf16/fp16 run the tensor-
 * core kernels at head sizes 32/64/128 and the SIMT ones elsewhere (24, 48)
 * or everywhere under ST_ATTENTION_KERNEL=simt (ctest runs this program
 * twice, once so); cuDNN is chosen with st_cuda_attention_select_gqa. Ours:
 * out within 1e-5 + u max|v| (P rounded before P V in bf16/fp16) +
 * 1e-4|cpu|, dqkv (overwritten: starts as junk) within 1e-5 + 4 u G
 * max|per-head gradient| + 1e-4|cpu| (D from the rounded out, summed over
 * a group of G heads), as test_cuda_ops.c's attention with the G factor;
 * cuDNN: test_cuda_attention_cudnn.c's bounds against float64 (bf16
 * 1e-2 + 1e-2|ref| out, 2e-2 G' + 1e-2|ref| per gradient part, G' = max
 * |reference part|; fp16 2e-3 each), here against the fp32 CPU plus the
 * same 1e-5 floor. Backward twice: identical bytes (cuDNN: when its engine
 * says deterministic).
 *
 * Decode with a KV cache of NKV heads: prefill then one position at a
 * time against the CPU's multi-head decode on the expanded cache (outputs
 * within 1e-5 + 1e-4|cpu| plus one rounding); the cache rows must equal
 * the k and v heads of the inputs bit for bit.
 *
 * Exit 0: all passed; 1: a check failed; 77: no CUDA device (skipped).
 * ST_CUDA_OPS_DTYPE=fp32|bf16|fp16 runs one dtype only.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_choice.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/ops_cuda.h"
#include "tests/cuda_check.h"
#include "util/error.h"

static int g_simt_forced; /* ST_ATTENTION_KERNEL=simt */

/* A FAIL line when the CPU reference lacks an op (the table is filled by
 * kernels/cpu/ops_table.c): nothing to compare against. */
static int have_cpu(const void *fn, const char *name) {
  if (fn) return 1;
  g_checks++, g_failures++;
  printf("  %-40s CPU reference has no entry: not compared  FAIL\n", name);
  return 0;
}

/* ---- RMSNorm */

static void test_rmsnorm(int N, int C, float eps) {
  printf("rmsnorm N=%d C=%d eps=%g\n", N, C, eps);
  if (!have_cpu((const void *)CPU->rmsnorm_forward, "rmsnorm_forward") ||
      !have_cpu((const void *)CPU->rmsnorm_backward, "rmsnorm_backward"))
    return;
  const int64_t NC = (int64_t)N * C;
  float *x = randn(NC, 2), *w = randn(C, 0.2f);
  for (int64_t i = 0; i < NC; i++) x[i] += 0.3f;
  for (int c = 0; c < C; c++) w[c] += 1.0f;
  round_st(x, NC);
  round_st(w, C);
  float *out = malloc(NC * 4), *rstd = malloc(N * 4);
  CPU->rmsnorm_forward(out, rstd, x, w, N, C, eps);
  void *d_x = dev_st(x, NC), *d_w = dev_st(w, C), *d_out = dev_st(NULL, NC);
  float *d_rstd = dev(NULL, N);
  float *g[2][2];
  for (int k = 0; k < 2; k++) {
    GPU->rmsnorm_forward(d_out, d_rstd, d_x, d_w, N, C, eps);
    g[k][0] = back_st(d_out, NC), g[k][1] = back(d_rstd, N);
  }
  expect_close_st("rmsnorm_forward out", g[0][0], out, NC, 1e-5, 1e-5);
  expect_close("rmsnorm_forward rstd (fp32)", g[0][1], rstd, N, 1e-6, 1e-5);
  expect_identical("rmsnorm_forward out", g[0][0], g[1][0], NC * 4);
  expect_identical("rmsnorm_forward rstd", g[0][1], g[1][1], N * 4);
  for (int k = 0; k < 2; k++) free(g[k][0]), free(g[k][1]);

  float *dout = randn_st(NC, 1), *dinp0 = randn_st(NC, 1), *dw0 = randn(C, 1);
  float *dinp = copy_of(dinp0, NC), *dw = copy_of(dw0, C);
  CPU->rmsnorm_backward(dinp, dw, dout, x, w, rstd, N, C);
  upload(d_rstd, rstd, N); /* the backward alone is compared */
  void *d_dout = dev_st(dout, NC), *d_dinp = dev_st(NULL, NC);
  float *d_dw = dev(NULL, C);
  for (int k = 0; k < 2; k++) {
    upload_st(d_dinp, dinp0, NC), upload(d_dw, dw0, C);
    GPU->rmsnorm_backward(d_dinp, d_dw, d_dout, d_x, d_w, d_rstd, N, C);
    g[k][0] = back_st(d_dinp, NC), g[k][1] = back(d_dw, C);
  }
  expect_close_st("rmsnorm_backward dinp (+=)", g[0][0], dinp, NC, 1e-5, 1e-4);
  /* dw sums N rows of dout * xhat (|term| about 1) in fp32 on both sides, in
   * different orders: the absolute error grows with the rows, so the
   * 1e-4 set at 300 rows scales with N past that (measured on an H200 at
   * 33,000 rows: 4.9e-3). */
  const double dw_abs = N > 300 ? 1e-4 * N / 300.0 : 1e-4;
  expect_close("rmsnorm_backward dw (+=, fp32)", g[0][1], dw, C, dw_abs, 1e-4);
  expect_identical("rmsnorm_backward dinp", g[0][0], g[1][0], NC * 4);
  expect_identical("rmsnorm_backward dw", g[0][1], g[1][1], C * 4);
  for (int k = 0; k < 2; k++) free(g[k][0]), free(g[k][1]);
  GPU->free(d_x), GPU->free(d_w), GPU->free(d_out), GPU->free(d_rstd), GPU->free(d_dout);
  GPU->free(d_dinp), GPU->free(d_dw);
  free(x), free(w), free(out), free(rstd), free(dout), free(dinp0), free(dw0), free(dinp), free(dw);
}

/* ---- RoPE */

/* The cos | sin table [maxT, HD] of rope_forward, theta 10000 (the tests
 * need any valid table; rank/model/rope.h builds the real one). */
static float *rope_table(int maxT, int HD) {
  float *cs = malloc((size_t)maxT * HD * sizeof *cs);
  for (int p = 0; p < maxT; p++)
    for (int i = 0; i < HD / 2; i++) {
      const double a = p * pow(10000.0, -2.0 * i / HD);
      cs[(size_t)p * HD + i] = (float)cos(a);
      cs[(size_t)p * HD + HD / 2 + i] = (float)sin(a);
    }
  return cs;
}

/* 1 when the v heads (the last NKV*HD columns of each row) of a and b hold
 * the same bits. */
static int v_equal(const float *a, const float *b, int64_t rows, int NH, int NKV, int HD) {
  const int64_t R = (int64_t)(NH + 2 * NKV) * HD, v0 = (int64_t)(NH + NKV) * HD;
  for (int64_t r = 0; r < rows; r++)
    if (memcmp(a + r * R + v0, b + r * R + v0, (size_t)NKV * HD * sizeof(float)) != 0) return 0;
  return 1;
}

static void test_rope(int B, int T, int pos0, int NH, int NKV, int HD) {
  printf("rope B=%d T=%d pos0=%d NH=%d NKV=%d HD=%d\n", B, T, pos0, NH, NKV, HD);
  if (!have_cpu((const void *)CPU->rope_forward, "rope_forward") ||
      !have_cpu((const void *)CPU->rope_backward, "rope_backward"))
    return;
  const int maxT = pos0 + T + 3;
  const int64_t rows = (int64_t)B * T, n = rows * (NH + 2 * NKV) * HD;
  float *cs = rope_table(maxT, HD), *x = randn_st(n, 1);
  float *d_cs = dev(cs, (int64_t)maxT * HD);
  float *want = copy_of(x, n);
  CPU->rope_forward(want, cs, B, T, pos0, NH, NKV, HD);
  void *d_x = dev_st(x, n);
  float *g[2];
  for (int k = 0; k < 2; k++) {
    upload_st(d_x, x, n);
    GPU->rope_forward(d_x, d_cs, B, T, pos0, NH, NKV, HD);
    g[k] = back_st(d_x, n);
  }
  expect_close_st("rope_forward qkv (in place)", g[0], want, n, 1e-6, 1e-5);
  expect_true("rope_forward: v heads untouched, bit for bit", v_equal(g[0], x, rows, NH, NKV, HD));
  expect_identical("rope_forward qkv", g[0], g[1], n * 4);
  if (DT == ST_FP32 && pos0 == 0) { /* orthogonal: the backward undoes the forward */
    upload(d_x, g[0], n);
    GPU->rope_backward(d_x, d_cs, B, T, NH, NKV, HD);
    float *inv = back(d_x, n);
    expect_close("rope_backward(rope_forward(x)) = x", inv, x, n, 1e-5, 0);
    free(inv);
  }
  free(g[0]), free(g[1]);

  float *dy = randn_st(n, 1), *dwant = copy_of(dy, n);
  CPU->rope_backward(dwant, cs, B, T, NH, NKV, HD);
  for (int k = 0; k < 2; k++) {
    upload_st(d_x, dy, n);
    GPU->rope_backward(d_x, d_cs, B, T, NH, NKV, HD);
    g[k] = back_st(d_x, n);
  }
  expect_close_st("rope_backward dqkv (in place)", g[0], dwant, n, 1e-6, 1e-5);
  expect_true("rope_backward: dv heads untouched", v_equal(g[0], dy, rows, NH, NKV, HD));
  expect_identical("rope_backward dqkv", g[0], g[1], n * 4);
  free(g[0]), free(g[1]);
  GPU->free(d_cs), GPU->free(d_x);
  free(cs), free(x), free(want), free(dy), free(dwant);
}

/* ---- SwiGLU */

static void test_swiglu(int N, int F) {
  printf("swiglu N=%d F=%d\n", N, F);
  if (!have_cpu((const void *)CPU->swiglu_forward, "swiglu_forward") ||
      !have_cpu((const void *)CPU->swiglu_backward, "swiglu_backward"))
    return;
  const int64_t NF = (int64_t)N * F, N2F = 2 * NF;
  float *inp = randn_st(N2F, 2), *out = malloc(NF * 4);
  CPU->swiglu_forward(out, inp, N, F);
  void *d_inp = dev_st(inp, N2F), *d_out = dev_st(NULL, NF);
  float *g[2];
  for (int k = 0; k < 2; k++) {
    GPU->swiglu_forward(d_out, d_inp, N, F);
    g[k] = back_st(d_out, NF);
  }
  expect_close_st("swiglu_forward out", g[0], out, NF, 2e-6, 1e-5);
  expect_identical("swiglu_forward out", g[0], g[1], NF * 4);
  free(g[0]), free(g[1]);

  float *dout = randn_st(NF, 1), *dinp = malloc(N2F * 4), *junk = randn(N2F, 1);
  CPU->swiglu_backward(dinp, dout, inp, N, F);
  void *d_dout = dev_st(dout, NF), *d_dinp = dev_st(NULL, N2F);
  for (int k = 0; k < 2; k++) {
    upload_st(d_dinp, junk, N2F); /* overwritten, so start dirty */
    GPU->swiglu_backward(d_dinp, d_dout, d_inp, N, F);
    g[k] = back_st(d_dinp, N2F);
  }
  expect_close_st("swiglu_backward dinp (=)", g[0], dinp, N2F, 2e-6, 1e-5);
  expect_identical("swiglu_backward dinp", g[0], g[1], N2F * 4);
  free(g[0]), free(g[1]);
  /* pointers one element past alignment: the unvectorised path, on N - 1
   * rows read from inp + 1 */
  CPU->swiglu_forward(out, inp + 1, N - 1, F);
  GPU->swiglu_forward(at(d_out, 1), at(d_inp, 1), N - 1, F);
  g[0] = back_st(d_out, NF);
  expect_close_st("swiglu_forward out (unaligned)", g[0] + 1, out, (int64_t)(N - 1) * F, 2e-6,
                  1e-5);
  free(g[0]);
  GPU->free(d_inp), GPU->free(d_out), GPU->free(d_dout), GPU->free(d_dinp);
  free(inp), free(out), free(dout), free(dinp), free(junk);
}

/* ---- the encoder without learned positions (rotary models) */

static void test_encoder_nopos(int B, int T, int C, int V) {
  printf("encoder wpe NULL B=%d T=%d C=%d V=%d\n", B, T, C, V);
  const int64_t BT = (int64_t)B * T, BTC = BT * C;
  int *inp = rand_ints(BT, V);
  float *wte = randn_st((int64_t)V * C, 1), *out = malloc(BTC * 4);
  for (int64_t i = 0; i < BT; i++) memcpy(out + i * C, wte + (int64_t)inp[i] * C, (size_t)C * 4);
  int *d_inp = dev_bytes(inp, (size_t)BT * sizeof(int));
  void *d_wte = dev_st(wte, (int64_t)V * C), *d_out = dev_st(NULL, BTC);
  GPU->encoder_forward(d_out, d_inp, d_wte, NULL, B, T, C);
  float *g = back_st(d_out, BTC);
  expect_exact_st("encoder_forward out = wte[inp]", g, out, BTC);
  free(g);
  float *dout = randn_st(BTC, 1), *dwte0 = randn((int64_t)V * C, 1);
  float *dwte = copy_of(dwte0, (int64_t)V * C);
  if (have_cpu((const void *)CPU->encoder_backward, "encoder_backward")) {
    CPU->encoder_backward(dwte, NULL, dout, inp, B, T, C, NULL, 0);
    void *d_dout = dev_st(dout, BTC);
    float *d_dwte = dev(dwte0, (int64_t)V * C);
    const size_t sbytes = (size_t)BT * 16 + ((size_t)1 << 20); /* the sort path's scratch */
    float *d_scratch = dev(NULL, (int64_t)(sbytes / 4));
    GPU->encoder_backward(d_dwte, NULL, d_dout, d_inp, B, T, C, d_scratch, sbytes);
    g = back(d_dwte, (int64_t)V * C);
    expect_close("encoder_backward dwte (+=), dwpe NULL", g, dwte, (int64_t)V * C, 0, 0);
    free(g);
    GPU->free(d_dout), GPU->free(d_dwte), GPU->free(d_scratch);
  }
  GPU->free(d_inp), GPU->free(d_wte), GPU->free(d_out);
  free(inp), free(wte), free(out), free(dout), free(dwte0), free(dwte);
}

/* ---- grouped-query attention */

/* qkv [rows, (NH+2NKV)hs] -> [rows, 3C] with each kv head repeated for the
 * G = NH/NKV query heads of its group. */
static float *expand_qkv(const float *q, int64_t rows, int NH, int NKV, int hs) {
  const int C = NH * hs, G = NH / NKV;
  const int64_t R = (int64_t)(NH + 2 * NKV) * hs;
  float *e = malloc((size_t)rows * 3 * C * sizeof *e);
  for (int64_t r = 0; r < rows; r++) {
    const float *src = q + r * R;
    float *dst = e + r * 3 * C;
    memcpy(dst, src, (size_t)C * 4);
    for (int h = 0; h < NH; h++) {
      memcpy(dst + C + h * hs, src + C + (h / G) * hs, (size_t)hs * 4);
      memcpy(dst + 2 * C + h * hs, src + C + NKV * hs + (h / G) * hs, (size_t)hs * 4);
    }
  }
  return e;
}

/* The multi-head gradient [rows, 3C] folded into the GQA layout: dq as is,
 * dk and dv of each kv head the sum over its group, in head order. */
static float *fold_dqkv(const float *d, int64_t rows, int NH, int NKV, int hs) {
  const int C = NH * hs, G = NH / NKV;
  const int64_t R = (int64_t)(NH + 2 * NKV) * hs;
  float *f = calloc((size_t)rows * R, sizeof *f);
  for (int64_t r = 0; r < rows; r++) {
    const float *src = d + r * 3 * C;
    float *dst = f + r * R;
    memcpy(dst, src, (size_t)C * 4);
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < hs; i++) {
        dst[C + (h / G) * hs + i] += src[C + h * hs + i];
        dst[C + NKV * hs + (h / G) * hs + i] += src[2 * C + h * hs + i];
      }
  }
  return f;
}

/* Columns [c0, c0 + w) of every row of x [rows, R], packed. */
static float *cols(const float *x, int64_t rows, int64_t R, int64_t c0, int64_t w) {
  float *y = malloc((size_t)(rows * w > 0 ? rows * w : 1) * sizeof *y);
  for (int64_t r = 0; r < rows; r++) memcpy(y + r * w, x + r * R + c0, (size_t)w * 4);
  return y;
}

typedef enum { PATH_OURS, PATH_CUDNN } att_path;

static const char *ours_name(int C, int NH) {
  if (DT == ST_FP32 || g_simt_forced || !st_attention_tc_takes(C, NH, DT)) return "simt";
  return "tensor-core";
}

static void test_gqa(att_path path, int B, int T, int NH, int NKV, int hs) {
  const int C = NH * hs, G = NH / NKV;
  const char *pname = path == PATH_CUDNN ? "cudnn" : ours_name(C, NH);
  printf("gqa attention [%s] B=%d T=%d NH=%d NKV=%d hs=%d\n", pname, B, T, NH, NKV, hs);
  const int64_t rows = (int64_t)B * T, R = (int64_t)(NH + 2 * NKV) * hs, n = rows * R;
  const int64_t BTC = rows * C;
  int det = 1;
  if (path == PATH_CUDNN) {
    st_attention_choice ch;
    if (st_cuda_attention_select_gqa(ST_ATTENTION_CUDNN, DT, B, T, C, NH, NKV, &ch) ||
        GPU->reserve(0, 0)) {
      printf("  select cudnn failed: %s  FAIL\n", st_error_msg());
      g_checks++, g_failures++;
      return;
    }
    det = ch.deterministic;
    printf("  %s\n", ch.note);
  }
  float *qkv = randn_st(n, 1), *ex = expand_qkv(qkv, rows, NH, NKV, hs);
  const int64_t ATT = CPU->attention_state_floats(B, T, NH);
  const int64_t GATT = GPU->attention_state_floats(B, T, NH);
  float *out = malloc(BTC * 4), *att = malloc(ATT * 4);
  CPU->attention_forward(out, att, ex, B, T, C, NH, NH);
  void *d_qkv = dev_st(qkv, n), *d_out = dev_st(NULL, BTC);
  float *d_att = dev(NULL, GATT);
  float *g[2][2];
  for (int k = 0; k < 2; k++) {
    GPU->attention_forward(d_out, d_att, d_qkv, B, T, C, NH, NKV);
    g[k][0] = back_st(d_out, BTC), g[k][1] = back(d_att, GATT);
  }
  const int bf = DT == ST_BF16;
  if (path == PATH_CUDNN)
    expect_close_st("attention_forward out", g[0][0], out, BTC, (bf ? 1e-2 : 2e-3) + 1e-5,
                    bf ? 1e-2 : 2e-3);
  else
    expect_close_st("attention_forward out", g[0][0], out, BTC,
                    1e-5 + (DT == ST_FP32 ? 0 : U * maxabs(qkv, n)), 1e-4);
  expect_identical("attention_forward out", g[0][0], g[1][0], BTC * 4);
  expect_identical("attention_forward state", g[0][1], g[1][1], GATT * 4);
  for (int k = 0; k < 2; k++) free(g[k][0]), free(g[k][1]);

  float *dout = randn_st(BTC, 1), *dex = calloc((size_t)rows * 3 * C, 4), *datt = malloc(ATT * 4);
  CPU->attention_backward(dex, datt, dout, ex, out, att, B, T, C, NH, NH);
  float *want = fold_dqkv(dex, rows, NH, NKV, hs);
  void *d_dout = dev_st(dout, BTC), *d_dqkv = dev_st(NULL, n);
  float *d_datt = dev(NULL, GATT), *junk = randn(n > GATT ? n : GATT, 1);
  for (int k = 0; k < 2; k++) {
    upload_st(d_dqkv, junk, n); /* overwritten, so start dirty */
    upload(d_datt, junk, GATT);
    GPU->attention_backward(d_dqkv, d_datt, d_dout, d_qkv, d_out, d_att, B, T, C, NH, NKV);
    g[k][0] = back_st(d_dqkv, n);
  }
  static const char *const part[3] = {"dq", "dk", "dv"};
  const int64_t c0[3] = {0, C, C + (int64_t)NKV * hs}, w[3] = {C, (int64_t)NKV * hs,
                                                                 (int64_t)NKV * hs};
  const double per_head = maxabs(dex, rows * 3 * C);
  for (int p = 0; p < 3; p++) {
    float *a = cols(g[0][0], rows, R, c0[p], w[p]), *b = cols(want, rows, R, c0[p], w[p]);
    char what[96];
    snprintf(what, sizeof what, "attention_backward %s (=)%s", part[p],
             p && G > 1 ? " group sum" : "");
    const int sum_of = p ? G : 1;
    if (path == PATH_CUDNN)
      expect_close_st(what, a, b, rows * w[p], (bf ? 2e-2 : 2e-3) * maxabs(b, rows * w[p]) + 1e-5,
                      bf ? 1e-2 : 2e-3);
    else
      expect_close_st(what, a, b, rows * w[p], 1e-5 + 4 * U * sum_of * per_head, 1e-4);
    free(a), free(b);
  }
  if (det) expect_identical("attention_backward dqkv", g[0][0], g[1][0], n * 4);
  else printf("  cudnn backward engine is NONDETERMINISTIC: bit-identity not checked\n");
  free(g[0][0]), free(g[1][0]);
  if (path == PATH_CUDNN) { /* back to ours for the tests that follow */
    st_attention_choice ch;
    st_cuda_attention_select_gqa(ST_ATTENTION_FLASH, DT, B, T, C, NH, NKV, &ch);
  }
  GPU->free(d_qkv), GPU->free(d_out), GPU->free(d_att), GPU->free(d_dout), GPU->free(d_dqkv);
  GPU->free(d_datt);
  free(qkv), free(ex), free(out), free(att), free(dout), free(dex), free(datt), free(want);
  free(junk);
}

/* ---- decode over a cache of NKV heads: a prefill of n0 positions, then
 * `steps` positions one at a time */

static void test_gqa_decode(int B, int NH, int NKV, int hs, int n0, int steps) {
  const int C = NH * hs, KV = NKV * hs, maxT = n0 + steps + 5;
  printf("gqa attention_decode B=%d NH=%d NKV=%d hs=%d prefill %d then %d x 1\n", B, NH, NKV, hs,
         n0, steps);
  const int64_t gcache = (int64_t)B * maxT * KV, ecache = (int64_t)B * maxT * C;
  void *d_kc = dev_st(NULL, gcache), *d_vc = dev_st(NULL, gcache);
  float *ek = calloc((size_t)ecache, 4), *ev = calloc((size_t)ecache, 4);
  float *gk_want = calloc((size_t)gcache, 4), *gv_want = calloc((size_t)gcache, 4);
  int pos = 0;
  for (int s = 0; s <= steps; s++) {
    const int nn = s == 0 ? n0 : 1;
    const int64_t rows = (int64_t)B * nn, R = C + 2 * KV;
    float *qkv = randn_st(rows * R, 1), *ex = expand_qkv(qkv, rows, NH, NKV, hs);
    for (int64_t r = 0; r < rows; r++) { /* the cache rows the op must write */
      const int64_t b = r / nn, t = pos + r % nn;
      memcpy(gk_want + (b * maxT + t) * KV, qkv + r * R + C, (size_t)KV * 4);
      memcpy(gv_want + (b * maxT + t) * KV, qkv + r * R + C + KV, (size_t)KV * 4);
    }
    float *out = malloc((size_t)rows * C * 4);
    CPU->attention_decode(out, ek, ev, ex, B, nn, pos, maxT, C, NH, NH);
    void *d_qkv = dev_st(qkv, rows * R), *d_out = dev_st(NULL, rows * C);
    GPU->attention_decode(d_out, d_kc, d_vc, d_qkv, B, nn, pos, maxT, C, NH, NKV);
    float *g1 = back_st(d_out, rows * C);
    GPU->attention_decode(d_out, d_kc, d_vc, d_qkv, B, nn, pos, maxT, C, NH, NKV);
    float *g2 = back_st(d_out, rows * C);
    if (s == 0 || s == steps) {
      char what[96];
      snprintf(what, sizeof what, "decode out, %d new at position %d", nn, pos);
      expect_close_st(what, g1, out, rows * C, 1e-5, 1e-4);
      expect_identical("decode out", g1, g2, (size_t)rows * C * 4);
    } else {
      expect_close_st("decode out (one position)", g1, out, rows * C, 1e-5, 1e-4);
    }
    free(qkv), free(ex), free(out), free(g1), free(g2);
    GPU->free(d_qkv), GPU->free(d_out);
    pos += nn;
  }
  float *gk = back_st(d_kc, gcache), *gv = back_st(d_vc, gcache);
  expect_exact_st("k cache [B,maxT,NKV*hs] (a copy)", gk, gk_want, gcache);
  expect_exact_st("v cache [B,maxT,NKV*hs] (a copy)", gv, gv_want, gcache);
  free(gk), free(gv), free(ek), free(ev), free(gk_want), free(gv_want);
  GPU->free(d_kc), GPU->free(d_vc);
}

static void test_family(void) {
  printf("== %s ==\n", GPU->name);
  test_rmsnorm(37, 72, 1e-5f);
  test_rmsnorm(300, 200, 1e-6f); /* several row chunks in the dw partials */
  test_rmsnorm(37, 75, 1e-5f);   /* C not a multiple of 8: unvectorised rows */
  test_rmsnorm(64, 2048, 1e-5f); /* Llama 3.2 1B width */
  /* 256 row chunks and more: the backward's fused dinp + dw kernel */
  test_rmsnorm(32768, 72, 1e-5f);
  test_rmsnorm(40000, 75, 1e-5f);  /* unvectorised rows, a short last chunk */
  test_rmsnorm(33000, 4096, 1e-5f); /* 4 warps a block, 64 KiB of shared rows */
  test_rope(2, 13, 0, 4, 2, 16);
  test_rope(2, 13, 5, 4, 2, 16); /* a later chunk (decode): positions from pos0 */
  test_rope(1, 77, 0, 8, 2, 64);
  test_rope(2, 9, 3, 4, 1, 128);
  test_rope(1, 20, 0, 3, 3, 24); /* NKV = NH */
  test_rope(2, 7, 2, 32, 8, 128); /* more pairs in a row than threads in a block */
  test_swiglu(37, 200);
  test_swiglu(37, 75); /* F not a multiple of 8: unvectorised */
  test_swiglu(64, 8192);
  test_encoder_nopos(3, 13, 72, 200);
  test_encoder_nopos(4, 300, 37, 7);
  /* our kernels: tensor-core head sizes (32, 64, 128) and SIMT-only ones
   * (24, 48) in bf16/fp16; all SIMT in fp32 */
  test_gqa(PATH_OURS, 2, 77, 8, 2, 32);
  test_gqa(PATH_OURS, 2, 130, 4, 1, 64);
  test_gqa(PATH_OURS, 1, 200, 4, 4, 64);
  test_gqa(PATH_OURS, 1, 130, 4, 2, 128);
  test_gqa(PATH_OURS, 2, 45, 8, 2, 48);
  test_gqa(PATH_OURS, 1, 77, 4, 1, 24);
  if (DT != ST_FP32) { /* cuDNN runs bf16/fp16 only */
    test_gqa(PATH_CUDNN, 2, 64, 8, 2, 64);
    test_gqa(PATH_CUDNN, 2, 128, 4, 1, 64);
    test_gqa(PATH_CUDNN, 1, 256, 4, 4, 64);
    test_gqa(PATH_CUDNN, 2, 128, 8, 2, 32);
    test_gqa(PATH_CUDNN, 1, 256, 8, 2, 128);
  }
  test_gqa_decode(2, 8, 2, 32, 7, 5);
  test_gqa_decode(1, 4, 1, 64, 13, 4);
  test_gqa_decode(2, 4, 4, 24, 5, 3);
}

int main(void) {
  char name[128];
  int rc = cuda_check_start("test_cuda_family", name, sizeof name);
  if (rc) return rc;
  const char *k = getenv("ST_ATTENTION_KERNEL");
  g_simt_forced = k && strcmp(k, "simt") == 0;
  printf("test_cuda_family: Llama-family ops, cuda-fp32/bf16/fp16 against %s on %s%s\n",
         CPU->name, name, g_simt_forced ? " (ST_ATTENTION_KERNEL=simt)" : "");
  const char *only = getenv("ST_CUDA_OPS_DTYPE");
  const st_dtype dts[] = {ST_FP32, ST_BF16, ST_FP16};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    if (only && *only && strcmp(only, st_dtype_name(dts[i])) != 0) continue;
    use_dtype(dts[i]);
    test_family();
  }
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
